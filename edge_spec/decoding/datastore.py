"""Static datastore drafting (REST, He et al. 2023; llama.cpp's `--lookup-cache-static`): the target's own earlier
answers, indexed so that the context's longest recent n-gram finds what the target said after it before.

The text: documents (token-id lists) joined, each followed by SEP (0xFFFFFFFF, never a token id): tokens [N] uint32.
The index: every position i with tokens[i] != SEP, sorted by its window tokens[i : i + L] with L = max_n + k_max (the
window is cut at its first SEP, and SEP sorts above every token id), ties by i: index [M] uint32. The positions whose
window starts with a pattern p (len(p) <= L) then form one contiguous run of the index, found by binary search.

`propose(context, k)` (the definition; tests/test_datastore.py checks it against a brute-force scan):
  1. the match: the largest n in [min_n, max_n] such that context[-n:] occurs in the text followed by a token (not SEP);
     none: no draft. (Occurrences of a longer suffix are occurrences of every shorter one, so n grows until it fails.)
  2. the walk, while len(draft) < min(k, k_max): count the tokens that follow the occurrences (after the matched
     n-gram and the draft so far); the most frequent one (lowest id on ties) is drafted if its count is at least
     min_share percent of the occurrences (those ending at a SEP count too), and the occurrences narrow to it.
The native runner (runtimes/native/src/datastore.cpp) reads the same file and drafts the same tokens.

File (`datastore.bin`, little-endian): header "ESDSTORE", then uint32 version, min_n, max_n, k_max, min_share,
vocab_size, n_tokens, n_index (40 bytes); tokens uint32[n_tokens]; index uint32[n_index].
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from edge_spec.contract.datastore_check import DATASTORE_VERSION as VERSION
from edge_spec.errors import BundleError, ConfigError

MAGIC = b"ESDSTORE"
SEP = 0xFFFFFFFF  # between documents; above every token id, so a window cut at a document's end sorts last
HEADER = struct.Struct("<8s8I")  # magic, version, min_n, max_n, k_max, min_share, vocab_size, n_tokens, n_index
MAX_WINDOW = 64  # max_n + k_max: what the sort key covers
_REBUILD = "re-export the bundle (edge-spec export) so that its datastore.bin is rebuilt, or pass --no-datastore"


class Datastore:
    """An n-gram -> continuation index over a fixed token text (see the module docstring)."""

    def __init__(self, tokens: np.ndarray, index: np.ndarray, *, min_n: int, max_n: int, k_max: int, min_share: int,
                 vocab_size: int):
        self.tokens = tokens  # [N] uint32, SEP after every document
        self.index = index  # [M] uint32, positions sorted by their window
        self.min_n, self.max_n, self.k_max, self.min_share, self.vocab_size = min_n, max_n, k_max, min_share, vocab_size
        # [vocab_size + 1]: the index run of windows starting with token t is starts[t] .. starts[t + 1]
        self._starts = np.searchsorted(tokens[index], np.arange(vocab_size + 1, dtype=np.int64)) \
            if len(index) else np.zeros(vocab_size + 1, dtype=np.int64)

    # ---- building ---------------------------------------------------------------------------------------
    @classmethod
    def build(cls, documents: Iterable[Sequence[int]], *, vocab_size: int, min_n: int = 2, max_n: int = 8,
              k_max: int = 8, min_share: int = 50) -> "Datastore":
        check_params(min_n, max_n, k_max, min_share, vocab_size, ConfigError, "pass other datastore parameters")
        parts = []
        for i, doc in enumerate(documents):
            ids = np.asarray(doc, dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise ConfigError(f"datastore document {i} holds a token id outside [0, {vocab_size})",
                                  "build the datastore from the target's own token ids (data/regenerated/<target>)")
            parts += [ids, np.array([SEP], dtype=np.int64)]
        tokens = (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)).astype(np.uint32)
        if len(tokens) >= SEP:
            raise ConfigError(f"a datastore of {len(tokens)} tokens does not fit uint32 positions", "use less text")
        positions = np.flatnonzero(tokens != SEP).astype(np.int64)
        keys = _windows(tokens, positions, max_n + k_max)  # [L, M]
        order = np.lexsort(keys[::-1]) if len(positions) else np.zeros(0, dtype=np.int64)  # stable: ties by position
        return cls(tokens, positions[order].astype(np.uint32), min_n=min_n, max_n=max_n, k_max=k_max,
                   min_share=min_share, vocab_size=vocab_size)

    # ---- the file -----------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        head = HEADER.pack(MAGIC, VERSION, self.min_n, self.max_n, self.k_max, self.min_share, self.vocab_size,
                           len(self.tokens), len(self.index))
        return head + self.tokens.astype("<u4").tobytes() + self.index.astype("<u4").tobytes()

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, path: str | Path, *, vocab_size: int | None = None) -> "Datastore":
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            raise BundleError(f"cannot read the datastore {path}: {err.strerror or err}", _REBUILD) from None
        return cls.from_bytes(data, where=str(path), vocab_size=vocab_size)

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "datastore", vocab_size: int | None = None) -> "Datastore":
        """Parse and check a datastore file (BundleError naming what is wrong): header, sizes, ids, the sort."""
        if len(data) < HEADER.size:
            raise BundleError(f"{where} is {len(data)} bytes, shorter than its {HEADER.size}-byte header", _REBUILD)
        magic, version, min_n, max_n, k_max, min_share, vocab, n_tokens, n_index = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise BundleError(f"{where} is not an edge-spec datastore (magic {magic!r})", _REBUILD)
        if version != VERSION:
            raise BundleError(f"{where} is datastore version {version}, this edge-spec reads version {VERSION}",
                              "update edge-spec, or " + _REBUILD)
        check_params(min_n, max_n, k_max, min_share, vocab, BundleError, _REBUILD, where)
        if vocab_size is not None and vocab != vocab_size:
            raise BundleError(f"{where} was built for a vocabulary of {vocab}, the target's is {vocab_size}", _REBUILD)
        want = HEADER.size + 4 * (n_tokens + n_index)
        if len(data) != want:
            raise BundleError(f"{where} is {len(data)} bytes, its header says {want} (truncated or altered)", _REBUILD)
        tokens = np.frombuffer(data, dtype="<u4", count=n_tokens, offset=HEADER.size).astype(np.uint32)
        index = np.frombuffer(data, dtype="<u4", count=n_index, offset=HEADER.size + 4 * n_tokens).astype(np.uint32)
        _check_text(tokens, index, vocab, max_n + k_max, where)
        return cls(tokens, index, min_n=min_n, max_n=max_n, k_max=k_max, min_share=min_share, vocab_size=vocab)

    # ---- drafting -----------------------------------------------------------------------------------------
    def _narrow(self, lo: int, hi: int, offset: int, token: int) -> tuple[int, int]:
        """The sub-run of index[lo:hi] whose windows hold `token` at `offset` (they already agree before it)."""
        col = self.tokens[self.index[lo:hi].astype(np.int64) + offset]  # sorted within the run
        return lo + int(np.searchsorted(col, token, "left")), lo + int(np.searchsorted(col, token, "right"))

    def _occurrences(self, pattern: Sequence[int]) -> tuple[int, int]:
        first = int(pattern[0])
        if not 0 <= first < self.vocab_size:
            return 0, 0
        lo, hi = int(self._starts[first]), int(self._starts[first + 1])
        for j in range(1, len(pattern)):
            if lo == hi:
                break
            lo, hi = self._narrow(lo, hi, j, int(pattern[j]))
        return lo, hi

    def _continued(self, lo: int, hi: int, offset: int) -> bool:
        """Whether any window in the run has a token (not SEP) at `offset` (SEP sorts last: check the first)."""
        return lo < hi and int(self.tokens[int(self.index[lo]) + offset]) != SEP

    def match(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(n, lo, hi): the longest matched suffix length and its index run; n = 0 when nothing matches."""
        best = (0, 0, 0)
        for n in range(self.min_n, min(self.max_n, len(context)) + 1):
            lo, hi = self._occurrences(context[-n:])
            if not self._continued(lo, hi, n):
                break
            best = (n, lo, hi)
        return best

    def candidates(self, lo: int, hi: int, offset: int) -> list[tuple[int, int]]:
        """The tokens at `offset` after the run's windows, as (token, count), most frequent first (ties: lowest id)."""
        col = self.tokens[self.index[lo:hi].astype(np.int64) + offset]
        ids, counts = np.unique(col[col != SEP], return_counts=True)
        order = np.lexsort((ids, -counts))
        return [(int(ids[i]), int(counts[i])) for i in order]

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to min(k, k_max) draft tokens after `context` (only its last max_n tokens matter); [] for no match."""
        n, lo, hi = self.match(context)
        draft: list[int] = []
        while n and len(draft) < min(k, self.k_max):
            offset = n + len(draft)
            col = self.tokens[self.index[lo:hi].astype(np.int64) + offset]  # sorted: runs of equal tokens, SEP last
            edges = np.flatnonzero(np.diff(col.astype(np.int64))) + 1
            starts = np.concatenate(([0], edges))
            counts = np.diff(np.concatenate((starts, [len(col)])))
            if col[starts[-1]] == SEP:  # occurrences at a document's end: counted in the share, never drafted
                starts, counts = starts[:-1], counts[:-1]
            if not len(counts):
                break
            best = int(np.argmax(counts))  # the first maximum: the lowest id
            if 100 * int(counts[best]) < self.min_share * (hi - lo):
                break
            draft.append(int(col[starts[best]]))
            lo, hi = lo + int(starts[best]), lo + int(starts[best]) + int(counts[best])
        return draft


def check_params(min_n, max_n, k_max, min_share, vocab_size, error, fix: str, where: str = "datastore") -> None:
    if not (1 <= min_n <= max_n and 1 <= k_max and max_n + k_max <= MAX_WINDOW):
        raise error(f"{where}: n-gram lengths {min_n}..{max_n} with k_max {k_max} (need 1 <= min_n <= max_n, "
                    f"k_max >= 1, max_n + k_max <= {MAX_WINDOW})", fix)
    if not 0 <= min_share <= 100 or not 1 <= vocab_size < SEP:
        raise error(f"{where}: min_share {min_share} (percent, 0..100) or vocab_size {vocab_size} out of range", fix)


def _windows(tokens: np.ndarray, positions: np.ndarray, length: int) -> np.ndarray:
    """[length, M] uint32: tokens[p + j] for each position p, SEP from the window's first SEP on."""
    last = len(tokens) - 1  # a SEP: reads past the end see SEP, as the cut does
    keys = np.empty((length, len(positions)), dtype=np.uint32)
    cut = np.zeros(len(positions), dtype=bool)
    for j in range(length):
        col = tokens[np.minimum(positions + j, last)]
        cut |= col == SEP
        keys[j] = np.where(cut, SEP, col)
    return keys


def _check_text(tokens: np.ndarray, index: np.ndarray, vocab: int, length: int, where: str) -> None:
    """The text ends with SEP and holds only ids < vocab; the index lists each other position once, sorted."""
    if len(tokens) and tokens[-1] != SEP:
        raise BundleError(f"{where}: the text does not end with a separator (corrupt)", _REBUILD)
    real = tokens != SEP
    if np.any(tokens[real] >= vocab):
        raise BundleError(f"{where}: a token id is >= its vocabulary size {vocab} (corrupt)", _REBUILD)
    if len(index) != int(real.sum()) or np.any(index >= len(tokens)) or np.any(~real[index]) \
            or len(np.unique(index)) != len(index):
        raise BundleError(f"{where}: the index does not list every text position exactly once (corrupt)", _REBUILD)
    if len(index) > 1:
        keys = _windows(tokens, index.astype(np.int64), length)  # [L, M]
        a, b = keys[:, :-1], keys[:, 1:]
        differs = a != b
        first = np.argmax(differs, axis=0)  # the first column where neighbours differ (0 where equal throughout)
        cols = np.arange(a.shape[1])
        if np.any(differs.any(axis=0) & (a[first, cols] > b[first, cols])):
            raise BundleError(f"{where}: the index is not sorted by window (corrupt)", _REBUILD)
