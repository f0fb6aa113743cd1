"""The adaptive draft length: `CostModel` picks k per pass from costs and acceptance measured during the run, so
speculation never loses to plain decoding. Each draft source has its own acceptance track: the MTP drafter
(`lookup=False`), prompt + output lookup (`lookup=True`) and the static datastore (`lookup="datastore"`); the two
retrieval sources cost nothing to draft. (Moved out of speculative.py, which re-exports it.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DATASTORE = "datastore"  # the third source's key (`lookup=DATASTORE`)


def _source(lookup: bool | str) -> str:
    """A source's key: False -> the MTP drafter, True -> prompt lookup, "datastore" -> the static datastore."""
    if lookup is False or lookup is True:
        return "lookup" if lookup else "mtp"
    if lookup != DATASTORE:
        raise ValueError(f"unknown draft source {lookup!r}")
    return lookup


@dataclass
class CostModel:
    """Picks k from costs measured during this run, so speculation never loses to plain decoding.

    rate(k) = E[tokens per pass | k] / (verify_s(k + 1) + k * draft_s); k = 0 is plain decoding.
    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i with a_i the running acceptance rate of position i.
    verify_s(T) is interpolated linearly between measured T (a pass over T tokens costs more with T).

    Three draft sources, priced apart: the MTP drafter (`lookup=False`: its acceptance, draft_s per draft),
    retrieval (`lookup=True`: its own acceptance, no draft cost) and the static datastore (`lookup="datastore"`:
    retrieval from the target's earlier answers, its own acceptance, no draft cost) - a retrieval burst is either a copied span the
    target accepts whole or nothing, an MTP burst decays position by position, and one k for both cut retrieval's
    bursts to the drafter's length (gemma-3-270m: mean k 1.0-1.3 where fixed k = 4 was 1.3-1.5x faster).
    A position beyond the chosen k is never reached, so its estimate would stay whatever it was: every
    `probe_every` passes of a source below k_max draft one position more (and a source at k = 0 tries 2).
    """

    k_max: int
    decay: float = 0.25  # EMA weight of a new observation
    probe_every: int = 16  # passes of a source below k_max between probes one position further
    verify_s: dict[int, float] = field(default_factory=dict)
    draft_s: float | None = None
    accept: np.ndarray | None = None  # [k_max] the MTP drafter's acceptance at each position, given it is reached
    lookup_accept: np.ndarray | None = None  # [k_max] retrieval's
    datastore_accept: np.ndarray | None = None  # [k_max] the datastore's
    since_probe: dict[str, int] = field(default_factory=lambda: {"mtp": 0, "lookup": 0, DATASTORE: 0})

    def __post_init__(self):
        if self.accept is None:
            self.accept = np.full(self.k_max, 0.6)  # prior until measured
        if self.lookup_accept is None:
            self.lookup_accept = np.full(self.k_max, 0.6)
        if self.datastore_accept is None:
            self.datastore_accept = np.full(self.k_max, 0.6)

    def _rates(self, lookup: bool | str) -> np.ndarray:
        return {"mtp": self.accept, "lookup": self.lookup_accept, DATASTORE: self.datastore_accept}[_source(lookup)]

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.decay) * old + self.decay * new

    def observe_verify(self, tokens: int, seconds: float) -> None:
        self.verify_s[tokens] = self._ema(self.verify_s.get(tokens), seconds)

    def observe_draft(self, seconds_per_step: float) -> None:
        self.draft_s = self._ema(self.draft_s, seconds_per_step)

    def observe_acceptance(self, drafted: int, accepted: int, lookup: bool | str = False) -> None:
        rates = self._rates(lookup)
        for i in range(min(drafted, accepted + 1)):  # positions reached: accepted ones + the first rejected
            rates[i] = self._ema(rates[i], 1.0 if i < accepted else 0.0)

    def expected_tokens(self, k: int, lookup: bool | str = False) -> float:
        return 1.0 + float(np.cumprod(self._rates(lookup)[:k]).sum())

    def verify_cost(self, tokens: int) -> float:
        known = sorted(self.verify_s)
        if tokens in self.verify_s or len(known) == 1:
            return self.verify_s.get(tokens, self.verify_s[known[0]])
        lo = max((t for t in known if t < tokens), default=known[0])
        hi = min((t for t in known if t > tokens), default=known[-1])
        if lo == hi:  # outside the measured range: extend the nearest segment's slope
            lo, hi = (known[-2], known[-1]) if tokens > known[-1] else (known[0], known[1])
        slope = (self.verify_s[hi] - self.verify_s[lo]) / (hi - lo)
        return max(self.verify_s[lo] + slope * (tokens - lo), 1e-9)

    def rate(self, k: int, lookup: bool | str = False) -> float:
        """Expected tokens per second of a pass with k drafts from the source."""
        draft = 0.0 if lookup else k * self.draft_s
        return self.expected_tokens(k, lookup) / (self.verify_cost(k + 1) + draft)

    def choose(self, lookup: bool | str = False) -> int:
        """Exploration first (measure a plain step and a full burst), then the best measured rate; the MTP drafter
        is priced once a burst of it has been timed (until then it gets full bursts, as retrieval does)."""
        if 1 not in self.verify_s:
            return 0
        if len(self.verify_s) < 2 or (not lookup and self.draft_s is None):
            return self.k_max
        best = int(np.argmax([self.rate(k, lookup) for k in range(self.k_max + 1)]))
        key = _source(lookup)
        if best == self.k_max:
            self.since_probe[key] = 0
            return best
        self.since_probe[key] += 1
        if self.since_probe[key] > self.probe_every:  # re-measure the position past the chosen ones
            self.since_probe[key] = 0
            return min(best + 1 if best else 2, self.k_max)
        return best
