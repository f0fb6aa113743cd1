"""RMSNorm as one node in the QNN exporter's fp32 graphs, so the HTP runs its own RmsNorm and no quantized tensor
holds x^2 or mean(x^2).

torch.onnx writes `model.transformer.RMSNorm` as six element-wise nodes (Pow, ReduceMean, Add eps, Sqrt, Div, Mul by
the weight), and the QDQ quantizer gives each output its own 16-bit grid. The residual stream reaches ~80 in
SmolLM2, so x^2 spans ~0 to ~6,400 and mean(x^2) of a small-norm row rounds coarsely: those 182 tensors held nearly
all that the 16-bit activations lost (CPU QDQ top-1 vs eager fp32 0.943 -> 0.958 with them float,
docs/android-qnn.md "where the 16-bit activations lose now"). `SimplifiedLayerNormalization` (onnxruntime's RMSNorm
kernel, ONNX domain; onnxruntime-qnn maps it to QNN's RmsNorm) takes x and the weight and computes the rest inside:
only its input and output are quantized.

Same maths as the six nodes (x / sqrt(mean(x^2) + eps) * w, fp32): tests/test_qnn.py compares the rewritten graph
with the original on the CPU provider.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

FUSED = "SimplifiedLayerNormalization"
# onnxruntime's quantizer converts a graph below opset 21 to 21 for 16-bit QDQ, and onnx's version converter knows no
# SimplifiedLayerNormalization (a contrib op): the graph is converted first, here.
QDQ_OPSET = 21


def _constant(name: str, graph: onnx.GraphProto, made: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The value of `name` when it is an initializer or a Constant node's output, else None."""
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = made.get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t) if node.attribute[0].name == "value" else None
    return None


def _last_axis_only(node: onnx.NodeProto, graph, made, rank: int | None) -> bool:
    """A ReduceMean over the last axis only, keeping it (axes as an attribute up to opset 17, an input from 18)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes = attrs.get("axes")
    if axes is None and len(node.input) > 1:
        axes = _constant(node.input[1], graph, made)
    axes = [int(a) for a in np.atleast_1d(axes)] if axes is not None else None
    last = {-1} | ({rank - 1} if rank else set())
    return attrs.get("keepdims", 1) == 1 and axes is not None and len(axes) == 1 and axes[0] in last


def fuse_rms_norms(path: Path) -> int:
    """Rewrite the model at `path` in place (at opset QDQ_OPSET at least): every Pow(x, 2) -> ReduceMean(last axis) -> Add(eps) -> Sqrt ->
    Div(x, .) [-> Mul(., weight)] whose intermediates nothing else reads becomes one SimplifiedLayerNormalization
    (x, weight or ones; axis -1, epsilon eps, fp32 statistics). Returns how many were fused."""
    proto = onnx.load(str(path))
    if next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) < QDQ_OPSET:
        proto = onnx.version_converter.convert_version(proto, QDQ_OPSET)
    proto = onnx.shape_inference.infer_shapes(proto)
    graph = proto.graph
    made = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.value_info) + list(graph.input)}

    def only_reader(name: str, op: str) -> onnx.NodeProto | None:
        got = readers.get(name, [])
        return got[0] if len(got) == 1 and got[0].op_type == op and name not in outputs else None

    dropped, added, new_inits, fused = set(), {}, [], 0
    for pow_ in graph.node:
        if pow_.op_type != "Pow" or id(pow_) in dropped:
            continue
        exponent = _constant(pow_.input[1], graph, made)
        mean = only_reader(pow_.output[0], "ReduceMean")
        add = mean and only_reader(mean.output[0], "Add")
        sqrt = add and only_reader(add.output[0], "Sqrt")
        div = sqrt and only_reader(sqrt.output[0], "Div")
        if exponent is None or exponent.size != 1 or float(exponent) != 2.0 or div is None \
                or div.input[0] != pow_.input[0] or not _last_axis_only(mean, graph, made, len(dims.get(pow_.input[0], []))):
            continue
        eps_name = add.input[1] if add.input[0] == mean.output[0] else add.input[0]
        eps = _constant(eps_name, graph, made)
        if eps is None or eps.size != 1:
            continue
        mul = readers.get(div.output[0], [])
        mul = mul[0] if len(mul) == 1 and mul[0].op_type == "Mul" and div.output[0] not in outputs else None
        weight = None
        if mul is not None:
            other = mul.input[1] if mul.input[0] == div.output[0] else mul.input[0]
            value = _constant(other, graph, made)
            weight = other if value is not None and value.ndim == 1 else None
        tag = f"{pow_.name or pow_.output[0]}.rms"
        if weight is None:  # no scale (Gemma-4's value norm, the final norm without one): a weight of ones
            mul, weight = None, f"{tag}.ones"
            width = (dims.get(pow_.input[0]) or [0])[-1]
            if not width:
                continue
            new_inits.append(numpy_helper.from_array(np.ones(width, np.float32), weight))
        out = (mul or div).output[0]
        node = helper.make_node(FUSED, [pow_.input[0], weight], [out], name=tag, axis=-1,
                                epsilon=float(eps), stash_type=1)
        for gone in (pow_, mean, add, sqrt, div) + ((mul,) if mul is not None else ()):
            dropped.add(id(gone))
        added[id(pow_)] = node
        fused += 1
    if not fused:
        onnx.save(proto, str(path))
        return 0
    nodes = [added.get(id(n), n) for n in graph.node if id(n) not in dropped or id(n) in added]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    used = {i for n in graph.node for i in n.input} | outputs
    consts = [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]
    for n in consts:
        graph.node.remove(n)
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    # onnx's shape inference skips a contrib op: the fused outputs keep their inferred shapes, so the quantizer's own
    # inference still reaches every tensor after them
    shapes = [v for v in graph.value_info if v.name in used]
    del graph.value_info[:]
    graph.value_info.extend(shapes)
    onnx.save(proto, str(path))
    return fused

