"""Our Transformer loaded from HF folders == transformers' reference models (fp32, max abs diff <= 1e-4)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edge_spec.exporters.onnx_fused import FusedOps

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.torch import TorchBackend
from tests.tiny import gemma4_config, save_reference

TOL = 1e-4


def full_logits(loaded, ids: list[int]) -> np.ndarray:
    """One forward over all of `ids` from an empty cache -> [T, V]."""
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)), prefill_chunk=len(ids))
    return session.forward(ids).logits


def reference_logits(ref, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float().numpy()


def test_tiny_llama_matches_transformers(tiny_llama):
    folder, ref = tiny_llama
    loaded = checkpoints.load(str(folder))
    ids = list(np.random.default_rng(0).integers(0, 320, 24))
    assert np.abs(full_logits(loaded, ids) - reference_logits(ref, ids)).max() <= TOL


# (transformers itself cannot run kv sharing without per-layer inputs, so that variant turns sharing off)
GEMMA4_VARIANTS = {
    "alternating+kv-sharing+per-layer-inputs": {},
    "default-5:1-pattern-no-sharing": dict(layer_types=None, num_hidden_layers=7, num_kv_shared_layers=0),
    "kv-sharing-3+double-wide-mlp": dict(
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"], num_hidden_layers=6, num_kv_shared_layers=3,
        use_double_wide_mlp=True),
    "k-eq-v+global-kv-heads+no-ple": dict(attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=0,
                                           hidden_size_per_layer_input=0, final_logit_softcapping=None),
    "moe-block": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24),
}


@pytest.mark.parametrize("variant", sorted(GEMMA4_VARIANTS))
def test_tiny_gemma4_matches_transformers(variant, tmp_path):
    ref = save_reference(gemma4_config(**GEMMA4_VARIANTS[variant]), tmp_path, seed=1)
    loaded = checkpoints.load(str(tmp_path))
    ids = list(np.random.default_rng(1).integers(0, 320, 20))  # longer than the sliding window (6)
    ours, theirs = full_logits(loaded, ids), reference_logits(ref, ids)
    assert np.abs(ours - theirs).max() <= TOL
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_multimodal_gemma4_folder_loads_text_part(tmp_path):
    """A Gemma4ForConditionalGeneration-style folder: text weights under model.language_model., towers ignored."""
    ref = save_reference(gemma4_config(), tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()}
    renamed["model.vision_tower.patch.weight"] = torch.zeros(2, 2)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    text_cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text_cfg}))
    ids = [5, 9, 14, 7, 30, 2, 8]
    assert np.abs(full_logits(checkpoints.load(str(tmp_path)), ids) - reference_logits(ref, ids)).max() <= TOL


@pytest.mark.parametrize("family", ["llama", "gemma4"])
def test_fused_op_forms_give_the_same_logits_in_eager(family, tiny_llama, tiny_gemma4):
    """`FusedOps` (rope tables, packed projections, residual adds folded into the norms: what exports to
    onnxruntime's RotaryEmbedding / SkipSimplifiedLayerNormalization) computes the same sums in the same order as
    the eager `Ops`: bit-identical."""
    folder = (tiny_llama if family == "llama" else tiny_gemma4)[0]
    loaded = checkpoints.load(str(folder))
    model, t = loaded.model, 20
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 320, (1, t)))
    causal = torch.triu(torch.full((t, t), -1e9), 1)[None, None]  # [1, 1, T, 0 + T]: empty caches
    masks = {kind: causal for kind in set(loaded.config.layer_kinds)}
    empty = [torch.zeros(1, c.num_kv_heads, 0, c.head_dim) for c in kv_layout(loaded.config, 64).caches]
    with torch.no_grad():
        plain = model(ids, torch.arange(t)[None], masks, empty, empty).logits
        fused = model(ids, torch.arange(t)[None], masks, empty, empty, ops=FusedOps(model, 64)).logits
    assert fused.abs().max() > 0 and torch.equal(fused, plain)


@pytest.mark.parametrize("family", ["llama", "gemma4"])
def test_rope_from_tables_gives_the_same_logits_in_eager(family, tiny_llama, tiny_gemma4):
    """`TableRopeOps` (cos / sin gathered from per-position tables: the QNN graphs, where a computed angle would be a
    clipped activation) rotates exactly as the eager `Ops` computes it, at positions far from 0 too: bit-identical
    logits (its GELU is the spelled form, which `SPELLED_GELU` shares)."""
    from edge_spec.model.ops import SPELLED_GELU, TableRopeOps

    folder = (tiny_llama if family == "llama" else tiny_gemma4)[0]
    model = checkpoints.load(str(folder)).model
    t, start = 12, 40
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 320, (1, t)))
    causal = torch.triu(torch.full((t, t), -1e9), 1)[None, None]
    masks = {kind: causal for kind in set(model.cfg.layer_kinds)}
    empty = [torch.zeros(1, c.num_kv_heads, 0, c.head_dim) for c in kv_layout(model.cfg, 64).caches]
    positions = torch.arange(start, start + t)[None]
    with torch.no_grad():
        plain = model(ids, positions, masks, empty, empty, ops=SPELLED_GELU).logits
        tables = model(ids, positions, masks, empty, empty, ops=TableRopeOps(start + t)).logits
    assert tables.abs().max() > 0 and torch.equal(tables, plain)
