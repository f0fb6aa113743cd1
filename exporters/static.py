"""What the fixed-shape exporters share (Core ML, QNN): the flat signatures of the target at one pass length and of
the drafter step, their example inputs at fixed shapes, and the model settings those graphs are traced under.

Signatures (names from edge_spec.kv; a format may respell them, e.g. Core ML's "." -> "_"):
  target T:  (input_ids [1, T], position_ids [1, T], mask_{kind} [1, 1, T, S_kind + T] per kind,
              k_cache_{l} / v_cache_{l} [1, H_kv, S_kind, D] per cached layer)
             -> (logits [1, T, V], hidden [1, T, H], k_new_{l} / v_new_{l} [1, H_kv, T, D])
  drafter:   (input_ids [1, 1], hidden [1, 1, Ht], position_ids [1, 1], mask_{kind} [1, 1, 1, S_kind] per source
              kind, the source layers' caches) -> (draft_token_ids [N], draft_logits [N], draft_hidden [1, 1, Ht])
The drafter holds the target's embedding (and, for head_from="target", its output table) as constants. Ids and
positions come in as int32 (what the ANE and the HTP index with) and are widened inside.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec import kv
from edge_spec.drafter import Drafter
from edge_spec.model import Attention, Transformer, spelled_gelu


class TargetFunction(nn.Module):
    """(input_ids, position_ids, *masks, *caches) -> (logits, hidden, *new rows), slot attention."""

    def __init__(self, model: Transformer, kinds: tuple[str, ...]):
        super().__init__()
        self.model, self.kinds = model, kinds

    def forward(self, input_ids, position_ids, *rest):
        n = len(self.kinds)
        masks, caches = rest[:n], rest[n:]
        out = self.model(input_ids.long(), position_ids.long(), dict(zip(self.kinds, masks)), list(caches[0::2]),
                         list(caches[1::2]))
        return (out.logits, out.hidden, *[r for k, v in zip(out.new_k, out.new_v) for r in (k, v)])


class PlacedTargetFunction(nn.Module):
    """(input_ids, position_ids, *slot masks, *keeps, *slot indices, *caches) -> (logits, hidden, *new rows): the QNN
    form. Per kind: the mask in slot form [1, 1, T, S], its keep (1 where the mask is 0) and the slot index [S] int32
    (edge_spec.fixed.slot_feeds); each
    layer places its new rows into their slots (`model.place_rows`) and attends over the S slots, so every key sits
    in its slot's column whatever T is."""

    def __init__(self, model: Transformer, kinds: tuple[str, ...]):
        super().__init__()
        self.model, self.kinds = model, kinds

    def forward(self, input_ids, position_ids, *rest):
        n = len(self.kinds)
        masks, keeps, index, caches = rest[:n], rest[n:2 * n], rest[2 * n:3 * n], rest[3 * n:]
        packed = {kind: (masks[i], keeps[i], index[i]) for i, kind in enumerate(self.kinds)}
        out = self.model(input_ids.long(), position_ids.long(), packed, list(caches[0::2]), list(caches[1::2]))
        return (out.logits, out.hidden, *[r for k, v in zip(out.new_k, out.new_v) for r in (k, v)])


class DrafterFunction(nn.Module):
    """(input_ids, hidden, position_ids, *masks, *source caches) -> (ids, logits, next hidden); tables constant."""

    def __init__(self, drafter: Drafter, target: Transformer, kinds: tuple[str, ...]):
        super().__init__()
        self.drafter, self.kinds = drafter, kinds
        self.embed_scale = float(target.embed_scale)
        self.embed = target.model.embed_tokens.weight
        self.table = target.lm_head.weight if drafter.cfg.head_from == "target" else None

    def forward(self, input_ids, hidden, position_ids, *rest):
        n = len(self.kinds)
        masks, caches = rest[:n], rest[n:]
        token_embed = F.embedding(input_ids.long(), self.embed) * self.embed_scale  # [1, 1, Ht]
        pairs = {kind: (caches[2 * i], caches[2 * i + 1]) for i, kind in enumerate(self.kinds)}
        out = self.drafter(token_embed, hidden, position_ids.long(), dict(zip(self.kinds, masks)), pairs, self.table)
        return out.token_ids.to(torch.int32), out.logits, out.hidden


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


@contextlib.contextmanager
def fixed_models(job, attention: str = "slots"):
    """The target (and drafter) set up as fixed-shape graphs run them, the tanh GELU written out
    (`model.spelled_gelu`). attention "slots": slot attention (batch-invariant in float: Core ML), rings addressed
    by position % slots; "placed": `PlacedTargetFunction`'s form (`model.place_rows` + `model.attend_concat`: no
    scatter, what the HTP compiles).
    Yields the target model."""
    model, layout = job.target.model.eval(), job.layout
    drafters = [job.drafter] if job.drafter is not None else []
    layers = [m for net in [model, *drafters] for m in net.modules() if isinstance(m, Attention)]
    if attention == "slots":
        model.slot_attention = True
        model.sliding_ring = layout.slots(kv.SLIDING) if kv.SLIDING in layout.kinds() else None
    else:
        for m in layers:
            m.concat = True
    try:
        with spelled_gelu(model, *drafters):
            yield model
    finally:
        model.slot_attention, model.sliding_ring = False, None
        for m in layers:
            m.concat = False
