"""Speculative decoding: hand-built verify cases, greedy exactness, and a distribution test with a negative control."""

from collections import Counter
from itertools import product

import numpy as np
import pytest
from scipy.stats import chisquare

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import DraftStep, Session
from edge_spec.contract.layout import kv_layout
from edge_spec.model.drafter import check_pair, new_drafter
from edge_spec.errors import ConfigError
from edge_spec.decoding.generate import generate_plain
from edge_spec.runtimes.torch import TorchBackend, TorchDrafter
from edge_spec.decoding.sampling import SamplingParams, token_probs
from edge_spec.decoding.speculative import (CostModel, LazyRows, SparseRows, accept_all, draft_distribution, generate_speculative,
                                   sparse_draft_distribution, verify, verify_greedy)


class Uniforms:
    """A stand-in rng that returns fixed uniforms, in order."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


P = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])  # target, [k + 1, V]
Q = np.array([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0]])  # drafter, [k, V]


def test_verify_rejection_samples_from_the_residual():
    # draft 1: p/q = 0.2/0.5 = 0.4 > u=0.3 -> accept; draft 2: 0.25/1.0 < u=0.5 -> reject;
    # residual max(0, p - q) = [.25, .25, 0, .25] -> cdf [1/3, 2/3, 2/3, 1]; u=0.5 -> token 1
    assert verify([1, 2], Q, P, Uniforms(0.3, 0.5, 0.5)) == (1, 1)


def test_verify_all_accepted_samples_the_bonus_from_the_target():
    # both accepted (u=0.1 < 0.4 and < 0.25); bonus from P[2]: cdf [.7, .8, .9, 1]; u=0.75 -> token 1
    assert verify([1, 2], Q, P, Uniforms(0.1, 0.1, 0.75)) == (2, 1)


def test_verify_first_draft_rejected():
    # draft 0 is token 2: p/q = 0.3/0.5 = 0.6 < u=0.9 -> reject at once; residual [.1, 0, 0, .4] -> [.2, 0, 0, .8]
    assert verify([2, 2], Q, P, Uniforms(0.9, 0.1)) == (0, 0)
    assert verify([2, 2], Q, P, Uniforms(0.9, 0.3)) == (0, 3)


def test_verify_greedy_is_the_one_hot_case():
    logits_t = np.array([[0.0, 5.0, 1.0], [2.0, 0.0, 9.0], [0.0, 0.0, 1.0]])
    target = token_probs(logits_t, SamplingParams(0.0))
    drafts_ok = token_probs(np.array([[0, 9, 0], [0, 0, 9.0]]), SamplingParams(0.0))
    for u in (0.0, 0.5, 0.999):  # the uniforms cannot change a greedy outcome
        assert verify([1, 2], drafts_ok, target, Uniforms(u, u, u)) == (2, 2)
        assert verify([1, 0], drafts_ok[[0, 0]] * 0 + np.eye(3)[[1, 0]], target, Uniforms(u, u, u)) == (1, 2)


def test_verify_greedy_equals_verify_on_one_hot_rows():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(0, 5))
        logits = rng.integers(0, 4, (k + 1, 6)).astype(np.float32)  # small integers: many ties
        target = token_probs(logits, SamplingParams(0.0))
        drafts = [int(x) if rng.random() < 0.7 else int(rng.integers(0, 6)) for x in logits.argmax(-1)[:k]]
        one_hot = np.eye(6)[drafts] if k else np.zeros((0, 6))
        assert verify_greedy(drafts, logits.argmax(-1)) == verify(drafts, one_hot, target, Uniforms(*[0.5] * 9))


@pytest.mark.parametrize("params", [SamplingParams(0.7), SamplingParams(1.0, top_k=3), SamplingParams(0.9, top_p=0.8),
                                    SamplingParams(0.0)])
def test_sparse_and_lazy_rows_index_like_the_dense_arrays(params):
    rng = np.random.default_rng(1)
    vocab, sparse, dense = 40, SparseRows(40), []
    for _ in range(3):
        ids = rng.choice(vocab, 9, replace=False)  # candidates in the drafter's (unsorted) order
        step = DraftStep(ids, rng.integers(-3, 3, 9).astype(np.float32), np.zeros(4, np.float32))  # with ties
        dense.append(draft_distribution(step, vocab, params))
        sparse.append(*sparse_draft_distribution(step, params))
    logits = rng.normal(size=(4, vocab)).astype(np.float32)
    lazy, full = LazyRows(logits, params), token_probs(logits, params)
    for i in range(3):
        np.testing.assert_allclose(sparse[i], dense[i], atol=1e-12)
        np.testing.assert_allclose(lazy[i], full[i], atol=1e-12)
        for x in range(vocab):
            assert sparse[i, x] == pytest.approx(dense[i][x], abs=1e-12)
            assert lazy[i, x] == pytest.approx(full[i][x], abs=1e-12)
    assert set(lazy.rows) == {0, 1, 2}  # row 3 was never asked for, so never computed


def test_cost_model_prefers_plain_decoding_for_a_useless_drafter():
    model = CostModel(k_max=4)
    assert model.choose() == 0  # measure a plain step first
    model.observe_verify(1, 0.010)
    assert model.choose() == 4  # then a full burst
    model.observe_verify(5, 0.014)
    model.observe_draft(0.002)
    for _ in range(20):
        model.observe_acceptance(4, 0)
    assert model.choose() == 0
    for _ in range(40):
        model.observe_acceptance(4, 4)
    assert model.choose() == 4
    assert model.expected_tokens(4) == pytest.approx(5.0, abs=0.01)


def test_cost_model_prices_retrieval_apart_from_the_drafter():
    """Retrieval bursts (copied spans, accepted whole) keep their full length while the drafter's acceptance is
    poor; with one k for both (the previous model) they were cut to the drafter's length."""
    model = CostModel(k_max=4)
    model.observe_verify(1, 0.010)
    model.observe_verify(5, 0.016)
    model.observe_draft(0.003)
    for _ in range(20):
        model.observe_acceptance(4, 0)  # the drafter: rejected at once
        model.observe_acceptance(4, 4, lookup=True)  # retrieval: accepted whole
    assert model.choose(lookup=True) == 4
    assert model.choose() == 0
    assert model.expected_tokens(4, lookup=True) == pytest.approx(5.0, abs=0.02)
    assert model.expected_tokens(4) == pytest.approx(1.0, abs=0.02)


def test_cost_model_probes_one_position_past_the_chosen_k():
    """A position beyond the chosen k is never reached, so every probe_every passes one more is drafted; when
    it is accepted the choice moves up."""
    model = CostModel(k_max=4, probe_every=3)
    model.observe_verify(1, 0.010)
    model.observe_verify(5, 0.030)  # long passes are dear: 1 draft is best at this acceptance
    model.observe_draft(0.001)
    model.accept[:] = [0.9, 0.3, 0.3, 0.3]
    picks = [model.choose() for _ in range(8)]
    assert picks == [1, 1, 1, 2, 1, 1, 1, 2]
    for _ in range(30):  # the probes find position 2 (and on) accepted
        model.observe_acceptance(4, 4)
    assert model.choose() == 4


# ---- greedy exactness on the real SmolLM2 ----------------------------------------------------------
class ScriptedDrafter:
    """Proposes a known continuation with every third token wrong: exercises accepts and rejects."""

    def __init__(self, continuation, vocab, prompt_len):
        self.continuation, self.vocab, self.prompt_len = continuation, vocab, prompt_len

    def begin(self, position, masks, n_cached):
        self.position, self.offset = position, 0  # `position` holds continuation[position - prompt_len]

    def step(self, token, hidden):
        self.offset += 1
        i = self.position + self.offset - self.prompt_len  # index of the token this step proposes
        tok = self.continuation[i] if 0 <= i < len(self.continuation) else 0
        if (self.position + self.offset) % 3 == 0:
            tok = (tok + 1) % self.vocab
        return DraftStep(np.array([tok]), np.array([1.0], dtype=np.float32), hidden)


PROMPTS = [("Write a haiku about the sea.", True), ("import numpy as np\n\ndef softmax(x):\n", False)]


EAGER_TIE = 1e-3  # eager torch's verify rows differ from its decode steps by ~5e-5 in SmolLM2's logits (README)


def plain_margins(session: Session, ids: list[int], tokens: list[int]) -> np.ndarray:
    """Top-1 minus top-2 logit at each plain greedy step, from one pass over prompt + output: [len(tokens)]."""
    session.reset()
    logits = session.forward(ids + tokens[:-1]).logits[len(ids) - 1:]  # [n, V]: the rows that chose `tokens`
    session.reset()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


@pytest.fixture(scope="module")
def smollm2_plain(smollm2):
    backend = TorchBackend(smollm2.model, kv_layout(smollm2.config, 512))
    session = Session(backend)
    plain = {}
    for prompt, chat in PROMPTS:
        ids = smollm2.tokenizer.encode_prompt(prompt, chat=chat)
        plain[prompt] = (ids, generate_plain(session, ids, max_new_tokens=32, params=SamplingParams(),
                                             rng=np.random.default_rng(0), stop_ids=frozenset()).tokens)
    return backend, session, plain


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_smollm2_eager_speculative_follows_plain_until_a_near_tie(smollm2, smollm2_plain, k, adaptive):
    """What eager torch guarantees: its GEMMs block rows by their count, so a verify row is not bit-identical to a
    decode step (the host check turns speculation off on it). Its speculative loop must still emit plain greedy's
    tokens wherever plain's top-2 margin is larger than that noise: equal up to the first near-tie (margin <
    EAGER_TIE), and the loop's own bookkeeping (rejections, rewinds) must not change anything before it."""
    backend, session, plain = smollm2_plain
    drafter = new_drafter(smollm2.config, seed=k, hidden_size=128, num_layers=2, intermediate_size=256,
                          num_centroids=1024, top_k_clusters=8)
    runner = TorchDrafter(drafter, backend, check_pair(smollm2.config, drafter.cfg))
    for prompt, (ids, expected) in plain.items():
        margins = plain_margins(session, ids, expected)
        ties = np.flatnonzero(margins < EAGER_TIE)
        sure = int(ties[0]) if ties.size else len(expected)  # tokens before the first near-tie
        assert sure >= 8, f"{prompt!r}: plain greedy has a near-tie at step {sure}; pick a prompt without one"
        out = generate_speculative(session, runner, ids, max_new_tokens=32, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                   vocab_size=smollm2.config.vocab_size, adaptive=adaptive, min_confidence=0.05)
        assert out.tokens[:sure] == expected[:sure], prompt


@pytest.mark.parametrize("k", [2, 5])
def test_smollm2_exact_when_drafts_are_mostly_right(smollm2, smollm2_plain, k):
    backend, session, plain = smollm2_plain
    for prompt, (ids, expected) in plain.items():
        drafter = ScriptedDrafter(expected, smollm2.config.vocab_size, len(ids))
        out = generate_speculative(session, drafter, ids, max_new_tokens=32, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                   vocab_size=smollm2.config.vocab_size)
        stats = out.extra["spec"]
        ties = np.flatnonzero(plain_margins(session, ids, expected) < EAGER_TIE)  # eager: see the test above
        sure = int(ties[0]) if ties.size else len(expected)
        assert out.tokens[:sure] == expected[:sure], prompt
        assert stats.accepted.sum() > 0 and stats.accepted.sum() < stats.drafted.sum()  # both paths ran
        assert stats.tau > 1.5


def test_eos_inside_a_draft_and_budget_mid_draft(smollm2, smollm2_plain):
    backend, session, plain = smollm2_plain
    ids, expected = next(iter(plain.values()))
    drafter = ScriptedDrafter(expected, smollm2.config.vocab_size, len(ids))
    stop = frozenset({expected[6]})  # pretend the 7th greedy token is EOS
    out = generate_speculative(session, drafter, ids, max_new_tokens=32, params=SamplingParams(),
                               rng=np.random.default_rng(0), stop_ids=stop, k=4, vocab_size=smollm2.config.vocab_size)
    assert out.tokens == expected[:7] and out.stop_reason == "eos"
    for budget in (1, 2, 9):
        out = generate_speculative(session, drafter, ids, max_new_tokens=budget, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset(), k=8,
                                   vocab_size=smollm2.config.vocab_size)
        assert out.tokens == expected[:budget] and out.stop_reason == "length"


def test_bad_spec_arguments(smollm2, smollm2_plain):
    backend, session, plain = smollm2_plain
    ids, _ = next(iter(plain.values()))
    for k in (0, -1, 2.5):
        with pytest.raises(ConfigError, match="spec_k"):
            generate_speculative(session, None, ids, max_new_tokens=4, params=SamplingParams(),
                                 rng=np.random.default_rng(0), stop_ids=frozenset(), k=k, vocab_size=1)


# ---- tiny Gemma-4 target + assistant -----------------------------------------------------------------
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_tiny_gemma4_speculative_greedy_equals_plain(tiny_gemma4, k, adaptive):
    target = checkpoints.load(str(tiny_gemma4[0]))
    drafter = new_drafter(target.config, seed=1, hidden_size=32, num_layers=3, intermediate_size=64,
                          num_centroids=16, top_k_clusters=4)
    backend = TorchBackend(target.model, kv_layout(target.config, 128))
    session = Session(backend)
    prompt = [int(i) for i in np.random.default_rng(k).integers(4, 320, 12)]
    expected = generate_plain(session, prompt, max_new_tokens=40, params=SamplingParams(),
                              rng=np.random.default_rng(0), stop_ids=frozenset()).tokens
    out = generate_speculative(session, TorchDrafter(drafter, backend, check_pair(target.config, drafter.cfg)), prompt,
                               max_new_tokens=40, params=SamplingParams(), rng=np.random.default_rng(0),
                               stop_ids=frozenset(), k=k, vocab_size=target.config.vocab_size, adaptive=adaptive)
    assert out.tokens == expected


# ---- sampling: same distribution as the target (chi-square, alpha = 0.01), with a negative control ----
SAMPLING = SamplingParams(temperature=1.0, top_k=6, top_p=0.95)
DIST_PROMPT = [5, 17, 42, 99, 7, 150]




def exact_joint_of_tokens_2_and_3(session: Session) -> dict[tuple[int, int], float]:
    """P(t2, t3) = sum_t1 P(t1) P(t2 | t1) P(t3 | t1, t2), enumerated exactly with the target."""
    def probs(ids):
        session.reset()
        return token_probs(session.forward(ids, last_only=True).logits[-1], SAMPLING)

    joint: Counter = Counter()
    p1 = probs(DIST_PROMPT)
    for t1 in np.flatnonzero(p1):
        p2 = probs(DIST_PROMPT + [int(t1)])
        for t2 in np.flatnonzero(p2):
            p3 = probs(DIST_PROMPT + [int(t1), int(t2)])
            for t3 in np.flatnonzero(p3):
                joint[(int(t2), int(t3))] += p1[t1] * p2[t2] * p3[t3]
    return joint


def chi_square_p(samples: list[tuple[int, int]], joint: dict) -> float:
    """Goodness of fit of the samples to the exact joint; 0 if any sample lies outside the target's support."""
    if any(c not in joint for c in samples):
        return 0.0
    n = len(samples)
    counts = Counter(samples)
    cells = sorted(joint, key=lambda c: -joint[c])
    big = [c for c in cells if joint[c] * n >= 5]
    small = [c for c in cells if joint[c] * n < 5]
    observed = [counts[c] for c in big] + [sum(counts[c] for c in small)]
    expected = [joint[c] * n for c in big] + [sum(joint[c] for c in small) * n]
    assert sum(observed) == n  # every sample lies in the target's support
    return chisquare(observed, expected).pvalue


class SkewedTargetDrafter:
    """Drafts from the target's own support with skewed frequencies (70% on its lowest id).

    A close-but-wrong drafter: within the support, so only frequencies can expose a wrong verifier."""

    def __init__(self, session: Session, prompt):
        self.session, self.history = session, list(prompt)

    def on_token(self, token):
        self.history.append(token)

    def begin(self, position, masks, n_cached):
        self.context = self.history[:position + 1]

    def step(self, token, hidden):
        if len(self.context) and self.context[-1] != token:
            self.context.append(token)
        self.session.reset()
        p = token_probs(self.session.forward(self.context, last_only=True).logits[-1], SAMPLING)
        support = np.flatnonzero(p)
        q = np.full(len(support), 0.3 / max(len(support) - 1, 1))
        q[0] = 0.7
        return DraftStep(support, np.log(q).astype(np.float32), hidden)


@pytest.fixture(scope="module")
def sampling_setup(tiny_llama):
    target = checkpoints.load(str(tiny_llama[0]))
    backend = TorchBackend(target.model, kv_layout(target.config, 64))
    session = Session(backend)
    drafter = new_drafter(target.config, seed=3, hidden_size=32, num_layers=1, intermediate_size=64,
                          num_centroids=16, top_k_clusters=8)
    runner = TorchDrafter(drafter, backend, check_pair(target.config, drafter.cfg))
    oracle = Session(TorchBackend(target.model, kv_layout(target.config, 64)))
    return target, session, runner, exact_joint_of_tokens_2_and_3(oracle), oracle


class ForcedLookup:
    """A retrieval drafter that always proposes the same two tokens: the likeliest t2 and t3 (after the likeliest
    t1), so its one-hot drafts are accepted often enough for a wrong verifier to show."""

    def __init__(self, oracle: Session):
        def best(ids):
            oracle.reset()
            return int(token_probs(oracle.forward(ids, last_only=True).logits[-1], SAMPLING).argmax())

        t1 = best(DIST_PROMPT)
        t2 = best(DIST_PROMPT + [t1])
        self.t1, self.drafts = t1, [t2, best(DIST_PROMPT + [t1, t2])]

    def extend(self, tokens):
        pass

    def propose(self, k):
        return self.drafts[:k]


def spec_samples(setup, verifier, drafter="mtp", n=1500):
    """`drafter`: "mtp" (the tiny MTP drafter), "skewed" (SkewedTargetDrafter), "lookup" (one-hot retrieval drafts
    on every burst, `ForcedLookup`), "datastore" (a datastore of the likeliest t1 t2 t3: drafts when t1 matches)."""
    from edge_spec.decoding.datastore import Datastore

    target, session, runner, _, oracle = setup
    rng = np.random.default_rng(1234)
    forced = ForcedLookup(oracle) if drafter in ("lookup", "datastore") else False
    store = None
    if drafter == "datastore":
        store = Datastore.build([DIST_PROMPT[-2:] + [forced.t1] + forced.drafts], vocab_size=target.config.vocab_size,
                                min_n=1, min_share=0)
        forced = False
    out, lookups, stored = [], 0, 0
    for _ in range(n):
        skewed = SkewedTargetDrafter(oracle, DIST_PROMPT) if drafter == "skewed" else None
        result = generate_speculative(session, skewed or runner, DIST_PROMPT, max_new_tokens=3, params=SAMPLING,
                                      rng=rng, stop_ids=frozenset(), k=2, vocab_size=target.config.vocab_size,
                                      verifier=verifier, on_token=skewed.on_token if skewed else None, lookup=forced,
                                      datastore=store)
        out.append((result.tokens[1], result.tokens[2]))
        lookups += result.extra["spec"].lookup_passes
        stored += result.extra["spec"].datastore_passes
    assert (lookups == n) == (drafter == "lookup")  # retrieval drafted every first burst
    assert (stored > n // 10) == (drafter == "datastore")
    return out


@pytest.mark.parametrize("drafter", ["mtp", "skewed", "lookup", "datastore"])
def test_speculative_sampling_matches_the_target_distribution(sampling_setup, drafter):
    assert chi_square_p(spec_samples(sampling_setup, verify, drafter), sampling_setup[3]) > 0.01


@pytest.mark.parametrize("drafter", ["skewed", "lookup"])
def test_negative_control_always_accept_fails_the_same_test(sampling_setup, drafter):
    samples = spec_samples(sampling_setup, accept_all, drafter)
    assert all(c in sampling_setup[3] for c in samples)  # same support: only the frequencies can expose it
    assert chi_square_p(samples, sampling_setup[3]) < 0.01
