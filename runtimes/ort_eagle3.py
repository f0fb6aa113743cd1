"""An EAGLE-3 drafter on ONNX Runtime beside an OrtBackend (a contract DrafterBackend): the ONNX twin of
runtimes/torch_eagle3.py, with the same begin / step semantics (read its docstring for which rows are committed).

  * the target's aux states: the bundle's target graph returns kv.AUX_HIDDEN for every row of a pass; the backend
    hands each pass's (ids, positions, aux rows) to `AuxRecord`, which keeps them by position (a committed position
    keeps the values of the pass that committed it, as AuxTarget does);
  * fc fusion: the bundle's fc graph (kv.eagle3_fc_io) runs once per burst over the target rows not yet fused
    (the missing rows c + 1..L read the aux states at c..L - 1);
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
from edge_spec.errors import BundleError
from edge_spec.runtimes.io_caches import BUCKET, IoCaches


class AuxRecord:
    """The target's tokens and aux states by position: ids [S] (-1: none yet), aux [S, n * H]."""

    def __init__(self, max_context: int, width: int):
        self.ids = np.full(max_context, -1, dtype=np.int64)
        self.aux = np.zeros((max_context, width), dtype=np.float32)

    def __call__(self, ids: np.ndarray, positions: np.ndarray, aux: np.ndarray) -> None:
        keep = positions < len(self.ids)  # ids, positions [T]; aux [T, n * H]
        self.ids[positions[keep]] = ids[keep]
        self.aux[positions[keep]] = aux[keep]


def draft_layout(manifest_layout: kv.KVLayout, max_context: int) -> kv.KVLayout:
    """The manifest's draft cache layout for a session of `max_context` (max_context + 1 slots)."""
    slots = max_context + 1
    return kv.KVLayout(tuple(replace(c, slots=slots) for c in manifest_layout.caches), slots)


class OrtEagle3Drafter:
    """DrafterBackend over an eagle3 bundle's step and fc graphs, beside the OrtBackend whose passes it records."""

    def __init__(self, step_session, fc_session, target, draft: kv.KVLayout, tables: dict | None = None):
        """Sessions of the bundle's "drafter" and "drafter_fc" graphs (runtimes/ort.open_bundle); `target`: the
        OrtBackend; `draft`: the drafter's cache layout for this session (`draft_layout`); `tables`: the bundle's
        memory-mapped shared tables the step graph takes as inputs (its token embedding; none when it has its own)."""
        if not target.aux_width:
            raise BundleError(f"the target graph has no {kv.AUX_HIDDEN} output, which an eagle3 drafter reads",
                              "re-export the bundle with this edge-spec (edge-spec export --drafter EAGLE3_FOLDER)")
        self.session, self.fc = step_session, fc_session
        self.record = target.aux_sink = AuxRecord(target.layout.max_context, target.aux_width)
        self.draft, self.tables = draft, dict(tables or {})
        self.caches = IoCaches(draft, BUCKET)
        capacity = draft.max_context  # slots: max_context + 1
        self.tokens = np.full(capacity + 1, -1, dtype=np.int64)  # token at each position when its row was computed
        self.committed = 0  # rows 1..committed are final (slots 0..committed - 1)
        self.used = 0  # rows written this burst (committed + chained)
        self.position, self.fresh = 0, False
        self.kernel_s = 0.0

    def begin(self, position: int, masks, n_cached: int) -> None:
        """A burst after the target's committed positions [0, position); the target's masks are unused."""
        keep = min(self.committed, position - 1)
        same = self.tokens[:keep + 1] == self.record.ids[:keep + 1]  # tokens 0..keep
        self.committed = keep if same.all() else max(int(np.argmin(same)) - 1, 0)
        self.used, self.position, self.fresh = self.committed, position, True

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        first, self.fresh = self.fresh, False
        if first:  # the missing rows c + 1..L: target aux [c, L), tokens c + 1..L (token L: this step's)
            c, end = self.committed, self.position
            ids = np.append(self.record.ids[c + 1:end], token)
            x = self._fuse(self.record.aux[c:end])  # [1, T, H]
        else:  # one chained row after the last one written
            ids = np.array([token], dtype=np.int64)
            x = np.asarray(hidden, dtype=np.float32).reshape(1, 1, -1)
        t, s = len(ids), self.used
        token_ids, logits, out_hidden, rows = self._run(ids.astype(np.int64)[None], x, s)
        self._write(rows, s, t)
        self.used += t
        if first:
            self.tokens[0] = self.record.ids[0]
            self.tokens[s + 1:s + 1 + t] = ids  # rows at positions s + 1..s + t
            self.committed = self.used
        return DraftStep(token_ids, logits, out_hidden[0, 0].copy())

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
