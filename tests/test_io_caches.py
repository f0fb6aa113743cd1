"""edge_spec.runtimes.io_caches: bucketed cache views keep every committed row through bucket moves and ring wraps (against a
plain [1, H_kv, S, D] array per layer written with the same plan)."""

import mmap
import sys

import numpy as np
import pytest

from edge_spec.contract import kv
from edge_spec.contract.kv_state import KVState
from edge_spec.runtimes.io_caches import IoCaches, NewRows

# two full layers of one shape (one store), one with other heads, a 12-slot ring
LAYOUT = kv.KVLayout((kv.CacheSpec(0, kv.FULL, 2, 4, 40, None), kv.CacheSpec(1, kv.SLIDING, 3, 4, 12, 8),
                      kv.CacheSpec(2, kv.FULL, 2, 4, 40, None), kv.CacheSpec(3, kv.FULL, 1, 8, 40, None)), 40, 9)


def run(passes: list[tuple[int, int]], seed: int = 0) -> None:
    """passes: (tokens in the pass, rows accepted); after each commit every bound view == the reference."""
    rng = np.random.default_rng(seed)
    caches, state = IoCaches(LAYOUT, bucket=8), KVState(LAYOUT)
    ref = [[np.zeros(c.shape, np.float32) for _ in "kv"] for c in LAYOUT.caches]
    new = NewRows(LAYOUT, 9)
    for t, accept in passes:
        caches.prepare(state.length, t)
        for i in range(len(LAYOUT.caches)):
            for view in new.views(i, t):
                view[...] = rng.standard_normal(view.shape)
        plan = state.plan_commit(accept)
        caches.commit(plan, new, t)
        for i, c in enumerate(LAYOUT.caches):
            rows, slots = plan[c.kind]
            for r, view in zip(ref[i], new.views(i, t)):
                r[:, :, slots] = view[:, :, rows]
        state.advance(accept, plan)
        for i, c in enumerate(LAYOUT.caches):
            b = caches.bucket[c.kind]
            filled = min(state.length, c.slots)
            assert b >= filled and b % 8 == 0 or b == c.slots
            for got, want in zip(caches.views(i), ref[i]):
                assert got.shape == (1, c.num_kv_heads, b, c.head_dim) and got.flags.c_contiguous
                np.testing.assert_array_equal(got[:, :, :filled], want[:, :, :filled])


def test_rows_survive_bucket_growth_and_ring_wraps():
    run([(9, 9), (5, 2), (1, 1), (9, 6), (3, 3), (9, 9), (2, 1)])  # 31 tokens: 4 buckets, the ring wraps twice


def test_views_move_together_with_generation():
    caches = IoCaches(LAYOUT, bucket=8)
    before = caches.generation
    caches.prepare(0, 3)
    assert caches.generation == before  # still the first bucket
    caches.prepare(6, 3)  # both kinds grow: full layers to 16 slots, the ring to all its 12
    grown = caches.generation
    assert grown > before and caches.bucket == {kv.FULL: 16, kv.SLIDING: 12}
    caches.prepare(0, 1)  # after a reset: shrinks back
    assert caches.generation > grown and caches.bucket == {kv.FULL: 8, kv.SLIDING: 8}


def test_a_single_head_layer_and_a_negative_control():
    """The check itself can fail: a commit that skips one layer is caught."""
    import pytest

    original = IoCaches.commit

    def skipping(self, plan, new, t):
        original(self, plan, new, t)
        self.k[3].flat[:] = 0

    IoCaches.commit = skipping
    try:
        with pytest.raises(AssertionError):
            run([(4, 4)])
    finally:
        IoCaches.commit = original


def test_rows_written_in_place_survive_the_commit_that_shrinks_the_bucket():
    """`shared` binding: the graph writes a pass's rows (and its dummy row, one spare slot on) into the bound view
    itself. A pass at the bucket edge grows the bucket; its commit shrinks it again and must carry the rows the pass
    wrote, not only the rows committed before it (the bug the host check found: max |diff| 8.9)."""
    layout = kv.KVLayout((kv.CacheSpec(0, kv.FULL, 3, 4, 40, None),), 40, binding=kv.BINDING_SHARED)
    rng = np.random.default_rng(0)
    caches, state = IoCaches(layout, bucket=8, spare=kv.SHARED_SPARE_SLOTS), KVState(layout)
    ref = np.zeros((1, 3, 41, 4), np.float32)
    for t, accept in ((5, 5), (2, 1), (2, 1), (3, 2), (9, 3), (2, 1), (2, 2)):  # passes across the edges 8, 16
        caches.prepare(state.length, t)
        assert caches.bucket[kv.FULL] >= state.length + t + 1  # the dummy row's slot is bound
        rows = rng.standard_normal((1, 3, t + 1, 4)).astype(np.float32)
        for view in caches.views(0):  # what GroupQueryAttention does: rows at slot == position, then the dummy
            view[:, :, state.length:state.length + t + 1] = rows
        ref[:, :, state.length:state.length + t + 1] = rows
        plan = state.plan_commit(accept)
        caches.commit(plan, None, t)
        state.advance(accept, plan)
        for got in caches.views(0):
            np.testing.assert_array_equal(got[:, :, :state.length], ref[:, :, :state.length])


def resident_pages(array: np.ndarray) -> int:
    """Pages of `array`'s memory the OS holds now (Linux mincore)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    start = array.ctypes.data - array.ctypes.data % mmap.PAGESIZE
    length = array.ctypes.data + array.nbytes - start
    vec = (ctypes.c_ubyte * ((length + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(sys.platform != "linux", reason="mincore's residency bits are Linux's")
def test_only_the_slots_in_use_are_resident():
    """SmolLM2's shape at 2,048 slots: 30 layers' K and V in one 94 MB store, 1.57 MB per row. Writing the first
    bucket of every row must not make the rest resident (numpy's allocator backs big arrays with 2 MB pages, so one
    write per row made all 94 MB resident: np.zeros in place of io_caches.lazy_zeros fails this)."""
    layout = kv.KVLayout(tuple(kv.CacheSpec(i, kv.FULL, 3, 64, 2048, None) for i in range(30)), 2048)
    caches = IoCaches(layout, bucket=64)
    store = next(iter(caches.stores.values()))
    assert store.nbytes == 60 * 3 * 2048 * 64 * 4 and resident_pages(store) == 0
    caches.prepare(0, 5)
    for i in range(30):
        for view in caches.views(i):  # [1, 3, 64, 64]: 48 KB at the start of the row
            view[...] = 1.0
    touched = 60 * (3 * 64 * 64 * 4 // mmap.PAGESIZE + 1)
    assert resident_pages(store) <= touched, (resident_pages(store), touched)
    np.testing.assert_array_equal(store[:, 3 * 64 * 64:], 0)  # the rest still reads as zeros
