"""An EAGLE-3 drafter on ONNX Runtime beside an OrtBackend (a contract DrafterBackend): the ONNX twin of
runtimes/torch_eagle3.py, with the same begin / step semantics (read its docstring for which rows are committed).

  * the target's aux states: the bundle's target graph returns kv.AUX_HIDDEN for every row of a pass; the backend
    hands each pass's (ids, positions, aux rows) to `AuxRecord`, which keeps them by position; which rows a step
    runs and which stay committed: edge_spec/contract/eagle3_rows.py;
  * fc fusion: the bundle's fc graph (kv.eagle3_fc_io) runs once per burst over the target rows not yet fused
    (the missing rows c + 1..L read the aux states at c..L - 1), kv.EAGLE3_FIRST_CHUNK rows at a time (fc, then the
    step graph over those rows, written before the next chunk reads them: a long prompt never runs as one pass);
  * its own cache: runtimes/io_caches.IoCaches over the manifest's draft layout (kind kv.DRAFT_KIND, one cache per
    drafter layer, slot p - 1 = position p); every step binds the bucket of slots in use and writes its new rows
    after the ones written this burst. `begin` rewinds the written count to the committed rows that still agree with
    the target's tokens; the chained rows of the last burst are overwritten.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import DraftStep
from edge_spec.contract.eagle3_rows import Eagle3Drafting
from edge_spec.errors import BundleError
from edge_spec.runtimes.io_caches import BUCKET, IoCaches


def draft_layout(manifest_layout: kv.KVLayout, max_context: int) -> kv.KVLayout:
    """The manifest's draft cache layout for a session of `max_context` (max_context + 1 slots)."""
    slots = max_context + 1
    return kv.KVLayout(tuple(replace(c, slots=slots) for c in manifest_layout.caches), slots)


class OrtEagle3Drafter(Eagle3Drafting):
    """DrafterBackend over an eagle3 bundle's step and fc graphs, beside the OrtBackend whose passes it records."""

    def __init__(self, step_session, fc_session, target, draft: kv.KVLayout, tables: dict | None = None):
        """Sessions of the bundle's "drafter" and "drafter_fc" graphs (runtimes/ort.open_bundle); `target`: the
        OrtBackend; `draft`: the drafter's cache layout for this session (`draft_layout`); `tables`: the bundle's
        memory-mapped shared tables the step graph takes as inputs (its token embedding; none when it has its own)."""
        if not target.aux_width:
            raise BundleError(f"the target graph has no {kv.AUX_HIDDEN} output, which an eagle3 drafter reads",
                              "re-export the bundle with this edge-spec (edge-spec export --drafter EAGLE3_FOLDER)")
        super().__init__(target, draft.max_context)  # slots: max_context + 1
        self.session, self.fc = step_session, fc_session
        self.draft, self.tables = draft, dict(tables or {})
        self.caches = IoCaches(draft, BUCKET)

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        rows = self.rows.next(token)
        if rows.first:  # the missing rows, kv.EAGLE3_FIRST_CHUNK at a time: fc over their aux states, then the step
            for a in range(0, len(rows.ids), kv.EAGLE3_FIRST_CHUNK):
                ids = rows.ids[a:a + kv.EAGLE3_FIRST_CHUNK]
                x = self._fuse(self.record.aux[rows.aux_from + a:rows.aux_from + a + len(ids)])  # [1, t, H]
                out = self._rows(ids, x, rows.s + a)
        else:
            out = self._rows(rows.ids, np.asarray(hidden, dtype=np.float32).reshape(1, 1, -1), rows.s)
        self.rows.wrote(rows)
        token_ids, logits, out_hidden = out
        return DraftStep(token_ids, logits, out_hidden[0, 0].copy())

    def _rows(self, ids: np.ndarray, hidden: np.ndarray, s: int):
        """t rows after the s written ones, their new K/V rows written into slots s..s + t - 1: ids [t], hidden
        [1, t, H] -> (token ids [Vd], logits [Vd], hidden [1, 1, H]) of the last row."""
        token_ids, logits, out_hidden, new = self._run(ids[None], hidden, s)
        self._write(new, s, len(ids))
        return token_ids, logits, out_hidden

    def _fuse(self, aux: np.ndarray) -> np.ndarray:
        """aux [T, n * H] -> fused [1, T, H] (the fc graph)."""
        start = time.perf_counter()
        fused = self.fc.run(None, {kv.AUX_HIDDEN: np.ascontiguousarray(aux[None])})[0]
        self.kernel_s += time.perf_counter() - start
        return fused

    def _run(self, ids: np.ndarray, hidden: np.ndarray, s: int):
        """T rows after the s written ones: ids [1, T], hidden [1, T, H] -> (token ids [Vd], logits [Vd],
        hidden [1, 1, H], new rows per layer (k, v) [1, H_kv, T, D])."""
        t = ids.shape[1]
        self.caches.prepare(s, t)  # binds a bucket b >= s + t slots, keeping rows [0, s)
        b = self.caches.bucket[kv.DRAFT_KIND]
        mask = np.full((1, 1, t, b + t), kv.NEG_INF, dtype=np.float32)  # [1, 1, T, b + T]
        mask[..., :s] = 0.0  # every written row is visible
        mask[0, 0, :, b:] = np.where(np.tri(t, dtype=bool), np.float32(0.0), kv.NEG_INF)  # causal over the new rows
        feeds = {kv.INPUT_IDS: ids, kv.HIDDEN: np.ascontiguousarray(hidden, dtype=np.float32),
                 kv.POSITION_IDS: np.arange(s + 1, s + 1 + t, dtype=np.int64)[None], kv.DRAFT_MASK: mask}
        for i, spec in enumerate(self.draft.caches):
            k_name, v_name = kv.draft_cache_names(spec.layer)
            feeds[k_name], feeds[v_name] = self.caches.views(i)
        feeds.update(self.tables)  # [V, H] or its quantized form: onnxruntime reads the mapped bytes, no copy
        start = time.perf_counter()
        out = self.session.run(None, feeds)
        self.kernel_s += time.perf_counter() - start
        return out[0], out[1], out[2], list(zip(out[3::2], out[4::2]))

    def _write(self, rows, s: int, t: int) -> None:
        """The new rows into slots s..s + t - 1 of the bound bucket (which holds them: `prepare`)."""
        for i, (nk, nv) in enumerate(rows):
            k, v = self.caches.views(i)
            k[:, :, s:s + t] = nk
            v[:, :, s:s + t] = nv
        self.caches.used[kv.DRAFT_KIND] = s + t
