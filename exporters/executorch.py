"""ExecuTorch exporter: ONE .pte whose methods are the target's forward and the drafter's step, XNNPACK-delegated,
the KV caches living in the program as mutable buffers shared by both methods (the KV contract's `state` binding).

    edge-spec export --format executorch --quant fp32|8da4w --out B

Layout of the program (`Program`):
  * buffers `k_cache_{l}` / `v_cache_{l}` per cached target layer l, shaped [H_kv, S, 1, D]: the contract's
    head-major [1, H_kv, S, D] cache with the heads as the batch of ExecuTorch's `llama::update_cache_with_indices`,
    which writes a forward's new rows in place at their slots (position, or position % ring) - a portable
    `index_copy_` on a buffer would copy the whole buffer every step;
  * method `target(input_ids [1, T], position_ids [1, T], mask.<kind> [1, 1, T, S_kind + T]) -> (logits, hidden)`:
    writes all T rows (rejected drafts included: the runtime's KVState masks them), then attends over the first
    S_kind slots of each buffer with the batch-invariant slot attention (edge_spec.model.attention.attend_slots, keys already
    in their slots), so a verify pass reproduces decode steps row for row; T <= max_pass (the planned buffers and
    the rings, W + max_pass, are sized for it);
  * method `drafter(input_ids [1, 1], hidden [1, 1, H], position_ids [1, 1], mask.<kind> [1, 1, 1, S_kind]) ->
    (draft_token_ids, draft_logits, draft_hidden)`: reads its source layers' buffers in place (no cache of its own,
    no copy), and the target's embedding / tied output table inside the same program;
  * with an EAGLE-3 drafter (edge_spec/model/eagle3.py) instead: the target method also returns kv.AUX_HIDDEN
    [1, T, n * H]; method `drafter_fc(aux) -> fused [1, T, H]`; method `drafter(input_ids [1, T], hidden [1, T, H],
    position_ids [1, T], draft_mask [1, 1, T, b + T]) -> (draft_token_ids, draft_logits, draft_hidden)` with the
    drafter's own cache as buffers `draft_{k,v}_cache_{l}` [H_kv, S_draft, 1, D] (draft layout `state`: each row goes
    into slot position - 1 before attention; kv.eagle3_drafter_io), T <= max_pass (the runtime chunks a burst's first
    rows); its token embedding gathered from the target's table when it is the same one (8da4w: the head's codes);
  * constant methods with the facts a runner needs (vocab, EOS, max context, max pass, layout) - the manifest has
    them too.
`MemoryPlanningPass(share_mutable_buffers=True)` gives each buffer one slot shared by every method, so the drafter
method reads what the target method wrote (executorch's Python `Program` sizes one arena per memory id across the
methods it loaded: load both once, never run two at once).

Files: the program (`executorch/program.pte`: methods, delegate graphs, no weights) and every constant once in
`executorch/weights.ptd` (ExecuTorch's named data, the manifest entries' `data`; `lower`).

Precisions: fp32; 8da4w (int8 per-token dynamic activations x XNNPACK's symmetric int4 weights in groups of 32,
each block's bf16 scale fitted to the bench prompts' activations and the rounding's mean shift folded into a bias);
8da4w-gguf (the same kernels, codes that keep each block's min and max exact + an fp32 block-offset term: a GGUF's
Q4_1 codes bit for bit, ~13 MB more for SmolLM2 and a slower step). Both: the output head 8-bit per row, and the
vocabulary table as the head's codes, read by ExecuTorch's quantized embedding op (exporters/executorch_quant.py). A tied table is the embedding's constant and
XNNPACK's head weight, the same bytes, which the weights file stores once (before 2026-12-06 the .pte kept both;
XNNPACK taking the constant as a run-time weight had stored it once but repacked it on every call, SmolLM2's decode
step 20.9 -> 26.5 ms: docs/architecture.md). Exporters import the
core only, never runtimes.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from edge_spec.contract import bundle
from edge_spec.contract import kv
from edge_spec.contract.bundle import COMMON_STEPS
from edge_spec.model.drafter import Drafter
from edge_spec.model.eagle3 import Eagle3Drafter
from edge_spec.errors import ConfigError, ExportError
from edge_spec.exporters.calibration import linear_input_stats
from edge_spec.exporters.executorch_quant import (GRID_NATIVE, PRECISION_GRIDS, output_table, quantize_8da4w,
                                                  quantize_tables, quantized_embedding_ops)
from edge_spec.logs import IMPORT_NOISE, quiet
from edge_spec.contract.manifest import EAGLE3_FC_GRAPH, GraphEntry
from edge_spec.model.attention import attend_slots
from edge_spec.model.forms import Slots, State
from edge_spec.model.ops import PACKED_SPELLED_GELU, SPELLED_GELU, pack_modules
from edge_spec.model.transformer import Transformer

PTE_DIR = "executorch"
PROGRAM_FILE = f"{PTE_DIR}/program.pte"
WEIGHTS_TAG = "weights"  # every constant of the program, its delegates' included, in one named-data file
WEIGHTS_FILE = f"{PTE_DIR}/{WEIGHTS_TAG}.ptd"
TARGET_METHOD = "target"
DRAFTER_METHOD = "drafter"


def cache_buffer(kind: str, layer: int) -> str:
    """Name of a cached layer's K or V buffer in the program (`kind`: "k" | "v"); also its mutable-buffer FQN."""
    return f"{kind}_cache_{layer}"


ATTENTION_FORMS = ("slots", "sdpa")


class Program(nn.Module):
    """The target (+ drafter) with the KV caches as buffers; `target_forward` and `drafter_step` are the methods.

    `attention`: "slots" (the default) - edge_spec.model.attention.attend_slots over [H_kv, S, 1, D] buffers viewed head-major:
    batch-invariant; "sdpa" - ExecuTorch's `llama::custom_sdpa` over [1, S, H_kv, D] buffers, causal from the pass's
    first position (full attention only): faster at T = 1 but its one-row and multi-row paths sum in other orders
    (measured, docs/architecture.md "ExecuTorch path"), so the host check turns speculative decoding off with it.
    Kept for that measurement."""

    def __init__(self, target: Transformer, layout: kv.KVLayout, drafter: Drafter | Eagle3Drafter | None = None,
                 sources: dict[str, int] | None = None, attention: str = "slots", aux_layers: tuple[int, ...] = ()):
        super().__init__()
        if attention not in ATTENTION_FORMS:
            raise ConfigError(f"unknown attention form {attention!r}", f"choose one of {', '.join(ATTENTION_FORMS)}")
        if attention == "sdpa" and kv.SLIDING in layout.kinds():
            raise ConfigError("the sdpa attention form supports full-attention targets only (custom_sdpa masks the "
                              "whole cache, which the runtime's bucketed masks do not cover)", "use attention='slots'")
        self.target, self.drafter, self.layout, self.attention = target, drafter, layout, attention
        self.ops = SPELLED_GELU  # `_quantized_copy` packs sibling projections and switches to PACKED_SPELLED_GELU
        self.kinds = layout.kinds()
        self.ring = layout.slots(kv.SLIDING) if kv.SLIDING in self.kinds else None  # rings: position % slots
        self.sources = kv.source_caches(layout, sources or {})
        self.aux_layers = tuple(aux_layers)  # an EAGLE-3 drafter's: the target method also returns kv.AUX_HIDDEN
        if isinstance(drafter, Eagle3Drafter):  # its own cache as buffers of the program (the `state` binding)
            self.draft = bundle.eagle3_layout(drafter.cfg, layout.max_context, layout)
            self.shared_table = shares_table(drafter, target)
            for c in self.draft.caches:
                for name in ("k", "v"):
                    self.register_buffer(draft_buffer(name, c.layer),
                                         torch.zeros(c.num_kv_heads, c.slots, 1, c.head_dim), persistent=False)
        elif drafter is not None and drafter.cfg.head_from == "target":  # the drafter scores with the target's table:
            self.head_table = target.lm_head.weight  # 8da4w: its QuantizedTable (`_quantized_copy`)
        for c in layout.caches:
            shape = (c.num_kv_heads, c.slots, 1, c.head_dim) if attention == "slots" else \
                (1, c.slots, c.num_kv_heads, c.head_dim)
            for name in ("k", "v"):
                self.register_buffer(cache_buffer(name, c.layer), torch.zeros(shape), persistent=False)

    def state_buffers(self) -> set[str]:
        """The FQNs of the buffers the methods write in place (the KV caches, the EAGLE-3 drafter's own)."""
        names = {cache_buffer(kind, c.layer) for c in self.layout.caches for kind in "kv"}
        if hasattr(self, "draft"):
            names |= {draft_buffer(kind, c.layer) for c in self.draft.caches for kind in "kv"}
        return names

    def _kv_buffers(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layout.caches[i].layer
        return getattr(self, cache_buffer("k", layer)), getattr(self, cache_buffer("v", layer))

    def _cache(self, i: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached layer i's K and V as [1, H_kv, slots, D] views (the first `slots` slots)."""
        c = self.layout.caches[i]
        if self.attention == "slots":
            return tuple(b.view(1, c.num_kv_heads, c.slots, c.head_dim)[:, :, :slots] for b in self._kv_buffers(i))
        return tuple(b[:, :slots].transpose(1, 2) for b in self._kv_buffers(i))

    def _write(self, i: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Cached layer i's new rows k, v [1, H_kv, T, D] into its buffers at `slots` [T], in place."""
        c, t = self.layout.caches[i], k.shape[2]
        for buffer, rows in zip(self._kv_buffers(i), (k, v)):
            if self.attention == "slots":  # heads as the batch: [H_kv, T, 1, D] into [H_kv, S, 1, D]
                torch.ops.llama.update_cache_with_indices(rows[0].unsqueeze(2), buffer, 0,
                                                          slots.view(1, t).expand(c.num_kv_heads, t))
            else:  # [1, T, H_kv, D] into [1, S, H_kv, D]
                torch.ops.llama.update_cache_with_indices(rows.transpose(1, 2), buffer, 0, slots.view(1, t))

    def target_forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *rest: torch.Tensor):
        """(ids, positions [1, T], a mask per kind, logit rows [R]) -> logits [1, R, V], hidden [1, R, H] (kv.target_io
        with logit_rows: a prefill chunk asks for its last row only, so the head runs on one row)."""
        masks, logit_rows = rest[:len(self.kinds)], rest[len(self.kinds)]
        t = input_ids.shape[1]
        bound = {kind: m.shape[-1] - t for kind, m in zip(self.kinds, masks)}  # slots attended per kind
        if self.attention == "sdpa":  # full layers attend causally over slots [0, start + T): slot == position
            start = position_ids[0, 0].item()
            torch._check_is_size(start)
            torch._check(start + t <= self.layout.max_context)

        def attend(i: int, q, k, v, slots, mask, scale):  # q: [1, H, T, D]; k, v: [1, H_kv, T, D] or None
            if k is not None:
                self._write(i, k, v, slots)
            b = bound[self.layout.caches[i].kind]
            if self.attention == "slots":
                kc, vc = self._cache(i, b)
                return attend_slots(q, kc, None, slots, vc, mask.add, mask.keep, scale)
            kb, vb = self._kv_buffers(i)
            if self.layout.caches[i].kind == kv.FULL:  # rows past start + T (rejected drafts) are never read
                out = torch.ops.llama.custom_sdpa(q.transpose(1, 2), kb, vb, start, None, 0.0, True, scale)
            else:  # a ring: the whole ring under the [T, R] mask (its kernel takes a mask of the full cache only)
                additive = mask.add[0, 0, :t]  # group_mask tiles the rows: the first T are the mask itself
                out = torch.ops.llama.custom_sdpa(q.transpose(1, 2), kb, vb, 0, additive, 0.0, False, scale)
            return out.reshape(1, t, -1)  # [1, T, H * D]

        out = self.target(input_ids, position_ids, dict(zip(self.kinds, masks)), [], [],
                          form=State(attend, Slots(self.ring)), ops=self.ops, rows=logit_rows,
                          aux_layers=self.aux_layers)
        return (out.logits, out.hidden, out.aux) if self.aux_layers else (out.logits, out.hidden)

    def drafter_step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                     *masks: torch.Tensor):
        kinds = sorted(self.sources)
        embed = self.target.model.embed_tokens(input_ids) * self.target.embed_scale  # [1, 1, Ht] (fp32 or codes)
        kv_in = {kind: self._cache(self.sources[kind], m.shape[-1]) for kind, m in zip(kinds, masks)}
        head = self.head_table if self.drafter.cfg.head_from == "target" else None
        out = self.drafter(embed, hidden, position_ids, dict(zip(kinds, masks)), kv_in, head, ops=SPELLED_GELU)
        return out.token_ids, out.logits, out.hidden

    def eagle3_step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                    mask: torch.Tensor):
        """An EAGLE-3 drafter's T rows (kv.eagle3_drafter_io, `state` binding): ids, positions [1, T], hidden
        [1, T, H], mask [1, 1, T, b + T] -> (candidate ids [Vd], the last row's logits [Vd], its hidden [1, 1, H]).
        Each row's K/V goes into its slot, position - 1, of the drafter's own buffers before attention reads their
        first b slots (the mask hides the new rows there: it shows them in its last T columns)."""
        t = input_ids.shape[1]
        b = mask.shape[-1] - t
        slots = (position_ids[0] - 1).view(1, t)  # [1, T]

        def store(i: int, k: torch.Tensor, v: torch.Tensor):  # k, v: [1, H_kv, T, D] -> caches [1, H_kv, b, D]
            c = self.draft.caches[i]
            views = []
            for name, rows in (("k", k), ("v", v)):
                buffer = getattr(self, draft_buffer(name, c.layer))  # [H_kv, S, 1, D]
                torch.ops.llama.update_cache_with_indices(rows[0].unsqueeze(2), buffer, 0,
                                                          slots.expand(c.num_kv_heads, t))
                views.append(buffer.view(1, c.num_kv_heads, c.slots, c.head_dim)[:, :, :b])
            return tuple(views)

        embeds = self.target.model.embed_tokens(input_ids) if self.shared_table else None  # [1, T, H] (or codes)
        n = len(self.draft.caches)
        out = self.drafter(hidden, input_ids, position_ids, mask, [None] * n, [None] * n, embeds, store=store)
        ids = self.drafter.target_ids(torch.arange(self.drafter.cfg.draft_vocab_size))  # [Vd]
        return ids, out.logits[0, -1], out.hidden[:, -1:]

    def eagle3_fc(self, aux: torch.Tensor):
        """aux [1, T, n * H] -> fused [1, T, H] (kv.eagle3_fc_io)."""
        return self.drafter.fuse(aux)


def draft_buffer(kind: str, layer: int) -> str:
    """Name of an EAGLE-3 drafter layer's own K or V buffer, [H_kv, S_draft, 1, D]."""
    return f"draft_{kind}_cache_{layer}"


def shares_table(drafter: Eagle3Drafter, target: Transformer) -> bool:
    """Whether the drafter's token table is the target's input embedding (then its method gathers the target's)."""
    mine, theirs = drafter.embed_tokens.weight.detach(), target.model.embed_tokens.weight.detach()
    return mine.shape == theirs.shape and torch.equal(mine.float(), theirs.float())


@contextlib.contextmanager
def _method(program: Program, forward: Callable):
    """Export `forward` as `program`'s forward (one module, so every method shares the buffers' FQNs)."""
    program.forward = forward
    try:
        yield program
    finally:
        del program.forward


@contextlib.contextmanager
def _exporting(program: Program):
    """torch.export's warnings and logs quiet while the program's methods are traced (the models run as the program
    runs them: `Program.target_forward` passes its attention form and the GELU written out,
    `ops.gelu_tanh_spelled`: XNNPACK's lowering of the fused tanh GELU computes the erf one)."""
    with warnings.catch_warnings(), quiet("torch", "torch.export", *IMPORT_NOISE):
        warnings.simplefilter("ignore")
        yield


def _export(program: Program, forward: Callable, args: tuple, dynamic: tuple, what: str):
    try:
        with _method(program, forward), torch.no_grad():
            return torch.export.export(program, args, dynamic_shapes=dynamic, strict=False,
                                       prefer_deferred_runtime_asserts_over_guards=True)
    except Exception as err:  # torch.export raises many types; say which method failed and why
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ExportError(f"torch.export failed for the {what} method: {first[:300]}",
                          "use --format onnx for this model, or report the model config") from err


def export_target_method(program: Program):
    layout = program.layout
    t = 3
    ids = torch.zeros(1, t, dtype=torch.long)
    pos = torch.arange(4, 4 + t)[None]
    masks = tuple(torch.zeros(1, 1, t, min(8, layout.slots(kind)) + t) for kind in program.kinds)
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=layout.max_pass)
    if program.attention == "slots":  # the mask's width - T = the slots attended (derived inside the graph)
        cols = {kind: torch.export.Dim.AUTO for kind in program.kinds}
    else:  # sdpa reads no mask width on full layers: declare it, or export would specialise the unused dim
        cols = {kind: torch.export.Dim(f"cols_{kind}", min=2, max=layout.slots(kind) + layout.max_pass)
                for kind in program.kinds}
    rows = torch.tensor([0, t - 1])  # [R], R != T: neither dim specialised to the other
    r_dim = torch.export.Dim(kv.R_DIM, min=1, max=layout.max_pass)
    dynamic = ({1: t_dim}, {1: t_dim}, (*({2: t_dim, 3: cols[kind]} for kind in program.kinds), {0: r_dim}))  # *rest
    return _export(program, program.target_forward, (ids, pos, *masks, rows), dynamic, "target")


def export_drafter_method(program: Program):
    kinds = sorted(program.sources)
    hidden = torch.zeros(1, 1, program.target.cfg.hidden_size)
    ids, pos = torch.zeros(1, 1, dtype=torch.long), torch.tensor([[8]])
    masks = tuple(torch.zeros(1, 1, 1, min(8, program.layout.slots(kind))) for kind in kinds)
    s_dims = {kind: torch.export.Dim(kv.slots_dim(kind), min=1, max=program.layout.slots(kind)) for kind in kinds}
    dynamic = (None, None, None, tuple({3: s_dims[kind]} for kind in kinds))
    return _export(program, program.drafter_step, (ids, hidden, pos, *masks), dynamic, "drafter")


def export_eagle3_methods(program: Program) -> dict:
    """The EAGLE-3 drafter's step (T <= max_pass rows, any attended slots) and fc methods."""
    h, t = program.target.cfg.hidden_size, 3
    ids, pos = torch.zeros(1, t, dtype=torch.long), torch.arange(6, 6 + t)[None]
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=program.layout.max_pass)
    step = _export(program, program.eagle3_step, (ids, torch.zeros(1, t, h), pos, torch.zeros(1, 1, t, 8 + t)),
                   ({1: t_dim}, {1: t_dim}, {1: t_dim}, {2: t_dim, 3: torch.export.Dim.AUTO}), "drafter")
    aux = torch.zeros(1, t, len(program.aux_layers) * h)
    fc = _export(program, program.eagle3_fc, (aux,), ({1: t_dim},), EAGLE3_FC_GRAPH)
    return {DRAFTER_METHOD: step, EAGLE3_FC_GRAPH: fc}


def constant_methods(job: bundle.ExportJob) -> dict:
    cfg, layout = job.target.config, job.layout
    return {"get_vocab_size": cfg.vocab_size, "get_max_context_len": layout.max_context,
            "get_max_pass": layout.max_pass, "get_eos_ids": sorted(job.target.stop_ids),
            "get_hidden_size": cfg.hidden_size, "get_n_cached_layers": len(layout.caches),
            "get_ring_slots": max((c.slots for c in layout.caches if c.window), default=0)}


def _custom_ops() -> None:
    """Register ExecuTorch's LLM ops with torch (llama::update_cache_with_indices) before tracing."""
    with quiet(*IMPORT_NOISE):
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    quantized_embedding_ops()  # quantized_decomposed::embedding_byte / _4bit (8da4w tables)


def lower(methods: dict, constants: dict, folder: Path, state: set[str]) -> bytes:
    """XNNPACK-delegate every method and plan one shared slot per mutable buffer (`state`: their FQNs); writes the
    weights file into `folder` (WEIGHTS_TAG + ".ptd") and returns the .pte bytes.

    Every constant goes to one named-data file (WEIGHTS_FILE): the program's own constants (ExecuTorch's
    `external_constants`) and its XNNPACK delegates' (tagged `delegate_constant_tag` before lowering), which
    ExecuTorch's NamedDataStore stores once per distinct content. A tied table is one array that the embedding reads
    as a program constant and the head as a delegate weight: the same bytes, stored once (in the .pte they were two
    copies: SmolLM2's 8da4w program 28 MB more, the fp32 one 113 MB)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    # `state`: the KV buffers' FQNs (Program.state_buffers): written in place by one method, only read by another
    # (the drafter), never weights
    placeholders = {name for program in methods.values()
                    for name, fqn in program.graph_signature.inputs_to_buffers.items() if fqn in state}
    for program in methods.values():
        _tag_constants(program, WEIGHTS_TAG, state)
    with warnings.catch_warnings(), quiet("torch", "torch.export", "executorch", *IMPORT_NOISE):
        warnings.simplefilter("ignore")
        edge = to_edge_transform_and_lower(methods, partitioner={name: [XnnpackPartitioner()] for name in methods},
                                           compile_config=EdgeCompileConfig(_check_ir_validity=False),
                                           constant_methods=constants)
        program = edge.to_executorch(ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=True),
            emit_mutable_buffer_names=True, external_constants=_weights_file(placeholders)))
        program.write_tensor_data_to_file(str(folder))
    written = sorted(p.name for p in folder.glob("*.ptd"))
    if written != [f"{WEIGHTS_TAG}.ptd"]:
        raise ExportError(f"executorch wrote the data files {written}, expected {WEIGHTS_TAG}.ptd alone",
                          "report the executorch version; pip install executorch==1.5.1")
    return program.buffer


def _weights_file(state_placeholders: set[str]):
    """ExecutorchBackendConfig's `external_constants`: the weights file for a program constant, except the KV
    buffers (a method that only reads them sees them as constants) and constants a view reads (ExecuTorch's emitter
    views only constants stored in the program: a clustered head's token-ordering buffer stays in the .pte)."""
    def tag(node) -> str | None:
        if node.name in state_placeholders or any("view" in str(user.target) for user in node.users):
            return None
        return WEIGHTS_TAG
    return tag


def _tag_constants(program, tag: str, state: set[str]) -> None:
    """Mark a method's constants (parameters, lifted constants, buffers no method mutates: `state` holds the FQNs
    of those that one does) for the named-data file: XNNPACK's preprocessing reads `delegate_constant_tag` from each
    weight's node."""
    sig = program.graph_signature
    constant = set(sig.inputs_to_parameters) | set(sig.inputs_to_lifted_tensor_constants) | \
        {node for node, buffer in sig.inputs_to_buffers.items() if buffer not in state}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in constant:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag


# ---- the bundle --------------------------------------------------------------------------------------
def export_steps(with_drafter: bool, **_) -> int:
    """How many times `export_bundle` calls `progress` (for a progress bar), whatever the lengths and options."""
    return COMMON_STEPS + 3 + (1 if with_drafter else 0)


def writer(*, attention: str = "slots") -> bundle.Writer:
    """The executorch format's `write` for edge_spec.contract.bundle.export_bundle. `max_pass` (default 64, or
    max_draft_len + 1): the most tokens per forward; the program's buffers are planned for it and its rings hold
    W + max_pass keys."""
    return functools.partial(_write, attention=attention)


export_bundle = bundle.entry("executorch")  # export_bundle(target, out, *, drafter, precision, ..., attention)


def _write(job: bundle.ExportJob, *, attention: str) -> tuple[dict, dict]:
    cfg, layout, step = job.target.config, job.layout, job.step
    if layout.max_pass is None:
        raise ConfigError("an ExecuTorch program needs a cap on the tokens per forward", "pass --max-pass")
    _custom_ops()
    eagle3 = isinstance(job.drafter, Eagle3Drafter)
    program = Program(job.target.model, layout, job.drafter, job.sources, attention, job.aux_layers).eval()
    grid = PRECISION_GRIDS.get(job.precision)
    if grid is not None:
        stats = None
        if grid == GRID_NATIVE:
            step("calibrating the int4 grid (the target's Linear inputs over the bench prompts, eager fp32)")
            stats = linear_input_stats(job.target)
        step(f"quantizing ({job.precision}: int8 dynamic activations, int4 weights in groups of 32)")
        program = _quantized_copy(program, grid, stats)
    else:
        step("preparing the program (fp32)")
    step("exporting the target method")
    with _exporting(program):
        methods = {TARGET_METHOD: export_target_method(program)}
        if job.drafter is not None:
            step("exporting the drafter method" + ("s (EAGLE-3: step and fc)" if eagle3 else ""))
            methods |= export_eagle3_methods(program) if eagle3 else {DRAFTER_METHOD: export_drafter_method(program)}
    step("lowering to XNNPACK and writing the .pte")
    (job.tmp / PTE_DIR).mkdir()
    data = lower(methods, constant_methods(job), job.tmp / PTE_DIR, program.state_buffers())
    del methods, program
    gc.collect()
    (job.tmp / PROGRAM_FILE).write_bytes(data)
    del data
    entry = functools.partial(GraphEntry, PROGRAM_FILE, job.precision, data=WEIGHTS_FILE)
    aux = len(job.aux_layers) * cfg.hidden_size
    graphs = {"target": entry(kv.target_io(layout, cfg.vocab_size, cfg.hidden_size, logit_rows=True, aux_size=aux),
                              method=TARGET_METHOD)}
    if eagle3:  # its step and fc methods; its cache: the program's buffers (draft layout `state`)
        c = job.drafter.cfg
        graphs["drafter"] = entry(kv.eagle3_drafter_io(program_draft(job), cfg.hidden_size, c.draft_vocab_size),
                                  method=DRAFTER_METHOD)
        graphs[EAGLE3_FC_GRAPH] = entry(kv.eagle3_fc_io(aux, cfg.hidden_size), method=EAGLE3_FC_GRAPH)
    elif job.drafter is not None:
        io = kv.drafter_io(layout, job.sources, cfg.vocab_size, cfg.hidden_size, job.drafter.cfg.candidates_per_step,
                           output_table=False)
        graphs["drafter"] = entry(io, method=DRAFTER_METHOD)
    return graphs, {}


def program_draft(job: bundle.ExportJob) -> kv.KVLayout:
    """An EAGLE-3 drafter's cache layout in the program (the manifest's draft_kv)."""
    return bundle.eagle3_layout(job.drafter.cfg, job.layout.max_context, job.layout)


def _quantized_copy(program: Program, grid: str, stats: dict | None) -> Program:
    """A deep copy with every Linear quantized (the caller's models stay fp32). The target's sibling projections of
    one input (q/k/v, gate/up) are packed into one Linear first (`pack_modules`): per layer XNNPACK then runs 4 int4
    GEMMs (the gguf grid: and 4 block-offset terms) instead of 7 (docs/benchmarks.md, "ExecuTorch 8da4w profile").
    `grid`: executorch_quant.GRID_NATIVE (fitted to `stats`, exporters/calibration.linear_input_stats) or GRID_GGUF."""
    import copy

    clone = copy.deepcopy(program)
    if pack_modules(clone.target):
        clone.ops = PACKED_SPELLED_GELU
    weight = clone.target.lm_head.weight  # [V, H] fp32, maybe the embedding's (tied)
    quantize_8da4w(clone.target, head="lm_head", grid=grid, stats=stats)  # the head: TABLE_BITS codes
    # the embedding(s) -> integer codes (a tied one: the head's codes): no fp32 table left
    tables = quantize_tables(clone.target, head=clone.target.lm_head, tied=weight)
    if isinstance(clone.drafter, Eagle3Drafter):  # fc, its layer and its draft-vocabulary head: 4-bit Linears
        quantize_8da4w(clone.drafter, grid=grid)
    elif clone.drafter is not None:  # tables / 1-D inputs stay as they are
        quantize_8da4w(clone.drafter, skip=("lm_head", "masked_embedding.centroids"), grid=grid)
    if hasattr(clone, "head_table"):  # the drafter gathers rows of the target's table: the quantized one
        del clone.head_table
        clone.head_table = tables[id(weight)] if id(weight) in tables else output_table(clone.target.lm_head, weight)
    return clone
