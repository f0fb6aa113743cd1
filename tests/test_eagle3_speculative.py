"""EAGLE-3 drafting in the eager speculative loop: the target's aux states, the drafter's own cache kept in step with
the target's commits and rewinds, greedy speculative == plain greedy token for token, and sampling that keeps the
target's distribution (the chi-square test of tests/test_speculative.py). A tiny random llama target (tests/tiny.py)
and a tiny random eagle3 drafter of edge-spec's own module (no speculators needed: test_eagle3.py ties the module to
speculators' model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import accept_all, generate_speculative, verify
from edge_spec.loading import checkpoints
from edge_spec.loading.speculators_eagle3 import eagle3_config_from_dict
from edge_spec.model.eagle3 import Eagle3Drafter, chain_mask
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.runtimes.torch_eagle3 import AuxTarget, TorchEagle3Drafter, eagle3_pair
from tests.test_speculative import DIST_PROMPT, SAMPLING, chi_square_p, exact_joint_of_tokens_2_and_3
from tests.tiny_eagle3 import randomize, vocab_map

AUX = (0, 1, 3)  # tiny llama has 3 layers: 3 is the stream leaving the last one


def drafter_for(target, seed: int = 0, draft_vocab: int = 160, **options) -> Eagle3Drafter:
    c = target.config
    layer = {"model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": 128,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab, "transformer_layer_config": layer,
           "eagle_aux_hidden_state_layer_ids": list(AUX), **options}
    model = Eagle3Drafter(eagle3_config_from_dict(cfg))
    randomize(model, seed)
    if model.cfg.mapped:
        d2t, t2d = vocab_map(c.vocab_size, draft_vocab, seed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    return model.eval()


@pytest.fixture(scope="module")
def target(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


def test_target_returns_the_residual_stream_entering_the_aux_layers(target, tiny_llama):
    """ModelOutput.aux == transformers' hidden_states[i] (the stream entering layer i) for i < L; id L is the stream
    leaving the last layer before the final norm (transformers' last entry is after it). Logits unchanged."""
    model, ref = target.model, tiny_llama[1]
    ids = torch.tensor([[5, 17, 42, 99, 7, 150, 3]])
    t = ids.shape[1]
    masks = {"full": chain_mask(0, 0, t)}  # causal, no cache
    k, v = ([torch.zeros(s.shape)[:, :, :0] for s in kv_layout(target.config, 16).caches] for _ in range(2))
    with torch.no_grad():
        plain = model(ids, torch.arange(t)[None], masks, k, v)
        out = model(ids, torch.arange(t)[None], masks, k, v, aux_layers=(2, 0, 3))
        theirs = ref(ids, output_hidden_states=True).hidden_states
    assert plain.aux is None and torch.equal(out.logits, plain.logits)
    h = target.config.hidden_size
    assert out.aux.shape == (1, t, 3 * h)
    for j, i in enumerate((2, 0)):
        assert (out.aux[..., j * h:(j + 1) * h] - theirs[i]).abs().max() < 1e-5
    normed = model.model.norm(out.aux[..., 2 * h:])
    assert (normed - theirs[3]).abs().max() < 1e-5


def fresh_rows(drafter: Eagle3Drafter, aux_target: AuxTarget, n: int):
    """The drafter's rows 1..n computed at once from the target's recorded states: (k, v) per layer [1, H_kv, n, D]."""
    ids = torch.from_numpy(aux_target.ids[1:n + 1])[None]
    k, v = drafter.empty_caches(0)
    with torch.no_grad():
        out = drafter(drafter.fuse(aux_target.aux[:n][None]), ids, torch.arange(1, n + 1)[None], chain_mask(0, 0, n),
                      k, v)
    return out.new_k, out.new_v


class CheckedDrafter(TorchEagle3Drafter):
    """At each burst's start, the committed rows equal rows recomputed from scratch from the target's states."""

    checks = 0

    def begin(self, position, masks, n_cached):
        super().begin(position, masks, n_cached)
        c = self.committed
        if c:
            ks, vs = fresh_rows(self.drafter, self.aux_target, c)
            for k, v, fk, fv in zip(self.k, self.v, ks, vs):
                assert (k[:, :, :c] - fk).abs().max() < 1e-4 and (v[:, :, :c] - fv).abs().max() < 1e-4
            self.checks += 1


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_plain(target, k):
    drafter = drafter_for(target, seed=k, norm_before_residual=True)
    backend, _ = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    runner = CheckedDrafter(drafter, backend)
    session = Session(backend)
    for seed in range(2):  # a second prompt: the drafter's rows of the first are dropped (they disagree)
        prompt = [int(i) for i in np.random.default_rng(seed).integers(4, 320, 12)]
        expected = generate_plain(session, prompt, max_new_tokens=40, params=SamplingParams(),
                                  rng=np.random.default_rng(0), stop_ids=frozenset()).tokens
        out = generate_speculative(session, runner, prompt, max_new_tokens=40, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                   vocab_size=target.config.vocab_size)
        assert out.tokens == expected
        assert out.extra["spec"].drafter_calls > 0
    assert runner.checks > 10


def test_a_new_prompt_differing_only_in_its_first_token_drops_the_committed_rows(target):
    """Row p reads the target's aux states at p - 1, which depend on token 0 as on every later one: after a prompt
    that differs from the previous one only in its first token, no committed row may survive (CheckedDrafter
    recomputes them; keeping them drafted from the old text's states)."""
    drafter = drafter_for(target, seed=2)
    backend, _ = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    runner = CheckedDrafter(drafter, backend)
    session = Session(backend)
    rest = [int(i) for i in np.random.default_rng(5).integers(4, 320, 12)]
    for first in (5, 9):
        prompt = [first] + rest
        expected = generate_plain(session, prompt, max_new_tokens=12, params=SamplingParams(),
                                  rng=np.random.default_rng(0), stop_ids=frozenset()).tokens
        out = generate_speculative(session, runner, prompt, max_new_tokens=12, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset(), k=3,
                                   vocab_size=target.config.vocab_size)
        assert out.tokens == expected
    assert runner.checks > 2


def test_accepted_drafts_are_recomputed_from_the_targets_states(target):
    """A verifier that accepts every draft (wrong on purpose: only the bookkeeping is under test) commits k + 1
    positions per pass; the drafter's next burst rebuilds those rows from the target's states, not its chain."""
    drafter = drafter_for(target, seed=1, fc_norm=True, norm_output=True)
    backend, _ = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    runner = CheckedDrafter(drafter, backend)
    out = generate_speculative(Session(backend), runner, DIST_PROMPT, max_new_tokens=30, params=SamplingParams(0.8),
                               rng=np.random.default_rng(0), stop_ids=frozenset(), k=4,
                               vocab_size=target.config.vocab_size, verifier=accept_all)
    assert out.extra["spec"].accepted.sum() > 10 and runner.checks >= 5


def test_a_target_without_aux_states_is_refused(target):
    from edge_spec.errors import ConfigError

    with pytest.raises(ConfigError, match="AuxTarget"):
        TorchEagle3Drafter(drafter_for(target), TorchBackend(target.model, kv_layout(target.config, 32)))
    with pytest.raises(ConfigError, match="outside the target's layers"):
        AuxTarget(target.model, (0, 4), 32)
    backend = TorchBackend(AuxTarget(target.model, (0, 1, 2), 32), kv_layout(target.config, 32))
    with pytest.raises(ConfigError, match=r"records aux layers \(0, 1, 2\), the drafter reads \(0, 1, 3\)"):
        TorchEagle3Drafter(drafter_for(target), backend)


def test_sampling_keeps_the_target_distribution(target):
    drafter = drafter_for(target, seed=3, norm_before_residual=True)
    backend, runner = eagle3_pair(target.model, drafter, kv_layout(target.config, 64))
    session = Session(backend)
    joint = exact_joint_of_tokens_2_and_3(Session(TorchBackend(target.model, kv_layout(target.config, 64))))
    rng = np.random.default_rng(1234)
    samples = []
    for _ in range(1500):
        out = generate_speculative(session, runner, DIST_PROMPT, max_new_tokens=3, params=SAMPLING, rng=rng,
                                   stop_ids=frozenset(), k=2, vocab_size=target.config.vocab_size, verifier=verify)
        samples.append((out.tokens[1], out.tokens[2]))
    assert chi_square_p(samples, joint) > 0.01
