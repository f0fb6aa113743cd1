"""Eager PyTorch backend: the numerical reference every other runtime is tested against.

K/V buffers are preallocated once per cached layer ([1, H_kv, S, D]); new rows stay pending after a
forward and are copied into their slots on commit. Full-attention layers only ever see the first
`n_cached` slots (the rest are empty), so decode cost grows with the context actually used.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from edge_spec.contract.backend import StepOutput
from edge_spec.contract.kv import FULL, SLIDING, CacheSpec, KVLayout, source_caches
from edge_spec.model.forms import SPLIT, Slots
from edge_spec.model.transformer import Transformer


class TorchBackend:
    name = "torch"

    def __init__(self, model: Transformer, layout: KVLayout, threads: int | None = None,
                 slot_attention: bool = False):
        if threads:
            torch.set_num_threads(threads)
        self.model = model
        self.layout = layout
        # batch-invariant attention (edge_spec.model.attention.attend_slots), as the exported graphs run it: every key in
        # its slot's column, so a verify row repeats a decode step's sums; off: the split form (no cache copy)
        self.slot_attention = slot_attention
        ring = layout.slots(SLIDING) if layout.max_pass is not None and SLIDING in layout.kinds() else None
        self.form = Slots(ring) if slot_attention else SPLIT  # rings of kv.ring_slots, as exported
        self.specs: list[CacheSpec] = list(layout.caches)
        self.k = [torch.zeros(s.shape) for s in self.specs]  # [1, H_kv, S, D] each
        self.v = [torch.zeros(s.shape) for s in self.specs]
        self._pending: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.kernel_s = 0.0  # seconds spent in the model's forward (the rest of a step is loop Python)

    @property
    def identity(self) -> str:
        """What kernels run (part of the host check's cache key)."""
        return f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def _visible_slots(self, spec: CacheSpec, n_cached: int, t: int = 0) -> int:
        """Full-attention slots past the committed ones are empty; slot attention also needs the T slots the new
        rows go to."""
        return min(n_cached + t, spec.slots) if spec.kind == FULL else spec.slots

    @torch.no_grad()
    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        t = input_ids.shape[1]
        extra = t if self.slot_attention else 0
        visible = {spec.kind: self._visible_slots(spec, n_cached, extra) for spec in self.specs}
        torch_masks = {}
        for kind, mask in masks.items():  # [1, 1, T, S + T]
            s = self.layout.slots(kind)
            torch_masks[kind] = torch.from_numpy(np.concatenate([mask[..., :visible[kind]], mask[..., s:]], axis=-1))
        ks = [k[:, :, :visible[spec.kind]] for k, spec in zip(self.k, self.specs)]
        vs = [v[:, :, :visible[spec.kind]] for v, spec in zip(self.v, self.specs)]
        start = time.perf_counter()
        out = self.model(torch.from_numpy(input_ids), torch.from_numpy(position_ids), torch_masks, ks, vs,
                         last_only=last_only, form=self.form)
        self.kernel_s += time.perf_counter() - start
        assert out.new_k[0].shape[2] == t
        self._pending = (out.new_k, out.new_v)
        return StepOutput(out.logits[0].float().numpy(), out.hidden[0].float().numpy())

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        assert self._pending is not None, "commit without a forward"
        new_k, new_v = self._pending
        for i, spec in enumerate(self.specs):
            rows, slots = (torch.from_numpy(a) for a in plan[spec.kind])
            self.k[i][:, :, slots] = new_k[i][:, :, rows]
            self.v[i][:, :, slots] = new_v[i][:, :, rows]
        self._pending = None

    def reset(self) -> None:
        self._pending = None


class TorchDrafter:
    """Eager drafter over a TorchBackend's K/V buffers (zero-copy views of the source layers)."""

    def __init__(self, drafter, target: TorchBackend, sources: dict[str, int]):
        self.drafter = drafter
        self.target = target
        self.sources = source_caches(target.layout, sources)
        self._burst = None
        self.kernel_s = 0.0

    @torch.no_grad()
    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        kv, torch_masks = {}, {}
        for kind, i in self.sources.items():
            spec = self.target.specs[i]
            n = self.target._visible_slots(spec, n_cached)
            kv[kind] = (self.target.k[i][:, :, :n], self.target.v[i][:, :, :n])
            torch_masks[kind] = torch.from_numpy(np.ascontiguousarray(masks[kind][..., :n]))
        self._burst = (torch.tensor([[position]]), torch_masks, kv)

    @torch.no_grad()
    def step(self, token: int, hidden: np.ndarray) -> "DraftStep":
        from edge_spec.contract.backend import DraftStep

        position_ids, masks, kv = self._burst
        embed = self.target.model.embed(torch.tensor([[token]]))  # [1, 1, Ht]
        start = time.perf_counter()
        out = self.drafter(embed, torch.from_numpy(hidden).view(1, 1, -1), position_ids, masks, kv,
                           self.target.model.lm_head.weight)
        self.kernel_s += time.perf_counter() - start
        return DraftStep(out.token_ids.numpy(), out.logits.numpy(), out.hidden[0, 0].numpy())
