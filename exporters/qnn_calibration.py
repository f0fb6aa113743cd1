"""The QNN exporter's calibration: activation ranges for the QDQ graphs, recorded on every pass of the fp32 graphs
run through the padded fixed-shape runtime on the bench prompts (`RangeRecorder`), merged across pass lengths (one range per tensor whatever T is,
the tensors matched by node position: `aligned_tensors`) and across each layer's cache tensors (`cache_groups`), the target's outputs widened (`with_headroom`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from edge_spec.contract import bundle
from edge_spec.exporters import calibration
from edge_spec.runtimes import qnn_htp
from edge_spec.contract.backend import Session
from edge_spec.loading.checkpoints import LoadedModel
from edge_spec.runtimes.fixed import FixedBackend, FixedDrafter
from edge_spec.runtimes.fixed_eagle3 import FixedEagle3Drafter
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams

DRAFTER_GRAPH, target_graph = qnn_htp.DRAFTER_GRAPH, qnn_htp.target_graph

# Calibration data (2026-12-06): every shipped bench prompt (3 chat, 3 documentation, 3 code), 64 tokens each, 48
# feeds per graph drawn uniformly from all passes. Before: the first 2 prompts, 48 tokens, the first 48 passes'
# feeds thinned to 12 - ranges from ~36 tokens of two chat prompts, which text outside them overran (SmolLM2's CPU
# QDQ graphs: top-1 0.52 on held-out everyday answers, 0.91 with every activation float:
# scripts/qnn_activation_ablation.py).
# Since 2026-12-08 every pass of the calibration run is ranged as it runs (`RangeRecorder`), not a sample of 48
# passes, and each prompt runs to 128 tokens, not 64: held-out text overran the ranges less. SmolLM2's target-only
# CPU QDQ bundle, 1,152 held-out everyday answer positions (scripts/qnn_activation_ablation.py --export
# [--calibration-tokens 128]): KL(fp32 || bundle) 0.00734 (48 passes, 64 tokens) -> 0.00272 (every pass) -> 0.00152
# (every pass, 128 tokens; top-1 0.952 -> 0.964 -> 0.975; the 8-bit weights alone: 0.00138 / 0.974).
# Each sequence runs at one pass length (round robin; the ranges are merged across lengths anyway).
CALIBRATION_PROMPTS = 9  # shipped bench prompts used for calibration
CALIBRATION_TOKENS = 128  # per prompt: its first tokens + the target's greedy continuation to this many more
# the target's outputs get their calibrated range widened by this factor (about its middle): a logit above the
# calibrated maximum clips, and clipped top logits tie, so the argmax can change (a 16-bit range twice as wide gives
# up one bit of resolution the logits do not need; measured on the tiny llama: top logit 1.14, calibrated max 0.84)
OUTPUT_HEADROOM = 2.0
# each MLP's down_proj input (the gated product SiLU(gate) x up, one 16-bit range per tensor) gets its calibrated range
# widened this many times about its middle: held-out text overruns a range calibrated on 576 positions, and a clipped
# product is the one activation error SmolLM2 pays for. Eager, held-out everyday answers, 1,075 positions
# (scripts/qnn_down_in.py, 2026-12-07): KL(fp32 || quantized) 0.00141 with the weights alone, 0.00308 with that input
# on its min / max grid (202 values clipped, nothing lost where none clip), 0.00142 / 0.00143 / 0.00147 / 0.00241
# with it widened x1.5 / 2 / 4 / 16 (0 clipped from x2: the grid's own rounding costs nothing until x16). In the
# bundle (CPU QDQ, 1,152 positions): mean KL 0.01369 -> 0.00735 and top-1 0.952 -> 0.960, what floating it gives.
# Widening every activation instead broke the model (top-1 0.80: the exact 0 / 1 `keep` and mask inputs and the
# normed linear inputs lose resolution they need): headroom goes where clipping was measured, not everywhere.
DOWN_IN_HEADROOM = 2.0


# ---- ------------------------------------------------------------------------------------
class RangeRecorder:
    """A predictor over the graph at `path` that records the min / max of every float tensor a node reads or writes
    (initializers aside) on every call: onnxruntime's MinMax calibration, streamed. The tensors are read as extra graph
    outputs of one unoptimized session (as onnxruntime's calibrator: no fusion), so a calibration run's every pass
    counts and no feed is kept. (Before 2026-12-08 a uniform sample of 48 passes was kept and ranged afterwards:
    SmolLM2's CPU QDQ graphs clipped on held-out text, KL(fp32 || bundle) 0.0073; every pass: 0.0029.)"""

    def __init__(self, path: Path):
        import onnxruntime as ort
        from onnx import shape_inference

        proto = shape_inference.infer_shapes(onnx.load(str(path)))
        graph = proto.graph
        floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
        typed = {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)
                 if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in floats}
        constants = {i.name for i in graph.initializer}
        wanted = {t for n in graph.node for t in list(n.input) + list(n.output) if t in typed and t not in constants}
        self.outputs = [o.name for o in graph.output]
        self.fed = sorted(wanted & {i.name for i in graph.input})
        self.produced = sorted(wanted - set(self.fed) - set(self.outputs))
        graph.output.extend([typed[t] for t in self.produced])
        self.ranged = {t for t in self.outputs if t in wanted} | set(self.produced)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.lo: dict[str, float] = {}
        self.hi: dict[str, float] = {}
        self.calls = 0

    def _add(self, name: str, value: np.ndarray) -> None:
        a, b = float(np.nanmin(value)), float(np.nanmax(value))
        self.lo[name], self.hi[name] = min(self.lo.get(name, a), a), max(self.hi.get(name, b), b)

    def __call__(self, feeds: dict) -> dict:
        values = self.session.run(self.outputs + self.produced, feeds)
        out = dict(zip(self.outputs, values))
        for name in self.fed:
            self._add(name, feeds[name])
        for name, value in zip(self.outputs + self.produced, values):
            if name in self.ranged:
                self._add(name, value)
        self.calls += 1
        return out

    def plain(self, feeds: dict) -> dict:
        """The graph's outputs, nothing recorded (position 0 on the host: not a quantized graph's input)."""
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))

    def ranges(self) -> dict[str, tuple[float, float]]:
        return {name: (self.lo[name], self.hi[name]) for name in self.lo}


def calibration_tokens(target: LoadedModel, run: Session, n_prompts: int = CALIBRATION_PROMPTS) -> list[list[int]]:
    """Our prompt data: each shipped bench prompt's first tokens + the target's own greedy continuation."""
    out, budget = [], min(CALIBRATION_TOKENS, run.max_context)
    for index, ids in enumerate(calibration.prompt_ids(target, n_prompts, budget // 2)):
        more = generate_plain(run, ids, max_new_tokens=budget - len(ids), params=SamplingParams(),
                              rng=np.random.default_rng(index), stop_ids=frozenset()).tokens
        out.append(ids + list(more))
    return out


def calibrate(job: bundle.ExportJob, graphs: dict[str, Path], lengths: tuple[int, ...], slots: dict[str, int],
              host_sink: bool = True, eagle3=None) -> tuple[dict[str, dict[str, tuple[float, float]]], list[list[int]]]:
    """(graph -> tensor -> (min, max), the token sequences they came from): `graphs` (fp32, as quantize reads them)
    run on the CPU through the bundle's own runtime, every tensor ranged on every pass (`RangeRecorder`).
    `host_sink`: position 0 runs as the runtime will run it, outside the quantized graphs (not recorded).
    `eagle3` (exporters/qnn.Eagle3Graphs): the drafter's step and fc graphs, run by runtimes/fixed_eagle3.py. Its
    first row reads the target's aux states at position 0, which the host sink computes in float: there an attention
    sink's massive activation (SmolLM2: 24,874) would set the fc graph's 16-bit ranges, so calibration feeds that
    row as zeros (at run time it saturates its ranges: one drafter cache row, drafts only)."""
    rec = {g: RangeRecorder(p) for g, p in graphs.items()}
    first = rec[target_graph(lengths[0])]  # the runtime pads row 0 to the shortest graph
    sink = first.plain if host_sink else None
    aux = len(job.aux_layers) * job.target.config.hidden_size
    backend = FixedBackend({t: rec[target_graph(t)] for t in lengths}, job.layout, slots, "qnn-calibration",
                           name="qnn", mask_floor=qnn_htp.MASK_FLOOR, placed=True, sink=sink, aux_width=aux)
    session = Session(backend)
    if eagle3 is not None:
        drafter = FixedEagle3Drafter({t: rec[g] for t, g in eagle3.steps.items()},
                                     {t: rec[g] for t, g in eagle3.fcs.items()}, backend, eagle3.draft,
                                     mask_floor=qnn_htp.MASK_FLOOR)
        record = backend.aux_sink

        def typical(ids: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> None:  # rows [t, aux]
            record(ids, positions, np.where((positions == 0)[:, None], np.float32(0.0), rows))

        backend.aux_sink = typical
    else:
        drafter = FixedDrafter(rec[DRAFTER_GRAPH], backend, job.sources) if job.drafter is not None else None
    sequences = calibration_tokens(job.target, session)
    for j in range(max(len(sequences), len(lengths))):  # round robin: every sequence once, every length at least once
        tokens, t = sequences[j % len(sequences)], lengths[j % len(lengths)]
        session.reset()  # chunked passes of exactly t tokens (the last may be shorter: a padded pass)
        for start in range(0, len(tokens), t):
            chunk = tokens[start:start + t]
            out = session.forward(chunk)
            session.commit(len(chunk))
            if drafter is not None and session.length < session.max_context:
                drafter.begin(session.length, session.state.drafter_masks(), session.length)
                step = drafter.step(tokens[min(start + t, len(tokens)) - 1], out.hidden[-1])
                drafter.step(int(step.token_ids[np.argmax(step.logits)]), step.hidden)
    return {g: r.ranges() for g, r in rec.items()}, sequences


def tensor_ranges(path: Path, feeds: list[dict]) -> dict[str, tuple[float, float]]:
    """tensor name -> (min, max) over `feeds` of every float tensor a node of the model at `path` reads or writes
    (initializers aside): onnxruntime's MinMax calibration, computed in one pass over the graph (`RangeRecorder`).
    onnxruntime's own calibrator inserts two reduce nodes per tensor, each placed by a search over every node
    (quadratic: 93 of a tiny Gemma-4 bundle's 190 s export, 2026-12-06)."""
    record = RangeRecorder(path)
    for feed in feeds:
        record(feed)
    return record.ranges()


def aligned_tensors(reference: onnx.GraphProto, other: onnx.GraphProto) -> list[tuple[str, str]]:
    """(reference's tensor, other's tensor) pairs that are the same tensor of the model at another pass length: the
    inputs and outputs of nodes matched by position (difflib over each computing node's op type and arity, so a node
    one graph has and the other lacks leaves the rest aligned; constants through the nodes reading them), plus the graphs' own inputs and outputs by name. Not all names:
    torch.onnx names a few constants differently at each T (its constant deduplication differs), so in a tiny
    Gemma-4's 5- and 9-row graphs `/model/Constant_14_output_0` was the Div's divisor in one and another constant in
    the other (docs/android-qnn.md "2026-12-06 (later)")."""
    import difflib

    def key(n):
        return n.op_type, len(n.input), len(n.output)

    def computing(g):  # Constant nodes are matched through their readers: where torch.onnx puts them differs too
        return [n for n in g.node if n.op_type != "Constant"]

    a, b = computing(reference), computing(other)
    pairs = [(v.name, v.name) for v in list(reference.input) + list(reference.output)]
    matcher = difflib.SequenceMatcher(None, [key(n) for n in a], [key(n) for n in b], autojunk=False)
    for i, j, size in matcher.get_matching_blocks():
        for x, y in zip(a[i:i + size], b[j:j + size]):
            pairs += [(p, q) for p, q in zip(list(x.input) + list(x.output), list(y.input) + list(y.output)) if p and q]
    return pairs


def merged_ranges(pre: dict[str, Path], own: dict[str, dict], shared: list[str]) -> dict[str, dict]:
    """graph -> tensor name -> (min, max): for each graph in `shared`, its tensors' ranges merged with the same tensor's
    in every other graph of `shared` (their `own` ranges: `RangeRecorder`; the same tensor: `aligned_tensors`, not
    the same name), for tensors every graph has.

    Each cached layer's K (and V) cache input, its new rows output and the concatenation of the two get one range:
    a key a verify pass computes (new rows) and the same key read back from the cache in a later decode step (cache
    input) then quantize to the same integers, so verify rows and decode steps see the same attention inputs."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(x, y):
        parent[root(x)] = root(y)

    protos = {g: onnx.load(str(pre[g]), load_external_data=False) for g in shared}
    first = shared[0]
    for g in shared[1:]:
        for p, q in aligned_tensors(protos[first].graph, protos[g].graph):
            join((g, q), (first, p))
    for g in shared:
        for group in cache_groups(protos[g]):
            for name in group[1:]:
                join((g, name), (g, group[0]))
    span: dict[tuple, tuple[float, float]] = {}
    seen: dict[tuple, set] = {}
    for g in shared:
        for name, (lo, hi) in own[g].items():
            r = root((g, name))
            old = span.get(r, (lo, hi))
            span[r] = (min(old[0], lo), max(old[1], hi))
            seen.setdefault(r, set()).add(g)
    return {g: {name: span[root((g, name))] for name in own[g] if seen[root((g, name))] == set(shared)}
            for g in shared}


def with_headroom(ranges: dict[str, tuple[float, float]], names: tuple[str, ...], factor: float = OUTPUT_HEADROOM
                  ) -> dict[str, tuple[float, float]]:
    """`ranges` with each of `names` (where present) widened `factor` times about its middle."""
    out = dict(ranges)
    for name in names:
        if name in out:
            lo, hi = out[name]
            mid, half = (lo + hi) / 2, (hi - lo) / 2 * factor
            out[name] = (mid - half, mid + half)
    return out


# data movement: QNN keeps the input's encoding (Gather / Slice: rows picked out of a tensor, e.g. an EAGLE-3 step's
# last row of draft logits; without them its headroom missed the head's output and its top logits clipped)
MOVES = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Slice")


def down_proj_inputs(path: Path) -> tuple[str, ...]:
    """Each MLP's down_proj input in the model at `path` (the 1x1 Conv of `qnn.linears_as_conv` whose weight sits under
    "/mlp/down_proj/") and the tensors it was moved from, back to the product computing it (`moved_from`)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return moved_from(path, tuple(n.input[0] for n in graph.node if n.op_type == "Conv" and len(n.input) > 1
                                  and "/mlp/down_proj/" in n.input[1]))


def moved_from(path: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` and, for each, the tensors it was moved from (Reshape / Transpose ...) back to the op computing it.
    QNN's config gives such an output its input's encoding, so a range set on the output alone does not reach the
    tensor the op writes: the output head as a 1x1 Conv (exporters/qnn.linears_as_conv) computes the logits into
    `<head>.conv.y` and a Reshape makes them `logits`; without it the headroom missed the Conv's output, its top
    logits clipped at the calibrated maximum (tiny llama: 0.31 of the logits' scale from eager, 0.07 with it)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    producers = {o: n for n in graph.node for o in n.output}
    out = []
    for name in names:
        while name not in out:
            out.append(name)
            node = producers.get(name)
            if node is None or node.op_type not in MOVES:
                break
            name = node.input[0]
    return tuple(out)


def cache_groups(proto: onnx.ModelProto, upstream: bool = True) -> list[list[str]]:
    """Per cache input (k_cache.l / v_cache.l): the input, its new rows output, the tensors the new rows are reshaped
    from (back to the op that computes them), and every tensor data movement makes of them (Gather of the new rows
    into slots, the Where that places them, a Concat) - one range for all.
    Why the tensors upstream: QNN's config gives a Reshape / Transpose output its input's encoding, so without them
    the new rows output kept the projection's own encoding (tiny llama: v_new.2 1.5193e-5 / 29730 vs v_cache.2
    1.5263e-5 / 29892), the HTP requantized the new rows into the cache's encoding inside a pass (~16 steps off the
    host's requantization of the same output a decode step reads back), and verify rows differed from decode steps.
    `upstream=False` leaves those tensors out (the earlier groups: scripts/qnn_exactness_variants.py measures both)."""
    outputs = {o.name for o in proto.graph.output}
    producers = {o: n for n in proto.graph.node for o in n.output}
    movers = [n for n in proto.graph.node if n.op_type in ("Gather", "Where", "Concat", "Transpose", "Reshape")]
    groups = []
    for value in proto.graph.input:
        if not value.name.startswith(("k_cache.", "v_cache.")):
            continue
        layer = value.name.split(".", 1)[1]
        new = ("k_new." if value.name.startswith("k_") else "v_new.") + layer
        group = {value.name} | ({new} if new in outputs else set())
        tensor = new  # back from the new rows to the op that computes them: the projection / RoPE output
        while upstream and (node := producers.get(tensor)) is not None and node.op_type in ("Transpose", "Reshape"):
            tensor = node.input[0]
            group.add(tensor)
        while True:  # data movement closes over the group (Where: its value inputs, not the condition)
            more = {n.output[0] for n in movers if (n.input[1:] if n.op_type == "Where" else n.input[:1]) and
                    any(i in group for i in (n.input[1:] if n.op_type == "Where" else n.input[:1]))}
            if more <= group:
                break
            group |= more
        groups.append(sorted(group))
    return groups
