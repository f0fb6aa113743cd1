"""What every peer shares: decode-time bookkeeping and the settle pause between our engine and a peer."""

from __future__ import annotations

import os

import numpy as np

SETTLE_S = 0.2  # pause when switching between our engine and a peer: both spin-wait idle threads for a while


def disk_bytes(path) -> int:
    """Bytes on disk of a model file or folder (every file under it, as `du -sb` counts them): what a user ships."""
    from pathlib import Path

    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class PeerTimes:
    """Decode-time bookkeeping shared by the peers: first-token latency and decode tok/s after the first token."""

    def __init__(self, threads: int | None):
        self.threads = threads or os.cpu_count()
        self.tokens, self.decode_s, self.first = 0, 0.0, []

    def record(self, n: int, start: float, t_first: float, end: float) -> None:
        self.first.append(t_first - start)
        self.tokens += n - 1
        self.decode_s += end - t_first

    def timing(self) -> dict:
        return {"tok_s": self.tokens / self.decode_s if self.decode_s else 0.0,
                "first_token_ms": 1000 * float(np.mean(self.first)) if self.first else None,
                "threads": self.threads, "tokens": self.tokens, "interleaved": True}
