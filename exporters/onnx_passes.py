"""The ONNX exporter's graph passes: the shared tables out of the graphs, weight transposes folded, MatMulNBits
quantization (int8 / int4, blocks of 32), the fp16 conversion, and saving with external data.

Input: the exported fp32 ModelProto; output: the graph the bundle ships (exporters/onnx.py calls these in order).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from edge_spec.contract import kv
from edge_spec.contract.formats import FORMATS, check_precision
from edge_spec.errors import ExportError
from edge_spec.logs import quiet

ONNX_DIR = "onnx"
TABLE_FILES = {kv.EMBED_TABLE: f"{ONNX_DIR}/embed_table.bin", kv.OUTPUT_TABLE: f"{ONNX_DIR}/output_table.bin",
               kv.EMBED_Q8: f"{ONNX_DIR}/embed_table_q8.bin", kv.EMBED_SCALES: f"{ONNX_DIR}/embed_table_scales.bin"}
QUANT_BLOCK = 32
# precision -> (weight bits, output-head bits, symmetric codes)
QUANT_BITS = {"int8": (8, 8, True), "int4": (4, 8, False)}  # precision -> (body bits, head bits, symmetric body)
# MatMulNBits with int8 activations: the only fast CPU kernels (fp32 activations, or float zero points, ran ~10x
# slower here, and 8-bit float zero points are refused), so int4's asymmetric codes keep the symmetric kernel and
# add a per-block offset term; int8 is symmetric like llama.cpp's Q8_0 and needs no offset term.
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


def quantize_blocks(w: np.ndarray, bits: int, block: int = QUANT_BLOCK, *, symmetric: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Block quantization of a MatMul weight w [K, N] (blocks of `block` along K, per output column).

    Returns (packed [N, K/block, block * bits / 8] uint8, scales [N * K/block], offsets [K/block, N] or None)
    with w[k, n] ~= (q[k, n] - 2^(bits-1)) * scale[n, k // block] (+ offset[k // block, n]), q in [0, 2^bits).
    Asymmetric: a block's min and max are represented exactly, so GGUF Q4_1 / Q8_1 weights (min + d * q) come
    back bit-exact (SmolLM2's built-in GGUF is Q4_1). Symmetric (no offset): scale = max |w| / (2^(bits-1) - 1),
    as llama.cpp's Q8_0.
    """
    k, n = w.shape
    kb = -(-k // block)
    wt = np.zeros((n, kb * block), dtype=np.float32)
    wt[:, :k] = w.T
    wt = wt.reshape(n, kb, block)
    zero = 2 ** (bits - 1)  # MatMulNBits' default zero point
    if symmetric:
        amax = np.abs(wt).max(-1)  # [N, kb]
        scale = np.where(amax > 0, amax / (zero - 1), 1.0).astype(np.float32)
        q = (np.clip(np.rint(wt / scale[..., None]), 1 - zero, zero - 1) + zero).astype(np.uint8)
        offset = None
    else:
        lo, hi = wt.min(-1), wt.max(-1)  # [N, kb]
        levels = 2 ** bits - 1
        scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
        q = np.clip(np.rint((wt - lo[..., None]) / scale[..., None]), 0, levels).astype(np.uint8)
        offset = np.ascontiguousarray((lo + zero * scale).astype(np.float32).T)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)  # two values per byte, the first in the low nibble
    return np.ascontiguousarray(q), scale.reshape(-1), offset


def _constant_weight(node, inits) -> np.ndarray | None:
    weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
        return None
    return numpy_helper.to_array(weight)


def _quantize_matmuls(proto: onnx.ModelProto, bits: int, head_bits: int, vocab_size: int,
                      symmetric: bool = False) -> None:
    """Every MatMul with a constant 2-D weight -> MatMulNBits(a) (+ (a @ block indicator) @ offsets if asymmetric).

    The offset term carries each block's minimum, so the fast symmetric kernel (no zero-point input) serves an
    asymmetric code. 8-bit weights (int8's, int4's output head) are always symmetric: llama.cpp's Q8_0 grid, which
    holds a Q8_0 GGUF table exactly and lets the head's bytes serve the embedding too (exporters/onnx_tables.py). `a @ indicator` (per-block sums of the activations) is shared by MatMuls of one input,
    and sibling MatMuls of one input (q/k/v, gate/up) become one wide MatMulNBits + Split: per-column maths
    is unchanged and SmolLM2's int8 graph loses 210 of its ~1,900 per-step ops. The output head
    (N == vocab) gets `head_bits`."""
    inits = _initializers(proto)
    weights = {node.output[0]: _constant_weight(node, inits) for node in proto.graph.node}
    siblings: dict[tuple, list] = {}  # (input, K, bits) -> MatMul nodes, in graph order
    for node in proto.graph.node:
        w = weights[node.output[0]]
        if w is not None:
            nbits = head_bits if w.shape[1] == vocab_size else bits
            siblings.setdefault((node.input[0], w.shape[0], nbits), []).append(node)
    nodes, block_sums, extra, done = [], {}, [], set()
    for node in proto.graph.node:
        if weights[node.output[0]] is None:
            nodes.append(node)
            continue
        if node.output[0] in done:
            continue
        a = node.input[0]
        w0 = weights[node.output[0]]
        group = siblings[(a, w0.shape[0], head_bits if w0.shape[1] == vocab_size else bits)]
        nbits = head_bits if w0.shape[1] == vocab_size else bits
        done.update(m.output[0] for m in group)
        w = np.concatenate([weights[m.output[0]] for m in group], axis=1)  # [K, sum N]
        k, n = w.shape
        sym = symmetric or nbits == 8  # 8-bit codes are symmetric (Q8_0's grid; int4's head: the table's bytes)
        packed, scales, offsets = quantize_blocks(w, nbits, symmetric=sym)
        base = f"{inits[node.input[1]].name}.q{nbits}" + (f".x{len(group)}" if len(group) > 1 else "")
        out = node.output[0] if len(group) == 1 else base + ".out"
        matmul = onnx.helper.make_node("MatMulNBits", [a, base, base + ".scales"],
                                       [out if sym else out + ".main"], name=base + ".q", domain="com.microsoft",
                                       K=k, N=n, bits=nbits, block_size=QUANT_BLOCK, accuracy_level=ACCURACY_LEVEL)
        extra += [numpy_helper.from_array(packed, base), numpy_helper.from_array(scales, base + ".scales")]
        if sym:
            nodes.append(matmul)
        else:
            if (a, k) not in block_sums:
                kb = offsets.shape[0]
                indicator = np.zeros((k, kb), dtype=np.float32)
                indicator[np.arange(k), np.arange(k) // QUANT_BLOCK] = 1.0
                name = f"{a}.block_sums{len(block_sums)}"
                extra.append(numpy_helper.from_array(indicator, name + ".indicator"))
                nodes.append(onnx.helper.make_node("MatMul", [a, name + ".indicator"], [name], name=name))
                block_sums[(a, k)] = name
            extra.append(numpy_helper.from_array(offsets, base + ".offsets"))
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


def quantize(proto: onnx.ModelProto, precision: str, vocab_size: int) -> onnx.ModelProto:
    """fp32 (as is) | fp16 (`to_float16`) | int8 (8-bit weights) | int4 (4-bit weights, 8-bit output head);
    blocks of 32, see `quantize_blocks`. Activations are quantized to int8 per block inside MatMulNBits
    (accuracy level 4)."""
    if precision == "fp32":
        return proto
    if precision == "fp16":
        return to_float16(proto)
    check_precision(FORMATS["onnx"], precision)
    _fold_weight_transposes(proto)
    bits, head_bits, symmetric = QUANT_BITS[precision]
    _quantize_matmuls(proto, bits, head_bits, vocab_size, symmetric)
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
