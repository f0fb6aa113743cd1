"""KV contract maths, exact and hand-built."""

import numpy as np
import pytest

from edge_spec.errors import ConfigError, ContextOverflowError, KVStateError
from edge_spec.contract.kv import (BINDING_IO, BINDING_SHARED, BINDING_STATE, FULL, SLIDING, CacheSpec, KVLayout, attention_mask, commit_slots,
                                   pass_cap, ring_slots)
from edge_spec.contract.kv_state import KVState

V = 0.0  # visible
X = np.float32(-1e30)  # masked


def test_mask_full_attention_cache_and_new_rows():
    # cache holds positions 0, 1 in slots 0, 1; slot 2 empty; two new tokens at positions 2, 3
    mask = attention_mask(np.array([0, 1, -1]), np.array([2, 3]), window=None)
    assert mask.tolist() == [[V, V, X, V, X],
                             [V, V, X, V, V]]


def test_mask_sliding_window_exact_bounds():
    # window 2: a key at p is visible to query q iff 0 <= q - p < 2
    ring = np.array([4, 1, 2, 3])  # a 4-slot ring after positions 0..4 (slot 0 overwritten by 4)
    mask = attention_mask(ring, np.array([5, 6]), window=2)
    assert mask.tolist() == [[V, X, X, X, V, X],
                             [X, X, X, X, V, V]]


def test_commit_slots_full_and_ring():
    rows, slots = commit_slots(start=5, n=3, slots=100, ring=False)
    assert rows.tolist() == [0, 1, 2] and slots.tolist() == [5, 6, 7]
    rows, slots = commit_slots(start=5, n=3, slots=4, ring=True)
    assert rows.tolist() == [0, 1, 2] and slots.tolist() == [1, 2, 3]
    rows, slots = commit_slots(start=2, n=6, slots=4, ring=True)  # only the last 4 rows survive
    assert rows.tolist() == [2, 3, 4, 5] and slots.tolist() == [0, 1, 2, 3]


def _state(window=4, slots=4, max_context=32):
    layout = KVLayout((CacheSpec(0, FULL, 1, 2, max_context, None), CacheSpec(1, SLIDING, 1, 2, slots, window)),
                      max_context)
    return KVState(layout)


def _commit(state, n):
    state.masks(n)
    state.advance(n, state.plan_commit(n))


def test_state_tracks_slot_positions_and_rewind_within_reach():
    state = _state()
    _commit(state, 6)  # positions 0..5; ring slots hold 4, 5, 2, 3
    assert state.slot_pos[SLIDING].tolist() == [4, 5, 2, 3]
    state.rewind(5)  # a query at 5 needs (1, 5) = 2, 3, 4: all still held
    assert state.length == 5
    assert state.slot_pos[SLIDING].tolist() == [4, -1, 2, 3]
    assert state.slot_pos[FULL][:6].tolist() == [0, 1, 2, 3, 4, -1]


def test_rewind_across_eviction_raises():
    state = _state()
    _commit(state, 6)
    with pytest.raises(KVStateError, match="evicted position 1"):
        state.rewind(4)  # a query at 4 needs position 1, overwritten by 5
    assert state.length == 6  # nothing changed


def test_repeated_small_rewinds_cannot_sneak_past_an_eviction():
    state = _state()
    _commit(state, 6)
    state.rewind(5)
    with pytest.raises(KVStateError):
        state.rewind(4)


def test_rewind_out_of_range_and_overflow():
    state = _state(max_context=8)
    _commit(state, 3)
    with pytest.raises(KVStateError):
        state.rewind(4)
    with pytest.raises(ContextOverflowError, match="context overflow"):
        state.masks(6)


def _overwrites_a_visible_key(window: int, slots: int, max_pass: int, positions: int = 80) -> bool:
    """Does some forward of T <= max_pass tokens, writing its new keys into ring slots (position % slots) before
    attending, overwrite a cached key that one of its own rows still sees?"""
    for p in range(positions):
        for t in range(1, max_pass + 1):
            written = {(p + i) % slots: p + i for i in range(t)}
            for q in range(p, p + t):
                for key in range(max(0, q - window + 1), p):  # cached keys row q sees
                    if written.get(key % slots, key) != key:
                        return True
    return False


@pytest.mark.parametrize("window,max_pass", [(6, 9), (4, 2), (3, 17), (6, 1)])
def test_ring_slots_hold_every_key_a_capped_forward_reads(window, max_pass):
    """W + max_pass - 1 slots (at least W + 1, for the drafter) are enough, and one slot fewer is not."""
    slots = ring_slots(window, 10_000, max_pass)
    assert slots == window + max(2, max_pass) - 1
    assert not _overwrites_a_visible_key(window, slots, max_pass)
    if max_pass >= 2:
        assert _overwrites_a_visible_key(window, slots - 1, max_pass)
    assert ring_slots(window, 10_000) == window + 1  # no cap: the drafter's W + 1
    assert ring_slots(window, 5, max_pass) == 5  # never more than the context


def test_layout_cap_refuses_long_forwards_and_survives_a_smaller_context():
    layout = KVLayout((CacheSpec(0, FULL, 1, 2, 64, None), CacheSpec(1, SLIDING, 1, 2, ring_slots(4, 64, 8), 4)), 64, 8)
    state = KVState(layout)
    state.masks(8)
    with pytest.raises(ConfigError, match="8 tokens per pass"):
        state.masks(9)
    small = layout.with_context(10)
    assert small.max_pass == 8 and small.slots(SLIDING) == 10 and small.slots(FULL) == 10
    assert KVLayout.from_json(layout.to_json()) == layout
    legacy = layout.to_json()
    del legacy["max_pass"]  # schema-1 manifests
    assert KVLayout.from_json(legacy).max_pass is None


# ---- the `state` binding: the program writes every row of a pass, rejected drafts included ----------------
def _state_binding(window=4, max_pass=3, slots=None, max_context=40):
    slots = slots or ring_slots(window, max_context, max_pass, BINDING_STATE)
    layout = KVLayout((CacheSpec(0, FULL, 1, 2, max_context, None), CacheSpec(1, SLIDING, 1, 2, slots, window)),
                      max_context, max_pass, BINDING_STATE)
    return KVState(layout)


def _verify(state, t, accept):
    """A verify pass of t rows (all written by the program), then `accept` of them committed."""
    state.masks(t)
    state.written(t)
    state.advance(accept, state.plan_commit(accept))


def test_state_rings_are_one_slot_larger_and_need_a_cap():
    assert ring_slots(4, 100, 3, BINDING_STATE) == 4 + 3 == ring_slots(4, 100, 3) + 1
    with pytest.raises(ConfigError, match="cap"):
        ring_slots(4, 100, None, BINDING_STATE)
    layout = _state_binding().layout
    assert KVLayout.from_json(layout.to_json()) == layout and layout.binding == BINDING_STATE


def test_shared_binding_keeps_no_ring():
    """`shared`: a fused kernel writes slot == position and attends over its window itself: every layer keeps the
    context's slots."""
    assert ring_slots(4, 100, 3, BINDING_SHARED) == ring_slots(4, 100, None, BINDING_SHARED) == 100


def test_state_write_reject_and_rewind():
    """Rejected rows sit in their slots but are masked; a later pass overwrites them; a rewind past a key that a
    rejected row clobbered in the ring raises instead of reading the clobbered slot."""
    state = _state_binding()  # ring of 7 slots, window 4, passes of <= 3
    _verify(state, 3, 3)  # positions 0..2 committed
    _verify(state, 3, 1)  # writes 3, 4, 5; keeps 3
    assert state.length == 4
    ring = state.slot_pos[SLIDING]
    assert [int(ring[p % 7]) for p in (3, 4, 5)] == [3, 4, 5]  # the rejected rows are physically there
    mask = state.masks(1)[SLIDING][0, 0, 0]  # the next query (at 4) must not see 4 or 5 in the cache part
    assert mask[4 % 7] == X and mask[5 % 7] == X and mask[3 % 7] == V
    for _ in range(3):  # ... passes of 3 writing 2 rows past the committed ones, wrapping the ring
        _verify(state, 3, 1)
    assert state.length == 7 and state.retained_from[SLIDING] == 9 - 7  # rows written up to position 8
    state.rewind(6)  # a query at 6 reads 3, 4, 5: still held
    with pytest.raises(KVStateError, match="evicted"):
        state.rewind(4)  # reads position 1, whose slot the (rejected) row at 8 took


def test_state_ring_wrap_inside_one_pass_keeps_what_the_pass_reads():
    """A pass of max_pass rows whose slots wrap around the ring never takes a slot that one of its own rows, or the
    next pass, still reads (W + max_pass slots; one fewer is caught by the window check)."""
    window, max_pass = 4, 3
    for start in range(0, 12):
        state = _state_binding(window, max_pass)
        for _ in range(start):
            _verify(state, 1, 1)
        _verify(state, max_pass, 1)  # wraps for some starts; only the first row accepted
        state.masks(max_pass)  # the next pass's window is whole
        state.drafter_masks()  # ... and so is the drafter's W + 1 keys before the bonus token
    small = _state_binding(window, max_pass, slots=window + max_pass - 1)
    for _ in range(6):
        _verify(small, 1, 1)
    _verify(small, max_pass, 1)
    with pytest.raises(KVStateError, match="the drafter"):
        small.drafter_masks()


def test_state_drafter_window_sees_committed_keys_only():
    state = _state_binding(window=4, max_pass=3)
    for _ in range(5):
        _verify(state, 1, 1)  # positions 0..4
    _verify(state, 3, 2)  # writes 5, 6, 7; commits 5, 6: the bonus token is at 7
    mask = state.drafter_masks()[SLIDING][0, 0, 0]
    ring = state.slot_pos[SLIDING]
    visible = sorted(int(ring[s]) for s in range(len(ring)) if mask[s] == V)
    assert visible == [2, 3, 4, 5, 6]  # W + 1 = 5 committed keys before 7; the rejected row at 7 is hidden


def test_pass_cap_keeps_long_head_passes_on_one_side_of_the_scoring_edge():
    """`shared` layouts with heads of 256: a pass after n cached tokens is capped while a decode step at n still scores
    <= 64 keys (n + min_rows + the dummy row), so that it and its last row's step score <= 64 keys too."""
    def layout(head_dim, binding=BINDING_SHARED):
        return KVLayout((CacheSpec(0, FULL, 1, head_dim, 200, None),), 200, None, binding)

    long = layout(256)
    assert [pass_cap(long, n) for n in (0, 30, 60, 61, 62, 63, 100)] == [63, 33, 3, 2, 1, None, None]
    assert [pass_cap(long, n, min_rows=2) for n in (0, 60, 61, 62)] == [62, 2, 1, None]
    for n in range(0, 64):  # the pass's keys (n + T + 1) and its last step's (n + T - 1 + min_rows + 1) stay <= 64
        for rows in (1, 2):
            cap = pass_cap(long, n, rows)
            if cap is not None:
                assert cap >= 1 and n + max(cap, rows) + 1 <= 64 and n + cap - 1 + rows + 1 <= 64
            else:
                assert n + rows + 1 > 64
    assert pass_cap(layout(128), 10) is None and pass_cap(layout(256, BINDING_IO), 10) is None
