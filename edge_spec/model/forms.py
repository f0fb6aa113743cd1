"""Attention forms: how a layer attends over the caches, chosen by whoever runs the model (an exporter, a runtime),
passed to `Transformer.forward` / `Drafter.forward` as an argument. The model holds no form of its own.

  Split()          keys = cache slots then the new rows, scored apart (`attention.attend`): eager training and the
                   eager runtime; no cache copy, but a verify row is not bit-identical to a decode step.
  Slots(ring)      batch-invariant (`attention.attend_slots`): full layers put position p in slot p, sliding
                   layers in slot p % ring (ring None: they keep the split form); the new rows' mask columns are
                   folded into their slots. What exported graphs run so verify rows == decode steps.
  Placed()         the new rows placed into their slots by data movement (`attention.place_rows`) and attention
                   in 4-D ops only (`attention.attend_concat`), with a 0/1 keep input: for accelerator compilers
                   that take no scatter; its masks come in as `Mask(add, keep, index)`.
  State(write, base)  the program owns the caches: `write(i, q, k, v, slots, mask, scale) -> [1, T, H * D]` writes
                   cached layer i's new rows into its buffers and attends over them; `base` (Split or Slots)
                   decides slots and masks.

A form's `begin` turns one forward's masks into a `Pass` (per-kind masks and slots, what KV-sharing layers read);
its `attend` runs one layer. Layers that reuse another layer's K/V read `Pass.shared[kind]`, which the storing
layer (or the drafter's caller) fills in the form's own terms.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch

from edge_spec.model.config import ATTENTION_FORMS, FULL
from edge_spec.model.attention import (attend, attend_concat, attend_slots, group_mask, place_rows, slot_mask,
                                       write_rows)


@dataclass(frozen=True)
class Mask:
    """One kind's attention mask. add: additive [B or 1, 1, T, S (+ T)]; keep: 1 where add is 0 (the placed form's
    0/1 input; the slot form builds a bool one per group count); index: the placed form's slot index [S]."""
    add: torch.Tensor
    keep: torch.Tensor | None = None
    index: torch.Tensor | None = None


def as_mask(m: torch.Tensor | Mask) -> Mask:
    return m if isinstance(m, Mask) else Mask(m)


@dataclass
class Pass:
    """One forward's attention state: masks and new-row slots per kind, what KV-sharing layers read."""
    form: "Form"
    masks: dict[str, Mask]
    slots: dict[str, torch.Tensor | None]
    shared: dict = field(default_factory=dict)
    grouped: dict = field(default_factory=dict)  # (kind, G) -> Mask over G*T group-major rows (slot form)

    def attend(self, layer, i: int | None, q, k, v, caches, pad_keys: bool = True):
        """layer: the Attention module (kind, scale, reuses_kv, stores_kv); i: its cache index (None: no cache);
        q [1, H, T, D], k / v [1, H_kv, T, D] or None (a KV-reusing layer); caches (k, v) [1, H_kv, S, D] or
        (None, None) -> (out [1, T, H * D], new rows (k, v) or None)."""
        return self.form.attend(self, layer, i, q, k, v, caches, pad_keys)


def _parts(p: Pass, layer, k, v, own: tuple) -> tuple[tuple, tuple, tuple | None]:
    """(key parts, value parts, new rows): a reusing layer reads its source's parts; a storing layer leaves its own."""
    if layer.reuses_kv:
        ks, vs = p.shared[layer.kind]
        return ks, vs, None
    if layer.stores_kv:
        p.shared[layer.kind] = own
    return own[0], own[1], (k, v)


class Form:
    def begin(self, position_ids: torch.Tensor, masks: dict, shared: dict | None = None) -> Pass:
        """position_ids [1, T]; masks: kind -> [B or 1, 1, T, S + T] (or a Mask) -> this forward's Pass."""
        return Pass(self, {kind: as_mask(m) for kind, m in masks.items()}, {kind: None for kind in masks},
                    dict(shared or {}))


class Split(Form):
    def attend(self, p: Pass, layer, i, q, k, v, caches, pad_keys):
        ks, vs, new = _parts(p, layer, k, v, ((caches[0], k), (caches[1], v)))
        return attend(q, ks, vs, p.masks[layer.kind].add, layer.scale), new


@dataclass(frozen=True)
class Slots(Form):
    ring: int | None = None  # sliding layers' ring slots (kv.ring_slots); None: sliding layers attend split

    def begin(self, position_ids, masks, shared=None):
        p = super().begin(position_ids, masks, shared)
        for kind, m in p.masks.items():
            if kind == FULL:
                p.slots[kind] = position_ids[0]
            elif self.ring is not None:
                p.slots[kind] = position_ids[0] % self.ring
            if p.slots[kind] is not None:
                p.masks[kind] = Mask(slot_mask(m.add, p.slots[kind]))  # [1, 1, T, S]
        return p

    def attend(self, p, layer, i, q, k, v, caches, pad_keys):
        slots = p.slots[layer.kind]
        if slots is None:
            return SPLIT.attend(p, layer, i, q, k, v, caches, pad_keys)
        own = None if layer.reuses_kv else ((caches[0], k), (write_rows(caches[1], v, slots),))
        ks, vs, new = _parts(p, layer, k, v, own)
        m = grouped(p, layer.kind, q.shape[1] // ks[0].shape[1])
        return attend_slots(q, ks[0], ks[1], slots, vs[0], m.add, m.keep, layer.scale, pad_keys=pad_keys), new


def grouped(p: Pass, kind: str, groups: int) -> Mask:
    """The kind's [1, 1, T, S] mask as (additive, keep) over G*T group-major rows, built once per forward."""
    key = (kind, groups)
    if key not in p.grouped:
        p.grouped[key] = Mask(*group_mask(p.masks[kind].add, groups))
    return p.grouped[key]


class Placed(Form):
    def attend(self, p, layer, i, q, k, v, caches, pad_keys):
        m = p.masks[layer.kind]
        own = None
        if not layer.reuses_kv:
            if m.index is not None:  # the new rows go into their slots: S columns, fixed positions
                own = ((place_rows(caches[0], k, m.index),), (place_rows(caches[1], v, m.index),))
            else:
                own = ((caches[0], k), (caches[1], v))
        ks, vs, new = _parts(p, layer, k, v, own)
        return attend_concat(q, ks, vs, m.add, layer.scale, m.keep), new


@dataclass(frozen=True)
class State(Form):
    write: Callable  # (i, q, k, v, slots, mask: Mask, scale) -> out [1, T, H * D]
    base: Form = field(default_factory=Split)

    def begin(self, position_ids, masks, shared=None):
        p = self.base.begin(position_ids, masks, shared)
        p.form = self
        return p

    def attend(self, p, layer, i, q, k, v, caches, pad_keys):
        slots = p.slots[layer.kind]
        m = grouped(p, layer.kind, q.shape[1] // layer.head_counts[1]) if slots is not None else p.masks[layer.kind]
        if layer.reuses_kv:  # the source layer's writer: the same buffer, nothing written
            return p.shared[layer.kind](q, None, None, slots, m, layer.scale), None
        writer = functools.partial(self.write, i)
        if layer.stores_kv:
            p.shared[layer.kind] = writer
        return writer(q, k, v, slots, m, layer.scale), (k, v)


SPLIT = Split()
PLACED = Placed()
NAMES = ATTENTION_FORMS  # what a format's registry row declares (formats.Format.attention): config.py spells them
