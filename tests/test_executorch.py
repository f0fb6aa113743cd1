"""ExecuTorch export + runtime: one .pte, target and drafter methods sharing the KV buffers (the `state` binding).
What only this format has: the program's manifest, its methods, 8da4w. Parity with eager, verify rows == decode
steps, speculative == plain, rejected drafts written into the state, wrong drafters, damaged programs and the CLI
are tests/test_contract.py's, over every format.

Tiny random checkpoints (tests/tiny.py); the fp32 .pte bundles come from the session's factory (tests/contract.py,
shared with the contract suite, the native runner's and the apps' tests; a tiny export takes ~1 min: most of it
XNNPACK's lowering of each delegated partition).
"""

import json

import numpy as np
import pytest

from edge_spec.contract import kv
from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.errors import BundleError
from edge_spec.exporters.executorch import DRAFTER_METHOD, PROGRAM_FILE, TARGET_METHOD, export_bundle
from edge_spec.contract.manifest import MANIFEST, read_manifest
from edge_spec.runtimes.torch import TorchBackend
from tests.parity import assert_drafter_matches_eager, prompt_ids


@pytest.fixture(scope="module")
def llama(tiny_llama_pte_pair):
    """Tiny llama + a clustered drafter scoring with the target's (tied) table (tests/conftest.py, shared)."""
    return tiny_llama_pte_pair


@pytest.fixture(scope="module")
def gemma(tiny_gemma4_pte_pair):
    """Tiny Gemma-4 (sliding rings of 6 + 9 = 15 slots, KV sharing) + a dense-head drafter (tests/conftest.py)."""
    return tiny_gemma4_pte_pair


# ---- the bundle --------------------------------------------------------------------------------------
def test_manifest_records_one_program_with_two_methods_and_state_rings(llama, gemma):
    m = read_manifest(llama[0])
    assert (m.format, m.binding, m.layout.binding, m.precision) == ("executorch", "state", "state", "fp32")
    assert {g.file for g in m.graphs.values()} == {PROGRAM_FILE}
    assert (m.graphs["target"].method, m.graphs["drafter"].method) == (TARGET_METHOD, DRAFTER_METHOD)
    assert [t.name for t in m.graphs["target"].io.inputs] == ["input_ids", "position_ids", "mask.full", "logit_rows"]
    assert not m.tables  # the drafter reads the target's table inside the program
    g = read_manifest(gemma[0])
    assert g.layout.max_pass == 9 and g.layout.slots(kv.SLIDING) == 6 + 9  # W + max_pass under `state`


# ---- bad input (damaged programs, wrong drafters: tests/test_contract.py) ----------------------------------
@pytest.fixture()
def damaged(llama, tmp_path):
    import shutil

    dst = tmp_path / "bundle"
    shutil.copytree(llama[0], dst)
    return dst


def test_a_manifest_naming_a_missing_method_is_refused(damaged):
    raw = json.loads((damaged / MANIFEST).read_text())
    raw["graphs"]["drafter"]["method"] = "draft_step"
    (damaged / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"has no method 'draft_step'"):
        load_bundle(damaged)


# ---- the real SmolLM2 ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_pte(smollm2, converted):
    """SmolLM2-135M + the built-in drafter as one fp32 .pte (~8 min to export on 2 cores, 3.2 GB peak RSS)."""
    from edge_spec.api import resolve_drafter
    from edge_spec.loading.checkpoints import load_drafter

    drafter = load_drafter(resolve_drafter("builtin:mtp", "smollm2-135m"))
    return export_bundle(smollm2, converted.parent / "bundle-et-fp32", drafter=drafter, max_context=256)


def test_smollm2_pte_matches_eager_and_speculates_exactly(smollm2, smollm2_pte):
    """fp32 .pte logits as close to a float64 reference as eager fp32 is (the bound of test_onnx.py's SmolLM2 test),
    greedy output == eager's argmax, and greedy speculative == plain through the program at k = 2."""
    from tests.test_onnx import FP32_ERROR_RATIO, float64_logits

    engine = load_bundle(smollm2_pte, threads=2)
    ids = smollm2.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    plain = engine.generate(ids, max_new_tokens=16, speculative=False)
    assert "Paris" in plain.text
    sequence = ids + plain.tokens[:-1]
    engine.session.reset()
    ours = engine.session.forward(sequence).logits
    ref = Session(TorchBackend(smollm2.model, engine.session.state.layout)).forward(sequence).logits
    exact = float64_logits(smollm2.model, sequence)
    assert np.abs(ours - exact).max() <= FP32_ERROR_RATIO * np.abs(ref - exact).max()
    assert ref[len(ids) - 1:].argmax(-1).tolist() == plain.tokens
    spec = engine.generate(ids, max_new_tokens=16, spec_k=2, adaptive=False)
    assert spec.tokens == plain.tokens and spec.extra["spec"].tau > 1.0


@pytest.mark.parametrize("fmt", ["executorch", "onnx"])
def test_e2b_sized_drafter_exports_and_matches_eager(e2b_pair, tmp_path, fmt):
    """The mission's drafter at its real size through the two CPU formats (the Core ML and QNN tests do the same for
    theirs): a random Gemma-4 E2B-assistant-shaped drafter (hidden 256, 4 layers [3 sliding, 1 full], vocab 262,144
    in 2,048 clusters, top 32) beside a 2-layer target of the same vocabulary (tests/tiny.e2b_pair): three draft steps
    through the bundle == eager (the clustered head's 4,096 candidates equal), export time, size and step time
    printed."""
    import importlib
    import resource
    import time


    target, drafter = e2b_pair
    start = time.perf_counter()
    export = importlib.import_module(f"edge_spec.exporters.{fmt}").export_bundle
    options = {"exporter": "torchscript"} if fmt == "onnx" else {}
    out = export(target, tmp_path / "bundle", drafter=drafter, precision="fp32", max_context=64, max_draft_len=2,
                 max_pass=3, **options)
    export_s = time.perf_counter() - start
    assert read_manifest(out).drafter.candidates_per_step == 32 * 262144 // 2048
    assert_drafter_matches_eager(out, target, drafter)
    engine = load_bundle(out, host_check=False)
    engine.session.prefill(prompt_ids(5))
    engine.drafter.begin(engine.session.length, engine.session.state.drafter_masks(), engine.session.length)
    hidden = np.zeros(target.config.hidden_size, np.float32)
    engine.drafter.step(5, hidden)
    start = time.perf_counter()
    for _ in range(3):
        engine.drafter.step(5, hidden)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
    print(f"\nE2B-sized drafter + shallow target -> {fmt} fp32: export {export_s:.0f} s, bundle {size:.0f} MB, drafter "
          f"step {(time.perf_counter() - start) / 3 * 1000:.1f} ms, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def test_packed_sibling_projections_compute_what_the_separate_ones_do(llama, gemma):
    """8da4w packs q/k/v and gate/up into one Linear each (`pack_modules`, read through PackedModuleOps): on a copy,
    the originals removed, the packed module's outputs are the separate projections' concatenation; gemma keeps its
    q/k/v (norms between projection and rotation) and packs gate/up; the caller's model is untouched."""
    import copy

    import torch

    from edge_spec.model.ops import PACKED_SPELLED_GELU, SPELLED_GELU, pack_modules, project

    for (_, target, _), packs_qkv in ((llama, True), (gemma, False)):
        model = target.model
        clone = copy.deepcopy(model)
        layers = len(model.model.layers)
        assert pack_modules(clone) == layers * (2 if packs_qkv else 1)
        x = torch.randn(1, 3, model.cfg.hidden_size)
        for block, packed in zip(model.model.layers, clone.model.layers):
            assert hasattr(block.self_attn, "q_proj") and hasattr(block.mlp, "gate_proj")  # the original stays
            assert not hasattr(packed.mlp, "gate_proj")
            torch.testing.assert_close(packed.mlp(x, PACKED_SPELLED_GELU), block.mlp(x, SPELLED_GELU),
                                       rtol=0, atol=1e-6)
            qkv = PACKED_SPELLED_GELU.qkv(packed.self_attn)
            if not packs_qkv:
                assert qkv is None
                continue
            attn = block.self_attn
            want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
            torch.testing.assert_close(project(qkv, x), want, rtol=0, atol=1e-6)
