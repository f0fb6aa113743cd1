"""ONNX exporter: the target graph (prefill / verify / decode, symbolic T) and the drafter step graph.

Both follow the `io` binding of the KV contract (edge_spec/contract/kv.py): caches are graph inputs with a
symbolic length per attention kind (`S_full`, `S_sliding`), graphs return only the new K/V rows
[1, H_kv, T, D]; IO names, order and shapes come from `kv.target_io` / `kv.drafter_io`.

Choices (see docs/architecture.md, "ONNX Runtime path"):
  * one target graph for every T (prefill chunks, verify, T=1 decode): the weights dominate a decode step;
    its `logit_rows` input picks the rows that get the final norm and the head (a prefill chunk: its last only);
  * symbolic cache length, so the runtime binds only the slot prefix in use (no attention over 2048 empty
    slots); caches keep the contract's head-major [1, H_kv, S, D] layout;
  * full attention is batch-invariant (edge_spec.model.attention.attend_slots): every key's score and every value sits
    in its slot's column (slot == position; the new V rows are written into a copy of the bound V cache, the
    new keys' scores into the cache scores), so a verify pass reproduces T=1 decode steps bit for bit; this
    costs one copy of the bound V prefix per layer and step (measured in docs/architecture.md). Sliding
    layers do the same in ring slots (slot = position % ring): the bundle caps the tokens per forward
    (`max_pass`, default 64) and its rings hold W + max_pass - 1 keys, so that no new key of a forward
    evicts one an earlier row of the same forward still reads (`kv.ring_slots`);
  * with the dynamo exporter the target uses onnxruntime's fused RotaryEmbedding (rope tables of max_context
    rows) and SkipSimplifiedLayerNormalization (residual add + RMSNorm) kernels and packed q/k/v and gate/up
    projections (`onnx_fused.FusedOps`; SmolLM2 int8: 1,383 -> 805 nodes per step, ~15-20% faster
    decode, measured in docs/architecture.md);
  * the target's input embedding table is written once, raw, as `onnx/embed_table.bin`: the target graph
    reads it as external data of its `embed_table` initializer and the drafter graph takes it as an input
    (the runtime binds one memory-mapped buffer to both), so the drafter embeds tokens - and a
    `head_from="target"` drafter scores them - without a second copy. An untied target with such a
    drafter also gets `output_table.bin` (its lm_head), the one case with a duplicate. int8 / int4 bundles of a
    tied target store no float table at all: the quantized output head's codes, scales (and zero points) are the
    table (`onnx/embed_table_q8.bin` or `embed_table_q4.bin`, ...), gathered by both graphs (exporters/onnx_tables.py);
  * precisions: fp32; fp16 (onnxruntime's float16 converter, float32 IO, `to_float16`); int8 / int4 / int4-gguf =
    weight-only MatMulNBits (blocks of 32, int8 activations = accuracy level 4): int8 symmetric codes (as Q8_0: no
    offset term); int4 onnxruntime's native grid (integer zero points, 4-bit tied head and table, as
    onnxruntime-genai's int4; each block's scale and zero point fitted to the layer inputs' statistics on the bench
    prompts, exporters/calibration.linear_input_stats + onnx_passes.fit_zero_point_grid); int4-gguf asymmetric min/max
    codes (a GGUF's Q4_1 weights exactly) + a per-block offset term, 8-bit symmetric head (Q8_0's grid). Top-1
    agreement with fp32 and bytes of each: docs/benchmarks.md. onnxruntime's own quantizers were measured and rejected:
    quantize_dynamic (per-tensor uint8 activations) and symmetric int4 agreed with fp32 on only ~60% of SmolLM2's
    top-1 tokens;
  * exporter: dynamo (default; leaner graphs, ~15% faster decode than TorchScript's shape-op chains) or
    TorchScript (`exporter="torchscript"`, ~10x faster to export). Both work with torch 2.13.

Exporters import the core only, never runtimes.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.contract import bundle
from edge_spec.contract import kv
from edge_spec.contract.bundle import COMMON_STEPS
from edge_spec.model.config import GEMMA4, REUSE
from edge_spec.model.drafter import Drafter
from edge_spec.errors import ConfigError, ExportError
from edge_spec.logs import quiet
from edge_spec.contract.manifest import GraphEntry, TableEntry
from edge_spec.model.forms import SPLIT, Form, Slots
from edge_spec.model.ops import EAGER, Ops
from edge_spec.model.transformer import Transformer
from edge_spec.exporters.onnx_fused import FusedOps
from edge_spec.exporters import calibration
from edge_spec.exporters.onnx_passes import (ONNX_DIR, QUANT, TABLE_FILES, ZERO_POINT, rename_embedding_table, quantize,
                                             save_graph, write_table)
from edge_spec.exporters.onnx_tables import quantize_drafter_table, quantize_gather_tables, share_table
from edge_spec.exporters.onnx_eagle3 import write_eagle3

TARGET_FILE = f"{ONNX_DIR}/target.onnx"
DRAFTER_FILE = f"{ONNX_DIR}/drafter.onnx"
OPSET = 18


# ---- flat-tensor wrappers (the exported signatures) ----------------------------------------------------
class TargetGraph(nn.Module):
    """(input_ids, position_ids, masks per kind, k/v caches per cached layer, logit rows [R]) -> (logits [1, R, V],
    hidden [1, R, H], with `aux_layers` aux_hidden [1, T, n * H], k/v new rows)."""

    def __init__(self, model: Transformer, kinds: tuple[str, ...], form: Form, ops: Ops, aux_layers: tuple = ()):
        super().__init__()
        self.model, self.kinds, self.form, self.ops, self.aux_layers = model, kinds, form, ops, tuple(aux_layers)

    def forward(self, input_ids, position_ids, masks: tuple, caches: tuple, logit_rows=None):
        out = self.model(input_ids, position_ids, dict(zip(self.kinds, masks)), list(caches[0::2]),
                         list(caches[1::2]), form=self.form, ops=self.ops, rows=logit_rows, aux_layers=self.aux_layers)
        rows = [r for k, v in zip(out.new_k, out.new_v) for r in (k, v)]
        return (out.logits, out.hidden, *((out.aux,) if self.aux_layers else ()), *rows)


class DrafterGraph(nn.Module):
    """(token, hidden, position, masks, source caches, tables) -> (candidate ids, their logits, next hidden)."""

    def __init__(self, drafter: Drafter, kinds: tuple[str, ...], embed_scale: float):
        super().__init__()
        self.drafter, self.kinds, self.embed_scale = drafter, kinds, embed_scale

    def forward(self, input_ids, hidden, position_ids, masks: tuple, caches: tuple, tables: tuple):
        token_embed = F.embedding(input_ids, tables[0]) * self.embed_scale  # the target's embed(), [1, 1, Ht]
        pairs = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(self.kinds))]
        kv_in = {kind: (k, v) for kind, (k, v) in zip(self.kinds, pairs)}
        head_table = tables[-1] if self.drafter.cfg.head_from == "target" else None
        out = self.drafter(token_embed, hidden, position_ids, dict(zip(self.kinds, masks)), kv_in, head_table)
        return out.token_ids, out.logits, out.hidden


# ---- export ------------------------------------------------------------------------------------------
EXPORTERS = ("dynamo", "torchscript")


def _torch_export(module: nn.Module, args: tuple, dynamic_shapes: tuple, io: kv.GraphIO,
                  exporter: str = "dynamo") -> onnx.ModelProto:
    """torch.onnx.export with the contract's IO names; symbolic dims from `io` (TorchScript) or `dynamic_shapes`
    (dynamo). Both give the same maths to within fp32 rounding; dynamo's graphs decode faster, TorchScript
    exports in seconds instead of about a minute for SmolLM2."""
    if exporter not in EXPORTERS:
        raise ConfigError(f"unknown exporter {exporter!r}", f"choose one of {', '.join(EXPORTERS)}")
    names = {"input_names": [t.name for t in io.inputs], "output_names": [t.name for t in io.outputs]}
    with quiet("torch.onnx"), warnings.catch_warnings(), contextlib.redirect_stdout(None), \
            tempfile.TemporaryDirectory() as work:
        warnings.simplefilter("ignore")
        try:
            if exporter == "torchscript":
                axes = {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in io.inputs + io.outputs}
                path = Path(work) / "graph.onnx"
                torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET, do_constant_folding=True,
                                  dynamic_axes={k: v for k, v in axes.items() if v}, **names)
                proto = onnx.load(path)
            else:
                program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes, optimize=True,
                                            opset_version=OPSET, verbose=False, **names)
                proto = program.model_proto
        except Exception as err:  # the exporters raise many types; say which graph failed and why
            lines = [line for line in str(err).splitlines() if line.strip()]
            cause = next((line for line in lines if line.startswith("<class")), lines[0] if lines else "")
            raise ExportError(f"torch.onnx.export ({exporter}) failed for {type(module).__name__}: {cause}",
                              "try the other exporter, or use the eager runtime (--runtime torch)") from err
    _canonical_io(proto, io)
    return proto


_DTYPES = {"float32": onnx.TensorProto.FLOAT, "int64": onnx.TensorProto.INT64}


def _canonical_io(proto: onnx.ModelProto, io: kv.GraphIO) -> None:
    """Give graph inputs/outputs the contract's names, order and symbolic dim names (checking fixed dims)."""
    for role, values, specs in (("input", proto.graph.input, io.inputs), ("output", proto.graph.output, io.outputs)):
        if [v.name for v in values] != [s.name for s in specs]:
            raise ExportError(f"exported {role}s {[v.name for v in values]} differ from the contract "
                              f"{[s.name for s in specs]}")
        for value, spec in zip(values, specs):
            ttype = value.type.tensor_type
            if ttype.elem_type != _DTYPES[spec.dtype]:
                raise ExportError(f"exported {role} {spec.name} has ONNX type {ttype.elem_type}, expected {spec.dtype}")
            if len(ttype.shape.dim) != len(spec.shape):
                raise ExportError(f"exported {role} {spec.name} has rank {len(ttype.shape.dim)}, expected "
                                  f"{len(spec.shape)}")
            for dim, want in zip(ttype.shape.dim, spec.shape):
                if isinstance(want, int):
                    if dim.HasField("dim_value") and dim.dim_value != want:
                        raise ExportError(f"exported {role} {spec.name} has shape {ttype.shape}, expected {spec.shape}")
                    dim.Clear()
                    dim.dim_value = want
                else:
                    if dim.HasField("dim_value"):
                        raise ExportError(f"exported {role} {spec.name}: dim {want} was specialised to "
                                          f"{dim.dim_value} (it must stay symbolic)")
                    dim.Clear()
                    dim.dim_param = want


def _blank_unused_outputs(proto: onnx.ModelProto) -> None:
    """Unread optional outputs of contrib nodes -> "" (SkipSimplifiedLayerNormalization's float32 statistics:
    unnamed, the kernel skips them and the fp16 converter cannot mistype them)."""
    read = {name for node in proto.graph.node for name in node.input} | {o.name for o in proto.graph.output}
    blanked = set()
    for node in proto.graph.node:
        if node.domain == "com.microsoft":
            for i, name in enumerate(node.output):
                if i > 0 and name and name not in read:
                    node.output[i] = ""
                    blanked.add(name)
    kept = [v for v in proto.graph.value_info if v.name not in blanked]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)


def _example_lengths(layout: kv.KVLayout) -> dict[str, int]:
    """Distinct example cache lengths per kind (never 0/1, which torch.export would specialise)."""
    return {kind: 5 + 2 * i for i, kind in enumerate(layout.kinds())}


ATTENTION_FORMS = ("slots", "split")


def export_target(model: Transformer, layout: kv.KVLayout, *, exporter: str = "dynamo",
                  attention: str = "slots", aux_layers: tuple[int, ...] = ()) -> onnx.ModelProto:
    """The target graph. `attention`: "slots" (batch-invariant, edge_spec.model.attention.attend_slots; what bundles ship) or
    "split" (cache part + new part, the form before 2026-11-30): kept only as the negative control of the exactness
    tests and the host check, which must find it not batch-invariant."""
    if attention not in ATTENTION_FORMS:
        raise ConfigError(f"unknown attention form {attention!r}", f"choose one of {', '.join(ATTENTION_FORMS)}")
    cfg = model.cfg
    io = kv.target_io(layout, cfg.vocab_size, cfg.hidden_size, True, len(aux_layers) * cfg.hidden_size)
    kinds = layout.kinds()
    t, lengths = 3, _example_lengths(layout)
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    start = min(lengths.values()) - t  # full-attention layers write the new rows into slots == positions
    pos = torch.arange(start, start + t)[None]
    masks = tuple(torch.zeros(1, 1, t, lengths[kind] + t) for kind in kinds)
    caches = tuple(torch.randn(1, c.num_kv_heads, lengths[c.kind], c.head_dim) for c in layout.caches for _ in "kv")
    rows = torch.tensor([0, t - 1])  # [R]: R != T, so that neither dim is specialised to the other
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=layout.max_context)
    r_dim = torch.export.Dim(kv.R_DIM, min=1, max=layout.max_context)
    s_dims = {kind: torch.export.Dim(kv.slots_dim(kind), min=1, max=layout.slots(kind)) for kind in kinds}
    dynamic = ({1: t_dim}, {1: t_dim}, tuple({2: t_dim, 3: torch.export.Dim.AUTO} for _ in kinds),
               tuple({2: s_dims[c.kind]} for c in layout.caches for _ in "kv"), {0: r_dim})
    ring = layout.slots(kv.SLIDING) if kv.SLIDING in kinds and layout.max_pass is not None else None  # uncapped: split
    form = Slots(ring) if attention == "slots" else SPLIT  # batch-invariant attention (edge_spec.model.forms)
    shared = layout.binding == kv.BINDING_SHARED
    if shared:
        _check_shared(model, layout, exporter)
    ops = FusedOps(model, layout.max_context, gqa=shared) if exporter == "dynamo" else EAGER  # TorchScript cannot
    proto = _torch_export(TargetGraph(model, kinds, form, ops, aux_layers).eval(), (ids, pos, masks, caches, rows),
                          dynamic, io, exporter)
    _blank_unused_outputs(proto)
    return proto


def default_binding(cfg, *, exporter: str = "dynamo", attention: str = "slots") -> str:
    """`shared` (GroupQueryAttention, ~9% faster SmolLM2 steps, docs/architecture.md "Fused attention") where it
    applies: the dynamo exporter, the batch-invariant form, a target `shared_refusal` takes (llama-like full
    attention, Gemma-3's sliding and full layers); `io` otherwise."""
    eligible = exporter == "dynamo" and attention == "slots" and shared_refusal(cfg) is None
    return kv.BINDING_SHARED if eligible else kv.BINDING_IO


def shared_refusal(cfg) -> str | None:
    """Why GroupQueryAttention cannot run `cfg`'s layers (None: it can). It takes one packed q/k/v projection whose
    q and k it rotates itself, attends causally over slot == position (with `local_window_size` for a sliding
    layer) and writes the new rows: Gemma-4's layers reusing another layer's cache, its keys used as values and its
    normed values are outside it."""
    if cfg.family == GEMMA4 or any(s == REUSE for s in cfg.kv_sharing) or cfg.attention_k_eq_v:
        return (f"the shared KV binding takes layers with their own q/k/v projections and caches "
                f"(llama, qwen3, gemma3), not {cfg.family}'s")
    return None


def _check_shared(model: Transformer, layout: kv.KVLayout, exporter: str) -> None:
    """The `shared` binding's GroupQueryAttention: the dynamo exporter, a target `shared_refusal` takes."""
    fix = "export with --kv io (the default for such targets)"
    if exporter != "dynamo":
        raise ConfigError("the shared KV binding (GroupQueryAttention) needs the dynamo exporter", fix)
    reason = shared_refusal(model.cfg)
    if reason is not None:
        raise ConfigError(reason, fix)


def export_drafter(drafter: Drafter, target: Transformer, layout: kv.KVLayout, sources: dict[str, int], *,
                   exporter: str = "dynamo") -> onnx.ModelProto:
    cfg = target.cfg
    kinds = tuple(sorted(sources))
    output_table = needs_output_table(cfg, drafter)
    io = kv.drafter_io(layout, sources, cfg.vocab_size, cfg.hidden_size, drafter.cfg.candidates_per_step, output_table)
    by_layer = {c.layer: c for c in layout.caches}
    lengths = _example_lengths(layout)
    ids = torch.randint(0, cfg.vocab_size, (1, 1))
    hidden = torch.randn(1, 1, cfg.hidden_size)
    pos = torch.tensor([[max(lengths.values())]])
    masks = tuple(torch.zeros(1, 1, 1, lengths[kind]) for kind in kinds)
    caches = tuple(torch.randn(1, by_layer[sources[k]].num_kv_heads, lengths[k], by_layer[sources[k]].head_dim)
                   for k in kinds for _ in "kv")
    tables = (target.model.embed_tokens.weight.detach(),)
    if output_table:
        tables += (target.lm_head.weight.detach(),)
    s_dims = {kind: torch.export.Dim(kv.slots_dim(kind), min=1, max=layout.slots(kind)) for kind in kinds}
    dynamic = (None, None, None, tuple({3: s_dims[k]} for k in kinds), tuple({2: s_dims[k]} for k in kinds for _ in "kv"),
               tuple({} for _ in tables))
    wrapper = DrafterGraph(drafter, kinds, float(target.embed_scale)).eval()
    return _torch_export(wrapper, (ids, hidden, pos, masks, caches, tables), dynamic, io, exporter)


def needs_output_table(cfg, drafter: Drafter | None) -> bool:
    """A head_from="target" drafter scores against the target's lm_head: a separate table only when untied."""
    head_from = getattr(drafter.cfg, "head_from", None) if drafter is not None else None  # eagle3: none
    return head_from == "target" and not cfg.tie_word_embeddings


# ---- the bundle --------------------------------------------------------------------------------------
def export_steps(with_drafter: bool, **_) -> int:
    """How many times `export_bundle` calls `progress` (for a progress bar), whatever the lengths and options."""
    return COMMON_STEPS + 2 + (2 if with_drafter else 0)


def writer(*, exporter: str = "dynamo", attention: str = "slots") -> bundle.Writer:
    """The onnx format's `write` for edge_spec.contract.bundle.export_bundle: `exporter` is torch.onnx's (dynamo |
    torchscript); `attention="split"` exports the non-batch-invariant form (a test-only negative control, see
    `export_target`). `max_pass` caps the tokens per forward only for targets with sliding-window layers (rings of
    W + max_pass - 1 slots); full-attention-only targets take any T and record no cap."""
    if exporter not in ("dynamo", "torchscript"):
        raise ConfigError(f"unknown torch.onnx exporter {exporter!r}", "choose dynamo or torchscript")
    return functools.partial(_write, exporter=exporter, attention=attention)


export_bundle = bundle.entry("onnx")  # export_bundle(target, out, *, drafter, precision, ..., exporter, attention)


def _write(job: bundle.ExportJob, *, exporter: str, attention: str) -> tuple[dict, dict]:
    """The ONNX artifacts: the shared tables, target.onnx (+ drafter.onnx), quantized to `job.precision`."""
    target, drafter, layout, precision, step = job.target, job.drafter, job.layout, job.precision, job.step
    cfg, tmp = target.config, job.tmp
    (tmp / ONNX_DIR).mkdir()
    embedding = target.model.model.embed_tokens.weight.detach().float().numpy()
    step("exporting the target graph")
    proto = export_target(target.model, layout, exporter=exporter, attention=attention, aux_layers=job.aux_layers)
    rename_embedding_table(proto, embedding)
    step(f"quantizing the target graph ({precision})" if precision != "fp32" else "saving the target graph")
    stats = None
    if precision in QUANT and QUANT[precision].grid == ZERO_POINT:  # int4: activation-aware grids (onnx_passes)
        stats = calibration.linear_input_stats(target)
    proto = quantize(proto, precision, cfg.vocab_size, stats)
    # int8 / int4 of a tied target: the head's quantized bytes are the one vocabulary table (exporters/onnx_tables.py)
    shared = share_table(proto, embedding) if precision in QUANT else None
    arrays = {kv.EMBED_TABLE: embedding} if shared is None else shared
    bits = kv.table_bits(arrays)
    tables = {name: _table_entry(tmp, name, array) for name, array in arrays.items()}
    if needs_output_table(cfg, drafter):
        tables[kv.OUTPUT_TABLE] = _table_entry(tmp, kv.OUTPUT_TABLE, target.model.lm_head.weight.detach().float().numpy())
    save_graph(proto, tmp / TARGET_FILE, {name: Path(TABLE_FILES[name]).name for name in arrays})
    del proto
    graphs = {"target": GraphEntry(TARGET_FILE, precision, kv.target_io(layout, cfg.vocab_size, cfg.hidden_size, True,
                                                                        len(job.aux_layers) * cfg.hidden_size))}
    if job.aux_layers:  # an eagle3 drafter: its fc and step graphs (exporters/onnx_eagle3.py)
        graphs.update(write_eagle3(job, functools.partial(_torch_export, exporter=exporter), bits))
    elif drafter is not None:
        step("exporting the drafter graph")
        dproto = export_drafter(drafter, target.model, layout, job.sources, exporter=exporter)
        step(f"quantizing the drafter graph ({precision})" if precision != "fp32" else "saving the drafter graph")
        dproto = quantize(dproto, precision, cfg.vocab_size)
        if shared is not None:
            quantize_drafter_table(dproto, cfg.vocab_size, cfg.hidden_size, bits)
        if precision in QUANT:  # its own vocabulary-sized tables (a derived token table) on the head's grid
            quantize_gather_tables(dproto, cfg.vocab_size, QUANT[precision].head_bits)
        save_graph(dproto, tmp / DRAFTER_FILE, {})
        io = kv.drafter_io(layout, job.sources, cfg.vocab_size, cfg.hidden_size, drafter.cfg.candidates_per_step,
                           needs_output_table(cfg, drafter), table_bits=bits)
        graphs["drafter"] = GraphEntry(DRAFTER_FILE, precision, io)
    return graphs, tables


def _table_entry(tmp: Path, name: str, array: np.ndarray) -> TableEntry:
    array = write_table(tmp / TABLE_FILES[name], array)
    return TableEntry(TABLE_FILES[name], str(array.dtype), tuple(array.shape))

