"""The one small protocol every runtime implements, and the Session that drives it.

A Backend runs the target graph over T new tokens given runtime-built positions and masks, keeps
the new K/V rows pending, and writes the ones the Session commits into its cache buffers.
The Session owns all bookkeeping (KVState); backends hold buffers and nothing else.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from edge_spec.contract.kv import WRITES_ALL, KVLayout, pass_cap
from edge_spec.contract.kv_state import KVState


class StepOutput(NamedTuple):
    logits: np.ndarray  # [T, V] float32 (T = 1 when the caller asked for the last position only)
    hidden: np.ndarray  # [T, H] float32, final hidden states (after the final norm)


class Backend(Protocol):
    layout: KVLayout
    name: str
    kernel_s: float  # running total of seconds inside the runtime's compute call (benchmarks split time with it)

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        """input_ids, position_ids: [1, T]; masks: kind -> [1, 1, T, S_kind + T].

        `n_cached` = committed positions: full-attention slots >= n_cached are empty, so a backend
        may skip them. New K/V rows stay pending until `commit`.
        """

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Accept the first rows of the last forward: kind -> (row indices, slot indices). `io` binding: write those
        pending rows into their cache slots; `state` binding: nothing to copy (the program already wrote every row
        into its own buffers; KVState masks the rejected ones)."""

    def reset(self) -> None:
        """Drop pending rows (buffers need no clearing: masks hide stale slots)."""


class Session:
    """KV state + a backend: prefill, step, commit, rewind. Positions are absolute and runtime-owned.

    `min_rows`: the fewest rows a pass of the target carries. 2 makes a one-token pass run as two rows, the
    second a dummy (the last token again, at the next position) that causal masks hide from the first and that
    is never committed, so that every pass takes the runtime's multi-row kernels: on CPUs whose one-row kernels
    sum in another order this is what keeps decode steps bit-identical to verify rows (edge_spec.decoding.hostcheck sets
    it from a probe of the host). A pass at the last context slot has no room for the dummy and runs as is;
    generation never runs one (the token it would produce has no position left).
    """

    def __init__(self, backend: Backend, prefill_chunk: int = 128, min_rows: int = 1):
        self.backend = backend
        self.state = KVState(backend.layout)
        self.prefill_chunk = prefill_chunk
        self.min_rows = min_rows

    @property
    def length(self) -> int:
        return self.state.length

    @property
    def max_context(self) -> int:
        return self.state.layout.max_context

    def pass_cap(self) -> int | None:
        """The most tokens the next verify pass may carry and stay bit-identical to decode steps (kv.pass_cap)."""
        return pass_cap(self.state.layout, self.length, self.min_rows)

    def forward(self, tokens: list[int], *, last_only: bool = False) -> StepOutput:
        """Run T tokens at positions [length, length + T) without committing them."""
        n = len(tokens)
        pad = self.min_rows - n if 0 < n < self.min_rows and self.length + self.min_rows <= self.max_context else 0
        rows = n + pad
        masks = self.state.masks(rows)
        ids = np.asarray(list(tokens) + [tokens[-1]] * pad, dtype=np.int64)[None]  # [1, T (+ dummy rows)]
        out = self.backend.forward(ids, self.state.position_ids(rows), masks, self.state.length, last_only and not pad)
        if self.state.layout.binding in WRITES_ALL:  # the graph wrote every row (dummies too) into the caches
            self.state.written(rows)
        if pad:  # drop the dummy rows; their pending K/V rows are never committed (commit takes the first n)
            keep = slice(n - 1, n) if last_only else slice(0, n)
            out = StepOutput(out.logits[keep], out.hidden[keep])
        return out

    def commit(self, n: int) -> None:
        """Keep the first `n` rows of the last forward in the cache."""
        plan = self.state.plan_commit(n)
        self.backend.commit(plan)
        self.state.advance(n, plan)

    def prefill(self, tokens: list[int]) -> StepOutput:
        """Commit all `tokens` in chunks; returns the output of the last position ([1, V], [1, H])."""
        self.state.check_fits(len(tokens))
        size = min(self.prefill_chunk, self.state.layout.max_pass or self.prefill_chunk)  # the graphs' cap per pass
        out = None
        for start in range(0, len(tokens), size):
            chunk = tokens[start:start + size]
            out = self.forward(chunk, last_only=True)
            self.commit(len(chunk))
        assert out is not None, "prefill needs at least one token"
        return out

    def rewind(self, pos: int) -> None:
        self.state.rewind(pos)
        self.backend.reset()

    def reset(self) -> None:
        self.state.reset()
        self.backend.reset()


class DraftStep(NamedTuple):
    token_ids: np.ndarray  # [N] int64 candidate ids (the whole vocabulary for a dense head)
    logits: np.ndarray  # [N] float32
    hidden: np.ndarray  # [Ht] float32, input hidden of the next draft step


class DrafterBackend(Protocol):
    """A drafter beside the target backend: the MTP drafter reads the target's caches (it owns none); an EAGLE-3
    drafter owns one, kept in step with the target's commits (edge_spec/runtimes/torch_eagle3.py)."""

    kernel_s: float  # as Backend.kernel_s

    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        """Start a burst at the bonus token's `position`; masks: kind -> [1, 1, 1, S_kind]."""

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        """One draft step from the previous token and hidden state ([Ht])."""
