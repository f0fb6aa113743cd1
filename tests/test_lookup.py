"""Retrieval drafting (edge_spec.decoding.lookup): exact proposals against a brute-force oracle, and lossless in the loop."""

import numpy as np
import pytest

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.lookup import PromptLookup
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative


def brute_force(ctx, k, max_n=4, min_n=2):
    """The definition: the longest suffix (max_n..min_n) that occurred earlier; the k tokens after its latest earlier
    occurrence (../shared/tools/drafting_headroom.py's ngram_propose)."""
    for n in range(max_n, min_n - 1, -1):
        if len(ctx) <= n:
            continue
        suffix = ctx[-n:]
        for s in range(len(ctx) - n - 1, -1, -1):
            if ctx[s:s + n] == suffix:
                return ctx[s + n:s + n + k]
    return []


def test_hand_built_proposals():
    assert PromptLookup([1, 2, 3, 4, 1, 2]).propose(3) == [3, 4, 1]  # "1 2" occurred at 0
    assert PromptLookup([1, 2, 3, 9, 1, 2, 3, 7, 2, 3]).propose(2) == [7, 2]  # latest earlier "2 3" (at 5) wins
    assert PromptLookup([1, 2, 3, 4, 5]).propose(4) == []  # nothing repeats
    assert PromptLookup([7, 7, 7, 7]).propose(5) == [7]  # overlapping occurrence, continuation cut at the end
    longer = PromptLookup([5, 1, 2, 3, 8, 9, 2, 3, 6, 1, 2, 3])  # "1 2 3" (n=3) beats the later "2 3" (n=2)
    assert longer.propose(2) == [8, 9]
    assert PromptLookup([1, 2, 1, 2]).propose(0) == []
    with pytest.raises(ValueError):
        PromptLookup(min_n=3, max_n=2)


def test_incremental_index_equals_the_definition_on_random_text():
    rng = np.random.default_rng(0)
    for trial in range(30):
        seq = [int(t) for t in rng.integers(0, 6, 120)]
        index = PromptLookup(seq[:3])
        for i in range(3, len(seq)):
            index.extend([seq[i]])
            for k in (1, 4):
                assert index.propose(k) == brute_force(seq[:i + 1], k), (trial, i, k)


def test_lookup_in_the_loop_is_lossless_and_fires_on_repetitive_text(tiny_llama):
    """Greedy: retrieval drafts (the only useful ones here: the MTP stand-in is always wrong) raise tau and the output
    is plain greedy's. Sampling with retrieval drafts is covered by the chi-square test (test_speculative.py)."""
    target = checkpoints.load(str(tiny_llama[0]))
    session = Session(TorchBackend(target.model, kv_layout(target.config, 128)))
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 4  # the tiny model continues repetitive text repetitively
    params = SamplingParams()

    class NeverRight:  # an MTP stand-in that is always wrong: only retrieval can raise tau
        def begin(self, position, masks, n_cached):
            pass

        def step(self, token, hidden):
            from edge_spec.contract.backend import DraftStep
            return DraftStep(np.array([3]), np.array([0.0], dtype=np.float32), hidden)

    plain = generate_plain(session, prompt, max_new_tokens=40, params=params, rng=np.random.default_rng(5),
                           stop_ids=frozenset())
    out = generate_speculative(session, NeverRight(), prompt, max_new_tokens=40, params=params,
                               rng=np.random.default_rng(5), stop_ids=frozenset(), k=4, vocab_size=320, lookup=True)
    stats = out.extra["spec"]
    assert out.tokens == plain.tokens
    assert stats.lookup_passes > 0 and stats.lookup_accepted > 0 and stats.tau > 1.0


def test_datastore_in_the_loop_is_lossless(tiny_llama):
    """Greedy with a static datastore (edge_spec.decoding.datastore) as the second source: one that holds the
    target's own continuation raises tau, one of random text only costs passes; the output is plain greedy's either
    way. Sampling with datastore drafts: the chi-square test (test_speculative.py)."""
    from edge_spec.decoding.datastore import Datastore

    target = checkpoints.load(str(tiny_llama[0]))
    session = Session(TorchBackend(target.model, kv_layout(target.config, 128)))
    prompt = [5, 17, 42, 99, 7, 150, 3, 11]
    params = SamplingParams()
    plain = generate_plain(session, prompt, max_new_tokens=40, params=params, rng=np.random.default_rng(5),
                           stop_ids=frozenset())
    rng = np.random.default_rng(1)
    own = Datastore.build([prompt[-3:] + plain.tokens[:25], list(rng.integers(0, 320, 50))], vocab_size=320)
    shuffled = [[int(t) for t in rng.permutation(prompt + plain.tokens)] for _ in range(5)]  # same words, wrong order
    junk = Datastore.build(shuffled, vocab_size=320, min_n=1, min_share=0)
    for store, helps in ((own, True), (junk, False)):
        for adaptive in (False, True):
            out = generate_speculative(session, _never_right(), prompt, max_new_tokens=40, params=params,
                                       rng=np.random.default_rng(5), stop_ids=frozenset(), k=4, vocab_size=320,
                                       lookup=False, datastore=store, adaptive=adaptive)
            stats = out.extra["spec"]
            assert out.tokens == plain.tokens, (helps, adaptive)
            assert stats.lookup_passes == 0 and stats.datastore_passes > 0
            assert stats.to_dict()["datastore_passes"] == stats.datastore_passes
            # every pass without a retrieval draft asked the datastore once, and the time it took is counted
            assert stats.lookup_calls == 0 and stats.datastore_calls == stats.target_calls
            assert 0 < stats.datastore_s <= stats.drafter_s
            if helps and not adaptive:  # adaptive depth follows measured timings, so under load it may draft less
                assert stats.datastore_accepted >= 20 and stats.tau > 2.0 and "datastore passes" in stats.summary()
            elif helps:
                assert stats.datastore_accepted > 0 and "datastore passes" in stats.summary()


def _never_right():
    class NeverRight:  # an MTP stand-in that is always wrong
        def begin(self, position, masks, n_cached):
            pass

        def step(self, token, hidden):
            from edge_spec.contract.backend import DraftStep
            return DraftStep(np.array([3]), np.array([0.0], dtype=np.float32), hidden)

    return NeverRight()


def test_retrieval_alone_is_lossless_and_never_calls_the_drafter(tiny_llama):
    """drafter None (`eval-drafter --no-mtp`, Engine.generate(mtp=False)): prompt lookup alone drafts, a pass with no
    retrieval draft is a plain step; greedy output == plain greedy, at fixed and adaptive k."""
    target = checkpoints.load(str(tiny_llama[0]))
    session = Session(TorchBackend(target.model, kv_layout(target.config, 128)))
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 4
    params = SamplingParams()
    plain = generate_plain(session, prompt, max_new_tokens=40, params=params, rng=np.random.default_rng(5),
                           stop_ids=frozenset())
    for adaptive in (False, True):
        out = generate_speculative(session, None, prompt, max_new_tokens=40, params=params,
                                   rng=np.random.default_rng(5), stop_ids=frozenset(), k=4, vocab_size=320,
                                   lookup=True, adaptive=adaptive)
        stats = out.extra["spec"]
        assert out.tokens == plain.tokens, adaptive
        assert stats.drafter_calls == 0 and stats.lookup_passes > 0 and stats.tau > 1.0
        assert stats.target_calls > stats.lookup_passes  # the passes without a retrieval draft were plain steps
