"""ONNX quantized bundles: the weight grids (exporters/onnx_passes.quantize_blocks) against their definitions, one
quantized vocabulary table per bundle (exporters/onnx_tables.py) gathered exactly, logits within measured bounds of
eager fp32, greedy speculative == plain, and verify rows bit-identical to decode steps in every precision."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edge_spec.api import load_bundle
from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.contract.manifest import read_manifest, read_table
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.exporters import onnx_passes, onnx_tables
from edge_spec.exporters.onnx import export_bundle
from edge_spec.runtimes.torch import TorchBackend
from tests.contract import differing_windows, host_checked_session
from tests.parity import prompt_ids

GREEDY = SamplingParams()
QUANTIZED = ["int8", "int4", "int4-gguf"]
# Quantized vs fp32 eager on the tiny random llama, 24 positions x 3 prompts (measured): max |diff| / max |logit|
# fp16 0.025%, int8 0.85% (symmetric codes), int4-gguf 6.9-8.4%, int4 (zero points, 4-bit head) 8.8%; top-1
# agreement 1.0 for all. Bounds leave ~3x headroom. (SmolLM2 and gemma-3-270m: docs/benchmarks.md.)
# precision -> (relative max diff, min top-1 agreement)
QUANT_BOUNDS = {"fp16": (1e-3, 1.0), "int8": (0.03, 0.9), "int4": (0.25, 0.85), "int4-gguf": (0.25, 0.85)}


@pytest.fixture(scope="module")
def llama(tiny_bundles):
    """Tiny llama + a clustered drafter scoring with the *target's* (tied) output table, fp32 (tests/contract.py)."""
    return tiny_bundles.get("onnx", "llama")


# ---- the grids -------------------------------------------------------------------------------------------------
def unpack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[N, kb, block * bits / 8] uint8 -> [N, kb, block] int32, the low nibble first."""
    q = codes.astype(np.int32)
    return np.stack([q & 15, q >> 4], -1).reshape(q.shape[0], q.shape[1], -1) if bits == 4 else q


def dequantize(b: onnx_passes.Blocks, bits: int, k: int) -> np.ndarray:
    """The inverse of `quantize_blocks`, written out: w[k, n] = (q - zero) * scale (+ offset)."""
    q = unpack(b.codes, bits)
    n, kb, block = q.shape
    zero = np.full((n, kb), 2 ** (bits - 1))
    if b.zero_points is not None:
        z = b.zero_points.reshape(n, -1).astype(np.int32)
        zero = (np.stack([z & 15, z >> 4], -1).reshape(n, -1) if bits == 4 else z)[:, :kb]
    w = (q - zero[..., None]) * b.scales.reshape(n, kb, 1)
    if b.offsets is not None:
        w = w + b.offsets.T[..., None]
    return w.reshape(n, kb * block)[:, :k].T


def test_offset_grid_is_exact_on_q4_1_weights():
    rng = np.random.default_rng(0)
    k, n, block = 64, 6, onnx_passes.QUANT_BLOCK
    # GGUF Q4_1-like weights: per block of 32 along K, min + d * j with j in 0..15 (both ends present)
    lo, d = rng.normal(size=(k // block, n)), rng.uniform(0.01, 0.1, (k // block, n))
    j = rng.integers(0, 16, (k, n))
    j[0::block], j[1::block] = 0, 15
    w = (np.repeat(lo, block, 0) + np.repeat(d, block, 0) * j).astype(np.float32)
    for bits in (4, 8):
        b = onnx_passes.quantize_blocks(w, bits, grid=onnx_passes.OFFSET)
        assert b.zero_points is None
        np.testing.assert_allclose(dequantize(b, bits, k), w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("grid, bits", [(onnx_passes.SYMMETRIC, 8), (onnx_passes.ZERO_POINT, 4),
                                        (onnx_passes.ZERO_POINT, 8)])
def test_native_grids_round_to_nearest_within_half_a_step(grid, bits):
    rng = np.random.default_rng(1)
    k, n, block = 96, 5, onnx_passes.QUANT_BLOCK  # 3 blocks: an odd count pads the packed zero points
    w = rng.normal(size=(k, n)).astype(np.float32)
    w[:block, 0] = np.abs(w[:block, 0])  # an all-positive block: its range is stretched to hold 0
    b = onnx_passes.quantize_blocks(w, bits, grid=grid)
    assert b.offsets is None and (b.zero_points is None) == (grid == onnx_passes.SYMMETRIC)
    step = np.repeat(b.scales.reshape(n, -1).T, block, 0)  # [K, N]
    err = np.abs(dequantize(b, bits, k) - w)
    assert (err <= step / 2 + 1e-6).all()
    blocks = w.reshape(-1, block, n)
    if grid == onnx_passes.SYMMETRIC:
        assert np.allclose(step * 127, np.abs(blocks).max(1).repeat(block, 0))
    else:
        lo, hi = np.minimum(blocks.min(1), 0), np.maximum(blocks.max(1), 0)  # [kb, N]
        assert np.allclose(step, ((hi - lo) / (2 ** bits - 1)).repeat(block, 0))
        if bits == 4:
            assert b.zero_points.shape == (n * 2,)  # ceil(3 / 2) bytes per column


def _run(nodes, inits, inputs, feeds):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("hidden", [64, 96])
def test_zero_point_blocks_are_what_matmulnbits_and_the_4_bit_gather_compute(hidden):
    """The layout is onnxruntime's: MatMulNBits over `quantize_blocks`' arrays computes x @ dequantize(w) (within its
    int8 activations), and the table's 4-bit gather (onnx_tables) returns dequantize's rows bit for bit, for any
    index rank."""
    rng = np.random.default_rng(2)
    vocab = 40
    table = rng.normal(size=(vocab, hidden)).astype(np.float32)  # [V, Ht]
    b = onnx_passes.quantize_blocks(table.T, 4, grid=onnx_passes.ZERO_POINT)
    rows = dequantize(b, 4, hidden).T  # [V, Ht]
    x = rng.normal(size=(1, hidden)).astype(np.float32)
    mm = helper.make_node("MatMulNBits", ["x", "c", "s", "z"], ["y"], domain="com.microsoft", K=hidden, N=vocab,
                          bits=4, block_size=32, accuracy_level=4)
    inits = [numpy_helper.from_array(a, n) for a, n in zip((b.codes, b.scales, b.zero_points), "csz")]
    x_in = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, hidden])
    y = _run([mm], inits, [x_in], {"x": x})
    assert np.abs(y - x @ rows.T).max() <= 0.02 * np.abs(x @ rows.T).max()
    gather = helper.make_node("Gather", [kv.EMBED_TABLE, "idx"], ["y"], name="g")
    proto = helper.make_model(helper.make_graph(
        [gather], "g", [helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]))
    idx_in = helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, None)
    names = onnx_tables.NAMES[4]
    tables = [numpy_helper.from_array(a, n) for a, n in zip((b.codes, b.scales, b.zero_points), names)]
    for reshaped in (False, True):  # the target's plain ops, the drafter's GatherBlockQuantized
        nodes, consts = onnx_tables._gather_nodes(proto, kv.EMBED_TABLE, list(names), vocab, hidden, 4, reshaped)
        assert any(n.op_type == "GatherBlockQuantized" for n in nodes) == reshaped
        for idx in (np.array([3, 39, 0]), np.array([[5, 7]]), np.array([[[1]]])):
            got = _run(nodes, consts + tables, [idx_in], {"idx": idx})
            assert got.shape == idx.shape + (hidden,) and np.array_equal(got, rows[idx].astype(np.float32))


# ---- bundles ----------------------------------------------------------------------------------------------------
def check_fp16_graphs(folder, manifest):
    """fp16 weights inside, float32 at every graph boundary, the shared tables left as the raw fp32 files."""
    for entry in manifest.graphs.values():
        proto = onnx.load(folder / entry.file, load_external_data=False)
        floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
        weights = [t for t in proto.graph.initializer if len(t.dims) == 2 and min(t.dims) > 1
                   and t.data_type in floats and t.name not in onnx_passes.TABLE_FILES]
        assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
        tables = [t for t in proto.graph.initializer if t.name in onnx_passes.TABLE_FILES]
        assert all(t.data_type == onnx.TensorProto.FLOAT and t.data_location == onnx.TensorProto.EXTERNAL
                   for t in tables)
        assert not any(n.op_type == "Cast" and n.input[0] in onnx_passes.TABLE_FILES for n in proto.graph.node)
        io = list(proto.graph.input) + list(proto.graph.output)
        assert all(v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16 for v in io)


def check_one_quantized_table(folder, manifest, target, precision):
    """A tied target: one quantized table (the head's bytes, on the head's grid: 8-bit Q8_0 for int8 / int4-gguf,
    4-bit with zero points for int4), no float copy in any file, read by both graphs' gathers."""
    bits = onnx_passes.QUANT[precision].head_bits
    names = onnx_tables.NAMES[bits]
    assert set(manifest.tables) == set(names)
    assert not any(rel.endswith(("embed_table.bin", "output_table.bin")) for rel in manifest.files)
    have = [read_table(folder, manifest.tables[n]) for n in names]
    table = target.model.model.embed_tokens.weight.detach().numpy()
    assert np.array_equal(have[0], onnx_tables.on_grid(table, bits, *have[1:]))  # the table on the head's own grid
    if precision == "int8":  # Q8_0's grid exactly (int4's grid is fitted per block)
        want = onnx_passes.quantize_blocks(table.T, bits, grid=onnx_tables.GRIDS[bits])
        assert np.array_equal(have[1], want.scales)
    for role in manifest.graphs:
        graph = onnx.load(folder / manifest.graphs[role].file, load_external_data=False).graph
        read = {i for n in graph.node for i in n.input}
        assert set(names) <= read and kv.EMBED_TABLE not in read, role
        head = [n for n in graph.node if n.op_type == "MatMulNBits" and names[0] in n.input]
        assert len(head) == (role == "target"), role  # the target's head reads the table's own bytes


@pytest.mark.parametrize("precision", ["fp16"] + QUANTIZED)
def test_quantized_bundle_logits_within_bound_and_speculative_exact(llama, tmp_path, precision):
    _, target, drafter = llama
    folder = export_bundle(target, tmp_path / precision, drafter=drafter, precision=precision, max_context=64)
    manifest = read_manifest(folder)
    assert manifest.precision == precision and manifest.graphs["target"].precision == precision
    graph = onnx.load(folder / manifest.graphs["target"].file, load_external_data=False).graph
    nbits = [(n.input[0], next(a.i for a in n.attribute if a.name == "bits")) for n in graph.node
             if n.op_type == "MatMulNBits"]
    layers = target.config.num_layers  # q/k/v fused, o, gate/up fused, down; + the head
    if precision == "fp16":
        check_fp16_graphs(folder, manifest)
    else:
        assert len(nbits) == len(set(nbits)) == 4 * layers + 1, "sibling MatMuls of one input must be fused"
        offsets = [n for n in graph.node if n.op_type == "MatMul"]
        assert bool(offsets) == (precision == "int4-gguf"), "only the GGUF-exact form pays an offset term"
        check_one_quantized_table(folder, manifest, target, precision)
    engine = load_bundle(folder, threads=1)
    ours, ref = engine.session, Session(TorchBackend(target.model, manifest.layout))
    ids = prompt_ids(24, seed=11)
    a, b = ours.forward(ids).logits, ref.forward(ids).logits
    max_diff, min_agree = QUANT_BOUNDS[precision]
    assert np.abs(a - b).max() <= max_diff * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= min_agree
    ours.reset()
    expected = generate_plain(ours, ids[:8], max_new_tokens=24, params=GREEDY, rng=np.random.default_rng(0),
                              stop_ids=frozenset()).tokens
    out = generate_speculative(ours, engine.drafter, ids[:8], max_new_tokens=24, params=GREEDY,
                               rng=np.random.default_rng(0), stop_ids=frozenset(), k=2, vocab_size=320)
    assert out.tokens == expected


@pytest.mark.parametrize("precision", ["fp16"] + QUANTIZED)  # fp32: tests/test_contract.py
def test_quantized_verify_rows_are_bit_identical_to_decode_steps(llama, tmp_path, precision):
    """The property greedy exactness rests on: a T=k+1 verify pass gives, row for row, the *same bits* as k+1
    T=1 decode steps (batch-invariant attention, edge_spec.model.attention.attend_slots), in the row mode the host check
    picks: one-token passes as they are where this CPU's one-row kernels sum like its multi-row ones, else with a
    masked dummy row (AMD AVX2: onnxruntime's 4-bit MatMulNBits). int8 activations inside MatMulNBits amplify any
    1-ulp difference, so quantized graphs are where a split would show. Positions 58..69 cross a bucket edge
    (64), so decode and verify also bind different cache lengths."""
    _, target, _ = llama
    folder = export_bundle(target, tmp_path / precision, precision=precision, max_context=160)
    session = host_checked_session(folder)
    assert differing_windows(session, prompt_ids(70, seed=5), ((58, 6), (61, 5), (40, 2), (64, 4))) == []


def _expected_error(wt, scale, zero, mean, var):
    """sum_i var_i e_i^2 + (sum_i mean_i e_i)^2 per block, written out with a loop over blocks."""
    n, kb, _ = wt.shape
    out = np.zeros((n, kb))
    for r in range(n):
        for b in range(kb):
            q = np.clip(np.rint(wt[r, b] / scale[r, b]) + zero[r, b], 0, 15)
            e = (q - zero[r, b]) * scale[r, b] - wt[r, b]
            out[r, b] = (var[b] * e * e).sum() + (mean[b] * e).sum() ** 2
    return out


def test_fitted_zero_point_grid_never_loses_to_round_to_nearest_and_beats_it_on_shifted_blocks():
    """fit_zero_point_grid's pick has, block by block, an expected output error no larger than round-to-nearest's
    (which is one of its candidates); on Q4_1-like blocks (lo + d * j) fed by activations with a large mean, where
    round-to-nearest shifts the whole block one way, it is clearly smaller."""
    rng = np.random.default_rng(3)
    n, kb, block = 16, 4, onnx_passes.QUANT_BLOCK
    lo, d = rng.normal(size=(n, kb, 1)), rng.uniform(0.02, 0.1, (n, kb, 1))
    wt = (lo + d * rng.integers(0, 16, (n, kb, block))).astype(np.float32)  # [N, kb, B]
    mean = rng.normal(size=(kb, block)) * 3 + 2  # channels whose mean is far from 0
    var = rng.uniform(0.5, 2, (kb, block))
    scale, zero = onnx_passes.fit_zero_point_grid(wt, mean, var, 4)
    assert scale.dtype == np.float32 and zero.dtype == np.uint8 and zero.max() <= 15
    fitted = _expected_error(wt, scale, zero.astype(np.float32), mean, var)
    rtn = onnx_passes.quantize_blocks(wt.reshape(n, -1).T, 4, grid=onnx_passes.ZERO_POINT)
    z = rtn.zero_points.reshape(n, -1)
    rtn_zero = np.stack([z & 15, z >> 4], -1).reshape(n, -1)[:, :kb].astype(np.float32)
    plain = _expected_error(wt, rtn.scales.reshape(n, kb), rtn_zero, mean, var)
    assert (fitted <= plain * (1 + 1e-5)).all()
    assert fitted.sum() < 0.7 * plain.sum()


def test_int4_export_calibrates_every_target_matmul(llama, tmp_path, monkeypatch):
    """int4 fits every target MatMul's grid (the head too) to its inputs' statistics: each one finds its Linear's
    calibration by `linear_key`, none falls back to round-to-nearest silently; int8 and int4-gguf do not calibrate."""
    _, target, _ = llama
    fitted = []
    real = onnx_passes.fit_zero_point_grid
    monkeypatch.setattr(onnx_passes, "fit_zero_point_grid", lambda wt, *a: fitted.append(wt.shape) or real(wt, *a))
    export_bundle(target, tmp_path / "int4", precision="int4", max_context=64)
    layers = target.config.num_layers  # q/k/v fused, o, gate/up fused, down; + the head
    assert len(fitted) == 4 * layers + 1 and (target.config.vocab_size, target.config.hidden_size // 32, 32) in fitted
    fitted.clear()
    export_bundle(target, tmp_path / "int8", precision="int8", max_context=64)
    assert not fitted
