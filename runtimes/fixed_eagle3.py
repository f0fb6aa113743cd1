"""An EAGLE-3 drafter over fixed-shape graphs (Core ML's functions; exporters/static.py Eagle3StepFunction and
Eagle3FcFunction), beside a FixedBackend whose passes it records: the fixed-shape twin of runtimes/ort_eagle3.py,
with the same begin / step semantics (edge_spec/contract/eagle3_rows.py says which rows a step runs and keeps).

  * lengths: the step and fc graphs exist at the target's pass lengths; a step of t rows runs the smallest T >= t,
    a burst's first step longer than the longest T runs in chunks of it (each chunk's rows are written before the
    next chunk reads them);
  * padding: a step is padded at the FRONT (the graph returns the last row's candidates, which must be a real row):
    T - t pad rows repeat the first real row's token, hidden and position and see only the written slots and
    themselves; no real row sees a pad row and none is written to the cache. fc is row by row: pad rows are zeros
    at the end, dropped;
  * its own cache: [1, H_kv, S_draft, D] float32 per drafter layer (S_draft: the manifest's draft layout, slot p - 1
    = position p), passed whole to every call; the runtime writes each step's real new rows after the s written ones.
"""

from __future__ import annotations

import time

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import DraftStep
from edge_spec.contract.eagle3_rows import Eagle3Drafting
from edge_spec.errors import BundleError
from edge_spec.runtimes.fixed import FixedBackend, Predictor


def front_pad_mask(s: int, t: int, n: int, slots: int, floor: float = kv.NEG_INF) -> np.ndarray:
    """[1, 1, n, slots + n] additive: n - t pad rows then t real rows after s written slots. Every row sees the
    written slots [0, s); real row i (graph row p + i, p = n - t) sees new rows p..p + i; pad row j sees itself.
    Hidden entries hold `floor` (a quantized graph's mask input has a calibrated range: QNN's MASK_FLOOR)."""
    p = n - t
    mask = np.full((1, 1, n, slots + n), floor, dtype=np.float32)
    mask[..., :s] = 0.0
    new = mask[0, 0, :, slots:]  # [n, n] view
    new[np.arange(p), np.arange(p)] = 0.0
    new[p:, p:] = np.where(np.tri(t, dtype=bool), np.float32(0.0), np.float32(floor))
    return mask


class FixedEagle3Drafter(Eagle3Drafting):
    """DrafterBackend over an eagle3 bundle's fixed-length step and fc graphs (length -> Predictor each)."""

    def __init__(self, steps: dict[int, Predictor], fcs: dict[int, Predictor], target: FixedBackend,
                 draft: kv.KVLayout, mask_floor: float = kv.NEG_INF):
        if not target.aux_width:
            raise BundleError(f"the target functions return no {kv.AUX_HIDDEN}, which an eagle3 drafter reads",
                              "re-export the bundle with this edge-spec (edge-spec export --drafter EAGLE3_FOLDER)")
        if sorted(steps) != sorted(fcs):
            raise BundleError(f"the eagle3 step lengths {sorted(steps)} differ from its fc lengths {sorted(fcs)}",
                              "re-export the bundle with this edge-spec")
        super().__init__(target, draft.max_context)  # slots: max_context + 1 = the graphs' S_draft
        self.steps, self.fcs, self.lengths = steps, fcs, sorted(steps)
        self.name, self.slots, self.mask_floor = target.feature, draft.max_context, mask_floor
        self.k = [np.zeros((1, c.num_kv_heads, self.slots, c.head_dim), np.float32) for c in draft.caches]
        self.v = [np.zeros_like(k) for k in self.k]
        self.layers = [c.layer for c in draft.caches]

    def length_for(self, t: int) -> int:
        return next(n for n in self.lengths if n >= t)  # callers chunk by self.lengths[-1]

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        rows = self.rows.next(token)
        if rows.first:  # the missing rows, the longest length at a time: fc over their aux states, then the step
            longest = self.lengths[-1]
            for a in range(0, len(rows.ids), longest):
                ids = rows.ids[a:a + longest]
                start = rows.aux_from + a
                out = self._run(ids, self._fuse(self.record.aux[start:start + len(ids)]), rows.s + a)
        else:
            out = self._run(rows.ids, np.asarray(hidden, dtype=np.float32).reshape(1, 1, -1), rows.s)
        self.rows.wrote(rows)
        token_ids, logits, out_hidden = out
        return DraftStep(token_ids, logits, out_hidden[0, 0].copy())

    def _fuse(self, aux: np.ndarray) -> np.ndarray:
        """aux [t, n * H] -> fused [1, t, H] (the fc graph of the next length, zero rows after the real ones)."""
        t = len(aux)
        n = self.length_for(t)
        padded = np.zeros((1, n, aux.shape[1]), np.float32)
        padded[0, :t] = aux
        out = self._call(self.fcs[n], {self.name(kv.AUX_HIDDEN): padded})
        return np.asarray(out[self.name(kv.FUSED_HIDDEN)], dtype=np.float32)[:, :t]

    def _run(self, ids: np.ndarray, hidden: np.ndarray, s: int):
        """t rows after the s written ones: ids [t], hidden [1, t, H] -> (token ids [Vd], logits [Vd], hidden
        [1, 1, H]); their new K/V rows go into slots s..s + t - 1."""
        t = len(ids)
        n = self.length_for(t)
        p = n - t  # pad rows at the front (module doc)
        name = self.name
        feeds = {name(kv.INPUT_IDS): np.concatenate([np.repeat(ids[:1], p), ids])[None].astype(np.int32),
                 name(kv.HIDDEN): np.concatenate([np.repeat(hidden[:, :1], p, axis=1), hidden], axis=1),
                 name(kv.POSITION_IDS): np.concatenate([np.full(p, s + 1), np.arange(s + 1, s + 1 + t)])[None]
                 .astype(np.int32),
                 name(kv.DRAFT_MASK): front_pad_mask(s, t, n, self.slots, self.mask_floor)}
        for i, layer in enumerate(self.layers):
            k_name, v_name = kv.draft_cache_names(layer)
            feeds[name(k_name)], feeds[name(v_name)] = self.k[i], self.v[i]
        out = self._call(self.steps[n], feeds)
        for i, layer in enumerate(self.layers):
            k_new, v_new = kv.draft_new_names(layer)
            self.k[i][:, :, s:s + t] = np.asarray(out[name(k_new)])[:, :, p:]
            self.v[i][:, :, s:s + t] = np.asarray(out[name(v_new)])[:, :, p:]
        return (np.asarray(out[name(kv.DRAFT_TOKEN_IDS)]).astype(np.int64),
                np.asarray(out[name(kv.DRAFT_LOGITS)], dtype=np.float32),
                np.asarray(out[name(kv.DRAFT_HIDDEN)], dtype=np.float32))

    def _call(self, predictor: Predictor, feeds: dict) -> dict:
        start = time.perf_counter()
        out = predictor(feeds)
        self.kernel_s += time.perf_counter() - start
        return out
