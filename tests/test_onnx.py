"""ONNX export + onnxruntime backend: what only the onnx format has (buckets, quantized graphs, the split-attention
control, graph IO, sliding-pass caps, atomic export, its CLI errors). Parity with eager, verify rows == decode steps,
speculative == plain, wrong drafters, damaged files and `generate` are tests/test_contract.py's, over every format.

Tiny random checkpoints (tests/tiny.py) except one real SmolLM2 test; the fp32 bundles come from the session's
factory (tests/contract.py), shared with the contract suite.
"""

import functools
import json
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

from edge_spec.loading import checkpoints
from edge_spec.contract import kv
from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.cli import main
from edge_spec.model import attention
from edge_spec.model.drafter import check_pair, save_drafter
from edge_spec.errors import BundleError, ConfigError, KVStateError
from edge_spec.exporters import onnx as onnx_exporter
from edge_spec.exporters.onnx import export_bundle
from edge_spec.decoding.generate import generate_plain
from edge_spec.contract.manifest import MANIFEST, Manifest, read_manifest
from edge_spec.runtimes import ort as ort_runtime
from edge_spec.runtimes.torch import TorchBackend, TorchDrafter
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from tests.contract import OracleDrafter, differing_windows, host_checked_session, tiny_drafter
from tests.parity import LOGITS_TOL, prompt_ids
from tests.tiny import gemma3_config, llama_config, save_gemma3_reference, save_reference

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def llama(tiny_bundles):
    """Tiny llama + a clustered drafter scoring with the *target's* (tied) output table, fp32 (tests/contract.py)."""
    return tiny_bundles.get("onnx", "llama")


@pytest.fixture(scope="module")
def gemma(tiny_bundles):
    """Tiny Gemma-4 (sliding rings of 6 + 9 - 1 = 14 slots, KV sharing, per-layer inputs) + a dense-head drafter
    with its own table, passes of <= 9 tokens, fp32 (tests/contract.py)."""
    return tiny_bundles.get("onnx", "gemma")


def ort_parts(folder, threads=1):
    engine = load_bundle(folder, threads=threads)
    return engine.session.backend, engine.drafter, engine


# ---- rings ---------------------------------------------------------------------------------------------
def test_rewind_across_a_ring_eviction_still_raises(gemma):
    backend, _, _ = ort_parts(gemma[0])
    session = Session(backend)
    session.prefill(prompt_ids(30))
    with pytest.raises(KVStateError, match="evicted"):
        session.rewind(5)


# ---- a prefill chunk runs the head on its last row only (kv.LOGIT_ROWS) -------------------------------------------
@pytest.mark.parametrize("model", ["llama", "gemma"])
def test_a_prefill_chunk_asks_the_graph_for_its_last_row_only(model, request):
    backend, _, _ = ort_parts(request.getfixturevalue(model)[0])
    assert backend.logit_rows, "bundles exported since 2026-12-05 take logit_rows"
    returned = []  # the logits shape each run wrote
    run = backend.session.run_with_iobinding

    def spy(binding):
        run(binding)
        returned.append(tuple(binding.get_outputs()[0].shape()))

    backend.session.run_with_iobinding = spy
    session = Session(backend)
    tokens = prompt_ids(7)
    every = session.forward(tokens)  # a verify pass: every row
    last = session.forward(tokens, last_only=True)  # a prefill chunk's pass
    vocab = every.logits.shape[-1]
    assert returned == [(1, 7, vocab), (1, 1, vocab)]
    np.testing.assert_allclose(last.logits[0], every.logits[-1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(last.hidden[0], every.hidden[-1], rtol=0, atol=1e-5)
    out = session.prefill(tokens)  # what prefill returns is that row
    np.testing.assert_array_equal(out.logits, last.logits)


def test_a_target_graph_without_logit_rows_still_reads(llama, tmp_path):
    """Bundles exported before LOGIT_ROWS: the manifest check takes their IO as it was (every row)."""
    folder = tmp_path / "old"
    shutil.copytree(llama[0], folder)
    data = json.loads((folder / MANIFEST).read_text())
    target = data["graphs"]["target"]
    target["inputs"] = [spec for spec in target["inputs"] if spec["name"] != kv.LOGIT_ROWS]
    for spec in target["outputs"][:2]:
        spec["shape"] = [kv.T_DIM if d == kv.R_DIM else d for d in spec["shape"]]
    (folder / MANIFEST).write_text(json.dumps(data))
    read_manifest(folder)  # the old IO passes the check
    target["outputs"][0]["shape"][1] = kv.R_DIM  # but not a mix of the two
    (folder / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="target graph output 0"):
        read_manifest(folder)


# ---- speculative through ORT == plain through ORT (every format's: tests/test_contract.py) ----------------------
def every_third_wrong(position):
    return position % 3 == 0


def test_accepted_drafts_commit_several_rows(llama, monkeypatch):
    """Bursts of accepted drafts commit several rows at once while the caches move between buckets of 8."""
    monkeypatch.setattr(ort_runtime, "BUCKET", 8)
    backend, _, _ = ort_parts(llama[0])
    session = Session(backend)
    ids = prompt_ids(9, seed=5)
    expected = generate_plain(session, ids, max_new_tokens=48, params=GREEDY, rng=np.random.default_rng(0),
                              stop_ids=frozenset()).tokens
    out = generate_speculative(session, OracleDrafter(expected, len(ids), every_third_wrong), ids, max_new_tokens=48,
                               params=GREEDY, rng=np.random.default_rng(0), stop_ids=frozenset(), k=4, vocab_size=320)
    assert out.tokens == expected and out.extra["spec"].tau > 1.5


def test_split_attention_is_caught_by_the_bit_identity_test_and_the_host_check(llama, tmp_path):
    """Negative control: the attention form before slot attention (cache part + new part) is not batch-invariant
    on any CPU; the bit-identity test above fails on it in both row modes, the host check says so, and generation
    then runs plain decoding with a notice instead of a speculative output that could differ."""
    _, target, drafter = llama
    folder = export_bundle(target, tmp_path / "split", drafter=drafter, precision="int8", max_context=160,
                           attention="split")
    engine = load_bundle(folder, threads=2, host_check=False)
    check = engine.check_host(cache=False)
    assert not check.exact and check.one_row_max_diff > 0 and check.two_row_max_diff > 0
    assert "NOT exact" in check.report()
    windows = ((58, 6), (61, 5), (40, 2), (64, 4))
    for rows in (1, 2):
        engine.session.min_rows = rows
        assert differing_windows(engine.session, prompt_ids(70, seed=5), windows), f"min_rows {rows}"
    engine.session.min_rows = 1
    ids = prompt_ids(9, seed=2)
    plain = engine.generate(ids, max_new_tokens=20, speculative=False)
    spec = engine.generate(ids, max_new_tokens=20, spec_k=4)
    assert spec.tokens == plain.tokens and "spec" not in spec.extra
    assert "speculative decoding is off" in spec.extra["notice"]
    forced = engine.generate(ids, max_new_tokens=20, spec_k=4, allow_inexact=True)  # benchmarks may still measure
    assert "spec" in forced.extra


def test_long_heads_are_scored_keys_major_so_verify_rows_stay_bit_identical(tmp_path, monkeypatch):
    """Heads longer than one GEMM block (gemma-3-270m: 256). onnxruntime's sgemm sums D = 256 in two blocks of 128
    when a matmul has more than 64 output columns (the cache's scores, one column per slot) and in one block when
    it has fewer (the new keys' scores), so scored query-major a key scored in a verify pass differs from the same
    key read back from the cache a step later (gemma-3-270m fp32: 1.4e-4 in the logits, one- and two-row modes
    alike, `edge-spec check`). Scored keys-major (attention._scores), both matmuls sum D alike. Negative control:
    the query-major form, exported by raising the block length, is caught by the same windows."""
    save_gemma3_reference(gemma3_config(head_dim=256, query_pre_attn_scalar=256), tmp_path / "ckpt", seed=3)
    target = checkpoints.load(str(tmp_path / "ckpt"))
    ids, windows = prompt_ids(150, seed=4), ((100, 5), (120, 4), (140, 3))  # caches of 128 / 160 slots
    folder = export_bundle(target, tmp_path / "keys-major", max_context=160, binding=kv.BINDING_IO)  # our attention
    assert differing_windows(host_checked_session(folder), ids, windows) == []
    monkeypatch.setattr(attention, "LONGEST_SINGLE_BLOCK", 1024)
    folder = export_bundle(target, tmp_path / "query-major", max_context=160, binding=kv.BINDING_IO)
    assert differing_windows(load_bundle(folder, threads=2, host_check=False).session, ids, windows)


def test_gemma_int4_sliding_layers_verify_rows_are_bit_identical_to_decode_steps(gemma, tmp_path):
    """The same property on a Gemma-4 target (sliding rings, KV sharing): its sliding layers attend over ring
    slots too (slot = position % 14 here). Before that, int4 logits differed by up to ~4 between a verify pass and
    T=1 steps. Windows: inside the ring, wrapping around within the pass, and a pass of the cap (9 tokens). (fp32:
    tests/test_contract.py, every format.)"""
    folder = export_bundle(gemma[1], tmp_path / "int4", precision="int4", max_context=96, max_pass=9)
    session = host_checked_session(folder)
    assert session.state.layout.slots(kv.SLIDING) == 14
    assert_sliding_session_is_exact(session)


def assert_sliding_session_is_exact(session) -> None:
    """Verify rows == decode steps in windows inside a 14-slot ring, wrapping it within the pass (where the layout
    has one) and at a pass of the cap (9 tokens); end to end, bursts of 4 mostly-right drafts (accepted and rejected
    ones) reproduce plain greedy decoding."""
    windows = ((58, 6), (53, 6), (40, 2), (64, 4), (26, 9))
    assert differing_windows(session, prompt_ids(80, seed=5), windows) == []
    prompt = prompt_ids(11, seed=1)
    expected = generate_plain(session, prompt, max_new_tokens=60, params=GREEDY, rng=np.random.default_rng(0),
                              stop_ids=frozenset()).tokens
    out = generate_speculative(session, OracleDrafter(expected, len(prompt), every_third_wrong), prompt,
                               max_new_tokens=60, params=GREEDY, rng=np.random.default_rng(0), stop_ids=frozenset(),
                               k=4, vocab_size=320)
    assert out.tokens == expected and out.extra["spec"].tau > 1.5


def test_sliding_targets_cap_the_tokens_per_pass(gemma, llama, tmp_path):
    """A bundle with sliding rings refuses a forward longer than its cap (the rings are sized for it) and chunks
    prefill under it; full-attention-only bundles record no cap. A cap below a verify pass is refused at export."""
    engine = load_bundle(gemma[0])
    assert engine.session.state.layout.max_pass == 9
    with pytest.raises(ConfigError, match="9 tokens per pass"):
        engine.session.forward(prompt_ids(10))
    out = engine.session.prefill(prompt_ids(30))  # 4 chunks of <= 9
    assert engine.session.length == 30 and out.logits.shape[0] == 1
    assert load_bundle(llama[0]).session.state.layout.max_pass is None
    with pytest.raises(ConfigError, match="max_pass must be"):
        export_bundle(gemma[1], tmp_path / "x", max_pass=4)  # max_draft_len 8 needs passes of 9
    assert not (tmp_path / "x").exists()


def test_shared_binding_fuses_attention_writes_in_place_up_to_the_last_slot_and_refuses_what_it_cannot_run(
        llama, gemma, tiny_bundles, tmp_path):
    """`--kv shared`: one GroupQueryAttention per layer (no score scatter, no new-row outputs), caches written in place
    with the dummy row one slot past the pass, so a pass ending at the last context slot still runs, and it agrees
    with the `io` bundle there. Gemma-4 targets (layers reusing another's cache) and the TorchScript exporter are
    refused, nothing written (the contract suite, tests/test_contract.py, holds its parity and exactness claims)."""
    folder, target, _ = tiny_bundles.get("onnx", "llama", kv.BINDING_SHARED)
    graph = onnx.load(folder / "onnx" / "target.onnx", load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("GroupQueryAttention") == target.config.num_layers and "ScatterElements" not in ops
    assert [o.name for o in graph.graph.output][2:4] == [kv.k_present_name(0), kv.v_present_name(0)]
    shared, io = load_bundle(folder, host_check=False).session, load_bundle(llama[0], host_check=False).session
    n = shared.max_context
    ids = prompt_ids(n - 3)
    for s in (shared, io):
        s.prefill(ids)
    for token in (5, 6, 7):  # the last pass writes slot n - 1 and its dummy row the spare slot n
        got, want = shared.forward([token]).logits, io.forward([token]).logits
        np.testing.assert_allclose(got, want, atol=LOGITS_TOL)
        shared.commit(1)
        io.commit(1)
    assert shared.length == n
    with pytest.raises(ConfigError, match="own q/k/v projections and caches .*not gemma4's"):
        export_bundle(gemma[1], tmp_path / "g", binding=kv.BINDING_SHARED)
    with pytest.raises(ConfigError, match="dynamo exporter"):
        export_bundle(llama[1], tmp_path / "t", binding=kv.BINDING_SHARED, exporter="torchscript")
    assert not (tmp_path / "g").exists() and not (tmp_path / "t").exists()


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_gemma3_shared_binding_attends_its_window_in_the_kernel_and_stays_exact(precision, tmp_path):
    """Gemma-3 under `--kv shared` (its default): one GroupQueryAttention per layer, a sliding layer's window as the
    kernel's local_window_size over slot == position caches (max_context slots, no ring). Its logits equal the `io`
    bundle's (rings, masks) within fp32 rounding before and past the window (6 here: an off-by-one in the window
    differs by ~0.2 from the 6th token on), verify rows == decode steps across bucket edges, and greedy speculative
    with accepted and rejected drafts == plain."""
    save_gemma3_reference(gemma3_config(), tmp_path / "ckpt", seed=3)
    target = checkpoints.load(str(tmp_path / "ckpt"))
    assert onnx_exporter.default_binding(target.config) == kv.BINDING_SHARED
    args = dict(max_context=96, max_pass=9, precision=precision)
    shared = export_bundle(target, tmp_path / "shared", **args)
    io = export_bundle(target, tmp_path / "io", binding=kv.BINDING_IO, **args)
    ops = [n.op_type for n in onnx.load(shared / "onnx" / "target.onnx", load_external_data=False).graph.node]
    assert ops.count("GroupQueryAttention") == target.config.num_layers and "ScatterElements" not in ops
    windows = [a.i for n in onnx.load(shared / "onnx" / "target.onnx", load_external_data=False).graph.node
               if n.op_type == "GroupQueryAttention" for a in n.attribute if a.name == "local_window_size"]
    assert windows == [6, 6, 6]  # the three sliding layers; the full one attends over everything
    a, b = (load_bundle(f, host_check=False).session for f in (shared, io))
    assert a.state.layout.slots(kv.SLIDING) == 96 and b.state.layout.slots(kv.SLIDING) == 14
    ids = prompt_ids(40, seed=2)
    for n in (3, 5, 6, 7, 30):
        a.reset()
        b.reset()
        np.testing.assert_allclose(a.prefill(ids[:n]).logits, b.prefill(ids[:n]).logits, atol=LOGITS_TOL)
    for token in ids[30:]:
        np.testing.assert_allclose(a.forward([token]).logits, b.forward([token]).logits, atol=LOGITS_TOL)
        a.commit(1)
        b.commit(1)
    assert_sliding_session_is_exact(host_checked_session(shared))


def test_gemma3_shared_long_heads_cap_the_passes_that_cross_the_scoring_edge(tmp_path, monkeypatch):
    """Heads of 256 (gemma-3-270m's): GroupQueryAttention's score sgemm sums them in one block while a pass scores
    <= 64 keys and in two beyond (kv.SCORE_EDGE), so a verify pass crossing 64 keys differs from its rows' decode
    steps (negative control: `Session.pass_cap` turned off). With the cap the host check finds both row modes exact,
    and greedy speculative decoding across position 64, drafts accepted and rejected, equals plain."""
    from edge_spec.contract.backend import Session
    from edge_spec.decoding import hostcheck

    save_gemma3_reference(gemma3_config(head_dim=256, query_pre_attn_scalar=256), tmp_path / "ckpt", seed=3)
    folder = export_bundle(checkpoints.load(str(tmp_path / "ckpt")), tmp_path / "b", max_context=160, max_pass=9)
    session = load_bundle(folder, threads=2, host_check=False).session
    ids = prompt_ids(150, seed=4)
    crossing = ((55, 9), (60, 4), (62, 2))
    # uncapped passes across the edge differ where the CPU's sgemm blocks the sum there (AVX-512 EPYC and Xeon); an
    # AVX2 EPYC (2026-12-07 night) summed both the same, and then there is nothing for the cap to fix, only to keep
    differ = differing_windows(session, ids, crossing)
    assert differ in ([], list(crossing)), differ
    assert differing_windows(session, ids, ((54, 9), (61, 2), (63, 4), (120, 9))) == []  # one side of it: exact
    check = hostcheck.probe(session, 320, artifact="x", runtime="ort")
    assert check.one_row_max_diff == 0.0 and check.two_row_max_diff == 0.0, check.report()
    prompt = prompt_ids(50, seed=1)
    for rows in (1, 2):
        session.min_rows = rows
        expected = generate_plain(session, prompt, max_new_tokens=40, params=GREEDY, rng=np.random.default_rng(0),
                                  stop_ids=frozenset()).tokens
        out = generate_speculative(session, OracleDrafter(expected, len(prompt), every_third_wrong), prompt,
                                   max_new_tokens=40, params=GREEDY, rng=np.random.default_rng(0),
                                   stop_ids=frozenset(), k=8, vocab_size=320)
        assert out.tokens == expected
    monkeypatch.setattr(Session, "pass_cap", lambda self: None)
    session.min_rows = 1
    uncapped = hostcheck.probe(session, 320, artifact="x", runtime="ort").one_row_max_diff
    assert (uncapped > 0) == bool(differ), uncapped  # the negative control, where this CPU's kernels differ


def test_schema_1_bundles_still_load(llama, tmp_path):
    """Bundles written before `max_pass` (schema 1: no cap; sliding layers in split form) keep loading."""
    folder = tmp_path / "old"
    shutil.copytree(llama[0], folder)
    raw = json.loads((folder / MANIFEST).read_text())
    raw["schema_version"] = 1
    del raw["kv"]["layout"]["max_pass"]
    (folder / MANIFEST).write_text(json.dumps(raw))
    engine = load_bundle(folder)
    assert engine.session.state.layout.max_pass is None
    assert len(engine.generate(prompt_ids(5), max_new_tokens=4, speculative=False).tokens) == 4


def test_untied_target_with_a_target_head_drafter_gets_its_output_table(tmp_path):
    ref = save_reference(llama_config(num_hidden_layers=1, tie_word_embeddings=False), tmp_path / "untied")
    del ref
    target = checkpoints.load(str(tmp_path / "untied"))
    drafter = tiny_drafter(target.config, num_layers=1, head_from="target")
    folder = export_bundle(target, tmp_path / "bundle", drafter=drafter, max_context=32, exporter="torchscript")
    manifest = read_manifest(folder)
    assert set(manifest.tables) == {kv.EMBED_TABLE, kv.OUTPUT_TABLE}
    backend, ort_drafter, engine = ort_parts(folder)
    torch_backend = TorchBackend(target.model, manifest.layout)
    eager = TorchDrafter(drafter, torch_backend, check_pair(target.config, drafter.cfg))
    ours, theirs = Session(backend), Session(torch_backend)
    out = ours.prefill(prompt_ids(6))
    theirs.prefill(prompt_ids(6))
    for runner in (ort_drafter, eager):
        runner.begin(ours.length, ours.state.drafter_masks(), ours.length)
    token, hidden = int(out.logits[-1].argmax()), out.hidden[-1]
    a, b = ort_drafter.step(token, hidden), eager.step(token, hidden)
    assert np.array_equal(a.token_ids, b.token_ids) and np.abs(a.logits - b.logits).max() <= LOGITS_TOL


# ---- the manifest and bundle integrity (damaged files, wrong drafters: tests/test_contract.py) ---------
def test_manifest_round_trip_and_contents(llama):
    folder, target, drafter = llama
    manifest = read_manifest(folder)
    raw = json.loads((folder / MANIFEST).read_text())
    assert Manifest.from_json(raw).to_json() == raw
    assert raw["schema_version"] == 2 and raw["format"] == "onnx" and raw["precision"] == "fp32"
    assert manifest.vocab_size == 320 and manifest.max_context == 160 and manifest.max_draft_len == 8
    assert manifest.drafter.kv_sharing == {"full": 2} and manifest.drafter.head_from == "target"
    assert manifest.eos_token_ids == (2,) and "im_start" in manifest.chat_template
    assert manifest.drafter.target_content_sha256 == manifest.target.content_sha256
    inputs = {t.name: t.shape for t in manifest.graphs["target"].io.inputs}
    assert inputs["mask.full"] == (1, 1, "T", "S_full+T") and inputs["k_cache.0"] == (1, 2, "S_full", 16)
    assert [c["slots"] for c in raw["kv"]["layout"]["caches"]] == [160, 160, 160]
    for rel in ("onnx/target.onnx", "onnx/target.onnx.data", "onnx/drafter.onnx", "onnx/embed_table.bin",
                "tokenizer.json", "tokenizer_config.json"):
        assert len(raw["files"][rel]["sha256"]) == 64


@pytest.fixture()
def damaged(llama, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(llama[0], dst)
    return dst


def test_graph_whose_io_differs_from_the_manifest_names_the_file(damaged):
    """A graph file edited after export (its checksums re-recorded, so only its IO is wrong) is refused at load."""
    from edge_spec.contract.manifest import sha256_file

    path = damaged / "onnx" / "target.onnx"
    proto = onnx.load(path, load_external_data=False)
    proto.graph.input[0].name = "tokens"
    for node in proto.graph.node:
        node.input[:] = ["tokens" if name == kv.INPUT_IDS else name for name in node.input]
    onnx.save(proto, path)
    raw = json.loads((damaged / MANIFEST).read_text())
    raw["files"]["onnx/target.onnx"] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (damaged / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"target\.onnx: graph inputs \['tokens'"):
        load_bundle(damaged)


def test_interrupted_export_leaves_no_bundle_and_a_rerun_succeeds(llama, tmp_path, monkeypatch):
    _, target, drafter = llama
    out = tmp_path / "bundle"
    export = functools.partial(export_bundle, exporter="torchscript")  # fast; atomicity does not depend on it

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-way")

    real = onnx_exporter.export_drafter
    monkeypatch.setattr(onnx_exporter, "export_drafter", killed)  # after the target graph was written
    with pytest.raises(RuntimeError, match="killed"):
        export(target, out, drafter=drafter, max_context=32)
    assert not out.exists() and not list(tmp_path.iterdir())  # no bundle, no temp folder
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(out)
    monkeypatch.setattr(onnx_exporter, "export_drafter", real)
    export(target, out, drafter=drafter, max_context=32)
    first = read_manifest(out)
    monkeypatch.setattr(onnx_exporter, "export_drafter", killed)  # a failed re-export keeps the old bundle
    with pytest.raises(RuntimeError):
        export(target, out, drafter=drafter, max_context=32, precision="int8")
    assert read_manifest(out).precision == first.precision == "fp32"


def test_unknown_provider_and_bad_options(llama):
    with pytest.raises(ConfigError, match="XnnpackExecutionProvider.*not available"):
        load_bundle(llama[0], provider="xnnpack")
    with pytest.raises(ConfigError, match="max_context"):
        load_bundle(llama[0], max_context=1000)
    engine = load_bundle(llama[0], max_context=40)  # a smaller context than exported is fine
    assert engine.max_context == 40
    with pytest.raises(ConfigError, match="max draft length 8"):
        engine.generate([5, 6], max_new_tokens=4, spec_k=9)


def test_running_a_bundle_imports_no_torch(llama, tmp_path):
    """An ONNX bundle runs on onnxruntime alone: loading it through the Python API (host check included) and decoding
    plainly and speculatively imports no torch, whose import alone holds ~180 MB resident (edge_spec/api.py imports
    it only where a checkpoint or an eager drafter is used; the attention forms' names live in model/config.py), and
    no gguf (~7 MB with the yaml and sentencepiece it imports: read only when a GGUF is, since 2026-12-07)."""
    import subprocess
    import sys

    code = ("import sys; from edge_spec.api import load_bundle; "
            f"e = load_bundle({str(llama[0])!r}, threads=1); "
            "e.generate([5, 6, 7], max_new_tokens=6, speculative=False); "
            "e.generate([5, 6, 7], max_new_tokens=6, allow_inexact=True); "
            "assert e.drafter is not None and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]; "
            "assert 'gguf' not in sys.modules")
    env = {**os.environ, "EDGE_SPEC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_sessions_run_without_a_memory_arena(llama):
    """The target's and the drafter's sessions hold no CPU memory arena (runtimes/ort.py make_session: an arena keeps
    the largest pass's buffers for the session's life; `make demo`'s decode peaked 15 MB lower without it)."""
    engine = load_bundle(llama[0], threads=1, host_check=False)
    for session in (engine.session.backend.session, engine.drafter.session):
        assert session.get_session_options().enable_cpu_mem_arena is False


FREED_PROBE = """
import sys, numpy as np
if sys.argv[1] == "load":
    from edge_spec.api import load_bundle
    engine = load_bundle(sys.argv[2], threads=1, host_check=False)
def in_heap(a):
    at = a.__array_interface__["data"][0]
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= at < hi:
                return True
    return False
a = np.ones(1 << 20)  # 8 MB: a mapping of its own under glibc's default threshold
first = in_heap(a)
del a
b = np.ones(1 << 20)  # after that free, glibc's moving threshold puts the next one in the heap
print(first, in_heap(b))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_pass_buffers_go_back_to_the_system(llama):
    """Once a session is made, an 8 MB buffer freed and allocated again is still a mapping of its own (returned to the
    system when freed: runtimes/ort.py return_freed_buffers), where a process that made no session serves the second
    one from the heap, which glibc keeps (the negative control: glibc's moving mmap threshold)."""
    def probe(*args):
        out = subprocess.run([sys.executable, "-c", FREED_PROBE, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    assert probe("bare") == ["False", "True"]  # glibc's default: the second 8 MB buffer comes from the heap
    assert probe("load", str(llama[0])) == ["False", "False"]


# ---- CLI -------------------------------------------------------------------------------------------------
def test_export_defaults_to_the_builtin_pair(tiny_llama, tmp_path, capsys):
    from edge_spec.api import default_drafter

    assert default_drafter("smollm2-135m") == "builtin"  # `edge-spec export --out B` exports the shipped pair
    assert default_drafter(str(tiny_llama[0])) is None  # a checkpoint folder has no built-in drafter
    for extra in ([], ["--drafter", "none"]):
        out = tmp_path / f"b{len(extra)}"
        assert main(["export", "--model", str(tiny_llama[0]), "--max-context", "32", "--out", str(out), *extra]) == 0
        assert read_manifest(out).drafter is None and "with drafter" not in capsys.readouterr().err


def test_cli_export_and_generate_bundle(tiny_llama, tmp_path, capsys):
    folder = tiny_llama[0]
    drafter_dir = save_drafter(tiny_drafter(checkpoints.load(str(folder)).config, num_layers=1), tmp_path / "drafter")
    out = tmp_path / "bundle"
    assert main(["export", "--model", str(folder), "--drafter", str(drafter_dir), "--format", "onnx",
                 "--quant", "fp32", "--max-context", "64", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    base = ["generate", "--prompt", "w5 w6 w7", "--max-new-tokens", "10", "--quiet"]
    results = {}
    for name, extra in {"spec": ["--bundle", str(out)], "plain": ["--bundle", str(out), "--no-spec"],
                        "torch": ["--bundle", str(out), "--runtime", "torch", "--no-spec"],
                        "eager": ["--model", str(folder)]}.items():
        code = main(base + extra)
        results[name] = (code, *capsys.readouterr())
    assert {r[0] for r in results.values()} == {0}
    assert results["spec"][1] == results["plain"][1] == results["torch"][1] == results["eager"][1]
    # the fp32 ONNX bundle is exact on this CPU (the host check's verdict) and speculation ran: spec == plain above
    assert "[ort]" in results["spec"][2] and "tau" in results["spec"][2] and "tau" not in results["plain"][2]
    assert "exactness: host-checked" in results["spec"][2]
    assert "[torch]" in results["torch"][2]  # the bundle's source checkpoints in eager torch: the same plain text


@pytest.mark.parametrize("args, message", [
    (["generate", "--bundle", "/no/such/bundle", "--prompt", "hi"], "does not exist"),
    (["generate", "--bundle", "{bundle}", "--model", "x", "--prompt", "hi"], "cannot be combined"),
    (["generate", "--model", "{model}", "--runtime", "ort", "--prompt", "hi"], "runs exported bundles"),
    (["generate", "--bundle", "{bundle}", "--provider", "coreml", "--prompt", "hi"], "not available"),
    (["generate", "--bundle", "{bundle}", "--ep", "qnn", "--prompt", "hi"], "do not run on Qualcomm"),
    (["export", "--model", "{model}", "--out", "{nonbundle}"], "refusing to replace"),
    (["export", "--model", "{model}", "--max-pass", "4", "--out", "{nonbundle}/b"], "max_pass must be"),
])
def test_cli_errors_exit_2(llama, tiny_llama, tmp_path, capsys, args, message):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    fill = {"bundle": str(llama[0]), "model": str(tiny_llama[0]), "nonbundle": str(tmp_path / "notes")}
    code = main([a.format(**fill) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


# ---- the real SmolLM2-135M -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2_bundle(smollm2, converted):
    return export_bundle(smollm2, converted.parent / "bundle-fp32", max_context=256)


def float64_logits(model, ids) -> np.ndarray:
    """The target's logits over `ids` in float64 (one forward from an empty cache): the reference both fp32
    implementations are measured against."""
    import copy

    import torch

    m64 = copy.deepcopy(model).double()
    t = len(ids)
    causal = torch.triu(torch.full((t, t), float(kv.NEG_INF), dtype=torch.float64), 1)[None, None]
    masks = {kind: causal for kind in model.cfg.rope}
    empty = [torch.zeros(1, h, 0, d, dtype=torch.float64) for h, d in
             ((model.cfg.kv_heads[i], model.cfg.head_dims[i]) for i in m64.cached_layers)]
    with torch.no_grad():
        return m64(torch.tensor([ids]), torch.arange(t)[None], masks, empty, [e.clone() for e in empty]).logits[0].numpy()


FP32_ERROR_RATIO = 4  # an exported fp32 graph may be off the float64 reference by at most 4x eager fp32's own error


def test_smollm2_ort_matches_eager(smollm2, smollm2_bundle):
    """fp32 ORT logits over prompt + 16 ORT greedy tokens are as close to a float64 reference as eager fp32 is
    (within FP32_ERROR_RATIO of eager's own error: both are fp32 sums of the same terms in kernel-dependent
    orders, so the bound scales with the logits and holds on AVX2 and AVX-512 alike; a fixed 1e-4 failed at
    1.17e-4 on an AMD EPYC), and every greedy token is eager's argmax (teacher-forced). The bound still catches
    small real errors: one layer's down projection rounded to bf16 is ~60x outside it."""
    import copy

    engine = load_bundle(smollm2_bundle, threads=2)
    ids = smollm2.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    tokens = generate_plain(engine.session, ids, max_new_tokens=16, params=GREEDY, rng=np.random.default_rng(0),
                            stop_ids=frozenset()).tokens
    engine.session.reset()
    sequence = ids + tokens[:-1]
    ours = engine.session.forward(sequence).logits
    layout = engine.session.state.layout
    ref = Session(TorchBackend(smollm2.model, layout)).forward(sequence).logits
    exact = float64_logits(smollm2.model, sequence)
    eager_error = np.abs(ref - exact).max()
    assert 0 < np.abs(ours - exact).max() <= FP32_ERROR_RATIO * eager_error
    assert ref[len(ids) - 1:].argmax(-1).tolist() == tokens
    assert "Paris" in smollm2.tokenizer.decode(tokens)
    broken = copy.deepcopy(smollm2.model)  # the negative control: a small real error
    down = broken.model.layers[10].mlp.down_proj.weight
    down.data.copy_(down.data.bfloat16().float())
    wrong = Session(TorchBackend(broken, layout)).forward(sequence).logits
    assert np.abs(wrong - exact).max() > FP32_ERROR_RATIO * eager_error
