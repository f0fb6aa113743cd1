"""The `io` binding's caches on the host, for runtimes whose graphs take a symbolic cache length (runtimes/ort.py;
scripts/et_binding_cost.py drives an ExecuTorch method with it). Fixed-shape graphs keep whole caches instead
(runtimes/fixed.py); `state` programs keep none (the program owns them).

One flat float32 buffer per cached layer and K / V, allocated once with the layer's full slot count. A runtime binds
only a *bucket* of it: the smallest multiple of `bucket` slots that holds every visible key (full attention: and the
slots a pass writes, see edge_spec.model.attention.attend_slots), viewed as the contiguous prefix [1, H_kv, b, D] of the flat
buffer (the contract's head-major layout: nothing is copied per step). Under the `shared` binding the graph writes
a pass's rows into the bound view itself (slot == position) and a commit copies nothing. When a kind's bucket grows (every `bucket`
tokens) or shrinks (after a reset / rewind) the heads are moved apart or together in place, O(rows in use), and
`generation` is bumped so a runtime knows its bound views moved.

Layers with one cache shape keep K and V as rows of one store [2n, H_kv * slots * D], so committing a pass copies the
accepted rows of all of them in one assignment.
"""

from __future__ import annotations

import mmap
from typing import Callable

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.kv import CacheSpec, KVLayout

BUCKET = 64  # cache slots bound per pass are a multiple of this (or the layer's full slot count)


def shape_groups(specs: list[CacheSpec]) -> dict[tuple, list[int]]:
    """Cached layers with one cache shape (kind, KV heads, head dim, slots) -> their indices in `specs`."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault((s.kind, s.num_kv_heads, s.head_dim, s.slots), []).append(i)
    return groups


def lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose pages become resident only when written: a private anonymous mapping with transparent
    huge pages off. numpy's own allocator asks for 2 MB pages on arrays over 4 MB, and a cache store's rows are
    ~1.5 MB apart, so the first pass (writing a few KB at the start of each row) made a whole store resident: 94 MB
    for SmolLM2 at 2,048 slots, where the slots in use hold ~3 MB (tests/test_io_caches.py)."""
    nbytes = int(np.prod(shape)) * 4
    if nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):  # Windows: no anonymous private mappings in the module
        return np.zeros(shape, dtype=np.float32)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux; "always" THP would otherwise back it with 2 MB pages
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=np.float32).reshape(shape)  # the array keeps the mapping alive


def grouped_rows(groups: dict[tuple, list[int]], rows: Callable[[tuple], int]
                 ) -> tuple[dict[tuple, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """One zeroed store [2n, H_kv * rows(group) * D] per shape group (`shape_groups`, `lazy_zeros`); returns
    (stores, per cached layer its (K, V) rows of its group's store: rows 2j and 2j + 1 for the group's j-th layer)."""
    stores = {key: lazy_zeros((2 * len(idx), key[1] * rows(key) * key[2])) for key, idx in groups.items()}
    per_layer: list = [None] * sum(len(idx) for idx in groups.values())
    for key, idx in groups.items():
        for j, i in enumerate(idx):
            per_layer[i] = (stores[key][2 * j], stores[key][2 * j + 1])
    return stores, per_layer


def stacked(store: np.ndarray, heads: int, rows: int, dim: int) -> np.ndarray:
    """[2n, >= heads*rows*dim] store -> its row prefixes as [2n, heads, rows, dim], a view (never a copy: setting
    .shape raises instead of copying)."""
    view = store[:, :heads * rows * dim].view()
    view.shape = (store.shape[0], heads, rows, dim)
    return view


class LayerCache:
    """K or V of one cached layer: a flat buffer of the layer's full size (a row of its shape group's store),
    viewed as its current bucket."""

    def __init__(self, spec: CacheSpec, flat: np.ndarray):
        self.heads, self.dim = spec.num_kv_heads, spec.head_dim
        self.flat = flat

    def view(self, b: int) -> np.ndarray:  # [1, H_kv, b, D], contiguous
        return self.flat[:self.heads * b * self.dim].reshape(1, self.heads, b, self.dim)

    def relayout(self, old: int, new: int, rows: int) -> None:
        """Re-view the buffer from bucket `old` to `new`, keeping rows [0, rows) of every head (in place)."""
        if old == new or self.heads == 1 or rows == 0:
            return
        src, dst = self.view(old)[0], self.view(new)[0]
        order = range(self.heads - 1, 0, -1) if new > old else range(1, self.heads)  # never overwrite unread rows
        for h in order:
            dst[h, :rows] = src[h, :rows]  # numpy buffers overlapping copies


class NewRows:
    """A pass's new K/V rows, stacked like the caches: group -> [2n, H_kv * t_cap * D]; `rows[i]` = cached layer i's
    (K, V) buffers, which a runtime binds as the graph's outputs ([1, H_kv, T, D] prefixes, `views`)."""

    def __init__(self, layout: KVLayout, t_cap: int):
        self.t_cap = t_cap
        self.specs = list(layout.caches)
        self.store, self.rows = grouped_rows(shape_groups(self.specs), lambda key: t_cap)

    def views(self, i: int, t: int) -> tuple[np.ndarray, np.ndarray]:  # [1, H_kv, T, D] each
        spec = self.specs[i]
        shape = (1, spec.num_kv_heads, t, spec.head_dim)
        return tuple(r[:int(np.prod(shape))].reshape(shape) for r in self.rows[i])


class IoCaches:
    """The caches of one session under the `io` binding: bucketed views, and commits of accepted rows."""

    def __init__(self, layout: KVLayout, bucket: int = BUCKET, spare: int = 0):
        """`spare`: slots past each layer's own that a pass may write (kv.SHARED_SPARE_SLOTS), bound with the rest."""
        self.layout, self.bucket_size, self.spare = layout, bucket, spare
        self.specs: list[CacheSpec] = list(layout.caches)
        self.groups = shape_groups(self.specs)
        self.stores, rows = grouped_rows(self.groups, lambda key: key[3] + spare)  # key[3]: the group's slot count
        self.k = [LayerCache(spec, k) for spec, (k, _) in zip(self.specs, rows)]
        self.v = [LayerCache(spec, v) for spec, (_, v) in zip(self.specs, rows)]
        self.bucket = {kind: self._bucket(0, kind) for kind in layout.kinds()}
        self.used = {kind: 0 for kind in layout.kinds()}  # rows [0, used) of each bucket hold data
        self.generation = 0  # bumped whenever a cache view moves (bound views must be rebound then)

    def _bucket(self, need: int, kind: str) -> int:
        return kv.bucket_slots(need, self.layout.slots(kind) + self.spare, self.bucket_size)

    def views(self, i: int) -> tuple[np.ndarray, np.ndarray]:  # cached layer i's K, V: [1, H_kv, b, D] each
        b = self.bucket[self.specs[i].kind]
        return self.k[i].view(b), self.v[i].view(b)

    def _fit(self, kind: str, used: int, need: int) -> None:
        """Make the bound prefix of `kind` the bucket for `need` visible slots, keeping rows [0, used)."""
        new, old = self._bucket(need, kind), self.bucket[kind]
        if new == old:
            return
        for i, spec in enumerate(self.specs):
            if spec.kind == kind:
                self.k[i].relayout(old, new, min(used, old, new))
                self.v[i].relayout(old, new, min(used, old, new))
        self.bucket[kind] = new
        self.generation += 1

    def prepare(self, n_cached: int, t: int) -> None:
        """Before a pass over t tokens after n_cached committed ones: buckets that hold every visible key and the
        slots the pass writes (until a ring wraps these are slots used .. used + t - 1 of the bound prefix)."""
        for kind in self.layout.kinds():
            used = min(n_cached, self.layout.slots(kind))  # slots >= used are empty (see kv.KVState.rewind)
            self._fit(kind, used, used + t + self.spare)
            self.used[kind] = used

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]], new: NewRows | None, t: int) -> None:
        """Copy the accepted rows of the last pass (over t tokens, its rows in `new`) into their slots:
        plan = kind -> (rows, slots), from kv.KVState.plan_commit. `new` None (the `shared` binding): the graph
        already wrote them there; only the slots in use are recorded."""
        for kind, (rows, slots) in plan.items():
            if len(slots):
                top = max(self.used[kind], int(slots.max()) + 1)
                # `shared`: the accepted rows already sit in their slots of the bound view; a re-layout keeps them
                self._fit(kind, top if new is None else self.used[kind], top)
                self.used[kind] = top
        if new is None:
            return
        for key in self.groups:
            kind, heads, dim, _ = key
            rows, slots = plan[kind]
            if not len(rows):
                continue
            cache = stacked(self.stores[key], heads, self.bucket[kind], dim)  # [2n, H_kv, b, D]
            fresh = stacked(new.store[key], heads, t, dim)  # [2n, H_kv, T, D]
            r0, s0, n = int(rows[0]), int(slots[0]), len(rows)
            if rows[-1] - r0 == n - 1 and slots[-1] - s0 == n - 1:  # runs of rows -> runs of slots: slices
                cache[:, :, s0:s0 + n] = fresh[:, :, r0:r0 + n]
            else:  # a sliding ring wrapping around
                cache[:, :, slots] = fresh[:, :, rows]
