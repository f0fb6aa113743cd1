"""QNN exporter: static ONNX graphs of the target (one per fixed pass length) and the drafter step, quantized as QDQ
with onnxruntime's own tools and compiled for a named Snapdragon SoC into EPContext models (QNN context binaries).

    edge-spec export --format qnn --soc sm8650 --quant 16a8w|8a8w --out B

The HTP runs no dynamic shapes, so the graphs are fixed-shape (`io` binding: caches are graph inputs, new rows
outputs; edge_spec.runtimes.fixed pads passes and holds the caches). The target is `static.PlacedTargetFunction`: per attention
kind it takes the mask in slot form, an exact 0 / 1 `keep.<kind>` and `slot_index.<kind>` besides the contract's
inputs, places new rows into their slots by data movement and attends over the slots (`model.place_rows`,
`model.attend_concat`: what the HTP compiles; the manifest lists the real input order under `fixed.qnn`). Per graph:
  1. torch.onnx (TorchScript exporter, opset 17, every shape static, ids int32) -> fp32 ONNX, every linear (the
     output head too) as a 1x1 Conv (`linears_as_conv`: QNN quantizes Conv weights per output channel, MatMul
     weights per tensor only), rotary cos / sin gathered from per-position tables (`TableRopeOps`: a computed
     angle is an activation whose calibrated range ends at the longest calibration position), each RMSNorm as one
     SimplifiedLayerNormalization node, the HTP's RmsNorm (`qnn_norms`: no quantized x^2). One target graph
     per pass length (`target_lengths`: by default two, decode + verify and the prefill chunk; every length with
     --qnn-graphs every);
  2. `qnn_preprocess_model` (QNN-friendly fusions);
  3. calibration on our own prompt data: the shipped bench prompts' tokens plus the target's greedy continuation,
     run through the fp32 graphs by the same padded runtime the bundle will use (edge_spec.runtimes.fixed), as chunked
     passes at every exported length (and the drafter's steps over them). Activation ranges are merged across
     the target's lengths tensor by tensor (matched by node position, `qnn_calibration.merged_ranges`: torch.onnx
     names some constants differently at each length), so every length quantizes every activation with the *same* scale: a
     verify row and a decode step then see the same quantized values (per-length calibration would give them
     different scales, and greedy speculative output would drift from plain);
  4. `get_qnn_qdq_config` + `quantize` (16-bit activations / 8-bit weights by default, the target's q / k / v
     weights at 16 bits: `WIDE_WEIGHTS`, and every linear of the few layers whose 8-bit weights cost the model
     most on the calibration sequences: `qnn_sensitivity`; 8a8w as an option) ->
     `qnn/<graph>.qdq.onnx`: portable (any SoC, and the CPU provider's reference run);
  5. `ort.ModelCompiler` on the QNN EP for the SoC (CPU fallback disabled) -> `qnn/<graph>.ctx.onnx`: one
     EPContext node holding the context binary (what the phone loads without re-preparing the graph). The export
     fails if any node would not run on the HTP.
  6. `qnn/target_sink.onnx` (`float_twin`): the shortest target graph's QDQ graph with float activations, for the
     host CPU. A pass
     from position 0 runs that row through it and the rest on the HTP, and step 3 calibrates the same way: the first
     token's massive activation (SmolLM2: 24,874 at position 0, under 700 elsewhere) never sets a 16-bit range.
  7. `share_weights`: the QDQ graphs' and the sink's initializers go into one `qnn/weights.data` (external data),
     each distinct tensor once. (The context binaries still hold one copy each: QNN's weight sharing across them,
     `ep.share_ep_contexts` at compile, wrote one shared .bin, but loading any graph from it segfaulted on the
     x86-64 simulator, with or without the option at load; docs/android-qnn.md.)
  8. `--qnn-position0 table` (the phone bundle, exporters/qnn_position0.py): the sink's rows for the chat template's
     first token and BOS precomputed into `qnn/position0.bin`; the sink, the QDQ graphs and `weights.data` are then
     left out (the CPU provider cannot run such a bundle; the HTP reads only the context binaries).
Masked attention entries are fed as MASK_FLOOR (edge_spec.runtimes.qnn_htp), not -1e30: the mask input has a calibrated range.
Measured on the simulated HTP (docs/android-qnn.md): the bundles run fully on it, and verify rows are bit-identical to
decode steps (masked values zeroed before P.V: `model.masked_values`; new rows in their cache's encoding:
`cache_groups`), so speculative decoding runs there; the host check keeps checking it at load.
Exporters import the core only, never runtimes.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from edge_spec.contract import bundle
from edge_spec.contract import kv
from edge_spec.runtimes import qnn_htp
from edge_spec.contract.bundle import COMMON_STEPS, DEFAULT_MAX_DRAFT_LEN
from edge_spec.contract.manifest import EAGLE3_FC_GRAPH
from edge_spec.model.attention import attend_concat
from edge_spec.model.forms import PLACED
from edge_spec.model.ops import TableRopeOps
from edge_spec.errors import ConfigError, ExportError
from edge_spec.exporters import static
from edge_spec.exporters import qnn_position0
from edge_spec.exporters.qnn_norms import fuse_rms_norms
from edge_spec.exporters.qnn_calibration import (DOWN_IN_HEADROOM, OUTPUT_HEADROOM, calibrate, down_proj_inputs,
                                                 merged_ranges, moved_from, with_headroom)
from edge_spec.exporters.qnn_sensitivity import BUDGET, GAIN, candidates, choose, graph_name, linear_gains
from edge_spec.runtimes.fixed import keep_name, pass_lengths, slot_index_name
from edge_spec.logs import quiet
from edge_spec.contract.manifest import GraphEntry

OPSET = 17
QNN_DIR, DRAFTER_GRAPH = qnn_htp.QNN_DIR, qnn_htp.DRAFTER_GRAPH
target_graph, qdq_file, ctx_file = qnn_htp.target_graph, qnn_htp.qdq_file, qnn_htp.ctx_file


# ---- 1. static fp32 graphs ---------------------------------------------------------------------------
def _onnx(module: nn.Module, args: tuple, io: tuple[list[str], list[str]], path: Path, what: str) -> None:
    """torch.onnx (TorchScript, static shapes) of `module` at `args`, IO named `io` = (inputs, outputs)."""
    names = {"input_names": io[0], "output_names": io[1]}
    try:
        with torch.no_grad(), quiet("torch.onnx"), warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET, do_constant_folding=True,
                              **names)
    except Exception as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ExportError(f"torch.onnx.export failed for the {what} graph: {first[:300]}",
                          "use --format onnx for this model, or report the model config") from err
    proto = onnx.load(str(path), load_external_data=False)
    got = [v.name for v in proto.graph.input], [v.name for v in proto.graph.output]
    if got != tuple(names.values()):
        raise ExportError(f"the {what} graph exported with IO {got}, expected {tuple(names.values())}")


# ---- 1b. linears as 1x1 convolutions (per-channel 8-bit weights) -----------------------------------------------
def linears_as_conv(path: Path) -> int:
    """Rewrite `path` in place: every MatMul of an activation [..., in] by a weight initializer [in, out] becomes
    Reshape [N, in, 1, 1] -> Conv (weight [out, in, 1, 1]) -> Reshape [..., out], N = the rows (static shapes).
    Why: QNN quantizes MatMul weights per tensor only, Conv weights per output channel. Measured on SmolLM2 (eager,
    weights fake-quantized to 8 bits, 127 bench prompt positions): per tensor top-1 0.748 vs fp32, per channel 0.961.
    Each row is its own batch item of the convolution, so rows stay independent of how many a pass holds.
    MatMuls reading a graph output too: the target's head reads `hidden` (until 2026-12-06 it stayed a MatMul with
    per-tensor weights; SmolLM2's weights alone at 8 bits: top-1 0.890 with a per-tensor head vs 0.961 per channel,
    scripts/qnn_weight_quant.py). Returns how many MatMuls were rewritten."""
    from onnx import helper, numpy_helper, shape_inference

    proto = shape_inference.infer_shapes(onnx.load(str(path)))
    graph = proto.graph
    weights = {i.name: i for i in graph.initializer}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    nodes, added, done = [], [], 0
    for n in graph.node:
        w = weights.get(n.input[1]) if n.op_type == "MatMul" else None
        shape = shapes.get(n.input[0]) if w is not None else None
        if w is None or len(w.dims) != 2 or not shape or not all(shape):
            nodes.append(n)
            continue
        rows, (d_in, d_out) = int(np.prod(shape[:-1])), w.dims
        tag = f"{n.name or n.output[0]}.conv"
        added += [numpy_helper.from_array(np.array([rows, d_in, 1, 1], np.int64), f"{tag}.shape_in"),
                  numpy_helper.from_array(np.array(shape[:-1] + [d_out], np.int64), f"{tag}.shape_out"),
                  numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(w).T)[:, :, None, None],
                                          f"{tag}.weight")]
        nodes += [helper.make_node("Reshape", [n.input[0], f"{tag}.shape_in"], [f"{tag}.x"], name=f"{tag}.in"),
                  helper.make_node("Conv", [f"{tag}.x", f"{tag}.weight"], [f"{tag}.y"], name=tag),
                  helper.make_node("Reshape", [f"{tag}.y", f"{tag}.shape_out"], list(n.output), name=f"{tag}.out")]
        done += 1
    used = {i for n in nodes for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(nodes)
    graph.initializer.extend(kept + added)
    onnx.save(proto, str(path))
    return done


# ---- 4. QDQ ---------------------------------------------------------------------------------------------
# At 16a8w the target's attention input projections keep 16-bit weights (per output channel, QNN's int16 Conv
# weights): 8 bits there cost most of what the weights lose. SmolLM2's CPU QDQ graph (one 3-row target graph),
# teacher-forced top-1 on 12 held-out everyday answers (scripts/qnn_activation_ablation.py, 2026-12-06): every
# linear 8-bit 0.938; q / k / v 16-bit 0.953; + down 0.935; + gate / up 0.945; every linear 16-bit 0.956
# (docs/android-qnn.md). Beyond this class, the few linears (and the head) whose 8-bit weights cost the model most are
# found per model at export (`qnn_sensitivity`, after calibration) and kept at 16 bits too.
WIDE_WEIGHTS = ("q_proj", "k_proj", "v_proj")


def quantize(pre: Path, out: Path, own: dict[str, tuple[float, float]], scheme: str, ranges: dict | None,
             tables: bool = False, wide: tuple[str, ...] = ()) -> None:
    """`pre` -> QDQ `out` (onnxruntime's QNN config, per-channel Conv weights), given its `own` calibrated ranges
    (`qnn_calibration.RangeRecorder`, handed over as onnxruntime's calibration cache: it calibrates nothing itself) and
    the `ranges` merged across the target's graphs, which override them where QNN fixes no scale itself. `tables`
    (the drafter's step): the vocabulary tables a Gather reads (`gather_tables`) at the
    weights' width - onnxruntime's QNN config treats a Gather's data as an activation, so at 16a8w a table takes 16
    bits (SmolLM2's drafter context binary: 116.6 MB, two 16-bit copies of the 49,152 x 576 table). The target's
    input table stays 16-bit: 8 bits there (2026-12-06) made the table's Gather feeding Gemma's 16-bit embedding
    scale requantize ~16x further apart on the simulated HTP than on the CPU provider, and the E2B-sized drafter
    fed by that target chose another top token on the two (tests/test_qnn.py::test_e2b_sized_drafter...); with
    8-bit tables in the drafter alone it agrees (6.7e-2 of the logits' scale, same top token)."""
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    act, weight = (getattr(QuantType, n) for n in qnn_htp.QUANTS[scheme])
    graph_inputs = {i.name for i in onnx.load(str(pre), load_external_data=False).graph.input}
    cache = out.with_name(out.name + ".calibration.json")
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, {
        name: (np.array([lo], np.float32), np.array([hi], np.float32)) for name, (lo, hi) in own.items()}), cache)
    with quiet("root", "onnxruntime"), warnings.catch_warnings(), _linear_input_rewrites():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            config = get_qnn_qdq_config(str(pre), None, activation_type=act, weight_type=weight,
                                        per_channel=True)  # Conv weights (linears_as_conv)
            fixed = config.extra_options.setdefault("TensorQuantOverrides", {})
            for name in gather_tables(pre) if tables else ():
                fixed.setdefault(name, [{"quant_type": weight}])
            if act == QuantType.QUInt16:  # 16a8w: `wide` linears' weights at 16 bits (WIDE_WEIGHTS: why)
                for name in wide_weights(pre, wide):
                    fixed.setdefault(name, [{"quant_type": QuantType.QInt16, "axis": 0}])
            for name, (lo, hi) in (ranges or {}).items():  # the merged ranges, where QNN fixes no scale itself
                if name in fixed or (name in graph_inputs and not name.startswith(("mask", "k_cache", "v_cache"))):
                    continue
                fixed[name] = [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
            quantize_static(str(pre), str(out), None, calibration_cache_path=cache, quant_format=config.quant_format,
                            activation_type=config.activation_type, weight_type=config.weight_type,
                            op_types_to_quantize=config.op_types_to_quantize, nodes_to_quantize=config.nodes_to_quantize,
                            nodes_to_exclude=config.nodes_to_exclude, per_channel=config.per_channel,
                            reduce_range=config.reduce_range, use_external_data_format=config.use_external_data_format,
                            extra_options=config.extra_options)
        finally:
            logging.disable(logging.NOTSET)
            cache.unlink(missing_ok=True)


def wide_weights(path: Path, names: tuple[str, ...]) -> list[str]:
    """The weight initializers of the 1x1 Convs (`linears_as_conv`) whose weight name has one of `names` as a path
    part (e.g. "/model/layers.0/self_attn/q_proj/MatMul.conv.weight" for "q_proj")."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    return [n.input[1] for n in graph.node if n.op_type == "Conv" and n.input[1] in inits
            and any(f"/{name}/" in n.input[1] for name in names)]


@contextlib.contextmanager
def _linear_input_rewrites():
    """onnxruntime's QDQ quantizer points each quantized activation's readers at its DequantizeLinear by comparing
    every input of every node in Python (`ONNXModel.replace_input_of_all_nodes`: 43 of a tiny Gemma-4 bundle's 84 s
    export, quadratic in the graph's size). For the call: the same rewrite, the nodes that read the tensor found by
    protobuf's own membership test first (the QDQ graphs are identical: tests/test_qnn.py)."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    def rewrite(self, old: str, new: str) -> None:
        for node in self.model.graph.node:
            if old in node.input:
                ONNXModel.replace_node_input(node, old, new)

    original = ONNXModel.replace_input_of_all_nodes
    ONNXModel.replace_input_of_all_nodes = rewrite
    try:
        yield
    finally:
        ONNXModel.replace_input_of_all_nodes = original


def gather_tables(path: Path) -> list[str]:
    """The initializers of the model at `path` that a Gather reads rows from (vocabulary tables)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    return sorted({n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in weights})


# ---- 5. context binaries -----------------------------------------------------------------------------------
def compile_context(qdq: Path, out: Path, soc: qnn_htp.Soc) -> None:
    """EPContext model for `soc` (context binary embedded); refuses a graph that does not fully land on the HTP."""
    ort, _ = qnn_htp.import_qnn()
    so = qnn_htp.session_options(soc)
    try:
        ort.ModelCompiler(so, str(qdq), embed_compiled_data_into_model=True,
                          flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED).compile_to_file(str(out))
    except Exception as err:
        off = qnn_htp.off_htp(qdq, soc) if "fallback to CPU EP" in str(err) else []
        if off:
            raise ExportError(f"{len(off)} node(s) of {qdq.name} would run outside the HTP on {soc.name}: "
                              f"{', '.join(off[:8])}", "report the model config; --format onnx runs it on the CPU") from err
        raise ExportError(f"QNN could not compile {qdq.name} for {soc.name}: {str(err).strip()[:400]}",
                          "report the model config; --format onnx runs it on the CPU") from err
    others = [f"{n.op_type} {n.name}" for n in onnx.load(str(out)).graph.node if n.op_type != "EPContext"]
    if others:
        raise ExportError(f"{len(others)} node(s) of {qdq.name} would run outside the HTP on {soc.name}: "
                          f"{', '.join(others[:5])}", "report the model config; --format onnx runs it on the CPU")


# ---- 6. the host's float twin of the first pass ----------------------------------------------------------
def float_twin(qdq: Path, out: Path) -> None:
    """`qdq` with every activation QuantizeLinear -> DequantizeLinear pair turned into an Identity: the same graph and
    the same 8-bit weights (their DequantizeLinear nodes stay), float activations. The runtime runs position 0 through
    it on the host CPU (`FixedBackend(sink=...)`): a model whose first token is an attention sink with a massive
    activation (SmolLM2: 24,874 in one channel of the residual stream at position 0, under 700 at every other
    position) would otherwise set every 16-bit residual range, so the quantized graphs never see that row."""
    proto = onnx.load(str(qdq))
    graph = proto.graph
    weights = {i.name for i in graph.initializer}
    quantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    if on_weights := [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in weights]:
        raise ExportError(f"{qdq.name}: {len(on_weights)} QuantizeLinear node(s) on weights, unexpected in a QDQ graph",
                          "report the model config")
    nodes = [onnx.helper.make_node("Identity", [quantized[n.input[0]]], list(n.output), name=n.name)
             if n.op_type == "DequantizeLinear" and n.input[0] in quantized else n
             for n in graph.node if n.op_type != "QuantizeLinear"]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(proto, str(out))


# ---- 7. one copy of the weights -----------------------------------------------------------------------------
SHARED_MIN_BYTES = 1024  # smaller initializers (scales, zero points, shapes) stay inside each graph
SHARED_ALIGN = 64


def share_weights(models: list[Path], data: Path) -> tuple[int, int]:
    """Move the initializers of `models` (ONNX files in one folder) of >= SHARED_MIN_BYTES into the external data
    file `data` next to them, each distinct tensor stored once (by content), every model pointing at it by offset.
    The six target / drafter QDQ graphs and the sink hold the same 8-bit weights (per-channel scales come from the
    weights alone), so the bundle stores them once instead of seven times. Returns (bytes before, bytes of `data`)."""
    stored: dict[bytes, tuple[int, int]] = {}  # sha256 of the bytes -> (offset, length)
    before = 0
    with open(data, "wb") as out:
        for path in models:
            proto = onnx.load(str(path))
            for tensor in proto.graph.initializer:
                array = onnx.numpy_helper.to_array(tensor)
                raw = array.tobytes()
                if len(raw) < SHARED_MIN_BYTES:
                    continue
                before += len(raw)
                digest = hashlib.sha256(raw).digest()
                if digest not in stored:
                    out.write(b"\0" * (-out.tell() % SHARED_ALIGN))
                    stored[digest] = (out.tell(), len(raw))
                    out.write(raw)
                offset, length = stored[digest]
                tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))  # typed fields -> raw_data only
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
            onnx.save(proto, str(path))
        size = out.tell()
    return before, size


# ---- 1c. an EAGLE-3 drafter's graphs -----------------------------------------------------------------------
@dataclass(frozen=True)
class Eagle3Graphs:
    draft: kv.KVLayout  # its own cache (bundle.eagle3_layout)
    steps: dict[int, str]  # pass length -> step graph name
    fcs: dict[int, str]  # pass length -> fc graph name


def _eagle3_graphs(job: bundle.ExportJob, lengths: tuple[int, ...], work: Path, fp32: dict[str, Path]) -> Eagle3Graphs:
    """An EAGLE-3 drafter's step and fc graphs at each of the target's pass lengths, fp32 ONNX into `fp32` (graph ->
    path), linears as 1x1 Convs and norms as single nodes like the target's. The step reads rotary cos / sin from
    tables and attends with 4-D ops only (`static.Eagle3StepFunction`: what the HTP compiles); the runtime pads a
    shorter step at the front (edge_spec.runtimes.fixed_eagle3)."""
    drafter, c = job.drafter.eval(), job.drafter.cfg
    draft = bundle.eagle3_layout(c, job.layout.max_context)
    step_io, fc_io = (kv.eagle3_drafter_io(draft, c.hidden_size, c.draft_vocab_size),
                      kv.eagle3_fc_io(len(job.aux_layers) * job.target.config.hidden_size, c.hidden_size))
    names = [([t.name for t in io.inputs], [t.name for t in io.outputs]) for io in (step_io, fc_io)]
    rows = draft.max_context + max(lengths) + 1  # positions a padded step can hold
    graphs = Eagle3Graphs(draft, {t: qnn_htp.eagle3_step_graph(t) for t in lengths},
                          {t: qnn_htp.eagle3_fc_graph(t) for t in lengths})
    for t in lengths:
        job.step(f"exporting the EAGLE-3 drafter at T = {t}")
        width = len(job.aux_layers) * job.target.config.hidden_size
        for g, module, args, io in ((graphs.steps[t], static.Eagle3StepFunction(drafter, rows, attend_concat),
                                     static.eagle3_step_args(drafter, draft, t), names[0]),
                                    (graphs.fcs[t], static.Eagle3FcFunction(drafter), (torch.zeros(1, t, width),),
                                     names[1])):
            fp32[g] = work / f"{g}.onnx"
            _onnx(module.eval(), args, io, fp32[g], g)
            linears_as_conv(fp32[g])
            fuse_rms_norms(fp32[g])
    return graphs


# ---- the bundle -------------------------------------------------------------------------------------------
def export_steps(with_drafter: bool, max_draft_len: int | None = None, max_pass: int | None = None,
                 graphs: str = "two", position0: str = "graph", eagle3: bool = False, **_) -> int:
    """How many times `export_bundle` calls `progress` for these lengths and --qnn-graphs (None: the defaults; for a
    progress bar). `eagle3`: the drafter is an EAGLE-3 one (a step and an fc graph per length)."""
    k = max_draft_len or DEFAULT_MAX_DRAFT_LEN
    lengths = len(target_lengths(graphs, k, max_pass or max(kv.DEFAULT_MAX_PASS, k + 1)))
    exports = lengths + (lengths if eagle3 else int(with_drafter))  # torch.onnx runs (an EAGLE-3 one: both graphs)
    graphs_out = lengths * (3 if eagle3 else 1) + (0 if eagle3 else int(with_drafter))  # quantized + compiled each
    return COMMON_STEPS + exports + 1 + 1 + 2 * graphs_out + 1 + 1 + (position0 == "table")


GRAPHS = ("two", "every")  # --qnn-graphs: which fixed pass lengths get a target graph (`target_lengths`)
# --qnn-position0: how a pass from position 0 gets its first row on the host. "graph": the sink graph (any first
# token; with the QDQ graphs, whose weights it shares in qnn/weights.data, so --provider cpu runs too); "table": rows
# precomputed for the chat template's first token and BOS (exporters/qnn_position0.py), no sink, QDQ graphs or
# weights.data: the phone bundle, one copy of the weights per context binary
POSITION0 = ("graph", "table")


def target_lengths(graphs: str, max_draft_len: int, max_pass: int) -> tuple[int, ...]:
    """The target graphs' pass lengths. "two" (default): one graph for decode and verify (max_draft_len + 1 rows; a
    decode step is a padded pass, which on an HTP costs about what one row does: it reads the same weights) and the
    prefill chunk - one graph when those are equal: two copies of the weights, since each QNN context binary holds its
    own (one context shared across graphs does not load on the x86-64 simulator, docs/android-qnn.md). "every":
    decode, verify at k + 1 for k in 1, 2, 4 and max_draft_len, prefill (`fixed.pass_lengths`, the Core ML lengths):
    ~6 copies. (Until 2026-12-06 "every" was the default: on the tiny Gemma-4 a 9-row pass differed from padded
    5-row decode steps through the CPU provider, because ranges were merged by tensor name and torch.onnx names some
    constants differently in each graph; `qnn_calibration.merged_ranges` now matches tensors by node position.)"""
    if graphs not in GRAPHS:
        raise ConfigError(f"unknown --qnn-graphs {graphs!r}", f"use one of {', '.join(GRAPHS)}")
    if graphs == "every":
        return pass_lengths(max_draft_len, max_pass)
    return tuple(sorted({max_draft_len + 1, max_pass}))


def writer(*, soc: str = qnn_htp.DEFAULT_SOC, host_sink: bool = True, graphs: str = "two",
           position0: str = "graph") -> bundle.Writer:
    """The qnn format's `write` for `soc` (edge_spec.contract.bundle.export_bundle); fails before any work when the
    SoC is unknown, `graphs` unknown or the QNN EP missing. `max_pass` (default 64, or max_draft_len + 1): the
    prefill chunk, the longest fixed pass length; `graphs`: `target_lengths`. `host_sink` (default): position 0 runs
    on the host CPU through `qnn/target_sink.onnx` (`float_twin`), and the quantized graphs are calibrated on the
    passes after it; False quantizes position 0 with the rest (measurements)."""
    chip = qnn_htp.get_soc(soc)
    target_lengths(graphs, 1, 1)  # refuses an unknown choice before any work
    if position0 not in POSITION0:
        raise ConfigError(f"unknown --qnn-position0 {position0!r}", f"use one of {', '.join(POSITION0)}")
    if position0 == "table" and not host_sink:
        raise ConfigError("--qnn-position0 table is computed by the host sink", "export with the host sink")
    qnn_htp.import_qnn()

    def write(job: bundle.ExportJob):
        return _write(job, chip, host_sink, graphs, position0)

    return write


export_bundle = bundle.entry("qnn")  # export_bundle(target, out, *, drafter, precision, ..., soc, host_sink)


def _write(job: bundle.ExportJob, soc: qnn_htp.Soc, host_sink: bool, graphs: str, position0: str
           ) -> tuple[dict, dict]:
    cfg, layout, step = job.target.config, job.layout, job.step
    if layout.max_pass is None:
        raise ConfigError("a QNN bundle needs fixed pass lengths", "pass --max-pass")
    lengths = target_lengths(graphs, job.max_draft_len, layout.max_pass)
    slots = {kind: layout.slots(kind) for kind in layout.kinds()}  # no headroom: new rows are their own columns
    work = job.tmp / "work"
    work.mkdir()
    (job.tmp / QNN_DIR).mkdir()
    fp32: dict[str, Path] = {}
    aux = len(job.aux_layers) * cfg.hidden_size  # an eagle3 drafter's: the target graphs return its aux states
    target_io = kv.target_io(layout, cfg.vocab_size, cfg.hidden_size, aux_size=aux)
    drafter_io = None
    kinds = layout.kinds()
    names_in = [t.name for t in target_io.inputs]
    placed_in = names_in[:2 + len(kinds)] + [keep_name(k) for k in kinds] + [slot_index_name(k) for k in kinds] \
        + names_in[2 + len(kinds):]
    model = job.target.model.eval()
    ops = TableRopeOps(layout.max_context + max(lengths))  # rotary from tables: no angle activation to clip
    for t in lengths:
        step(f"exporting the target at T = {t}")
        fp32[target_graph(t)] = work / f"{target_graph(t)}.onnx"
        _onnx(static.PlacedTargetFunction(model, kinds, ops, job.aux_layers).eval(),
              static.placed_target_args(layout, slots, t),
              (placed_in, [o.name for o in target_io.outputs]), fp32[target_graph(t)], target_graph(t))
        linears_as_conv(fp32[target_graph(t)])
        fuse_rms_norms(fp32[target_graph(t)])
    eagle3 = _eagle3_graphs(job, lengths, work, fp32) if job.aux_layers else None
    if job.drafter is not None and not eagle3:
        step("exporting the drafter step")
        drafter_io = kv.drafter_io(layout, job.sources, cfg.vocab_size, cfg.hidden_size,
                                   job.drafter.cfg.candidates_per_step, output_table=False, tables=False)
        fp32[DRAFTER_GRAPH] = work / f"{DRAFTER_GRAPH}.onnx"
        module = static.DrafterFunction(job.drafter.eval(), model, tuple(sorted(job.sources)), PLACED, ops).eval()
        _onnx(module, static.drafter_args(model, layout, job.sources, slots, ids=torch.int32),
              ([t.name for t in drafter_io.inputs], [t.name for t in drafter_io.outputs]), fp32[DRAFTER_GRAPH],
              DRAFTER_GRAPH)
        linears_as_conv(fp32[DRAFTER_GRAPH])
        fuse_rms_norms(fp32[DRAFTER_GRAPH])
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    pre = {}
    for g, path in fp32.items():
        pre[g] = work / f"{g}.pre.onnx"
        if not qnn_preprocess_model(str(path), str(pre[g])):
            pre[g] = path
    step("calibrating on the bench prompts (fp32 graphs, CPU, every tensor ranged on every pass)")
    own, sequences = calibrate(job, pre, lengths, slots, host_sink, eagle3)  # graph -> tensor -> (min, max)
    wide, sensitivity = WIDE_WEIGHTS, None
    if job.precision == "16a8w":  # the linears whose 8-bit weights cost most keep 16 bits (qnn_sensitivity: why)
        step("measuring which linears keep 16-bit weights (eager, one at a time)")
        recipe, with_16 = linear_gains(model, sequences, WIDE_WEIGHTS)
        chosen = choose(recipe, with_16, candidates(model, WIDE_WEIGHTS), sum(p.numel() for p in model.parameters()),
                        GAIN, BUDGET)
        wide += tuple(graph_name(n) for n in chosen)
        sensitivity = {"kl_8bit": recipe, "kl_16bit_alone": with_16, "chosen": list(chosen), "gain": GAIN,
                       "budget": BUDGET}
    else:
        step(f"{job.precision}: every weight at 8 bits")
    targets = [target_graph(t) for t in lengths]
    merged = merged_ranges(pre, own, targets)  # one range per tensor across the target's graphs
    outputs = dict.fromkeys(targets, (kv.LOGITS, kv.HIDDEN))  # the outputs whose ranges get headroom
    if eagle3:  # the drafter's step graphs share their ranges, and so do its fc graphs
        for group, names in ((eagle3.steps, (kv.DRAFT_LOGITS, kv.DRAFT_HIDDEN)), (eagle3.fcs, ())):
            merged |= merged_ranges(pre, own, list(group.values()))
            outputs |= dict.fromkeys(group.values(), names)
    for g in fp32:
        step(f"quantizing {g} ({job.precision}" + (f"; 16-bit weights: {', '.join(wide)}" if sensitivity and g in targets
                                                    else "") + ")")
        ranges = with_headroom(merged[g], moved_from(pre[g], outputs[g])) if g in merged else None
        if g in targets:  # the MLPs' gated products: held-out text overruns their calibrated ranges (DOWN_IN_HEADROOM)
            ranges = with_headroom(ranges, down_proj_inputs(pre[g]), DOWN_IN_HEADROOM)
        tables = g == DRAFTER_GRAPH or bool(eagle3 and g in eagle3.steps.values())
        quantize(pre[g], job.tmp / qdq_file(g), own[g], job.precision, ranges, tables=tables,
                 wide=wide if g in targets else ())
        step(f"compiling {g} for {soc.name} (HTP v{soc.htp_arch})")
        compile_context(job.tmp / qdq_file(g), job.tmp / ctx_file(g), soc)
    if host_sink:
        step("writing the host's float twin of the first pass")
        float_twin(job.tmp / qdq_file(target_graph(lengths[0])), job.tmp / qnn_htp.sink_file())  # row 0, padded
    step("storing the weights once for the QDQ graphs")
    share_weights([job.tmp / qdq_file(g) for g in fp32] + ([job.tmp / qnn_htp.sink_file()] if host_sink else []),
                  job.tmp / qnn_htp.weights_file())
    for leftover in work.iterdir():
        leftover.unlink()
    work.rmdir()
    chip = {"soc": soc.name, "soc_model": soc.soc_model, "htp_arch": soc.htp_arch, "quant": job.precision,
            "mask_floor": qnn_htp.MASK_FLOOR, "sdk": qnn_htp.versions(), "target_inputs": placed_in,
            "host_sink": qnn_htp.sink_file() if host_sink else None,
            "weights16": list(wide) if job.precision == "16a8w" else [],  # the recipe: linears at 16 bits
            "weight_sensitivity": sensitivity,
            "headroom": {"outputs": OUTPUT_HEADROOM, "down_proj_input": DOWN_IN_HEADROOM},
            "calibration": {"prompts": len(sequences), "tokens": max(map(len, sequences)), "ranged": "every pass"}}
    if position0 == "table":  # the phone bundle: position 0's rows instead of the sink, the QDQ graphs and their weights
        tokens = qnn_position0.first_tokens(job.target)
        step(f"precomputing position 0 for first tokens {tokens}")
        qnn_position0.write_table(job.tmp / qnn_htp.sink_file(), job.layout, lengths[0], slots, tokens,
                                  job.tmp / qnn_htp.position0_file(), aux)
        for g in fp32:
            (job.tmp / qdq_file(g)).unlink()
        (job.tmp / qnn_htp.sink_file()).unlink()
        (job.tmp / qnn_htp.weights_file()).unlink()
        chip |= {"host_sink": None, "cpu_graphs": False,
                 "position0": {"file": qnn_htp.position0_file(), "tokens": tokens}}
    fixed = {"lengths": {str(t): target_graph(t) for t in lengths}, "slots": slots, "qnn": chip}
    graphs = {"target": GraphEntry(QNN_DIR, job.precision, target_io, fixed=fixed)}
    if eagle3:  # its step and fc graphs at the target's lengths, over its own `io` cache
        c = job.drafter.cfg
        graphs["drafter"] = GraphEntry(QNN_DIR, job.precision,
                                       kv.eagle3_drafter_io(eagle3.draft, c.hidden_size, c.draft_vocab_size),
                                       method=eagle3.steps[lengths[0]],
                                       fixed={"lengths": {str(t): g for t, g in eagle3.steps.items()},
                                              "slots": {kv.DRAFT_KIND: eagle3.draft.max_context}, "qnn": chip})
        graphs[EAGLE3_FC_GRAPH] = GraphEntry(QNN_DIR, job.precision, kv.eagle3_fc_io(aux, c.hidden_size),
                                             method=eagle3.fcs[lengths[0]],
                                             fixed={"lengths": {str(t): g for t, g in eagle3.fcs.items()}, "qnn": chip})
    elif drafter_io is not None:
        graphs["drafter"] = GraphEntry(QNN_DIR, job.precision, drafter_io, method=DRAFTER_GRAPH,
                                       fixed={"slots": slots, "qnn": chip})
    return graphs, {}
