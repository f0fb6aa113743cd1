"""ONNX export of an EAGLE-3 drafter (edge_spec/model/eagle3.py): its fc graph and its step graph.

The target graph of such a bundle also returns kv.AUX_HIDDEN (exporters/onnx.py, `TargetGraph(aux_layers=...)`);
the drafter is two small graphs beside it:

  * `onnx/drafter_fc.onnx` (kv.eagle3_fc_io): aux_hidden [1, T, n * H] -> fused_hidden [1, T, H], the fc projection
    with the checkpoint's norms (norm_before_fc / fc_norm). A separate graph, not an input path of the step graph:
    the step graph then always takes a [1, T, H] `hidden` (fused for the rows that pair a target state with the
    next token, the previous row's output for a chained draft), and the runtime runs fc once per burst over the
    target rows it has not fused yet.
  * `onnx/drafter.onnx` (kv.eagle3_drafter_io): input_ids, hidden, position_ids [1, T], draft_mask [1, 1, T, S + T]
    and the drafter's own caches (`io` binding: caches in, new rows out) -> the last row's candidates (every draft
    id as its target id, d + d2t[d]), their logits, its chained hidden, and all T rows' new K/V.

Token embeddings: a Speculators drafter embeds with the verifier's own table (frozen, left out of most checkpoints,
`load_eagle3(target_embedding=)`). When the drafter's table equals the target's, the step graph takes the bundle's
shared table as inputs (kv.table_specs, the MTP drafter graph's binding) and gathers its T rows from it: float32 in
an fp32 bundle, the quantized codes of the tied head in an int8 / int4 one (exporters/onnx_tables.py), so no
vocabulary-sized copy is written (SmolLM2: 113 MB fewer). A drafter with a table of its own keeps it, on the head's
grid in a quantized bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import onnx
import torch
from torch import nn
from torch.nn import functional as F

from edge_spec.contract import bundle, kv
from edge_spec.contract.manifest import EAGLE3_FC_GRAPH, GraphEntry
from edge_spec.errors import ConfigError
from edge_spec.exporters.onnx_passes import ONNX_DIR, QUANT, quantize, save_graph
from edge_spec.exporters.onnx_tables import quantize_drafter_table, quantize_gather_tables
from edge_spec.model.eagle3 import Eagle3Drafter

DRAFTER_FILE = f"{ONNX_DIR}/drafter.onnx"
FC_FILE = f"{ONNX_DIR}/drafter_fc.onnx"


class Eagle3StepGraph(nn.Module):
    """(input_ids [1, T], hidden [1, T, H], position_ids [1, T], mask [1, 1, T, S + T], k/v caches per layer
    [1, H_kv, S, D], tables: () or (the target's embedding [V, H],)) -> (token ids [Vd], logits [Vd],
    hidden [1, 1, H], k/v new rows per layer [1, H_kv, T, D])."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("token_ids", drafter.target_ids(torch.arange(drafter.cfg.draft_vocab_size)))  # [Vd]

    def forward(self, input_ids, hidden, position_ids, mask, caches: tuple, tables: tuple = ()):
        embeds = F.embedding(input_ids, tables[0]) if tables else None  # [1, T, H]
        out = self.drafter(hidden, input_ids, position_ids, mask, list(caches[0::2]), list(caches[1::2]), embeds)
        rows = [r for k, v in zip(out.new_k, out.new_v) for r in (k, v)]
        # the candidate ids depend on no input: an Identity keeps them a computed output (see _computed_outputs)
        return (self.token_ids, out.logits[0, -1], out.hidden[:, -1:], *rows)


class Eagle3FcGraph(nn.Module):
    """aux [1, T, n * H] -> fused [1, T, H]."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, aux):
        return self.drafter.fuse(aux)


# (module, example args, dynamic shapes, contract IO) -> the graph with the contract's IO: exporters/onnx.py's
# torch.onnx export with one exporter bound (passed in: this module does not import onnx.py, which imports it)
Export = Callable[[nn.Module, tuple, tuple, kv.GraphIO], onnx.ModelProto]


def export_step(drafter: Eagle3Drafter, draft: kv.KVLayout, export: Export, shared: bool = False) -> onnx.ModelProto:
    """The step graph for the drafter's own cache layout `draft` (bundle.eagle3_layout); `shared`: it takes the
    target's float32 embedding table as the input kv.EMBED_TABLE instead of holding embed_tokens."""
    cfg = drafter.cfg
    h = cfg.hidden_size
    tables = tuple(kv.table_specs(cfg.target_vocab_size, h)) if shared else ()
    io = kv.eagle3_drafter_io(draft, h, cfg.draft_vocab_size, tables)
    t, s = 3, 5  # distinct example lengths (never 0 / 1, which torch.export would specialise)
    ids = torch.randint(0, cfg.target_vocab_size, (1, t))
    pos = torch.arange(s + 1, s + 1 + t)[None]
    caches = tuple(torch.randn(1, c.num_kv_heads, s, c.head_dim) for c in draft.caches for _ in "kv")
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=draft.max_context)
    s_dim = torch.export.Dim(kv.slots_dim(kv.DRAFT_KIND), min=1, max=draft.max_context)
    dynamic = ({1: t_dim}, {1: t_dim}, {1: t_dim}, {2: t_dim, 3: torch.export.Dim.AUTO},
               tuple({2: s_dim} for _ in caches))
    args = (ids, torch.randn(1, t, h), pos, torch.zeros(1, 1, t, s + t), caches)
    if shared:  # the tables argument: (the target's embedding [V, H],)
        args, dynamic = args + ((drafter.embed_tokens.weight.detach(),),), dynamic + (({},),)
    proto = export(Eagle3StepGraph(drafter).eval(), args, dynamic, io)
    _computed_outputs(proto)
    return proto


def export_fc(drafter: Eagle3Drafter, export: Export) -> onnx.ModelProto:
    cfg = drafter.cfg
    io = kv.eagle3_fc_io(cfg.num_aux * cfg.hidden_size, cfg.hidden_size)
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=1 << 20)
    return export(Eagle3FcGraph(drafter).eval(), (torch.randn(1, 3, cfg.num_aux * cfg.hidden_size),), ({1: t_dim},),
                  io)


def _computed_outputs(proto: onnx.ModelProto) -> None:
    """A graph output that is an initializer (the constant candidate ids) -> the output of an Identity node, which
    every runtime binds like any other output."""
    inits = {i.name for i in proto.graph.initializer}
    for out in proto.graph.output:
        if out.name in inits:
            source = out.name + "_const"
            next(i for i in proto.graph.initializer if i.name == out.name).name = source
            proto.graph.node.append(onnx.helper.make_node("Identity", [source], [out.name]))


def shares_embedding(drafter: Eagle3Drafter, target_table: torch.Tensor) -> bool:
    """Whether the drafter's token table is the target's input embedding [V, H], value for value."""
    mine = drafter.embed_tokens.weight.detach()
    return mine.shape == target_table.shape and torch.equal(mine.float(), target_table.detach().float())


def write_eagle3(job: bundle.ExportJob, export: Export, table_bits: int) -> dict[str, GraphEntry]:
    """The eagle3 drafter's graphs (two progress steps, as the MTP drafter's): manifest entries by graph name.
    `table_bits`: the bundle's shared embedding table's form (kv.table_bits: 0 float32, 8, 4)."""
    drafter, precision, tmp = job.drafter, job.precision, Path(job.tmp)
    if not isinstance(drafter, Eagle3Drafter):
        raise ConfigError("aux layers were requested without an EAGLE-3 drafter")
    cfg = drafter.cfg
    vocab, h = cfg.target_vocab_size, cfg.hidden_size
    draft = bundle.eagle3_layout(cfg, job.layout.max_context)
    shared = shares_embedding(drafter, job.target.model.model.embed_tokens.weight)
    job.step("exporting the drafter graph")
    step, fc = export_step(drafter, draft, export, shared), export_fc(drafter, export)
    job.step(f"quantizing the drafter graph ({precision})" if precision != "fp32" else "saving the drafter graph")
    step = quantize(step, precision, vocab)
    if shared and table_bits:  # the float32 table input -> the shared quantized table's inputs
        quantize_drafter_table(step, vocab, h, table_bits)
    elif precision in QUANT:  # a table of its own: on the head's grid
        quantize_gather_tables(step, vocab, QUANT[precision].head_bits)
    save_graph(step, tmp / DRAFTER_FILE, {})
    save_graph(quantize(fc, precision, vocab), tmp / FC_FILE, {})
    tables = tuple(kv.table_specs(vocab, h, table_bits)) if shared else ()
    return {"drafter": GraphEntry(DRAFTER_FILE, precision, kv.eagle3_drafter_io(draft, h, cfg.draft_vocab_size, tables)),
            EAGLE3_FC_GRAPH: GraphEntry(FC_FILE, precision, kv.eagle3_fc_io(cfg.num_aux * h, h))}
