"""Core ML export, verified on Linux: each bundle's .mlpackage is read back from disk and executed op by op by the
MIL reference executor (runtimes/coreml_mil.py, EDGE_SPEC_COREML_EXECUTOR=mil) through the coreml runtime's own
Backend (padding to fixed pass lengths, cache writes, drafter feeds). What this cannot show: speed and device
placement on a Mac, and whether the Mac's kernels are batch-invariant (the host check measures that there).

What only Core ML has stays here: the multifunction package, pad rows, the MLState binding's states, compression,
the executor. Parity with eager (`io` and `--kv state`), verify rows == decode steps, speculative == plain, rejected
drafts, wrong drafters, damaged packages and `generate` are tests/test_contract.py's, over every format.

Tiny random checkpoints (tests/tiny.py); the fp32 packages come from the session's factory (tests/contract.py, shared
with the contract suite; ~1-3 min each: 5 target functions + the drafter step).
"""

import json
import platform

import numpy as np
import pytest

from edge_spec.contract import kv
from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.cli import main
from edge_spec.errors import BundleError, ConfigError
from edge_spec.exporters.coreml import DRAFTER_FUNCTION, PACKAGE, export_bundle, target_function
from edge_spec.runtimes.fixed import pass_lengths
from edge_spec.contract.manifest import MANIFEST, read_manifest
from edge_spec.runtimes import coreml_mil
from edge_spec.runtimes.fixed import pad_mask, slot_feeds
from edge_spec.runtimes.coreml import EXECUTOR_ENV
from edge_spec.runtimes.torch import TorchBackend
from tests.contract import differing_windows, round_kv_to_fp16
from tests.parity import assert_drafter_matches_eager, chunked_logits, prompt_ids
from tests.tiers import LONG, long_variant


@pytest.fixture(autouse=True)
def mil_executor(monkeypatch):
    monkeypatch.setenv(EXECUTOR_ENV, "mil")


@pytest.fixture(scope="module")
def llama(tiny_bundles):
    """Tiny llama + a clustered drafter scoring with the target's (tied) table; fp32 compute, passes of 1, 2, 3, 5, 9
    tokens, context 160 (tests/contract.py)."""
    return tiny_bundles.get("coreml", "llama", "io")


@pytest.fixture(scope="module")
def gemma(tiny_bundles):
    """Tiny Gemma-4 (sliding rings of 6 + 9 - 1 = 14 slots, KV sharing, per-layer inputs) + a dense-head drafter."""
    return tiny_bundles.get("coreml", "gemma", "io")


# ---- the package ------------------------------------------------------------------------------------
def test_one_multifunction_package_with_fixed_lengths(llama, gemma):
    m = read_manifest(llama[0])
    assert (m.format, m.binding, m.precision) == ("coreml", "io", "fp32")
    assert {g.file for g in m.graphs.values()} == {PACKAGE}
    lengths = m.graphs["target"].fixed["lengths"]
    assert lengths == {str(t): target_function(t) for t in (1, 2, 3, 5, 9)} and pass_lengths(4, 9) == (1, 2, 3, 5, 9)
    assert m.graphs["target"].fixed["slots"] == {"full": 160 + 8}  # headroom for pad rows
    assert m.graphs["drafter"].method == DRAFTER_FUNCTION and not m.tables
    assert kv.EMBED_TABLE not in [t.name for t in m.graphs["drafter"].io.inputs]
    functions = coreml_mil.load_functions(llama[0] / PACKAGE)
    assert set(functions) == set(lengths.values()) | {DRAFTER_FUNCTION}
    f = functions["target_5"]
    assert f.inputs["input_ids"] == ((1, 5), np.int32) and f.inputs["mask_full"][0] == (1, 1, 5, 168 + 5)
    assert f.outputs[:2] == ["logits", "hidden"] and f.outputs[2] == "k_new_0"
    g = read_manifest(gemma[0])
    assert g.graphs["target"].fixed["slots"]["sliding"] == 6 + 9 - 1  # rings already hold a whole pass


def test_weights_are_stored_once_across_functions(llama):
    """save_multifunction deduplicates identical weights: 6 functions take about one copy of the weights."""
    _, target, drafter = llama
    params = sum(p.numel() for p in target.model.parameters()) + sum(p.numel() for p in drafter.parameters())
    weights = llama[0] / PACKAGE / "Data" / "com.apple.CoreML" / "weights"
    size = sum(p.stat().st_size for p in weights.rglob("*") if p.is_file())
    assert size < 1.5 * 4 * params  # fp32: 4 bytes each; six separate packages would take ~6x


def test_pad_mask_keeps_real_rows_and_gives_pad_rows_the_last_real_rows_view():
    """A pad row must not see only itself: to the model that is a position-0 row, which SmolLM2 gives its
    attention-sink activation, and a quantized graph calibrated over such rows is noise (runtimes/fixed.py)."""
    mask = kv.attention_mask(np.array([0, 1, -1, -1]), np.array([2, 3]), None)[None, None]  # [1, 1, 2, 4 + 2]
    out = pad_mask(mask, t=2, n=4, s=4, s_f=6)  # [1, 1, 4, 6 + 4]
    assert out.shape == (1, 1, 4, 10)
    assert np.array_equal(out[0, 0, :2, :4], mask[0, 0, :, :4]) and np.array_equal(out[0, 0, :2, 6:8], mask[0, 0, :, 4:])
    assert (out[0, 0, :2, 4:6] == kv.NEG_INF).all()
    assert (out[0, 0, :2, 8:] == kv.NEG_INF).all()  # no real row sees a pad row
    assert np.array_equal(out[0, 0, 2], out[0, 0, 1]) and np.array_equal(out[0, 0, 3], out[0, 0, 1])
    assert (out[0, 0, 2:] == 0).sum(-1).tolist() == [4, 4]  # slots 0, 1 and real rows 0, 1 (not themselves)


def test_slot_feeds_give_pad_rows_the_last_real_rows_view_and_write_nothing():
    mask = kv.attention_mask(np.array([0, 1, -1, -1]), np.array([2, 3]), None)[None, None]  # [1, 1, 2, 4 + 2]
    out, index = slot_feeds(mask, np.array([2, 3]), n=4, s=4, s_f=6, ring=False, floor=-100.0)  # [1, 1, 4, 6], [6]
    assert np.array_equal(out[0, 0, 0], [0, 0, 0, -100, -100, -100])  # row 0 (position 2): slots 0, 1 and its own
    assert np.array_equal(out[0, 0, 1], [0, 0, 0, 0, -100, -100])
    assert np.array_equal(out[0, 0, 2], out[0, 0, 1]) and np.array_equal(out[0, 0, 3], out[0, 0, 1])
    assert index.tolist() == [0, 1, 6, 7, 4, 5]  # slots 2, 3 take real rows 0, 1; pad rows (8, 9) go nowhere


# ---- exactness (verify rows, speculative == plain, rejections: tests/test_contract.py) ---------------------
def test_the_exactness_test_fails_when_sums_depend_on_shapes(llama, monkeypatch):
    """Negative control: with BLAS matmuls (kernels chosen by shape) the same package is not batch-invariant and
    the host check says so, so tests/test_contract.py's verify-rows test can fail."""
    monkeypatch.setattr(coreml_mil, "_rows_matmul", lambda x, w: np.matmul(x.astype(np.float32), w.astype(np.float32)))
    engine = load_bundle(llama[0], host_check=False)
    assert differing_windows(engine.session, prompt_ids(90, seed=5), ((58, 6), (61, 5), (40, 3))) != []
    assert not engine.check_host(cache=False).exact


# ---- the state binding (MLState) ---------------------------------------------------------------------
STATE_TOL = 2e-2  # fp16 states (Core ML's only state type) vs eager fp32, of the logits' scale (measured: see below)


@pytest.fixture(scope="module")
def llama_state(tiny_bundles):
    """The llama pair exported again with --kv state (same lengths, context; tests/contract.py)."""
    return tiny_bundles.get("coreml", "llama", "state")


@pytest.fixture(scope="module")
def gemma_state(tiny_bundles):
    return tiny_bundles.get("coreml", "gemma", "state")


@pytest.fixture(params=["llama_state", long_variant("gemma_state")])
def state_pair(request):
    return request.getfixturevalue(request.param)


@LONG  # the gemma `state` package: a variant (tests/tiers.py)
def test_state_package_declares_one_set_of_states(gemma_state):
    """Every function (target lengths and drafter) declares the same fp16 states, one per cached layer's K and V,
    [1, H_kv, S_f, D] with S_f a multiple of 32 holding the layout's slots and a spare one; no cache is an input or
    output; the manifest says what a runner outside Python feeds."""
    from edge_spec.runtimes import fixed

    m = read_manifest(gemma_state[0])
    assert (m.binding, m.layout.binding) == ("state", "state")
    entry = m.graphs["target"]
    slots = entry.fixed["slots"]
    assert slots == fixed.state_slots(m.layout) == {"sliding": 32, "full": 128}  # rings 6 + 9 = 15, context 96
    names = entry.fixed["states"]
    assert names == [f"{kv_}_cache_{c.layer}" for c in m.layout.caches for kv_ in "kv"]
    assert m.graphs["drafter"].fixed["states"] == names
    assert entry.fixed["inputs"] == ["input_ids", "position_ids", "mask_full", "mask_sliding", "write_slots_full",
                                     "write_slots_sliding"]
    functions = coreml_mil.load_functions(gemma_state[0] / PACKAGE)
    by_layer = {c.layer: c for c in m.layout.caches}
    for name, fn in functions.items():
        assert sorted(fn.states) == sorted(names), name
        for state, (shape, dtype) in fn.states.items():
            c = by_layer[int(state.rsplit("_", 1)[1])]
            assert shape == (1, c.num_kv_heads, slots[c.kind], c.head_dim) and dtype == np.float16
        assert not [i for i in fn.inputs if "cache" in i] and not [o for o in fn.outputs if "_new_" in o]
    assert functions["target_5"].inputs["write_slots_sliding"] == ((5,), np.int32)
    assert functions["target_5"].inputs["mask_sliding"][0] == (1, 1, 5, 32)


def test_state_gap_to_fp32_eager_is_the_fp16_rounding_of_the_caches(state_pair, monkeypatch):
    """Against plain fp32 eager the package is STATE_TOL of the logits' scale off, and all of it is the fp16 states:
    against eager with fp16-rounded keys and values the gap is > 4x smaller (llama: 400x; the tiny Gemma-4 7.6x,
    see tests/contract.STATE_REF_TOL, the tolerance of its parity there)."""
    _, target, _ = state_pair
    engine = load_bundle(state_pair[0], host_check=False)
    layout = engine.session.state.layout
    ids = prompt_ids(40, seed=11)
    ours = chunked_logits(engine.session, ids, 1)
    plain = chunked_logits(Session(TorchBackend(target.model, layout)), ids, 1)
    round_kv_to_fp16(monkeypatch)
    rounded = chunked_logits(Session(TorchBackend(target.model, layout)), ids, 1)
    scale = np.abs(plain).max()
    gap, rest = np.abs(ours - plain).max(), np.abs(ours - rounded).max()
    print(f"\nstate vs eager fp32 {gap:.1e}, vs eager with fp16 keys / values {rest:.1e} (logit scale {scale:.2f})")
    assert rest * 4 < gap <= STATE_TOL * scale


def test_state_pad_rows_write_only_the_spare_slot(llama_state, monkeypatch):
    """Passes of 4 tokens run the T = 5 function with one pad row each: they give the bits of one-token passes (the
    pad row went to the spare slot, which no mask shows). Negative control: pad rows sent to slot 0 (a committed
    key) instead change the logits, so a wrong write destination cannot go unseen."""
    from edge_spec.runtimes import fixed

    engine = load_bundle(llama_state[0], host_check=False)
    ids = prompt_ids(20, seed=2)
    one = chunked_logits(engine.session, ids, 1)
    engine.session.reset()
    assert np.array_equal(chunked_logits(engine.session, ids, 4), one)
    engine.session.reset()
    real = fixed.write_slots

    def into_slot_0(positions, n, s, s_f, ring):
        out = real(positions, n, s, s_f, ring)
        out[len(positions):] = 0
        return out

    monkeypatch.setattr(fixed, "write_slots", into_slot_0)
    bad = chunked_logits(engine.session, ids, 4)
    assert not np.array_equal(bad, one)


def test_a_manifest_whose_binding_disagrees_with_its_layout_is_refused(llama, tmp_path):
    import shutil

    dst = tmp_path / "bundle"
    shutil.copytree(llama[0], dst)
    raw = json.loads((dst / MANIFEST).read_text())
    raw["kv"]["binding"] = "state"  # the layout (and the package) are io
    (dst / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"KV binding 'state' \(layout 'io'\)"):
        load_bundle(dst)


def test_cli_exports_a_state_package_and_refuses_kv_elsewhere(tiny_llama, tmp_path, capsys):
    out = tmp_path / "cm-state"
    assert main(["export", "--model", str(tiny_llama[0]), "--drafter", "none", "--format", "onnx", "--kv", "state",
                 "--out", str(out)]) == 2
    assert "no KV binding 'state'" in capsys.readouterr().err and not out.exists()
    assert main(["export", "--model", str(tiny_llama[0]), "--drafter", "none", "--format", "executorch", "--kv", "io",
                 "--out", str(out)]) == 2
    assert "no KV binding 'io'" in capsys.readouterr().err
    assert main(["export", "--model", str(tiny_llama[0]), "--drafter", "none", "--format", "coreml", "--kv", "state",
                 "--max-context", "64", "--max-draft-len", "2", "--max-pass", "3", "--out", str(out)]) == 0
    assert read_manifest(out).binding == "state"
    assert main(["generate", "--bundle", str(out), "--prompt", "w5 w6 w7", "--max-new-tokens", "6", "--quiet"]) == 0
    assert capsys.readouterr().out.strip()


# ---- compressed / fp16 packages ---------------------------------------------------------------------------
@pytest.mark.parametrize("precision,bound,agree", [("fp16", 5e-3, 0.95), ("int8", 0.05, 0.9), ("int4", 0.3, 0.75)])
def test_fp16_and_compressed_logits_within_bound(llama, tmp_path, precision, bound, agree):
    """fp16 compute and coremltools.optimize weight compression, vs eager fp32 (bound relative to the logits'
    scale; tiny random weights are a worst case for int4: measured in docs/coreml.md), and greedy speculative ==
    plain through the compressed package."""
    _, target, drafter = llama
    folder = export_bundle(target, tmp_path / precision, drafter=drafter, precision=precision, max_context=64,
                           max_draft_len=2, max_pass=3)
    engine = load_bundle(folder)
    ref = Session(TorchBackend(target.model, engine.session.state.layout))
    ids = prompt_ids(24, seed=11)
    a, b = chunked_logits(engine.session, ids, 3), chunked_logits(ref, ids, 3)  # 3: the package's longest function
    assert np.abs(a - b).max() <= bound * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= agree
    engine.session.reset()
    plain = engine.generate(ids[:8], max_new_tokens=16, speculative=False)
    assert engine.generate(ids[:8], max_new_tokens=16, spec_k=2, lookup=False).tokens == plain.tokens
    assert engine.default_spec_k == 2  # no spec_k: the bundle's max draft length, not 4 (which it refuses)
    assert engine.generate(ids[:8], max_new_tokens=16, lookup=False).tokens == plain.tokens


# ---- errors ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(platform.system() == "Darwin", reason="on macOS Core ML itself runs the package")
def test_without_a_mac_loading_says_what_is_needed(llama, monkeypatch):
    monkeypatch.delenv(EXECUTOR_ENV)
    with pytest.raises(ConfigError, match="Core ML prediction needs macOS") as err:
        load_bundle(llama[0])
    assert f"{EXECUTOR_ENV}=mil" in str(err.value)


def test_bad_executor_compute_units_and_provider_are_refused(llama, monkeypatch):
    with pytest.raises(ConfigError, match="unknown compute units"):
        load_bundle(llama[0], compute_units="ane")
    with pytest.raises(ConfigError, match="--compute-units"):
        load_bundle(llama[0], provider="xnnpack")
    monkeypatch.setenv(EXECUTOR_ENV, "gpu")
    with pytest.raises(ConfigError, match="not a Core ML executor"):
        load_bundle(llama[0])


def test_a_manifest_without_fixed_lengths_is_refused(llama, tmp_path):
    """(Damaged files, the package's included: tests/test_contract.py.)"""
    import shutil

    dst = tmp_path / "bundle"
    shutil.copytree(llama[0], dst)
    raw = json.loads((dst / MANIFEST).read_text())
    del raw["graphs"]["target"]["fixed"]
    (dst / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="lists no fixed pass lengths"):
        load_bundle(dst)


def test_cli_export_and_generate(tiny_llama, tmp_path, capsys):
    """Export through the CLI at its default precision, fp16, and generate (another format's precision refused:
    tests/test_contract.py)."""
    out = tmp_path / "cm"
    assert main(["export", "--model", str(tiny_llama[0]), "--drafter", "none", "--format", "coreml",
                 "--max-context", "64", "--max-draft-len", "2", "--max-pass", "3", "--out", str(out)]) == 0
    assert "coreml fp16" in capsys.readouterr().err
    base = ["generate", "--bundle", str(out), "--prompt", "w5 w6 w7", "--max-new-tokens", "6", "--quiet"]
    assert main(base) == 0
    assert capsys.readouterr().out.strip()
    assert main(base + ["--compute-units", "cpu_and_ne", "--runtime", "torch"]) == 2
    assert "applies to coreml bundles" in capsys.readouterr().err


# ---- at real sizes ---------------------------------------------------------------------------------------
def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture(scope="module")
def smollm2_package(smollm2, converted):
    """SmolLM2-135M + the built-in drafter as one fp16 package (the default precision), passes of 1, 2, 3, 5, 9."""
    import time

    from edge_spec.api import load_export_drafter, resolve_drafter

    drafter = load_export_drafter(resolve_drafter("builtin", "smollm2-135m", fmt="coreml"), smollm2)
    start = time.perf_counter()
    folder = export_bundle(smollm2, converted.parent / "bundle-coreml-fp16", drafter=drafter, max_context=256,
                           max_pass=9)
    print(f"\nSmolLM2 + drafter -> Core ML fp16: {time.perf_counter() - start:.0f} s, peak RSS {_peak_rss_mb():.0f} MB "
          f"(this process so far), package {_package_mb(folder):.0f} MB")
    return folder


def _package_mb(folder) -> float:
    return sum(p.stat().st_size for p in (folder / PACKAGE).rglob("*") if p.is_file()) / 1e6


def test_smollm2_package_runs_and_speculates_exactly(smollm2, smollm2_package):
    """The converted SmolLM2 package through the MIL executor: greedy output says Paris, logits within the fp16 bound
    of eager fp32 (relative 2e-2 of their scale: fp16 compute rounds every op to 11 bits), greedy speculative ==
    plain at k = 2, and the package stores the weights once (fp16: ~2 bytes per parameter)."""
    engine = load_bundle(smollm2_package)
    ids = smollm2.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    plain = engine.generate(ids, max_new_tokens=8, speculative=False)
    assert "Paris" in plain.text
    engine.session.reset()
    ours = engine.session.forward(ids[:9]).logits
    ref = Session(TorchBackend(smollm2.model, engine.session.state.layout)).forward(ids[:9]).logits
    assert np.abs(ours - ref).max() <= 2e-2 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.8
    spec = engine.generate(ids, max_new_tokens=8, spec_k=2, lookup=False)
    assert spec.tokens == plain.tokens
    params = sum(p.numel() for p in smollm2.model.parameters())
    assert _package_mb(smollm2_package) * 1e6 < 2.6 * params


def test_e2b_sized_drafter_converts_and_matches_eager(e2b_pair, tmp_path):
    """The mission's drafter at its real size: a random Gemma-4 E2B-assistant-shaped drafter (hidden 256, 4 layers
    [3 sliding, 1 full], vocab 262144 in 2048 clusters, top 32: ~76M parameters) beside a shallow Gemma-4 target of the
    same vocabulary (2 layers, hidden 256; its global head dim equals head_dim, so transformers writes an empty
    per_layer_config, which the loader once misread): conversion, executor parity of three draft steps (the clustered head's
    4,096 candidates equal eager's), file size, export time and the executor's step time printed."""
    import time


    target, drafter = e2b_pair
    n = sum(p.numel() for p in drafter.parameters())
    start = time.perf_counter()
    out = export_bundle(target, tmp_path / "bundle", drafter=drafter, precision="fp32", max_context=64,
                        max_draft_len=2, max_pass=3)
    export_s = time.perf_counter() - start
    assert read_manifest(out).drafter.candidates_per_step == 32 * 262144 // 2048
    step = coreml_mil.load_functions(out / PACKAGE)[DRAFTER_FUNCTION]
    assert_drafter_matches_eager(out, target, drafter)
    feeds = {name: np.zeros(shape, dtype) for name, (shape, dtype) in step.inputs.items()}
    start = time.perf_counter()
    step(feeds)
    print(f"\nE2B-sized drafter ({n / 1e6:.1f}M params) + shallow target -> Core ML fp32: export {export_s:.0f} s, "
          f"package {_package_mb(out):.0f} MB, executor drafter step {time.perf_counter() - start:.2f} s (numpy, not a "
          f"Mac), peak RSS {_peak_rss_mb():.0f} MB")
