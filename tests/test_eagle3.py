"""EAGLE-3 drafters in Speculators' format: the maths in pure functions, the reader's refusals, and the oracle:
tiny random checkpoints built and saved by the `speculators` package itself, read back by edge-spec's reader (which
never imports speculators), run on the same inputs: draft logits within 1e-4 and the same draft tokens, for every
norm option of the format, llama and qwen3 layers, one and two layers, reduced and full draft vocabularies, and
chained draft steps through edge-spec's own KV cache against speculators' training-time-test steps."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch
from safetensors.torch import save_file

from edge_spec.errors import CheckpointError
from edge_spec.loading.speculators_eagle3 import (check_vocab_map, eagle3_config_from_dict, is_eagle3_folder,
                                                  load_eagle3)
from edge_spec.model.eagle3 import NEG, Eagle3Drafter, chain_mask, default_aux_layers, draft_to_target
from tests.prereq import skip_or_fail
from tests.tiny_eagle3 import HIDDEN, VOCAB, randomize, speculators_draft_logits, speculators_eagle3, vocab_map

TOL = 1e-4
# speculators 0.9 calls transformers 5.25's layers with the argument name transformers < 5.40 still takes
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")


# ---- pure functions, exact ----------------------------------------------------------------------------------------
def test_d2t_holds_offsets_from_draft_ids_to_target_ids():
    d2t = torch.tensor([0, 1, 1, 3])  # draft vocabulary = target ids 0, 2, 3, 6
    assert draft_to_target(torch.tensor([0, 1, 2, 3]), d2t).tolist() == [0, 2, 3, 6]
    assert draft_to_target(torch.tensor([[3, 1]]), d2t).tolist() == [[6, 2]]  # any shape
    assert draft_to_target(torch.tensor([5, 7]), None).tolist() == [5, 7]  # no map: the identity


def test_check_vocab_map_accepts_speculators_maps_and_refuses_broken_ones():
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[0, 2, 3, 6]] = True
    assert check_vocab_map(torch.tensor([0, 1, 1, 3]), t2d, 8).tolist() == [0, 2, 3, 6]
    with pytest.raises(CheckpointError, match="outside the target vocabulary"):
        check_vocab_map(torch.tensor([0, 1, 1, 5]), t2d, 8)  # 3 + 5 = 8
    with pytest.raises(CheckpointError, match="two draft ids to one target id"):
        check_vocab_map(torch.tensor([0, 1, 0, 3]), t2d, 8)  # 1 + 1 = 2 + 0
    with pytest.raises(CheckpointError, match="t2d does not mark exactly"):
        check_vocab_map(torch.tensor([0, 1, 1, 4]), t2d, 8)  # 7 where t2d says 6


def test_default_aux_layers_are_low_middle_high():
    assert default_aux_layers(30) == (2, 15, 27)
    assert default_aux_layers(8) == (2, 4, 5)


def test_chain_mask():
    m = chain_mask(visible=2, capacity=3, t=2)
    assert m.shape == (1, 1, 2, 5)
    want = [[0, 0, NEG, 0, NEG], [0, 0, NEG, 0, 0]]  # slot 2 not written yet; new rows causal
    assert torch.equal(m[0, 0], torch.tensor(want))


# ---- the reader's refusals (no speculators needed) -------------------------------------------------------------
def layer_dict(**overrides) -> dict:
    return {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, **overrides}


def config_dict(**overrides) -> dict:
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"], "draft_vocab_size": 128,
            "eagle_aux_hidden_state_layer_ids": [0, 1, 2], "norm_before_residual": True, "norm_before_fc": False,
            "fc_norm": False, "norm_output": False, "target_hidden_size": None, "embed_requires_grad": False,
            "speculators_config": {"algorithm": "eagle3"}, "transformer_layer_config": layer_dict(), **overrides}


def test_config_is_read():
    cfg = eagle3_config_from_dict(config_dict())
    assert (cfg.hidden_size, cfg.draft_vocab_size, cfg.target_vocab_size, cfg.num_aux) == (HIDDEN, 128, VOCAB, 3)
    assert cfg.aux_layer_ids == (0, 1, 2) and cfg.norm_before_residual and not cfg.qk_norm and cfg.mapped
    assert eagle3_config_from_dict(config_dict(eagle_aux_hidden_state_layer_ids=None)).aux_layer_ids is None
    qwen = layer_dict(model_type="qwen3")
    del qwen["head_dim"]
    cfg = eagle3_config_from_dict(config_dict(transformer_layer_config=qwen))
    assert cfg.qk_norm and cfg.layers.head_dims[0] == 128  # Qwen3Config's default head_dim, not hidden / heads


@pytest.mark.parametrize("overrides, match", [
    (dict(speculators_model_type="dflash"), "'dflash', not 'eagle3'"),
    (dict(norm_something_new=True), r"\['norm_something_new'\] are not part of"),
    (dict(norm_before_fc=True, fc_norm=True), "norm_before_fc and fc_norm are both set"),
    (dict(transformer_layer_config=layer_dict(model_type="mistral")), "model_type 'mistral' is not supported"),
    (dict(transformer_layer_config=layer_dict(layer_types=["sliding_attention"])), "sliding-window"),
    (dict(transformer_layer_config=layer_dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})),
     "unsupported RoPE type 'yarn'"),
    (dict(transformer_layer_config=layer_dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4})),
     "RoPE type 'proportional' is not supported"),
    (dict(transformer_layer_config=layer_dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5})),
     "partial_rotary_factor"),
    (dict(transformer_layer_config=layer_dict(hidden_act="gelu")), "hidden_act 'gelu'"),
    (dict(target_hidden_size=128), "target_hidden_size 128 != hidden_size 64"),
    (dict(draft_vocab_size=512), "draft_vocab_size 512"),
    (dict(eagle_aux_hidden_state_layer_ids=[1, 1, 2]), "must be distinct"),
])
def test_unsupported_options_are_refused_by_name_with_the_fix(overrides, match):
    with pytest.raises(CheckpointError, match=match) as err:
        eagle3_config_from_dict(config_dict(**overrides))
    assert err.value.fix


def save_own(folder, cfg_dict: dict, drop=(), replace: dict | None = None) -> Eagle3Drafter:
    """A checkpoint written by hand from our own module (random weights, a valid vocabulary map), with the tensors
    in `drop` left out and those in `replace` swapped in."""
    model = Eagle3Drafter(eagle3_config_from_dict(cfg_dict))
    randomize(model, 0)
    d2t, t2d = vocab_map(VOCAB, model.cfg.draft_vocab_size, 0)
    model.d2t.copy_(d2t)
    model.t2d.copy_(t2d)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k not in drop}
    save_file({**tensors, **(replace or {})}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg_dict))
    return model


def test_checkpoint_tensors_are_checked(tmp_path):
    save_own(tmp_path, config_dict())
    assert is_eagle3_folder(tmp_path) and not is_eagle3_folder(tmp_path / "nowhere")
    assert load_eagle3(tmp_path).cfg.mapped
    save_own(tmp_path, config_dict(), replace={"d2t": torch.zeros(128, dtype=torch.long)})  # not t2d's ids
    with pytest.raises(CheckpointError, match="t2d does not mark exactly"):
        load_eagle3(tmp_path)
    save_own(tmp_path, config_dict(), replace={"fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)})
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \(64, 128\), config.json implies \(64, 192\)"):
        load_eagle3(tmp_path)
    save_own(tmp_path, config_dict(), replace={"layers.0.self_attn.q_norm.weight": torch.ones(16)})
    with pytest.raises(CheckpointError, match="unexpected tensor 'layers.0.self_attn.q_norm.weight'"):
        load_eagle3(tmp_path)


def test_a_checkpoint_without_embeddings_takes_the_targets(tmp_path):
    """Speculators may leave embed_tokens to the verifier: the reader says so, and takes the target's when given."""
    model = save_own(tmp_path, config_dict(), drop=("embed_tokens.weight",))
    with pytest.raises(CheckpointError, match="embed_tokens") as err:
        load_eagle3(tmp_path)
    assert "target_embedding=" in err.value.fix
    ours = load_eagle3(tmp_path, target_embedding=model.embed_tokens.weight)
    assert torch.equal(ours.embed_tokens.weight, model.embed_tokens.weight)
    with pytest.raises(CheckpointError, match="pair the drafter"):
        load_eagle3(tmp_path, target_embedding=torch.zeros(VOCAB + 1, HIDDEN))


# ---- the oracle: speculators' own model -------------------------------------------------------------------------
ORACLE = ("the oracle is the `speculators` package: pip install --no-deps speculators hs-connectors; "
          "pip install loguru pydantic-settings datasets (docs/drafter.md)")

CASES = {  # name -> speculators_eagle3 kwargs
    "llama": dict(),
    "llama-norm_before_residual": dict(norm_before_residual=True),
    "llama-norm_before_fc": dict(norm_before_fc=True),
    "llama-fc_norm": dict(fc_norm=True),
    "llama-norm_output": dict(norm_output=True),
    "llama-all-2-layers": dict(norm_before_residual=True, fc_norm=True, norm_output=True, num_layers=2),
    "llama-full-vocab-4-aux": dict(draft_vocab=VOCAB, aux_layers=(0, 1, 2, 3)),
    "llama-llama3-rope": dict(rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8}),  # tiny: scaling reaches T=12 rows
    "qwen3": dict(layer="qwen3"),
    "qwen3-norm_before_residual": dict(layer="qwen3", norm_before_residual=True),
    "qwen3-norm_before_fc-norm_output": dict(layer="qwen3", norm_before_fc=True, norm_output=True),
    "qwen3-all-2-layers": dict(layer="qwen3", norm_before_residual=True, fc_norm=True, norm_output=True,
                               num_layers=2),
}
T, STEPS = 12, 3  # document length, speculators' training-time-test steps (step k: the k-th chained draft)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(speculators' model, ours read from its save_pretrained folder, aux [1, T, n H], input ids [1, T])."""
    if importlib.util.find_spec("speculators") is None:
        skip_or_fail(ORACLE)  # skips here; fails in CI, where the oracle must run
    folder = tmp_path_factory.mktemp(request.param)
    kwargs = CASES[request.param]
    ref = speculators_eagle3(folder, seed=len(request.param), **kwargs)
    ours = load_eagle3(folder)
    g = torch.Generator().manual_seed(7)
    aux = torch.randn(1, T, ours.cfg.num_aux * HIDDEN, generator=g)
    ids = torch.randint(0, VOCAB, (1, T), generator=g)
    return ref, ours, aux, ids


def prefill(ours, aux, ids, n):
    """Our rows 0..n-1 (positions 1..n, as speculators numbers them) on empty caches -> output, caches."""
    k, v = ours.empty_caches(0)
    with torch.no_grad():
        out = ours(ours.fuse(aux[:, :n]), ids[:, :n], 1 + torch.arange(n)[None], chain_mask(0, 0, n), k, v)
    return out, out.new_k, out.new_v


def test_config_and_vocabulary_map_match(pair):
    ref, ours, _, _ = pair
    c = ref.config
    assert ours.cfg.draft_vocab_size == c.draft_vocab_size and ours.cfg.target_vocab_size == ref.verifier_vocab_size
    assert len(ours.layers) == c.transformer_layer_config.num_hidden_layers
    for option in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert getattr(ours.cfg, option) == getattr(c, option), option
    if ref.use_draft_vocab:
        assert torch.equal(ours.d2t, ref.d2t) and torch.equal(ours.t2d, ref.t2d)
        draft = torch.arange(c.draft_vocab_size)
        assert torch.equal(ours.target_ids(draft), ref.t2d.nonzero().flatten())  # d + d2t[d]: t2d's ids in order
    else:
        assert ours.d2t is None and ref.d2t is None


def test_first_draft_step_matches_speculators(pair):
    """Every row of a document at once (causal over our cache): logits within 1e-4, the same argmax drafts."""
    ref, ours, aux, ids = pair
    logits, tokens = speculators_draft_logits(ref, aux, ids, ttt_steps=1)
    out, _, _ = prefill(ours, aux, ids, T)
    assert (out.logits - logits[0]).abs().max() < TOL
    assert torch.equal(out.logits.argmax(-1), tokens[0])


@pytest.mark.parametrize("q", [0, 5, T - STEPS])
def test_chained_draft_steps_through_our_cache_match_speculators(pair, q):
    """Speculators' training-time-test step k at row q attends to rows 0..q of step 0 and to row q of steps 1..k:
    what our loop does when it drafts k tokens after row q, one row at a time through its own cache, chaining
    the previous step's hidden (teacher-forced with the document's tokens, as speculators is)."""
    ref, ours, aux, ids = pair
    logits, tokens = speculators_draft_logits(ref, aux, ids, ttt_steps=STEPS)
    out, ks, vs = prefill(ours, aux, ids, q + 1)
    assert (out.logits[0, q] - logits[0][0, q]).abs().max() < TOL
    hidden = out.hidden[:, q:q + 1]  # [1, 1, H]
    for step in range(1, STEPS):
        n = ks[0].shape[2]
        with torch.no_grad():
            out = ours(hidden, ids[:, q + step:q + step + 1], torch.tensor([[1 + q + step]]), chain_mask(n, n, 1),
                       ks, vs)
        assert (out.logits[0, 0] - logits[step][0, q]).abs().max() < TOL, step
        assert int(out.logits[0, 0].argmax()) == int(tokens[step][0, q]), step
        ks = [torch.cat([k, new], dim=2) for k, new in zip(ks, out.new_k)]
        vs = [torch.cat([v, new], dim=2) for v, new in zip(vs, out.new_v)]
        hidden = out.hidden


def test_a_flipped_norm_option_is_seen(pair):
    """Negative control: the same weights read with a norm option flipped are far from speculators' logits (so the
    tests above pin each option down). norm_output only changes what chains, so it is checked on a chained step."""
    ref, ours, aux, ids = pair
    logits, _ = speculators_draft_logits(ref, aux, ids, ttt_steps=2)
    for option in ("norm_before_residual", "norm_output", "fc_norm" if not ours.cfg.norm_before_fc else None):
        if option is None:
            continue
        flipped = Eagle3Drafter(dataclasses.replace(ours.cfg, **{option: not getattr(ours.cfg, option)}))
        flipped.load_state_dict(ours.state_dict(), strict=False)  # fc_norm's weights: kept, or ones when added
        out, ks, vs = prefill(flipped, aux, ids, 1)
        with torch.no_grad():
            out = flipped(out.hidden, ids[:, 1:2], torch.tensor([[2]]), chain_mask(1, 1, 1), ks, vs)
        assert (out.logits[0, 0] - logits[1][0, 0]).abs().max() > 1e-2, option
