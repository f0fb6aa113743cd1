"""What the fixed-shape exporters share (Core ML, QNN): the flat signatures of the target at one pass length and of
the drafter step, their example inputs at fixed shapes, and the model settings those graphs are traced under.

Signatures (names from edge_spec.contract.kv; a format may respell them, e.g. Core ML's "." -> "_"):
  target T:  (input_ids [1, T], position_ids [1, T], mask_{kind} [1, 1, T, S_kind + T] per kind,
              k_cache_{l} / v_cache_{l} [1, H_kv, S_kind, D] per cached layer)
             -> (logits [1, T, V], hidden [1, T, H], k_new_{l} / v_new_{l} [1, H_kv, T, D])
  drafter:   (input_ids [1, 1], hidden [1, 1, Ht], position_ids [1, 1], mask_{kind} [1, 1, 1, S_kind] per source
              kind, the source layers' caches) -> (draft_token_ids [N], draft_logits [N], draft_hidden [1, 1, Ht])
The drafter holds the target's embedding (and, for head_from="target", its output table) as constants. Ids and
positions come in as int32 (what the ANE and the HTP index with) and are widened inside.
An EAGLE-3 drafter instead (`io` binding; kv.eagle3_drafter_io / kv.eagle3_fc_io, ids int32):
  target T:  as above, plus aux_hidden [1, T, n * H] after hidden
  step T:    (input_ids [1, T], hidden [1, T, H], position_ids [1, T], draft_mask [1, 1, T, S_draft + T], its own
              caches) -> (draft_token_ids [Vd], draft_logits [Vd], draft_hidden [1, 1, H] of the last row, new rows)
  fc T:      aux_hidden [1, T, n * H] -> fused_hidden [1, T, H]

The `state` binding (Core ML's MLState): the caches are buffers of the function module, k_cache_{l} / v_cache_{l}
[1, H_kv, S_f, D] (S_f from edge_spec.runtimes.fixed.state_slots), written in place:
  target T:  (input_ids [1, T], position_ids [1, T], mask_{kind} [1, 1, T, S_f] (slot form), write_slots_{kind} [T]
              int32) -> (logits [1, T, V], hidden [1, T, H]); every row is written at its slot before attending
  drafter:   (input_ids [1, 1], hidden [1, 1, Ht], position_ids [1, 1], mask_{kind} [1, 1, 1, S_f]) -> as above,
              reading the target's buffers (same names: one state object serves both functions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.contract import kv
from edge_spec.model.drafter import Drafter
from edge_spec.model.eagle3 import Eagle3Drafter
from edge_spec.model.attention import attend, attend_slots, group_mask
from edge_spec.model.forms import PLACED, SPLIT, Form, Mask, Slots, State
from edge_spec.model.ops import SPELLED_GELU, Ops
from edge_spec.model.rope import Rope, rope_tables
from edge_spec.model.transformer import Transformer


class TargetFunction(nn.Module):
    """(input_ids, position_ids, *masks, *caches) -> (logits, hidden, [aux,] *new rows), slot attention; `aux_layers`
    (an EAGLE-3 drafter's): aux [1, T, n * H], the stream entering those layers (as the model carries it)."""

    def __init__(self, model: Transformer, layout: kv.KVLayout, aux_layers: tuple[int, ...] = ()):
        super().__init__()
        self.model, self.kinds, self.form, self.aux_layers = model, layout.kinds(), slot_form(layout), tuple(aux_layers)

    def forward(self, input_ids, position_ids, *rest):
        n = len(self.kinds)
        masks, caches = rest[:n], rest[n:]
        out = self.model(input_ids.long(), position_ids.long(), dict(zip(self.kinds, masks)), list(caches[0::2]),
                         list(caches[1::2]), form=self.form, ops=SPELLED_GELU, aux_layers=self.aux_layers)
        aux = (out.aux,) if self.aux_layers else ()
        return (out.logits, out.hidden, *aux, *[r for k, v in zip(out.new_k, out.new_v) for r in (k, v)])


class Eagle3StepFunction(nn.Module):
    """An EAGLE-3 drafter's T rows at one fixed T, `io` binding: (input_ids [1, T] int32, hidden [1, T, H],
    position_ids [1, T] int32, draft_mask [1, 1, T, S + T], its own caches [1, H_kv, S, D] per layer) ->
    (draft_token_ids [Vd] int32 (target ids), draft_logits [Vd], draft_hidden [1, 1, H] of the LAST row, the new
    rows [1, H_kv, T, D] per layer). The runtime pads a shorter step at the front (edge_spec.runtimes.fixed_eagle3),
    so the last row is always a real one. The drafter's own token table is a constant.
    `rope_rows` (QNN): rotary cos / sin gathered from tables of that many positions (a computed angle is an
    activation whose calibrated range ends at calibration's longest position: ops.TableRopeOps says why);
    `attention`: model.attention.attend, or attend_concat (4-D ops only: what the HTP compiles)."""

    def __init__(self, drafter: Eagle3Drafter, rope_rows: int | None = None, attention=attend):
        super().__init__()
        self.drafter, self.attention = drafter, attention
        ids = drafter.target_ids(torch.arange(drafter.cfg.draft_vocab_size))
        self.register_buffer("token_ids", ids.to(torch.int32))  # [Vd]
        self.tables = rope_tables(drafter.inv_freq, rope_rows) if rope_rows else None  # [rows, D/2] each

    def forward(self, input_ids, hidden, position_ids, mask, *caches):
        rope = None
        if self.tables is not None:
            pos = position_ids.long()
            cos, sin = (torch.cat([t[pos], t[pos]], dim=-1)[:, :, None, :] for t in self.tables)  # [1, T, 1, D]
            rope = Rope(cos, sin)
        out = self.drafter(hidden, input_ids.long(), position_ids.long(), mask, list(caches[0::2]), list(caches[1::2]),
                           rope=rope, attention=self.attention)
        rows = [r for k, v in zip(out.new_k, out.new_v) for r in (k, v)]
        # + 0 x an input: a computed output (torch.onnx folds a constant one away, and its name with it)
        return (self.token_ids + input_ids[0, :1] * 0, out.logits[0, -1], out.hidden[:, -1:], *rows)


class Eagle3FcFunction(nn.Module):
    """aux [1, T, n * H] (the target function's, its stream divided by `scale`: edge_spec.model.headroom) ->
    fused [1, T, H] = fc(norms(aux * scale)). Row by row: pad rows change no real row."""

    def __init__(self, drafter: Eagle3Drafter, scale: float = 1.0):
        super().__init__()
        self.drafter, self.scale = drafter, float(scale)

    def forward(self, aux):
        return self.drafter.fuse(aux * self.scale if self.scale != 1.0 else aux)


class PlacedTargetFunction(nn.Module):
    """(input_ids, position_ids, *slot masks, *keeps, *slot indices, *caches) -> (logits, hidden, [aux,] *new rows):
    the QNN form (`aux_layers`: as TargetFunction's). Per kind: the mask in slot form [1, 1, T, S], its keep (1 where the mask is 0) and the slot index [S] int32
    (edge_spec.runtimes.fixed.slot_feeds); each
    layer places its new rows into their slots (`model.place_rows`) and attends over the S slots, so every key sits
    in its slot's column whatever T is."""

    def __init__(self, model: Transformer, kinds: tuple[str, ...], ops: Ops = SPELLED_GELU,
                 aux_layers: tuple[int, ...] = ()):
        super().__init__()
        self.model, self.kinds, self.ops, self.aux_layers = model, kinds, ops, tuple(aux_layers)  # QNN: TableRopeOps

    def forward(self, input_ids, position_ids, *rest):
        n = len(self.kinds)
        masks, keeps, index, caches = rest[:n], rest[n:2 * n], rest[2 * n:3 * n], rest[3 * n:]
        placed = {kind: Mask(masks[i], keeps[i], index[i]) for i, kind in enumerate(self.kinds)}
        out = self.model(input_ids.long(), position_ids.long(), placed, list(caches[0::2]), list(caches[1::2]),
                         form=PLACED, ops=self.ops, aux_layers=self.aux_layers)
        aux = (out.aux,) if self.aux_layers else ()
        return (out.logits, out.hidden, *aux, *[r for k, v in zip(out.new_k, out.new_v) for r in (k, v)])


class DrafterFunction(nn.Module):
    """(input_ids, hidden, position_ids, *masks, *source caches) -> (ids, logits, next hidden); tables constant."""

    def __init__(self, drafter: Drafter, target: Transformer, kinds: tuple[str, ...], form: Form = SPLIT,
                 ops: Ops = SPELLED_GELU):
        super().__init__()
        self.drafter, self.kinds, self.form, self.ops = drafter, kinds, form, ops  # PLACED, TableRopeOps: QNN
        self.embed_scale = float(target.embed_scale)
        self.embed = target.model.embed_tokens.weight
        self.table = target.lm_head.weight if drafter.cfg.head_from == "target" else None

    def forward(self, input_ids, hidden, position_ids, *rest):
        n = len(self.kinds)
        masks, caches = rest[:n], rest[n:]
        token_embed = F.embedding(input_ids.long(), self.embed) * self.embed_scale  # [1, 1, Ht]
        pairs = {kind: (caches[2 * i], caches[2 * i + 1]) for i, kind in enumerate(self.kinds)}
        out = self.drafter(token_embed, hidden, position_ids.long(), dict(zip(self.kinds, masks)), pairs, self.table,
                           form=self.form, ops=self.ops)
        return out.token_ids.to(torch.int32), out.logits, out.hidden


class StateCaches(nn.Module):
    """The `state` binding's cache buffers, one K and one V [1, H_kv, S_f, D] per cached layer, named as the contract
    spells them for Core ML (k_cache_{l}: `kv.feature_name`), so every function declares the same states: the base
    of each state function (the buffers' names are their FQNs, which the converter names the states by)."""

    def __init__(self, layout: kv.KVLayout, slots: dict[str, int]):
        super().__init__()
        self.layout = layout
        for c in layout.caches:
            for name in (kv.k_cache_name(c.layer), kv.v_cache_name(c.layer)):
                self.register_buffer(kv.feature_name(name), torch.zeros(1, c.num_kv_heads, slots[c.kind], c.head_dim),
                                     persistent=False)

    def pair(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layout.caches[i].layer
        return (getattr(self, kv.feature_name(kv.k_cache_name(layer))),
                getattr(self, kv.feature_name(kv.v_cache_name(layer))))

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor) -> None:
        """Cached layer i's new rows k, v [1, H_kv, T, D] into slots index [T], in place (a scatter along the slots:
        slice assignment would need contiguous slots, and a ring's pass may wrap). The rows are rounded to fp16 first:
        the state keeps them so, and without it row t of a verify pass would see rows < t of the same pass in fp32
        where one-token steps see them read back in fp16 (measured: 4e-5 apart in fp32 programs)."""
        where = index.long().view(1, 1, -1, 1).expand(k.shape)
        for buffer, rows in zip(self.pair(i), (k, v)):  # rounded as the fp16 state holds them, so a pass attends
            buffer.scatter_(2, where, rows.half().to(rows.dtype))  # to its own rows as later passes will (exactness)

    def touch(self) -> None:
        """Zero each buffer's spare (last) slot: a function that only reads the caches still writes every one, so
        the converter declares all of them as states (it makes states of mutated buffers only; read-only buffers
        would become constants) and every function's states are the same set."""
        for i in range(len(self.layout.caches)):
            for buffer in self.pair(i):
                buffer[:, :, -1:] = 0.0


class StateTargetFunction(StateCaches):
    """(input_ids, position_ids, *slot masks, *write slots) -> (logits, hidden, [aux]) over the module's own caches
    (`aux_layers`: as TargetFunction's)."""

    def __init__(self, model: Transformer, layout: kv.KVLayout, slots: dict[str, int],
                 aux_layers: tuple[int, ...] = ()):
        super().__init__(layout, slots)
        self.model, self.kinds, self.aux_layers = model, layout.kinds(), tuple(aux_layers)

    def forward(self, input_ids, position_ids, *rest):
        n = len(self.kinds)
        masks, index = dict(zip(self.kinds, rest[:n])), dict(zip(self.kinds, rest[n:]))
        grouped = {}  # (kind, groups) -> group_mask of the kind's slot mask, built once per forward

        def attend(i, q, k, v, slots, mask, scale):  # q: [1, H, T, D]; k, v: [1, H_kv, T, D] or None (KV sharing)
            kind = self.layout.caches[i].kind
            if k is not None:
                self.write(i, k, v, index[kind])
            kc, vc = self.pair(i)
            key = (kind, q.shape[1] // kc.shape[1])
            if key not in grouped:
                grouped[key] = group_mask(masks[kind], key[1])
            return attend_slots(q, kc, None, None, vc, *grouped[key], scale)  # [1, T, H * D]

        out = self.model(input_ids.long(), position_ids.long(), masks, [], [], form=State(attend), ops=SPELLED_GELU,
                         aux_layers=self.aux_layers)
        return (out.logits, out.hidden, out.aux) if self.aux_layers else (out.logits, out.hidden)


class StateDrafterFunction(StateCaches):
    """(input_ids, hidden, position_ids, *slot masks) -> (ids, logits, next hidden), reading the target's caches."""

    def __init__(self, drafter: Drafter, target: Transformer, layout: kv.KVLayout, slots: dict[str, int],
                 sources: dict[str, int]):
        super().__init__(layout, slots)
        self.inner = DrafterFunction(drafter, target, tuple(sorted(sources)))
        self.sources = kv.source_caches(layout, sources)

    def forward(self, input_ids, hidden, position_ids, *masks):
        self.touch()
        views = [t for kind in self.inner.kinds for t in self.pair(self.sources[kind])]
        return self.inner(input_ids, hidden, position_ids, *masks, *views)


def target_args(layout: kv.KVLayout, slots: dict[str, int], t: int, ids: torch.dtype = torch.long) -> tuple:
    """Example inputs of the target at pass length `t` over caches of `slots` (kind -> S)."""
    input_ids = torch.zeros(1, t, dtype=ids)
    pos = torch.arange(t, dtype=ids)[None]
    masks = tuple(torch.zeros(1, 1, t, slots[kind] + t) for kind in layout.kinds())
    caches = tuple(torch.zeros(1, c.num_kv_heads, slots[c.kind], c.head_dim) for c in layout.caches for _ in "kv")
    return (input_ids, pos, *masks, *caches)


def placed_target_args(layout: kv.KVLayout, slots: dict[str, int], t: int) -> tuple:
    """Example inputs of `PlacedTargetFunction` at pass length `t` (int32 ids)."""
    ids, pos, *rest = target_args(layout, slots, t, ids=torch.int32)
    kinds = layout.kinds()
    masks = tuple(torch.zeros(1, 1, t, slots[kind]) for kind in kinds)
    keeps = tuple(torch.ones(1, 1, t, slots[kind]) for kind in kinds)
    index = tuple(torch.arange(slots[kind], dtype=torch.int32) for kind in kinds)
    return (ids, pos, *masks, *keeps, *index, *rest[len(kinds):])


def state_target_args(layout: kv.KVLayout, slots: dict[str, int], t: int) -> tuple:
    """Example inputs of `StateTargetFunction` at pass length `t` (int32 ids and write slots)."""
    kinds = layout.kinds()
    masks = tuple(torch.zeros(1, 1, t, slots[kind]) for kind in kinds)
    index = tuple(torch.arange(t, dtype=torch.int32) for _ in kinds)
    return (torch.zeros(1, t, dtype=torch.int32), torch.arange(t, dtype=torch.int32)[None], *masks, *index)


def drafter_args(target: Transformer, layout: kv.KVLayout, sources: dict[str, int], slots: dict[str, int],
                 ids: torch.dtype = torch.long) -> tuple:
    """Example inputs of the drafter step over the source layers' caches."""
    kinds = sorted(sources)
    index = kv.source_caches(layout, sources)
    input_ids, pos = torch.zeros(1, 1, dtype=ids), torch.tensor([[1]], dtype=ids)
    hidden = torch.zeros(1, 1, target.cfg.hidden_size)
    masks = tuple(torch.zeros(1, 1, 1, slots[kind]) for kind in kinds)
    caches = tuple(torch.zeros(1, layout.caches[index[k]].num_kv_heads, slots[k], layout.caches[index[k]].head_dim)
                   for k in kinds for _ in "kv")
    return (input_ids, hidden, pos, *masks, *caches)


def eagle3_step_args(drafter: Eagle3Drafter, draft: kv.KVLayout, t: int) -> tuple:
    """Example inputs of `Eagle3StepFunction` at T = `t` over the drafter's own caches (layout `draft`)."""
    s = draft.max_context
    ids, pos = torch.zeros(1, t, dtype=torch.int32), torch.arange(1, t + 1, dtype=torch.int32)[None]
    caches = tuple(torch.zeros(1, c.num_kv_heads, s, c.head_dim) for c in draft.caches for _ in "kv")
    return (ids, torch.zeros(1, t, drafter.cfg.hidden_size), pos, torch.zeros(1, 1, t, s + t), *caches)


def slot_form(layout: kv.KVLayout) -> Slots:
    """Slot attention as fixed-shape graphs run it (batch-invariant in float), rings addressed by position % slots."""
    return Slots(layout.slots(kv.SLIDING) if kv.SLIDING in layout.kinds() else None)
