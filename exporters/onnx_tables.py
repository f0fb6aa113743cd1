"""One 8-bit vocabulary table per int8 / int4 ONNX bundle: the tied output head's bytes also serve both embeddings.

A tied target's output head (`quantize` gives it 8-bit symmetric codes, blocks of 32 along the hidden size) holds
the same table as its input embedding. `share_table` makes that head weight and its scales the bundle's shared
tables (kv.EMBED_Q8 [V, Ht/32, 32] uint8, kv.EMBED_SCALES [V * Ht/32] float32) and turns the target's embedding
Gather into onnxruntime's GatherBlockQuantized over them; `quantize_drafter_table` does the same to the drafter
graph's table input. The float32 table (SmolLM2: 113 MB, gemma-3-270m: 671 MB) is then written nowhere.
`quantize_gather_tables` does the same to a drafter's own vocabulary-sized tables (its derived token table).

The 8-bit grid is llama.cpp's Q8_0 (scale = max |w| / 127): a GGUF whose token table is Q8_0 (SmolLM2's built-in
one) comes back bit for bit, so the embedding rows equal the float32 table's exactly. An untied target keeps the
float32 table (`share_table` returns None).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edge_spec.contract import kv
from edge_spec.errors import ExportError
from edge_spec.exporters.onnx_passes import quantize_blocks

TABLE_BITS = 8


def _attr(node, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)


def _gather_nodes(proto: onnx.ModelProto, table: str, codes: str, scales: str, vocab: int, hidden: int
                  ) -> tuple[list, list]:
    """Every `Gather(table, idx)` -> GatherBlockQuantized over the 8-bit `codes` [V, Ht/32, 32] and `scales`
    [V * Ht/32] + a reshape to idx.shape + [Ht]. Returns (nodes in graph order, constant initializers they need)."""
    blocks = hidden // kv.TABLE_BLOCK
    prefix = table + "."
    consts = [numpy_helper.from_array(np.array([vocab, blocks, 1], dtype=np.int64), prefix + "scales_shape"),
              numpy_helper.from_array(np.array([hidden], dtype=np.int64), prefix + "hidden")]
    scales3 = prefix + "scales3"  # [V, Ht/32, 1]: one scale per block, as GatherBlockQuantized takes them
    nodes, first = [], True
    for node in proto.graph.node:
        if table not in node.input:
            nodes.append(node)
            continue
        if node.op_type != "Gather" or node.input[0] != table or (_attr(node, "axis") or 0) != 0:
            raise ExportError(f"{node.op_type} node {node.name} reads the table {table} other than by a row Gather",
                              "export this model at fp32 or fp16 (int8 / int4 tables are only gathered)")
        if first:
            nodes.append(helper.make_node("Reshape", [scales, prefix + "scales_shape"], [scales3],
                                          name=prefix + "scales3"))
            first = False
        out, idx = node.output[0], node.input[1]
        name = node.name or out
        nodes += [
            helper.make_node("GatherBlockQuantized", [codes, idx, scales3], [out + ".blocks"], name=name + ".q8",
                             domain="com.microsoft", bits=TABLE_BITS, block_size=kv.TABLE_BLOCK, gather_axis=0,
                             quantize_axis=2),  # [*idx.shape, Ht/32, 32]
            helper.make_node("Shape", [idx], [out + ".idx_shape"], name=name + ".idx_shape"),
            helper.make_node("Concat", [out + ".idx_shape", prefix + "hidden"], [out + ".shape"], name=name + ".shape",
                             axis=0),
            helper.make_node("Reshape", [out + ".blocks", out + ".shape"], [out], name=name + ".rows")]  # [*idx, Ht]
    return nodes, consts


def _replace(proto: onnx.ModelProto, nodes: list, consts: list) -> None:
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    proto.graph.initializer.extend(consts)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def share_table(proto: onnx.ModelProto, table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The quantized target graph `proto` with its tied 8-bit head's weight and scales renamed to the shared tables
    and its embedding Gather reading them. `table`: the float32 embedding [V, Ht]. Returns (codes [V, Ht/32, 32] uint8,
    scales [V * Ht/32] float32) to be written as the bundle's tables, or None (proto untouched) when the head is not
    this table on the 8-bit grid (an untied target) or Ht is not a whole number of blocks."""
    vocab, hidden = table.shape
    if hidden % kv.TABLE_BLOCK:
        return None
    heads = [n for n in proto.graph.node if n.op_type == "MatMulNBits" and _attr(n, "N") == vocab
             and _attr(n, "bits") == TABLE_BITS and len(n.input) == 3]
    if len(heads) != 1:
        return None
    head = heads[0]
    inits = {t.name: t for t in proto.graph.initializer}
    codes, scales = (numpy_helper.to_array(inits[name]) for name in head.input[1:3])
    want_codes, want_scales, _ = quantize_blocks(table.T, TABLE_BITS, kv.TABLE_BLOCK, symmetric=True)
    if not (np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)):
        return None  # untied: the head is another matrix
    for name, new in zip(head.input[1:3], (kv.EMBED_Q8, kv.EMBED_SCALES)):
        inits[name].name = new
    head.input[1:3] = [kv.EMBED_Q8, kv.EMBED_SCALES]
    nodes, consts = _gather_nodes(proto, kv.EMBED_TABLE, kv.EMBED_Q8, kv.EMBED_SCALES, vocab, hidden)
    _replace(proto, nodes, consts)
    alive = [t for t in proto.graph.initializer if t.name != kv.EMBED_TABLE]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(alive)
    return codes, scales


def quantize_drafter_table(proto: onnx.ModelProto, vocab: int, hidden: int) -> None:
    """The drafter graph's `embed_table` input [V, Ht] float32 -> the shared 8-bit table's two inputs, read by
    GatherBlockQuantized (the drafter only gathers rows of it: its token's embedding, its candidates' rows)."""
    nodes, consts = _gather_nodes(proto, kv.EMBED_TABLE, kv.EMBED_Q8, kv.EMBED_SCALES, vocab, hidden)
    _replace(proto, nodes, consts)
    inputs = []
    for value in proto.graph.input:
        if value.name != kv.EMBED_TABLE:
            inputs.append(value)
            continue
        for spec in kv.table_specs(vocab, hidden, quantized=True):
            dtype = {"uint8": onnx.TensorProto.UINT8, "float32": onnx.TensorProto.FLOAT}[spec.dtype]
            inputs.append(helper.make_tensor_value_info(spec.name, dtype, list(spec.shape)))
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)


def quantize_gather_tables(proto: onnx.ModelProto, vocab: int) -> list[str]:
    """A graph's own vocabulary-sized float32 tables that are only gathered (a drafter's table derived from its
    target's embedding: gemma-3-270m's is 262,144 x 256, 268 MB) -> 8-bit codes + scales (Q8_0's grid) read by
    GatherBlockQuantized. Returns the names of the tables it quantized."""
    done = []
    for init in list(proto.graph.initializer):
        dims = tuple(init.dims)
        if init.data_type != onnx.TensorProto.FLOAT or len(dims) != 2 or dims[0] != vocab or dims[1] % kv.TABLE_BLOCK:
            continue
        readers = [n for n in proto.graph.node if init.name in n.input]
        if not readers or any(n.op_type != "Gather" or n.input[0] != init.name or (_attr(n, "axis") or 0) != 0
                              for n in readers):
            continue
        codes, scales, _ = quantize_blocks(numpy_helper.to_array(init).T, TABLE_BITS, kv.TABLE_BLOCK, symmetric=True)
        name = init.name
        nodes, consts = _gather_nodes(proto, name, name + ".q8", name + ".scales", vocab, dims[1])
        _replace(proto, nodes, consts + [numpy_helper.from_array(codes, name + ".q8"),
                                         numpy_helper.from_array(scales, name + ".scales")])
        alive = [t for t in proto.graph.initializer if t.name != name]
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(alive)
        done.append(name)
    return done
