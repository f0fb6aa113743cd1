"""The KV state: what the caches hold, position by position (the buffers themselves belong to the backend).

The bookkeeping half of the KV-cache contract (edge_spec/contract/kv.py holds the layout, the IO names and the pure
functions): commit, rewind and masks for every binding, refusing a read or rewind that would need an evicted key.
"""

from __future__ import annotations

import numpy as np

from edge_spec.errors import ContextOverflowError, KVStateError
from edge_spec.contract.kv import WRITES_ALL, KVLayout, attention_mask, check_pass, commit_slots, drafter_window


# ---- state -------------------------------------------------------------------------------------
class KVState:
    """Bookkeeping of what the caches hold (the buffers themselves belong to the backend).

    `length` = number of committed positions = the absolute position of the next token to commit.
    `slot_pos[kind][s]` = the position whose key/value slot s holds (-1: empty). `io` binding: only committed rows
    are ever written. `state` binding: every row of a forward is written (`written`), so slots may hold uncommitted
    positions (>= length; masked) and a ring may lose committed keys to rejected drafts: `retained_from` follows
    the rows written, and a read or rewind that needs a lost key raises instead of attending to the wrong one.
    """

    def __init__(self, layout: KVLayout):
        self.layout = layout
        self.length = 0
        self.slot_pos = {kind: np.full(layout.slots(kind), -1, dtype=np.int64) for kind in layout.kinds()}
        # kind -> every position in [retained_from, length) is still held by that kind's slots
        self.retained_from = {kind: 0 for kind in layout.kinds()}

    def check_fits(self, n_new: int) -> None:
        if self.length + n_new > self.layout.max_context:
            raise ContextOverflowError(
                f"context overflow: {self.length} cached + {n_new} new tokens > max context "
                f"{self.layout.max_context}",
                "shorten the prompt, lower max_new_tokens, or load with a larger max_context")

    def masks(self, n_new: int) -> dict[str, np.ndarray]:
        """Masks for the next forward over `n_new` tokens: kind -> [1, 1, T, S_kind + T]."""
        self.check_fits(n_new)
        check_pass(self.layout, n_new)
        self._check_window(lambda w: w - 1, "this pass")
        query = np.arange(self.length, self.length + n_new, dtype=np.int64)
        return {kind: attention_mask(self._committed(kind), query, self.layout.window(kind))[None, None]
                for kind in self.layout.kinds()}

    def drafter_masks(self) -> dict[str, np.ndarray]:
        """Masks for a drafter query at position `length` over the committed caches: kind -> [1, 1, 1, S_kind]."""
        self._check_window(lambda w: w + 1, "the drafter")
        query = np.array([self.length], dtype=np.int64)
        return {kind: attention_mask(self._committed(kind), query, drafter_window(self.layout.window(kind)))[None, None, :,
                                                                                                   :self.layout.slots(kind)]
                for kind in self.layout.kinds()}

    def _committed(self, kind: str) -> np.ndarray:
        """slot_pos with slots holding uncommitted rows (`state` binding: rejected drafts) shown empty."""
        sp = self.slot_pos[kind]
        return np.where(sp < self.length, sp, -1) if self.layout.binding in WRITES_ALL else sp

    def _check_window(self, keys, reader: str) -> None:
        """Refuse a read whose window reaches a ring slot already overwritten (`keys(W)` committed keys before
        position `length` are read). Never raised by a layout sized with `ring_slots`; a smaller ring gets this
        error instead of wrong logits."""
        for kind in self.layout.kinds():
            window = self.layout.window(kind)
            if window is not None and max(0, self.length - keys(window)) < self.retained_from[kind]:
                raise KVStateError(
                    f"{reader} at position {self.length} reads the {kind} ring back to position "
                    f"{max(0, self.length - keys(window))}, but its {self.layout.slots(kind)} slots were overwritten "
                    f"up to position {self.retained_from[kind] - 1} (rows written past the committed ones)",
                    "re-export with rings sized by kv.ring_slots for this binding and --max-pass, or reset the session")

    def written(self, n: int) -> None:
        """`state` / `shared` binding: a forward wrote n rows at positions [length, length + n) into their slots (the backend's
        buffers now hold them, committed or not): record what each slot physically holds and what rings lost."""
        for kind in self.layout.kinds():
            ring = self.layout.window(kind) is not None
            rows, slots = commit_slots(self.length, n, self.layout.slots(kind), ring)
            self.slot_pos[kind][slots] = self.length + rows
            if ring:
                self.retained_from[kind] = max(self.retained_from[kind], self.length + n - self.layout.slots(kind))

    def position_ids(self, n_new: int) -> np.ndarray:  # [1, T]
        return np.arange(self.length, self.length + n_new, dtype=np.int64)[None]

    def plan_commit(self, n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """kind -> (rows, slots) to write for committing the first `n` new rows. Does not mutate."""
        self.check_fits(n)
        return {kind: commit_slots(self.length, n, self.layout.slots(kind), self.layout.window(kind) is not None)
                for kind in self.layout.kinds()}

    def advance(self, n: int, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        for kind, (rows, slots) in plan.items():
            self.slot_pos[kind][slots] = self.length + rows
        self.length += n
        for kind in self.retained_from:
            self.retained_from[kind] = max(self.retained_from[kind], self.length - self.layout.slots(kind))

    def rewind(self, pos: int) -> None:
        """Forget positions >= pos. Raises if a sliding ring already evicted a key `pos` still needs."""
        if not 0 <= pos <= self.length:
            raise KVStateError(f"cannot rewind to position {pos}: the cache holds positions [0, {self.length})",
                               "rewind to a position between 0 and the current length")
        for kind in self.layout.kinds():
            window = self.layout.window(kind)
            if window is None:
                continue
            needed_from = max(0, pos - window + 1)  # the next query (at `pos`) sees (pos - window, pos)
            if needed_from < self.retained_from[kind]:
                raise KVStateError(
                    f"cannot rewind to position {pos}: the {kind} ring ({self.layout.slots(kind)} slots) "
                    f"already evicted position {needed_from}, which a query at {pos} must see",
                    "re-prefill the prompt from scratch (session.reset()) instead of rewinding this far")
        for kind, sp in self.slot_pos.items():
            sp[sp >= pos] = -1
        self.length = pos

    def reset(self) -> None:
        self.length = 0
        for kind, sp in self.slot_pos.items():
            sp[:] = -1
            self.retained_from[kind] = 0
