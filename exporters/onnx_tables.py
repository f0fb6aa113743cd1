"""One quantized vocabulary table per int8 / int4 ONNX bundle: the tied output head's bytes also serve both embeddings.

A tied target's output head (`quantize` gives it its precision's head grid, blocks of 32 along the hidden size)
holds the same table as its input embedding. `share_table` makes that head's weight, scales (and zero points) the
bundle's shared tables and turns the target's embedding Gather into a gather over them; `quantize_drafter_table`
does the same to the drafter graph's table input. The float32 table (SmolLM2: 113 MB, gemma-3-270m: 671 MB) is
then written nowhere. `quantize_gather_tables` does the same to a drafter's own vocabulary-sized tables (its derived
token table), on the bundle's table grid.

Two forms (edge_spec/contract/kv.py):
  * 8 bits (int8, int4-gguf): kv.EMBED_Q8 [V, Ht/32, 32] + kv.EMBED_SCALES, llama.cpp's Q8_0 grid (scale =
    max |w| / 127), gathered by onnxruntime's GatherBlockQuantized. A GGUF whose token table is Q8_0 comes back bit
    for bit, so the embedding rows equal the float32 table's exactly.
  * 4 bits (int4, onnxruntime's native grid, as onnxruntime-genai's int4 models): kv.EMBED_Q4 [V, Ht/32, 16] +
    kv.EMBED_SCALES + kv.EMBED_ZERO_POINTS, exactly MatMulNBits' layout. The drafter graph reshapes its inputs to
    GatherBlockQuantized's 2-D layout (same bytes, no copy); the target graph, whose head's MatMulNBits also reads
    them, gathers its few rows by plain ops, (code - zero point) * scale - the same arithmetic, bit for bit
    (`_gather_nodes`).
An untied target keeps the float32 table (`share_table` returns None).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edge_spec.contract import kv
from edge_spec.errors import ExportError
from edge_spec.exporters.onnx_passes import SYMMETRIC, ZERO_POINT, quantize_blocks

GRIDS = {8: SYMMETRIC, 4: ZERO_POINT}  # a table's bits -> its grid
NAMES = {8: (kv.EMBED_Q8, kv.EMBED_SCALES), 4: (kv.EMBED_Q4, kv.EMBED_SCALES, kv.EMBED_ZERO_POINTS)}


def _attr(node, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)


def _const(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _gather8(prefix: str, inputs: list[str], idx: str, out: str, name: str) -> list:
    """GatherBlockQuantized over 8-bit codes [V, Ht/32, 32] and scales [V, Ht/32, 1] -> [*idx, Ht/32, 32]."""
    codes, _ = inputs
    return [helper.make_node("GatherBlockQuantized", [codes, idx, prefix + "scales3"], [out], name=name + ".q8",
                             domain="com.microsoft", bits=8, block_size=kv.TABLE_BLOCK, gather_axis=0,
                             quantize_axis=2)]


def _gather4(prefix: str, inputs: list[str], idx: str, out: str, name: str) -> list:
    """Codes [V, Ht/32, 16], flat scales [V * Ht/32] and flat zero points [V * ceil(Ht/64)] -> the rows
    (code - zero point) * scale as [*idx, Ht/32, 16, 2] float32 (flattened in the caller: byte j of a block holds its
    codes 2j (low nibble) and 2j + 1). Scales and zero points are gathered from the flat arrays by computed indices
    (row * per-row count + block), so nothing is reshaped or copied whatever idx's rank."""
    codes, scales, zero_points = inputs
    mk = helper.make_node
    return [
        mk("Gather", [codes, idx], [name + ".c"], name=name + ".c"),  # [*idx, Ht/32, 16] uint8
        mk("BitwiseAnd", [name + ".c", prefix + "mask"], [name + ".lo"], name=name + ".lo"),
        mk("BitShift", [name + ".c", prefix + "four"], [name + ".hi"], name=name + ".hi", direction="RIGHT"),
        mk("Unsqueeze", [name + ".lo", prefix + "last"], [name + ".lo1"], name=name + ".lo1"),
        mk("Unsqueeze", [name + ".hi", prefix + "last"], [name + ".hi1"], name=name + ".hi1"),
        mk("Concat", [name + ".lo1", name + ".hi1"], [name + ".q8"], name=name + ".q8", axis=-1),  # [.., 16, 2]
        mk("Cast", [name + ".q8"], [name + ".q"], name=name + ".q", to=onnx.TensorProto.FLOAT),
        mk("Unsqueeze", [idx, prefix + "last"], [name + ".i1"], name=name + ".i1"),  # [*idx, 1]
        mk("Mul", [name + ".i1", prefix + "blocks"], [name + ".ib"], name=name + ".ib"),
        mk("Add", [name + ".ib", prefix + "block_ids"], [name + ".si"], name=name + ".si"),  # [*idx, Ht/32]
        mk("Gather", [scales, name + ".si"], [name + ".s"], name=name + ".s"),
        mk("Mul", [name + ".i1", prefix + "zp_bytes"], [name + ".iz"], name=name + ".iz"),
        mk("Add", [name + ".iz", prefix + "zp_byte_ids"], [name + ".zi"], name=name + ".zi"),  # [*idx, Ht/32]
        mk("Gather", [zero_points, name + ".zi"], [name + ".zb"], name=name + ".zb"),  # the byte of each block's zp
        mk("BitShift", [name + ".zb", prefix + "zp_shifts"], [name + ".zs"], name=name + ".zs", direction="RIGHT"),
        mk("BitwiseAnd", [name + ".zs", prefix + "mask"], [name + ".z8"], name=name + ".z8"),
        mk("Cast", [name + ".z8"], [name + ".z"], name=name + ".z", to=onnx.TensorProto.FLOAT),
        mk("Unsqueeze", [name + ".z", prefix + "last2"], [name + ".z4"], name=name + ".z4"),  # [*idx, Ht/32, 1, 1]
        mk("Unsqueeze", [name + ".s", prefix + "last2"], [name + ".s4"], name=name + ".s4"),
        mk("Sub", [name + ".q", name + ".z4"], [name + ".d"], name=name + ".d"),
        mk("Mul", [name + ".d", name + ".s4"], [out], name=name + ".w")]


def _gather_nodes(proto: onnx.ModelProto, table: str, inputs: list[str], vocab: int, hidden: int, bits: int,
                  reshaped: bool = True) -> tuple[list, list]:
    """Every `Gather(table, idx)` -> a gather over the quantized table `inputs` (NAMES' order) + a reshape to
    idx.shape + [Ht]. Returns (nodes in graph order, constant initializers they need). 4 bits, `reshaped`: the
    inputs are graph inputs (bound buffers, which a Reshape aliases) or initializers nothing else reads, so they are
    reshaped to GatherBlockQuantized's 2-D layout ([V, Ht/2] codes, [V, Ht/32] scales, [V, ceil(Ht/64)] zero points:
    the same bytes), ~2.5x faster than the plain ops on a drafter's ~768 candidate rows; not `reshaped` (the target
    graph's table, which its head's MatMulNBits also reads: onnxruntime would fold a Reshape of it into a second
    copy): the plain ops of `_gather4`."""
    blocks = hidden // kv.TABLE_BLOCK
    prefix = table + "."
    u8 = lambda name, values: numpy_helper.from_array(np.array(values, dtype=np.uint8), prefix + name)  # noqa: E731
    consts = [_const(prefix + "hidden", [hidden])]
    setup = []
    if bits == 4 and reshaped:
        consts += [_const(prefix + "codes_shape", [vocab, hidden // 2]), _const(prefix + "scales_shape", [vocab, blocks]),
                   _const(prefix + "zp_shape", [vocab, -(-blocks // 2)])]
        setup = [helper.make_node("Reshape", [src, prefix + part + "_shape"], [prefix + part + "2"],
                                  name=prefix + part + "2") for src, part in zip(inputs, ("codes", "scales", "zp"))]
    elif bits == 8:
        consts.append(_const(prefix + "scales_shape", [vocab, blocks, 1]))
        setup = [helper.make_node("Reshape", [inputs[1], prefix + "scales_shape"], [prefix + "scales3"],
                                  name=prefix + "scales3")]  # [V, Ht/32, 1]: one scale per block
    else:
        ids = np.arange(blocks)
        consts += [u8("mask", 15), u8("four", 4), u8("zp_shifts", 4 * (ids % 2)), _const(prefix + "last", [-1]),
                   _const(prefix + "last2", [-1, -2]), _const(prefix + "blocks", [blocks]),
                   _const(prefix + "block_ids", list(ids)), _const(prefix + "zp_bytes", [-(-blocks // 2)]),
                   _const(prefix + "zp_byte_ids", list(ids // 2))]
    nodes, first = [], True
    for node in proto.graph.node:
        if table not in node.input:
            nodes.append(node)
            continue
        if node.op_type != "Gather" or node.input[0] != table or (_attr(node, "axis") or 0) != 0:
            raise ExportError(f"{node.op_type} node {node.name} reads the table {table} other than by a row Gather",
                              "export this model at fp32 or fp16 (int8 / int4 tables are only gathered)")
        if first:
            nodes += setup
            first = False
        out, idx = node.output[0], node.input[1]
        name = node.name or out
        if bits == 8:
            nodes += _gather8(prefix, inputs, idx, out + ".blocks", name)
        elif reshaped:  # [*idx, Ht]
            nodes.append(helper.make_node(
                "GatherBlockQuantized", [prefix + "codes2", idx, prefix + "scales2", prefix + "zp2"], [out + ".blocks"],
                name=name + ".q4", domain="com.microsoft", bits=4, block_size=kv.TABLE_BLOCK, gather_axis=0,
                quantize_axis=1))
        else:
            nodes += _gather4(prefix, inputs, idx, out + ".blocks", name)
        nodes += [  # [*idx, Ht/32, 32] (or [*idx, Ht/32, 16, 2]) -> [*idx, Ht]
            helper.make_node("Shape", [idx], [out + ".idx_shape"], name=name + ".idx_shape"),
            helper.make_node("Concat", [out + ".idx_shape", prefix + "hidden"], [out + ".shape"], name=name + ".shape",
                             axis=0),
            helper.make_node("Reshape", [out + ".blocks", out + ".shape"], [out], name=name + ".rows")]
    return nodes, consts


def _replace(proto: onnx.ModelProto, nodes: list, consts: list) -> None:
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    proto.graph.initializer.extend(consts)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _drop(proto: onnx.ModelProto, name: str) -> None:
    alive = [t for t in proto.graph.initializer if t.name != name]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(alive)


def on_grid(table: np.ndarray, bits: int, scales: np.ndarray, zero_points: np.ndarray | None = None) -> np.ndarray:
    """`table` [V, Ht] rounded onto a head's own grid (its scales [V * Ht/32] and packed zero points, else the
    symmetric zero point 2^(bits-1)), packed as MatMulNBits' codes [V, Ht/32, 32 * bits / 8]: the head's codes
    exactly when the head is this table (whatever fit chose the grid: onnx_passes.fit_zero_point_grid)."""
    vocab, hidden = table.shape
    blocks = table.reshape(vocab, -1, kv.TABLE_BLOCK).astype(np.float32)
    scale = scales.reshape(vocab, -1)
    zero = np.full(scale.shape, 2 ** (bits - 1), np.float32)
    if zero_points is not None:
        z = zero_points.reshape(vocab, -1)
        zero = (np.stack([z & 15, z >> 4], -1).reshape(vocab, -1) if bits == 4 else z)[:, :scale.shape[1]]
    q = np.clip(np.rint(blocks / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1).astype(np.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4) if bits == 4 else q


def share_table(proto: onnx.ModelProto, table: np.ndarray) -> dict[str, np.ndarray] | None:
    """The quantized target graph `proto` with its tied head's weight, scales (and zero points) renamed to the
    shared tables and its embedding Gather reading them. `table`: the float32 embedding [V, Ht]. Returns the
    tables to write (name -> array, kv.EMBED_Q8 / EMBED_Q4 ...), or None (proto untouched) when the head is not
    this table on its own grid (an untied target) or Ht is not a whole number of blocks."""
    vocab, hidden = table.shape
    if hidden % kv.TABLE_BLOCK:
        return None
    heads = [n for n in proto.graph.node if n.op_type == "MatMulNBits" and _attr(n, "N") == vocab
             and _attr(n, "bits") in GRIDS]
    if len(heads) != 1:
        return None
    head, bits = heads[0], _attr(heads[0], "bits")
    names = NAMES[bits]
    if len(head.input) < 1 + len(names):
        return None
    inits = {t.name: t for t in proto.graph.initializer}
    have = [numpy_helper.to_array(inits[name]) for name in head.input[1:1 + len(names)]]  # (a bias may follow)
    if not np.array_equal(have[0], on_grid(table, bits, *have[1:])):
        return None  # untied: the head is another matrix
    for name, new in zip(head.input[1:1 + len(names)], names):
        inits[name].name = new
    head.input[1:1 + len(names)] = list(names)
    nodes, consts = _gather_nodes(proto, kv.EMBED_TABLE, list(names), vocab, hidden, bits, reshaped=False)
    _replace(proto, nodes, consts)
    _drop(proto, kv.EMBED_TABLE)
    return dict(zip(names, have))


def quantize_drafter_table(proto: onnx.ModelProto, vocab: int, hidden: int, bits: int) -> None:
    """The drafter graph's `embed_table` input [V, Ht] float32 -> the shared quantized table's inputs
    (kv.table_specs), gathered (the drafter only reads rows of it: its token's embedding, its candidates' rows)."""
    nodes, consts = _gather_nodes(proto, kv.EMBED_TABLE, list(NAMES[bits]), vocab, hidden, bits)
    _replace(proto, nodes, consts)
    inputs = []
    for value in proto.graph.input:
        if value.name != kv.EMBED_TABLE:
            inputs.append(value)
            continue
        for spec in kv.table_specs(vocab, hidden, bits):
            dtype = {"uint8": onnx.TensorProto.UINT8, "float32": onnx.TensorProto.FLOAT}[spec.dtype]
            inputs.append(helper.make_tensor_value_info(spec.name, dtype, list(spec.shape)))
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)


def quantize_gather_tables(proto: onnx.ModelProto, vocab: int, bits: int) -> list[str]:
    """A graph's own vocabulary-sized float32 tables that are only gathered (a drafter's table derived from its
    target's embedding: gemma-3-270m's is 262,144 x 256, 268 MB) -> `bits`-bit codes on GRIDS' grid, gathered as
    the shared table is. Returns the names of the tables it quantized."""
    done = []
    for init in list(proto.graph.initializer):
        dims = tuple(init.dims)
        if init.data_type != onnx.TensorProto.FLOAT or len(dims) != 2 or dims[0] != vocab or dims[1] % kv.TABLE_BLOCK:
            continue
        readers = [n for n in proto.graph.node if init.name in n.input]
        if not readers or any(n.op_type != "Gather" or n.input[0] != init.name or (_attr(n, "axis") or 0) != 0
                              for n in readers):
            continue
        q = quantize_blocks(numpy_helper.to_array(init).T, bits, kv.TABLE_BLOCK, grid=GRIDS[bits])
        name = init.name
        names = [f"{name}.q{bits}", f"{name}.scales", f"{name}.zero_points"][:len(NAMES[bits])]
        arrays = [a for a in q if a is not None]
        nodes, consts = _gather_nodes(proto, name, names, vocab, dims[1], bits)
        _replace(proto, nodes, consts + [numpy_helper.from_array(a, n) for a, n in zip(arrays, names)])
        _drop(proto, name)
        done.append(name)
    return done
