"""The ONNX exporter's graph passes: the shared tables out of the graphs, weight transposes folded, MatMulNBits
quantization (int8 / int4, blocks of 32), the fp16 conversion, and saving with external data.

Input: the exported fp32 ModelProto; output: the graph the bundle ships (exporters/onnx.py calls these in order).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from edge_spec.contract import kv
from edge_spec.exporters.grid_fit import fit_zero_point_grid
from edge_spec.contract.formats import FORMATS, check_precision
from edge_spec.errors import ExportError
from edge_spec.logs import quiet

ONNX_DIR = "onnx"
TABLE_FILES = {name: f"{ONNX_DIR}/{name}.bin" for name in (kv.EMBED_TABLE, kv.OUTPUT_TABLE, kv.EMBED_Q8, kv.EMBED_Q4,
                                                           kv.EMBED_SCALES, kv.EMBED_ZERO_POINTS)}
QUANT_BLOCK = 32
# the weight grids of a block of 32 (MatMulNBits' kernels with int8 activations, accuracy level 4, take the first two)
SYMMETRIC, ZERO_POINT, OFFSET = "symmetric", "zero_point", "offset"


@dataclass(frozen=True)
class Quant:
    """A quantized precision: the body's bits and grid, the output head's (a tied head's codes are the table)."""

    bits: int
    grid: str
    head_bits: int
    head_grid: str


QUANT = {
    # symmetric codes, llama.cpp's Q8_0 grid: no offset term (~14% faster than asymmetric codes)
    "int8": Quant(8, SYMMETRIC, 8, SYMMETRIC),
    # onnxruntime's native 4-bit grid: integer zero points, round-to-nearest over [min(lo, 0), max(hi, 0)] per block
    # (what onnxruntime's and onnxruntime-genai's quantizers build); the tied head and the table 4-bit too
    "int4": Quant(4, ZERO_POINT, 4, ZERO_POINT),
    # a GGUF's Q4_1 blocks (lo + d * q) bit for bit: symmetric codes + a per-block offset term (the block minimum),
    # which integer zero points cannot hold; 8-bit head (Q8_0's grid: a Q8_0 token table exactly)
    "int4-gguf": Quant(4, OFFSET, 8, SYMMETRIC),
}
# fp32 activations, or float zero points, ran ~10x slower here (docs/benchmarks.md), so every grid above keeps the
# int8-activation kernels
ACCURACY_LEVEL = 4


# ---- ------------------------------------
def _initializers(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in proto.graph.initializer}


def rename_embedding_table(proto: onnx.ModelProto, table: np.ndarray) -> None:
    """Name the initializer the token Gather reads `embed_table` (checked by value, not by exporter naming)."""
    inits = _initializers(proto)
    found = None
    for node in proto.graph.node:
        if node.op_type == "Gather" and node.input[1] == kv.INPUT_IDS and node.input[0] in inits:
            init = inits[node.input[0]]
            if tuple(init.dims) == table.shape and np.array_equal(numpy_helper.to_array(init), table):
                found = init.name
                break
    if found is None:
        raise ExportError("the exported target has no embedding Gather over input_ids with the embedding table")
    for node in proto.graph.node:
        node.input[:] = [kv.EMBED_TABLE if name == found else name for name in node.input]
    inits[found].name = kv.EMBED_TABLE


def _fold_weight_transposes(proto: onnx.ModelProto) -> None:
    """Transpose(2-D initializer) -> a transposed initializer, so quantizers see MatMuls with constant weights
    (the tied lm_head reads the embedding table through such a Transpose)."""
    inits = _initializers(proto)
    keep = []
    for node in proto.graph.node:
        src = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if src is not None and len(src.dims) == 2 and perm == [1, 0]:
            proto.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(src).T.copy(), node.output[0]))
            continue
        keep.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    _drop_unused_initializers(proto)


class Blocks(NamedTuple):
    """A MatMulNBits weight: codes [N, K/block, block * bits / 8] uint8 (two 4-bit codes per byte, the first in the
    low nibble), scales [N * K/block] float32, and per grid zero points [N * ceil(K/block * bits / 8)] uint8 (packed
    per column like the codes) or offsets [K/block, N] float32."""

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None = None
    offsets: np.ndarray | None = None


def _pack4(q: np.ndarray) -> np.ndarray:
    """[..., 2m] values in 0..15 -> [..., m] uint8, the first of each pair in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def quantize_blocks(w: np.ndarray, bits: int, block: int = QUANT_BLOCK, *, grid: str = SYMMETRIC,
                    stats: np.ndarray | None = None) -> Blocks:
    """Block quantization of a MatMul weight w [K, N] (blocks of `block` along K, per output column), q in
    [0, 2^bits), as `Blocks`:
      * symmetric: w = (q - 2^(bits-1)) * scale, scale = max |w| / (2^(bits-1) - 1) (llama.cpp's Q8_0 for 8 bits);
      * zero_point: w = (q - z) * scale, z an integer in [0, 2^bits), round-to-nearest over [min(lo, 0), max(hi, 0)]
        (onnxruntime's quantizer; the range holds 0 so that z is a code); with `stats` (the input channels' mean and
        mean square [K], exporters/calibration.linear_input_stats) each block's grid is `fit_zero_point_grid`'s;
      * offset: w = (q - 2^(bits-1)) * scale + offset, scale = (hi - lo) / (2^bits - 1): a block's min and max are
        exact, so GGUF Q4_1 / Q8_1 weights (lo + d * q) come back bit for bit.
    """
    k, n = w.shape
    kb = -(-k // block)
    wt = np.zeros((n, kb * block), dtype=np.float32)
    wt[:, :k] = w.T
    wt = wt.reshape(n, kb, block)
    levels, mid = 2 ** bits - 1, 2 ** (bits - 1)  # mid: MatMulNBits' default zero point
    zero_points = offsets = None
    if grid == SYMMETRIC:
        amax = np.abs(wt).max(-1)  # [N, kb]
        scale = np.where(amax > 0, amax / (mid - 1), 1.0).astype(np.float32)
        q = (np.clip(np.rint(wt / scale[..., None]), 1 - mid, mid - 1) + mid).astype(np.uint8)
    elif grid == ZERO_POINT:
        if stats is None:
            lo, hi = np.minimum(wt.min(-1), 0), np.maximum(wt.max(-1), 0)  # [N, kb]
            scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
            z = np.clip(np.rint(-lo / scale), 0, levels).astype(np.uint8)  # [N, kb]
            q = np.clip(np.rint(wt / scale[..., None]) + z[..., None], 0, levels).astype(np.uint8)
        else:
            mean, mean_sq = (np.pad(np.asarray(a, np.float64), (0, kb * block - k)).reshape(kb, block) for a in stats)
            scale, z = fit_zero_point_grid(wt, mean, np.maximum(mean_sq - mean * mean, 0), bits)
            q = np.clip(np.rint(wt / scale[..., None]) + z[..., None], 0, levels).astype(np.uint8)
        if bits == 4:
            z = _pack4(np.pad(z, ((0, 0), (0, kb % 2))))  # [N, ceil(kb / 2)]
        zero_points = np.ascontiguousarray(z.reshape(-1))
    elif grid == OFFSET:
        lo, hi = wt.min(-1), wt.max(-1)  # [N, kb]
        scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
        q = np.clip(np.rint((wt - lo[..., None]) / scale[..., None]), 0, levels).astype(np.uint8)
        offsets = np.ascontiguousarray((lo + mid * scale).astype(np.float32).T)
    else:
        raise ValueError(f"unknown grid {grid!r}: {SYMMETRIC}, {ZERO_POINT} or {OFFSET}")
    if bits == 4:
        q = _pack4(q)
    return Blocks(np.ascontiguousarray(q), scale.reshape(-1), zero_points, offsets)


def _constant_weight(node, inits) -> np.ndarray | None:
    weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
        return None
    return numpy_helper.to_array(weight)


def _quantize_matmuls(proto: onnx.ModelProto, quant: Quant, vocab_size: int, stats: dict | None = None) -> None:
    """Every MatMul with a constant 2-D weight -> MatMulNBits(a) on `quant`'s grid (the output head, N == vocab, on
    its head grid); the offset grid adds (a @ block indicator) @ offsets, which carries each block's minimum so that
    the fast kernel serves a Q4_1 code. `a @ indicator` (per-block sums of the activations) is shared by MatMuls of
    one input, and sibling MatMuls of one input (q/k/v, gate/up) become one wide MatMulNBits + Split: per-column
    maths is unchanged and SmolLM2's int8 graph loses 210 of its ~1,900 per-step ops. `stats`: the input channels'
    statistics per Linear (exporters/calibration.linear_input_stats, keyed by `linear_key`) for the zero-point grid's
    activation-aware fit; a MatMul without them (a drafter's) gets round-to-nearest."""
    inits = _initializers(proto)
    stats = stats or {}
    weights = {node.output[0]: _constant_weight(node, inits) for node in proto.graph.node}

    def grid_of(w: np.ndarray) -> tuple[int, str]:
        return (quant.head_bits, quant.head_grid) if w.shape[1] == vocab_size else (quant.bits, quant.grid)

    siblings: dict[tuple, list] = {}  # (input, K, bits, grid) -> MatMul nodes, in graph order
    for node in proto.graph.node:
        w = weights[node.output[0]]
        if w is not None:
            siblings.setdefault((node.input[0], w.shape[0], *grid_of(w)), []).append(node)
    nodes, block_sums, extra, done = [], {}, [], set()
    for node in proto.graph.node:
        if weights[node.output[0]] is None:
            nodes.append(node)
            continue
        if node.output[0] in done:
            continue
        a = node.input[0]
        w0 = weights[node.output[0]]
        nbits, grid = grid_of(w0)
        group = siblings[(a, w0.shape[0], nbits, grid)]
        done.update(m.output[0] for m in group)
        w = np.concatenate([weights[m.output[0]] for m in group], axis=1)  # [K, sum N]
        k, n = w.shape
        key = (k, np.ascontiguousarray(w[:, 0]).tobytes())  # calibration.linear_key of the first member
        q = quantize_blocks(w, nbits, grid=grid, stats=stats.get(key) if grid == ZERO_POINT else None)
        base = f"{inits[node.input[1]].name}.q{nbits}" + (f".x{len(group)}" if len(group) > 1 else "")
        out = node.output[0] if len(group) == 1 else base + ".out"
        inputs = [a, base, base + ".scales"] + ([base + ".zero_points"] if q.zero_points is not None else [])
        offset = q.offsets is not None
        matmul = onnx.helper.make_node("MatMulNBits", inputs, [out + ".main" if offset else out], name=base + ".q",
                                       domain="com.microsoft", K=k, N=n, bits=nbits, block_size=QUANT_BLOCK,
                                       accuracy_level=ACCURACY_LEVEL)
        extra += [numpy_helper.from_array(q.codes, base), numpy_helper.from_array(q.scales, base + ".scales")]
        if q.zero_points is not None:
            extra.append(numpy_helper.from_array(q.zero_points, base + ".zero_points"))
        if not offset:
            nodes.append(matmul)
        else:
            if (a, k) not in block_sums:
                kb = q.offsets.shape[0]
                indicator = np.zeros((k, kb), dtype=np.float32)
                indicator[np.arange(k), np.arange(k) // QUANT_BLOCK] = 1.0
                name = f"{a}.block_sums{len(block_sums)}"
                extra.append(numpy_helper.from_array(indicator, name + ".indicator"))
                nodes.append(onnx.helper.make_node("MatMul", [a, name + ".indicator"], [name], name=name))
                block_sums[(a, k)] = name
            extra.append(numpy_helper.from_array(q.offsets, base + ".offsets"))
            nodes += [
                matmul,
                onnx.helper.make_node("MatMul", [block_sums[(a, k)], base + ".offsets"], [out + ".offset"],
                                      name=base + ".offset"),
                onnx.helper.make_node("Add", [out + ".main", out + ".offset"], [out], name=base + ".add")]
        if len(group) > 1:
            sizes = np.array([weights[m.output[0]].shape[1] for m in group], dtype=np.int64)
            extra.append(numpy_helper.from_array(sizes, base + ".split"))
            nodes.append(onnx.helper.make_node("Split", [out, base + ".split"], [m.output[0] for m in group],
                                               name=base + ".split", axis=-1))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    proto.graph.initializer.extend(extra)
    _drop_unused_initializers(proto)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def _drop_unused_initializers(proto: onnx.ModelProto) -> None:
    used = {name for node in proto.graph.node for name in node.input} | {o.name for o in proto.graph.output}
    alive = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(alive)


def to_float16(proto: onnx.ModelProto) -> onnx.ModelProto:
    """fp16 weights and compute with onnxruntime's own converter; graph IO stays float32 (`keep_io_types`), so
    caches, masks and the runtime are the same as fp32. Nodes that read a shared table (`embed_table`,
    `output_table`: the raw fp32 files both graphs bind) stay fp32, so the table is neither converted nor cast
    per step; the tied output head gets its own fp16 copy (the Transpose is folded first). For accelerator
    providers (CoreML / QNN / GPU); on this x86 CPU fp16 plain decode is ~10% slower than fp32
    (docs/architecture.md)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    _fold_weight_transposes(proto)
    tables = set(TABLE_FILES)
    keep_fp32 = [n.name for n in proto.graph.node if tables & set(n.input)]
    table_inits = {}  # name -> a copy of the fp32 initializer, restored after conversion
    for t in proto.graph.initializer:
        if t.name in tables:
            table_inits[t.name] = onnx.TensorProto()
            table_inits[t.name].CopyFrom(t)
    with quiet("onnxruntime"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = convert_float_to_float16(proto, keep_io_types=True, node_block_list=keep_fp32,
                                       disable_shape_infer=True)
    # the converter stores float initializers as fp16 (and casts float graph inputs to fp16) and casts them back
    # for the fp32 nodes: undo both round trips for the tables (the raw fp32 files are the single copy)
    fp32_alias = {}  # Cast output -> the table it carries, for casts back to float32
    fp16_of = {}  # Cast output -> table, for casts of a table to fp16
    for node in out.graph.node:
        if node.op_type != "Cast":
            continue
        to = next(a.i for a in node.attribute if a.name == "to")
        src = node.input[0]
        table = src if src in tables else fp16_of.get(src) or fp32_alias.get(src)
        if table is not None:
            (fp32_alias if to == onnx.TensorProto.FLOAT else fp16_of)[node.output[0]] = table
    for node in out.graph.node:
        node.input[:] = [fp32_alias.get(name, name) for name in node.input]
    table_casts = fp32_alias.keys() | fp16_of.keys()
    kept = list(out.graph.node)
    while True:  # drop table casts nobody reads, back to front along each chain
        used = {name for node in kept for name in node.input} | {o.name for o in out.graph.output}
        alive = [n for n in kept
                 if not (n.op_type == "Cast" and n.output[0] in table_casts and n.output[0] not in used)]
        if len(alive) == len(kept):
            break
        kept = alive
    dangling = [n.name for n in kept if n.op_type == "Cast" and n.output[0] in table_casts]
    if dangling:
        raise ExportError(f"fp16 conversion left table casts that fp16 nodes still read: {dangling}")
    del out.graph.node[:]
    out.graph.node.extend(kept)
    for t in out.graph.initializer:
        if t.name in table_inits:
            t.CopyFrom(table_inits[t.name])
    _drop_unused_initializers(out)
    return out


def quantize(proto: onnx.ModelProto, precision: str, vocab_size: int, stats: dict | None = None) -> onnx.ModelProto:
    """fp32 (as is) | fp16 (`to_float16`) | int8 / int4 / int4-gguf (MatMulNBits on the grids of `QUANT`, blocks of
    32, see `quantize_blocks`; `stats`: see `_quantize_matmuls`). Activations are quantized to int8 per block inside
    MatMulNBits (accuracy level 4)."""
    if precision == "fp32":
        return proto
    if precision == "fp16":
        return to_float16(proto)
    check_precision(FORMATS["onnx"], precision)
    _fold_weight_transposes(proto)
    _quantize_matmuls(proto, QUANT[precision], vocab_size, stats)
    return proto


def save_graph(proto: onnx.ModelProto, path: Path, tables: dict[str, str]) -> None:
    """Write `path` + `path.data` (external weights); initializers named in `tables` (name -> file relative to
    path's folder, already written raw) are pointed at those files instead of being copied."""
    for init in proto.graph.initializer:
        if init.name in tables:
            nbytes = int(np.prod(init.dims)) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
            init.ClearField("raw_data")
            del init.float_data[:]
            del init.int32_data[:]
            del init.external_data[:]
            for key, value in (("location", tables[init.name]), ("offset", "0"), ("length", str(nbytes))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            init.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    for written in (path, path.with_name(path.name + ".data")):
        if written.exists():
            written.chmod(0o644)  # onnx creates the data file 0600; a bundle is meant to be copied and shared


def write_table(path: Path, array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    path.parent.mkdir(parents=True, exist_ok=True)
    array.tofile(path)
    return array
