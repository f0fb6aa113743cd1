"""An EAGLE-3 drafter's bookkeeping, format-neutral (no runtime's types): the target's aux states by position
(`AuxRecord`) and which rows each draft step runs and which of them stay committed (`Eagle3Rows`). The Python twin
of runtimes/native/src/eagle3.h; runtimes/ort_eagle3.py and runtimes/executorch.py run their graphs over what it says,
with the semantics of runtimes/torch_eagle3.py (read its docstring for why).

Unlike an MTP drafter, an EAGLE-3 drafter owns a KV cache. Its row at position p pairs the target's aux states at
p - 1 with token p (slot p - 1), so after the target commits positions [0, L) (token L pending) its rows 1..L are
final. Each burst:
  begin(L)     keep the committed rows whose tokens 0..p all still agree with the target's (a rewind or a new
               prompt drops the rest, also when only token 0 differs: every row's aux states read it);
  first step   run the missing rows c + 1..L in one pass (target aux [c, L) through the fc graph, tokens c + 1..L),
               commit them: row L's output is the first draft;
  later steps  one chained row each (the previous row's hidden, the draft token), written after the committed rows
               but not committed: the next burst starts from the committed length again, which drops them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class AuxRecord:
    """The target's tokens and aux states by position: ids [S] (-1: none yet), aux [S, n * H]. Every target pass
    records its rows (rejected drafts too: a later pass over the same position overwrites them, so a committed
    position keeps the values of the pass that committed it)."""

    def __init__(self, max_context: int, width: int):
        self.ids = np.full(max_context, -1, dtype=np.int64)
        self.aux = np.zeros((max_context, width), dtype=np.float32)

    def __call__(self, ids: np.ndarray, positions: np.ndarray, aux: np.ndarray) -> None:
        keep = positions < len(self.ids)  # ids, positions [T]; aux [T, n * H]
        self.ids[positions[keep]] = ids[keep]
        self.aux[positions[keep]] = aux[keep]


@dataclass(frozen=True)
class Rows:
    """One step's rows, at positions s + 1..s + T (slots s..s + T - 1), after the s written ones. `first`: the burst's
    first step, whose hidden is the fc graph over the target's aux rows [aux_from, aux_from + T); else the one chained
    row, whose hidden is the previous step's."""
    first: bool
    s: int
    aux_from: int
    ids: np.ndarray  # [T] int64

    @property
    def positions(self) -> np.ndarray:  # [T]
        return np.arange(self.s + 1, self.s + 1 + len(self.ids), dtype=np.int64)


class Eagle3Rows:
    def __init__(self, record: AuxRecord, capacity: int):
        """`capacity`: the drafter cache's slots (the target's max_context + 1)."""
        self.record = record
        self.tokens = np.full(capacity + 1, -1, dtype=np.int64)  # token at each position when its row was computed
        self.committed = 0  # rows 1..committed are final (slots 0..committed - 1)
        self.used = 0  # rows written this burst (committed + chained)
        self.position, self.fresh = 0, False

    def begin(self, position: int) -> None:
        """A burst after the target's committed positions [0, position)."""
        keep = min(self.committed, position - 1)
        same = self.tokens[:keep + 1] == self.record.ids[:keep + 1]  # tokens 0..keep
        self.committed = keep if same.all() else max(int(np.argmin(same)) - 1, 0)
        self.used, self.position, self.fresh = self.committed, position, True

    def next(self, token: int) -> Rows:
        first, self.fresh = self.fresh, False
        if first:  # the missing rows c + 1..L: target aux [c, L), tokens c + 1..L (token L: this step's)
            c = self.committed
            return Rows(True, self.used, c, np.append(self.record.ids[c + 1:self.position], token).astype(np.int64))
        return Rows(False, self.used, 0, np.array([token], dtype=np.int64))

    def wrote(self, rows: Rows) -> None:
        """After the graph ran `rows` and its new K/V rows were written into slots s..s + T - 1."""
        t = len(rows.ids)
        self.used = rows.s + t
        if rows.first:
            self.tokens[0] = self.record.ids[0]
            self.tokens[rows.s + 1:rows.s + 1 + t] = rows.ids
            self.committed = self.used


class Eagle3Drafting:
    """What every runtime's eagle3 DrafterBackend shares: an AuxRecord fed by the target backend's `aux_sink` (after
    each pass: ids [T], positions [T], aux rows [T, aux_width]), the rows bookkeeping over a cache of `slots`, and
    `begin`. Subclasses run their graphs in `step`."""

    def __init__(self, target, slots: int):
        self.record = target.aux_sink = AuxRecord(target.layout.max_context, target.aux_width)
        self.rows = Eagle3Rows(self.record, slots)
        self.kernel_s = 0.0

    def begin(self, position: int, masks, n_cached: int) -> None:
        """A burst after the target's committed positions [0, position); the target's masks are unused."""
        self.rows.begin(position)
