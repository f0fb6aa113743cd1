"""Node-by-node comparison of a one-token decode step with row 0 of a verify pass (`edge-spec check --nodes`).

The host check (edge_spec.decoding.hostcheck) says *whether* verify rows equal decode steps on this machine; this tool says
*where* they first part: every node output of the bundle's target graph is made a graph output, the graph runs once
over T tokens at position p and once over the first of them alone, and the outputs are compared node by node in
graph order. It is how the AMD EPYC finding was made (onnxruntime's 4-bit MatMulNBits: its one-row kernel sums in
another order than its multi-row kernel, docs/architecture.md "Exactness on every CPU").

Both runs see identical cache inputs: random K/V in every slot, except that the slots the verify pass writes its
rows 1..T-1 into hold exactly those rows (taken from a first verify run), so even tensors computed over the whole
cache before masking are comparable. A tensor with a token axis is compared on the row of the first token (an axis
of size n * T in the verify run against n in the step is read as n groups of T rows, as attend_slots folds query
heads); tensors whose shapes differ otherwise are counted as not comparable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.kv import KVLayout
from edge_spec.contract.kv_state import KVState

_FLOAT_OPS = {"MatMul", "MatMulNBits", "FusedMatMul", "Gemm", "Softmax", "Add", "Mul", "Sub", "Div", "Sqrt",
              "Sigmoid", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding"}


class NodeDiff(NamedTuple):
    index: int  # position in the graph's node list
    op: str
    output: str
    max_diff: float  # max |step - verify row 0| (0.0: bit-identical)


class NodeReport(NamedTuple):
    start: int
    tokens: int
    diffs: list[NodeDiff]  # every compared (floating-point) node output, in graph order
    not_comparable: int

    @property
    def first_difference(self) -> NodeDiff | None:
        return next((d for d in self.diffs if d.max_diff > 0), None)

    def text(self, limit: int = 12) -> str:
        differing = [d for d in self.diffs if d.max_diff > 0]
        lines = [f"verify pass of {self.tokens} tokens at position {self.start} vs a one-token step: "
                 f"{len(self.diffs)} node outputs compared, {len(differing)} differ"
                 f"{f', {self.not_comparable} not comparable' if self.not_comparable else ''}"]
        for d in differing[:limit]:
            lines.append(f"  node {d.index:5d} {d.op:<34} {d.output:<40} max |diff| {d.max_diff:.3g}")
        if len(differing) > limit:
            lines.append(f"  ... {len(differing) - limit} more")
        return "\n".join(lines)


def _expose_all_outputs(proto, onnx):
    """Every node output becomes a graph output (element type from value_info, else by op)."""
    types = {v.name: v.type.tensor_type.elem_type for v in list(proto.graph.value_info) + list(proto.graph.input)}
    types.update({t.name: t.data_type for t in proto.graph.initializer})
    existing = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if not name or name in existing:
                continue
            elem = types.get(name)
            if elem is None:
                elem = onnx.TensorProto.FLOAT if node.op_type in _FLOAT_OPS else types.get(node.input[0])
            if elem is None:
                continue
            types[name] = elem
            proto.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
            existing.add(name)


def _session(path: Path, threads: int | None, *, optimize: bool, tables: dict | None = None,
             save_to: Path | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0
    so.log_severity_level = 3
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if save_to is not None:
        so.optimized_model_filepath = str(save_to)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    keep = []
    if tables:
        keep = [ort.OrtValue.ortvalue_from_numpy(np.asarray(t)) for t in tables.values()]
        so.add_external_initializers(list(tables), keep)
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    session._keep = keep
    return session


def _optimized(graph: Path, work: Path, threads: int | None, tables: dict):
    """The graph as onnxruntime runs it (after its fusions, saved by onnxruntime itself): exposing intermediate
    outputs of the *original* graph would block fusions (FusedMatMul, the norms) and compare other kernels than
    generation runs."""
    import onnx

    _session(graph, threads, optimize=True, tables=tables, save_to=work / "optimized.onnx")
    return onnx.load(work / "optimized.onnx", load_external_data=False)


def _feeds(layout: KVLayout, io: kv.GraphIO, tokens: np.ndarray, start: int, caches: dict[str, np.ndarray]) -> dict:
    state = KVState(layout)
    state.advance(start, state.plan_commit(start))
    t = len(tokens)
    feeds = {kv.INPUT_IDS: tokens[None].astype(np.int64), kv.POSITION_IDS: state.position_ids(t)}
    feeds[kv.LOGIT_ROWS] = np.arange(t, dtype=np.int64)  # every row (graphs with kv.LOGIT_ROWS)
    for kind, mask in state.masks(t).items():
        feeds[kv.mask_name(kind)] = mask.astype(np.float32)  # the whole cache is bound: [1, 1, T, S + T]
    feeds.update(caches)
    return {name: value for name, value in feeds.items() if name in {s.name for s in io.inputs}}



def _row0(step: np.ndarray, verify: np.ndarray, t: int) -> np.ndarray | None:
    """The part of `verify` that corresponds to `step` (see the module docstring), or None."""
    if step.shape == verify.shape:
        return verify
    dims = [d for d, (a, b) in enumerate(zip(step.shape, verify.shape)) if a != b]
    if step.ndim != verify.ndim or len(dims) != 1 or verify.shape[dims[0]] != step.shape[dims[0]] * t:
        return None
    d = dims[0]
    folded = verify.reshape(verify.shape[:d] + (step.shape[d], t) + verify.shape[d + 1:])
    return np.take(folded, 0, axis=d + 1)


def node_diff(folder: str | Path, *, start: int = 40, tokens: int = 5, threads: int | None = None,
              seed: int = 0) -> NodeReport:
    """Compare a verify pass of `tokens` random tokens at position `start` with a step over the first token."""
    import onnx

    from edge_spec.contract.manifest import read_manifest, read_table

    folder = Path(folder)
    manifest = read_manifest(folder)
    layout, entry = manifest.layout, manifest.graphs["target"]
    if start + tokens > layout.max_context:
        start = layout.max_context - tokens
    tables = {n: read_table(folder, manifest.tables[n]) for n in kv.TARGET_TABLES if n in manifest.tables}
    with tempfile.TemporaryDirectory() as work:
        proto = _optimized(folder / entry.file, Path(work), threads, tables)
        _expose_all_outputs(proto, onnx)
        exposed = Path(work) / "exposed.onnx"
        onnx.save(proto, exposed)
        session = _session(exposed, threads, optimize=False)
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, manifest.vocab_size, tokens)
    shared = layout.binding == kv.BINDING_SHARED  # the graph returns the written caches, one spare slot bound
    caches = {}
    for c in layout.caches:
        for name in (kv.k_cache_name(c.layer), kv.v_cache_name(c.layer)):
            shape = (1, c.num_kv_heads, c.slots + (kv.SHARED_SPARE_SLOTS if shared else 0), c.head_dim)
            caches[name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    first = dict(zip(names, session.run(None, _feeds(layout, entry.io, ids, start, caches))))
    for c in layout.caches:  # slots the verify pass writes rows 1..T-1 into hold those rows in both runs
        for name, new, present in ((kv.k_cache_name(c.layer), kv.k_new_name(c.layer), kv.k_present_name(c.layer)),
                                   (kv.v_cache_name(c.layer), kv.v_new_name(c.layer), kv.v_present_name(c.layer))):
            slots = [(start + i) % c.slots if c.window else start + i for i in range(1, tokens)]
            caches[name][:, :, slots] = first[present][:, :, slots] if shared else first[new][:, :, 1:]
    verify = dict(zip(names, session.run(None, _feeds(layout, entry.io, ids, start, caches))))
    step = dict(zip(names, session.run(None, _feeds(layout, entry.io, ids[:1], start, caches))))
    producer = {name: (i, node.op_type) for i, node in enumerate(proto.graph.node) for name in node.output}
    diffs, skipped = [], 0
    for name in names:
        if name not in producer:
            continue
        a = np.asarray(step[name])
        if a.dtype.kind != "f":  # shape arithmetic and indices legitimately differ with T
            continue
        if shared and producer[name][1] == "GroupQueryAttention" and a.ndim == 4:  # written caches: the first
            a, b = a[:, :, start], np.asarray(verify[name])[:, :, start]  # token's slot (the rest differ with T)
        else:
            b = _row0(a, np.asarray(verify[name]), tokens)
        if b is None:
            skipped += 1
            continue
        diff = 0.0 if np.array_equal(a, b, equal_nan=True) else float(np.nanmax(np.abs(a.astype(np.float64) - b)))
        diffs.append(NodeDiff(*producer[name], name, diff))
    diffs.sort(key=lambda d: d.index)
    return NodeReport(start, tokens, diffs, skipped)
