"""Core ML exporter: ONE multifunction .mlpackage holding the target at fixed pass lengths and the drafter step,
the KV caches as function inputs (the KV contract's `io` binding: the layout the Neural Engine runs well).

    edge-spec export --format coreml --quant fp16|fp32|int8|int4|int4-channel [--kv io|state] --out B

Functions of `coreml/program.mlpackage` (coremltools `save_multifunction`, identical weights stored once):
  * `target_{T}` for each pass length T in `pass_lengths(...)` (1 = decode, 2..k+1 = verify, the largest = the
    prefill chunk): (input_ids [1, T] int32, position_ids [1, T] int32, mask_{kind} [1, 1, T, S_kind + T],
    k_cache_{l} / v_cache_{l} [1, H_kv, S_kind, D]) -> (logits [1, T, V], hidden [1, T, H], k_new_{l} / v_new_{l}
    [1, H_kv, T, D]). Every shape is fixed (the ANE runs only fixed or enumerated shapes): the runtime pads a pass
    to the next length (pad rows repeat the last token at the next positions and see what the last real row sees;
    they are never committed).
  * `drafter`: (input_ids [1, 1], hidden [1, 1, Ht], position_ids [1, 1], mask_{kind} [1, 1, 1, S_kind], the source
    layers' caches) -> (draft_token_ids, draft_logits, draft_hidden); the target's embedding (and output table) are
    constants of the function, deduplicated against the target's by `save_multifunction`.
  * with an EAGLE-3 drafter (edge_spec/model/eagle3.py) instead: every `target_{T}` also returns aux_hidden
    [1, T, n * H]; `drafter_{T}` (the step: its own cache as function IO, draft_mask [1, 1, T, S_draft + T], the last
    row's candidates out; a shorter step is padded at the front) and `drafter_fc_{T}` (aux -> fused, fp32 compute)
    for each T of the target (exporters/static.py Eagle3StepFunction / Eagle3FcFunction). Its cache is function IO
    under either binding: beside a `state` target its functions declare no states (the target's MLState serves the
    target's functions only; manifest: the draft layout stays `io`, Format.eagle3_state False).
Feature names are the contract's (edge_spec.contract.kv) with "." spelled "_" (`kv.feature_name`); ids are int32.

`--kv state` (the contract's `state` binding, iOS 18 / macOS 15 MLState; what the GPU runs well): the caches are
states k_cache_{l} / v_cache_{l} [1, H_kv, S_f, D] fp16 (Core ML's only state type), S_f = edge_spec.runtimes.fixed.state_slots
(the layout's slots + a spare one for pad rows, rounded up to 32), declared identically by every function, so one
`make_state()` serves the target's functions and the (MTP) drafter, which reads the target's state in place:
  * `target_{T}`: (input_ids, position_ids, mask_{kind} [1, 1, T, S_f] slot form, write_slots_{kind} [T] int32)
    -> (logits, hidden): scatters all T rows into their slots (pad rows into the spare slot), then attends over the
    slots (edge_spec.exporters.static.StateTargetFunction);
  * `drafter`: (input_ids, hidden, position_ids, mask_{kind} [1, 1, 1, S_f]) -> as above (it zeroes the spare slot of
    every state, so that the converter declares them all: it makes states of mutated buffers only).

Slots: full layers hold max_context + `headroom` slots (the largest pass length - 1), so a padded pass never
writes a pad row's key into a slot a real row reads, even at the end of the context; rings keep kv.ring_slots
(W + max_pass - 1, which already holds a whole pass). Attention is the batch-invariant slot form
(edge_spec.model.attention.attend_slots), so verify rows reproduce decode steps wherever the kernels are row-independent;
the host check measures it on the Mac that runs the package.

Precisions (coremltools.optimize on the converted functions): fp16 compute (default; IO stays fp32; RMSNorm's ops in
fp32, `FP32_OPS`: its squares overflow fp16; the target's residual stream carried divided by a power of two where its
fp32 peak on the bench prompts needs it, edge_spec.model.headroom: gemma-3-270m's reaches 104,061), fp32 compute,
int8 per-channel weights, int4 per-block (32) weights (GPU), int4 per-channel (what the ANE runs), all fp16 compute.
Conversion goes through torch.export (its decomposed graph, with torch 2.13's `alias` no-ops removed).
Exporters import the core only, never runtimes.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from edge_spec.contract import bundle
from edge_spec.exporters import calibration
from edge_spec.contract import kv
from edge_spec.exporters import static
from edge_spec.exporters import coreml_passes
from edge_spec.contract.bundle import COMMON_STEPS, DEFAULT_MAX_DRAFT_LEN
from edge_spec.errors import ConfigError, ExportError
from edge_spec.contract.formats import FORMATS
from edge_spec.logs import IMPORT_NOISE, quiet
from edge_spec.runtimes.coreml_tools import import_coremltools
from edge_spec.runtimes.fixed import function_slots, pass_lengths, state_slots, write_slots_name
from edge_spec.contract.manifest import EAGLE3_FC_GRAPH, GraphEntry
from edge_spec.model import headroom

COREML_DIR = "coreml"
PACKAGE = f"{COREML_DIR}/program.mlpackage"
DRAFTER_FUNCTION = "drafter"
QUANT_BLOCK = 32
# ops kept in fp32 inside fp16 programs: RMSNorm's squares and their mean overflow fp16 (SmolLM2's residual stream
# reaches 290 after 3 layers and 24,880 later: 290^2 > 65504; measured through the MIL executor - every token came out
# 0), so the norm's pow / mean / + eps / sqrt / divide run in fp32
FP32_OPS = frozenset({"pow", "reduce_mean", "sqrt", "rsqrt", "real_div"})


def keep_fp32(op) -> bool:
    """FP16ComputePrecision's op_selector: True keeps `op` in fp32 (FP32_OPS, and the + eps after a mean)."""
    if op.op_type in FP32_OPS:
        return True
    return op.op_type == "add" and any(getattr(getattr(v, "op", None), "op_type", None) in FP32_OPS
                                       for v in op.inputs.values())


def target_function(t: int) -> str:
    return f"target_{t}"


def eagle3_step_function(t: int) -> str:
    return f"{DRAFTER_FUNCTION}_{t}"


def eagle3_fc_function(t: int) -> str:
    return f"{EAGLE3_FC_GRAPH}_{t}"


# ---- conversion ------------------------------------------------------------------------------------
def _drop_aliases(program) -> None:
    """torch 2.13's decompositions leave `aten.alias` no-ops, which coremltools 9.0 does not know."""
    graph = program.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and str(node.target).startswith("aten.alias"):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    program.graph_module.recompile()


def convert(module: nn.Module, args: tuple, inputs: list[str], outputs: list[str], precision: str, what: str,
            fp32_compute: bool = False):
    """One fixed-shape function: torch.export -> ct.convert (mlprogram, iOS 18) -> renamed features -> compressed
    (`precision`'s weights; its compute precision unless `fp32_compute`)."""
    ct = import_coremltools()
    try:  # (coremltools' per-pass progress bars go to a buffer: the export's own bar reports each function)
        with torch.no_grad(), warnings.catch_warnings(), quiet("torch", "torch.export", "coremltools", *IMPORT_NOISE), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.export.export(module, args, strict=False).run_decompositions()
            _drop_aliases(program)
            compute = ct.precision.FLOAT32 if precision == "fp32" or fp32_compute else \
                ct.transform.FP16ComputePrecision(op_selector=lambda op: not keep_fp32(op))
            mlmodel = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                                 compute_precision=compute, skip_model_load=True)
    except Exception as err:  # torch.export / coremltools raise many types: name the function and the cause
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ExportError(f"Core ML conversion failed for the {what} function: {first[:300]}",
                          "use --format onnx or executorch for this model, or report the model config") from err
    spec = mlmodel.get_spec()
    got_in = [i.name for i in spec.description.input]
    got_out = [o.name for o in spec.description.output]
    if len(got_in) != len(inputs) or len(got_out) != len(outputs):
        raise ExportError(f"the {what} function converted with {len(got_in)} inputs / {len(got_out)} outputs, "
                          f"expected {len(inputs)} / {len(outputs)}")
    for old, new in zip(got_in + got_out, inputs + outputs):
        if old != new:
            ct.utils.rename_feature(spec, old, new)
    mlmodel = ct.models.MLModel(spec, weights_dir=mlmodel.weights_dir, skip_model_load=True)
    return compress(mlmodel, precision)


def compress(mlmodel, precision: str):
    """Weight compression of a converted function (coremltools.optimize.coreml), or the model as is."""
    if precision in ("fp32", "fp16"):
        return mlmodel
    import coremltools.optimize.coreml as cto

    if precision == "int8":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel")
    elif precision == "int4":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4", granularity="per_block",
                                         block_size=QUANT_BLOCK)
    elif precision == "int4-channel":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4", granularity="per_channel")
    else:
        raise ConfigError(f"unknown Core ML precision {precision!r}", "choose one of " + ", ".join(FORMATS["coreml"].precisions))
    with warnings.catch_warnings(), quiet("coremltools"), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op))


def target_features(layout: kv.KVLayout, aux: bool = False) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of the target functions; `state`: the write slots follow the masks; `aux`: aux_hidden."""
    io = kv.target_io(layout, 1, 1, aux_size=1 if aux else 0)
    inputs = [kv.feature_name(t.name) for t in io.inputs]
    if layout.binding == kv.BINDING_STATE:
        inputs += [kv.feature_name(write_slots_name(kind)) for kind in layout.kinds()]
    return inputs, [kv.feature_name(t.name) for t in io.outputs]


def drafter_features(layout: kv.KVLayout, sources: dict[str, int]) -> tuple[list[str], list[str]]:
    io = kv.drafter_io(layout, sources, 1, 1, 1, output_table=False, tables=False)
    return [kv.feature_name(t.name) for t in io.inputs], [kv.feature_name(t.name) for t in io.outputs]


def eagle3_features(draft: kv.KVLayout) -> tuple[tuple[list[str], list[str]], tuple[list[str], list[str]]]:
    """((inputs, outputs) of the EAGLE-3 step functions, those of its fc functions)."""
    names = [[kv.feature_name(t.name) for t in specs] for io in (kv.eagle3_drafter_io(draft, 1, 1), kv.eagle3_fc_io(1, 1))
             for specs in (io.inputs, io.outputs)]
    return (names[0], names[1]), (names[2], names[3])


def state_names(layout: kv.KVLayout) -> list[str]:
    """The `state` binding's state names, in the order every function declares them."""
    return [kv.feature_name(name(c.layer)) for c in layout.caches for name in (kv.k_cache_name, kv.v_cache_name)]


# ---- the bundle --------------------------------------------------------------------------------------
def export_steps(with_drafter: bool, max_draft_len: int | None = None, max_pass: int | None = None, **_) -> int:
    """How many times `export_bundle` calls `progress` for these lengths (None: the defaults; for a progress bar)."""
    k = max_draft_len or DEFAULT_MAX_DRAFT_LEN
    n_lengths = len(pass_lengths(k, max_pass or max(kv.DEFAULT_MAX_PASS, k + 1)))
    return COMMON_STEPS + n_lengths + 1 + (1 if with_drafter else 0)


def writer() -> bundle.Writer:
    """The coreml format's `write` for edge_spec.contract.bundle.export_bundle. `max_pass` (default 64, or
    max_draft_len + 1): the prefill chunk, the largest fixed pass length; `binding`: "io" (caches as function IO,
    default) or "state" (MLState; see the module doc)."""
    return _write


export_bundle = bundle.entry("coreml")  # export_bundle(target, out, *, drafter, precision, ..., binding)


def _write(job: bundle.ExportJob) -> tuple[dict, dict]:
    ct = import_coremltools()
    cfg, layout, step = job.target.config, job.layout, job.step
    if layout.max_pass is None:
        raise ConfigError("a Core ML package needs fixed pass lengths", "pass --max-pass")
    lengths = pass_lengths(job.max_draft_len, layout.max_pass)
    state = layout.binding == kv.BINDING_STATE
    eagle3 = bool(job.aux_layers)
    slots = state_slots(layout) if state else function_slots(layout, lengths)
    work = job.tmp / "functions"
    work.mkdir()
    desc = ct.utils.MultiFunctionDescriptor()
    with coreml_passes.pipeline_checks():  # coremltools' pass pipelines, validated once each (not after every pass)
        for name, path in _functions(job, lengths, slots, work):
            desc.add_function(str(path), src_function_name="main", target_function_name=name)
        step("merging the functions into one .mlpackage")
        desc.default_function_name = target_function(1)
        (job.tmp / COREML_DIR).mkdir()
        with warnings.catch_warnings(), quiet("coremltools"), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            ct.utils.save_multifunction(desc, str(job.tmp / PACKAGE))
    shutil.rmtree(work)
    fixed = {"lengths": {str(t): target_function(t) for t in lengths}, "slots": slots}
    if state:  # what a runner outside Python needs to feed the functions and size the shared state
        fixed |= {"inputs": target_features(layout)[0], "states": state_names(layout)}
    aux = len(job.aux_layers) * cfg.hidden_size
    graphs = {"target": GraphEntry(PACKAGE, job.precision, kv.target_io(layout, cfg.vocab_size, cfg.hidden_size,
                                                                        aux_size=aux),
                                   method=target_function(1), fixed=fixed)}
    if eagle3:  # its step and fc functions at the target's lengths, over its own `io` cache
        draft, c = bundle.eagle3_layout(job.drafter.cfg, layout.max_context), job.drafter.cfg
        graphs["drafter"] = GraphEntry(PACKAGE, job.precision, kv.eagle3_drafter_io(draft, c.hidden_size,
                                                                                     c.draft_vocab_size),
                                       method=eagle3_step_function(1),
                                       fixed={"lengths": {str(t): eagle3_step_function(t) for t in lengths},
                                              "slots": {kv.DRAFT_KIND: draft.max_context}})
        graphs[EAGLE3_FC_GRAPH] = GraphEntry(PACKAGE, job.precision, kv.eagle3_fc_io(aux, c.hidden_size),
                                             method=eagle3_fc_function(1),
                                             fixed={"lengths": {str(t): eagle3_fc_function(t) for t in lengths}})
    elif job.drafter is not None:
        drafter_io = kv.drafter_io(layout, job.sources, cfg.vocab_size, cfg.hidden_size,
                                   job.drafter.cfg.candidates_per_step, output_table=False, tables=False)
        graphs["drafter"] = GraphEntry(PACKAGE, job.precision, drafter_io, method=DRAFTER_FUNCTION,
                                       fixed={"slots": slots} | ({"states": state_names(layout)} if state else {}))
    return graphs, {}


def _functions(job: bundle.ExportJob, lengths: tuple[int, ...], slots: dict[str, int], work: Path):
    """Convert and save each function as its own package under `work`; yields (function name, package path).
    The models run as the package runs them (`static.TargetFunction`: slot attention, rings, the tanh GELU spelled
    out: coremltools 9.0 converts torch.export's tanh GELU as the erf one)."""
    layout = job.layout
    state = layout.binding == kv.BINDING_STATE
    model = job.target.model.eval()
    names_in, names_out = target_features(layout, bool(job.aux_layers))
    stream, note, s = model, "", 1
    if job.precision != "fp32":  # fp16 compute: the residual stream must fit fp16 (edge_spec.model.headroom)
        s, peak = calibration.stream_scale(job.target)
        stream = headroom.scaled_stream(model, s).eval()
        note = f", residual stream / {s}: its fp32 peak {peak:,.0f} on the bench prompts" if s > 1 else ""
    for t in lengths:
        job.step(f"converting the target at T = {t} ({job.precision}, {layout.binding} binding{note})")
        if state:
            module = static.StateTargetFunction(stream, layout, slots, job.aux_layers)
            args = static.state_target_args(layout, slots, t)
        else:
            module, args = static.TargetFunction(stream, layout, job.aux_layers), static.target_args(layout, slots, t)
        ml = convert(module.eval(), args, names_in, names_out, job.precision, target_function(t))
        _check_states(ml, layout, target_function(t))
        yield target_function(t), _save(ml, work / f"{target_function(t)}.mlpackage")
    if job.aux_layers:
        yield from _eagle3_functions(job, lengths, s, work)
    elif job.drafter is not None:
        job.step(f"converting the drafter step ({job.precision})")
        d_in, d_out = drafter_features(layout, job.sources)
        args = static.drafter_args(model, layout, job.sources, slots)
        if state:
            module = static.StateDrafterFunction(job.drafter.eval(), model, layout, slots, job.sources)
            args = args[:3 + len(job.sources)]  # no cache inputs: the states
        else:
            module = static.DrafterFunction(job.drafter.eval(), model, tuple(sorted(job.sources)))
        ml = convert(module.eval(), args, d_in, d_out, job.precision, DRAFTER_FUNCTION)
        _check_states(ml, layout, DRAFTER_FUNCTION)
        yield DRAFTER_FUNCTION, _save(ml, work / f"{DRAFTER_FUNCTION}.mlpackage")


def _eagle3_functions(job: bundle.ExportJob, lengths: tuple[int, ...], scale: int, work: Path):
    """An EAGLE-3 drafter's step and fc functions at each pass length (one progress step). fc runs in fp32 compute:
    it reads the target's stream divided by `scale` (fp16 headroom) and multiplies it back, beyond fp16's range
    where the stream is (gemma-3-270m: 104,061)."""
    drafter = job.drafter.eval()
    draft = bundle.eagle3_layout(drafter.cfg, job.layout.max_context)
    (step_in, step_out), (fc_in, fc_out) = eagle3_features(draft)
    job.step(f"converting the EAGLE-3 drafter's step and fc functions at T = {', '.join(map(str, lengths))} "
             f"({job.precision})")
    width = drafter.cfg.num_aux * drafter.cfg.hidden_size
    for t in lengths:
        ml = convert(static.Eagle3StepFunction(drafter).eval(), static.eagle3_step_args(drafter, draft, t), step_in,
                     step_out, job.precision, eagle3_step_function(t))
        _check_states(ml, draft, eagle3_step_function(t))  # none, beside a `state` target too: its cache is IO
        yield eagle3_step_function(t), _save(ml, work / f"{eagle3_step_function(t)}.mlpackage")
        ml = convert(static.Eagle3FcFunction(drafter, scale).eval(), (torch.zeros(1, t, width),), fc_in, fc_out,
                     job.precision, eagle3_fc_function(t), fp32_compute=True)
        _check_states(ml, draft, eagle3_fc_function(t))
        yield eagle3_fc_function(t), _save(ml, work / f"{eagle3_fc_function(t)}.mlpackage")


def _check_states(mlmodel, layout: kv.KVLayout, what: str) -> None:
    """Every function of a `state` package must declare the same states (one MLState serves them all); an EAGLE-3
    drafter's functions (`layout`: its own, `io`) declare none."""
    want = state_names(layout) if layout.binding == kv.BINDING_STATE else []
    got = [s.name for s in mlmodel.get_spec().description.state]
    if sorted(got) != sorted(want):
        raise ExportError(f"the {what} function declares states {got}, expected {want}",
                          "report the model config; export with --kv io meanwhile")


def _save(mlmodel, path: Path) -> Path:
    mlmodel.save(str(path))
    return path
