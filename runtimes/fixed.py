"""Fixed-shape graphs: the runtime half every fixed-shape format shares (Core ML, QNN).

Accelerators that compile a graph ahead of time (the Apple Neural Engine, Qualcomm's HTP) run only fixed shapes,
so such a format exports the target at a few pass lengths and the drafter step at one shape, all over caches of a
fixed number of slots. This module holds what follows from that, independent of the format:

  * `pass_lengths`: which lengths are exported (decode 1, verify k + 1 for k in 1, 2, 4 and max_draft_len, the
    prefill chunk); a pass of t tokens runs the smallest length T >= t;
  * `function_slots`: full layers get `longest pass - 1` slots of headroom, so a pad row's key never lands in a slot
    a real row reads, even at the end of the context; rings keep kv.ring_slots (they already hold a whole pass);
  * `pad_mask`: the contract's mask [1, 1, t, s + t] as a graph's [1, 1, T, S_f + T];
  * `FixedBackend` / `FixedDrafter`: edge_spec.contract.backend's Backend and DrafterBackend over such graphs: the runtime
    holds the caches ([1, H_kv, S_f, D] float32 per cached layer), passes them to every call, writes the committed
    rows itself. Pad rows repeat the last token at the next positions, see what the last real row sees (no real
    row sees them) and are never committed. They used to see only themselves (the placed form: nothing at all), which
    no real row ever does but position 0, where SmolLM2's residual stream reaches 24,874 (its attention sink; a token
    alone: ~23,000, in context < 130: scripts/sink_rows.py); the QNN calibration saw such pad rows and the 16a8w
    bundle was noise (top-1 vs eager 0.024 at passes up to 9; with pad rows as now 0.882: scripts/qnn_quality.py
    --max-pass 9).
  * the `state` binding (Core ML's MLState): the caches live in the program as states of `state_slots` slots (the
    layout's, at least one spare, rounded up to STATE_ALIGN); each pass takes the slot mask (`slot_feeds`) and the
    slot each row writes (`write_slots`: real rows their slot, pad rows the spare one, which no mask ever shows),
    writes all its rows, and `commit` only accepts (KVState hides what it did not accept).

A format's runtime supplies `Predictor`s (feeds -> outputs, names as the graphs spell them) and `name` (contract
name -> graph name: Core ML features spell "." as "_", ONNX keeps the contract's names).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import DraftStep, StepOutput
from edge_spec.errors import ConfigError
from edge_spec.logs import NOTICES
from edge_spec.contract.kv import KVLayout

Predictor = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def keep_name(kind: str) -> str:  # [1, 1, T, S] float32 0 / 1, placed form: 1 where the slot mask is 0
    return f"keep.{kind}"


def slot_index_name(kind: str) -> str:  # [S] int32, placed form: slot j takes row index[j] of cat(cache, new rows)
    return f"slot_index.{kind}"


def write_slots_name(kind: str) -> str:  # [T] int32, state form: the cache slot each row of the pass writes
    return f"write_slots.{kind}"


STATE_ALIGN = 32  # state binding: cache slots per kind are a multiple of this (what the Neural Engine wants of states)


def state_slots(layout: KVLayout) -> dict[str, int]:
    """kind -> slots of a `state` program's caches: the layout's plus at least one spare (pad rows write there),
    rounded up to STATE_ALIGN."""
    return {kind: -(-(layout.slots(kind) + 1) // STATE_ALIGN) * STATE_ALIGN for kind in layout.kinds()}


def write_slots(positions: np.ndarray, n: int, s: int, s_f: int, ring: bool) -> np.ndarray:
    """[n] int32: the slot each row of a pass of t = len(positions) real rows padded to n writes - position % s in a
    ring, the position otherwise; pad rows the spare slot s_f - 1 (never attended: `slot_feeds` masks [s, s_f))."""
    out = np.full(n, s_f - 1, dtype=np.int32)
    out[:len(positions)] = positions % s if ring else positions
    return out


def pass_lengths(max_draft_len: int, prefill: int) -> tuple[int, ...]:
    """The fixed pass lengths exported: decode (1), verify at k + 1 for k in 1, 2, 4 and max_draft_len, the prefill
    chunk. The runtime pads a pass to the next one (adaptive k lands between them)."""
    verify = {k + 1 for k in (1, 2, 4) if k <= max_draft_len} | {max_draft_len + 1}
    return tuple(sorted({1, prefill} | verify))


def function_slots(layout: KVLayout, lengths: tuple[int, ...]) -> dict[str, int]:
    """kind -> the cache slots the graphs take: full layers get headroom for pad rows (see the module doc)."""
    headroom = max(lengths) - 1
    return {kind: layout.slots(kind) + (headroom if kind == kv.FULL else 0) for kind in layout.kinds()}


def pad_mask(mask: np.ndarray, t: int, n: int, s: int, s_f: int, floor: float = kv.NEG_INF) -> np.ndarray:
    """The contract's mask [1, 1, t, s + t] as a graph's [1, 1, n, s_f + n]: real rows keep their columns (cache
    slots [0, s), new rows [s_f, s_f + t)), slots [s, s_f) stay masked, pad rows see what the last real row sees
    (module doc: why). Masked entries become `floor` (a quantized graph needs a small finite one: its mask input has a
    calibrated range)."""
    out = np.full((1, 1, n, s_f + n), floor, dtype=np.float32)
    out[:, :, :t, :s] = np.maximum(mask[..., :s], floor)
    out[:, :, :t, s_f:s_f + t] = np.maximum(mask[..., s:], floor)
    out[:, :, t:] = out[:, :, t - 1:t]  # pad rows: the last real row's view (module doc: why)
    return out


def slot_feeds(mask: np.ndarray, positions: np.ndarray, n: int, s: int, s_f: int, ring: bool,
               floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The placed form's inputs of one kind for a pass of t = len(positions) real rows padded to n, over a graph of
    s_f slots of which the runtime's layout uses s: the contract's mask [1, 1, t, s + t] as a slot mask [1, 1, n, s_f]
    (slot j of row r: the new row's column where this pass writes slot j, else the cache column; slots [s, s_f) are
    masked) and the slot index [s_f] int32 (j, or s_f + r where real row r writes slot j: position % s
    in a ring, the position otherwise; pad rows see what the last real row sees and write nothing)."""
    t = len(positions)
    slots = positions % s if ring else positions
    out = np.full((1, 1, n, s_f), floor, dtype=np.float32)
    rows_view = out[0, 0]  # [n, s_f] (indexed apart: out[0, 0, :t, slots] would put the slots axis first)
    rows_view[:t, :s] = np.maximum(mask[0, 0, :, :s], floor)
    rows_view[:t, slots] = np.maximum(mask[0, 0, :, s:s + t], floor)
    rows_view[t:] = rows_view[t - 1]  # pad rows: the last real row's view
    index = np.arange(s_f, dtype=np.int32)
    index[slots] = s_f + np.arange(t, dtype=np.int32)
    return out, index


def fixed_shapes(entry, layout: KVLayout, what: str) -> tuple[dict[int, str], dict[str, int]]:
    """A fixed-shape target entry's (pass length -> entry point, kind -> graph slots), checked against `layout`:
    rings cannot shrink (their slot count is the graphs' modulus); full layers may use fewer slots than exported."""
    lengths = {int(t): name for t, name in entry.fixed["lengths"].items()}
    slots = {kind: int(n) for kind, n in entry.fixed["slots"].items()}
    state = layout.binding == kv.BINDING_STATE
    expected = state_slots(layout) if state else {c.kind: c.slots for c in layout.caches}
    for c in layout.caches:
        if c.window and expected[c.kind] != slots[c.kind]:
            raise ConfigError(f"this {what}'s rings hold {slots[c.kind]} slots; a layout of {c.slots} cannot run on "
                              "its fixed shapes", "load it with its exported --max-context")
    return lengths, slots


class FixedBackend:
    """edge_spec.contract.backend.Backend over fixed-length target graphs (this runtime owns the caches)."""

    def __init__(self, functions: dict[int, Predictor], layout: KVLayout, slots: dict[str, int], identity: str, *,
                 name: str, feature: Callable[[str], str] = lambda n: n, mask_floor: float = kv.NEG_INF,
                 fix: str = "re-export with --max-pass", placed: bool = False, sink: Predictor | None = None,
                 sink_tokens: frozenset[int] | None = None, aux_width: int = 0):
        self.functions, self.layout, self.slots = functions, layout, slots
        # an eagle3 bundle's target functions also return kv.AUX_HIDDEN [1, T, aux_width]; after each pass `aux_sink`
        # (set by the eagle3 drafter, edge_spec/contract/eagle3_rows.py) gets (ids [t], positions [t], aux rows [t, .])
        self.aux_width, self.aux_sink, self._aux = aux_width, None, None
        # position 0 through its own length-1 graph (QNN: float activations on the host), the rest of a first pass
        # through the quantized graphs with that row in its slot (`first_pass`). `sink_tokens`: the first tokens the
        # sink holds (a table of precomputed rows, runtimes/qnn.py); a pass from another runs through the graphs
        self.sink, self.sink_tokens = sink, sink_tokens
        self.first_token = min(sink_tokens) if sink_tokens else None  # what the host check starts its probe with
        self._told = False  # the notice of a first token the sink does not hold: once
        self.placed = placed  # the graphs take slot masks + slot indices (`slot_feeds`), not concat masks
        self.state = layout.binding == kv.BINDING_STATE  # the graphs hold the caches (slot masks + write slots)
        self.lengths = sorted(functions)
        self.identity = identity  # part of the host check's cache key
        self.name, self.feature, self.mask_floor, self.fix = name, feature, mask_floor, fix
        self.k = [] if self.state else \
            [np.zeros((1, c.num_kv_heads, slots[c.kind], c.head_dim), np.float32) for c in layout.caches]
        self.v = [np.zeros_like(k) for k in self.k]
        self._pending: list[np.ndarray] | None = None
        self.kernel_s = 0.0

    def length_for(self, t: int) -> int:
        fit = [n for n in self.lengths if n >= t]
        if not fit:
            raise ConfigError(f"one forward over {t} tokens exceeds this bundle's longest graph ({self.lengths[-1]} "
                              "tokens)", f"use a smaller --spec-k, or {self.fix}")
        return fit[0]

    def cache_feeds(self, indices) -> dict[str, np.ndarray]:
        feeds = {}
        if self.state:  # the program's own states
            return feeds
        for i in indices:
            layer = self.layout.caches[i].layer
            feeds[self.feature(kv.k_cache_name(layer))] = self.k[i]
            feeds[self.feature(kv.v_cache_name(layer))] = self.v[i]
        return feeds

    def feeds(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray]) -> dict:
        """The padded feeds of one pass ([1, t] ids and positions, the contract's masks) for the graph of length n."""
        t = input_ids.shape[1]
        n = self.length_for(t)
        pad = n - t
        ids = np.concatenate([input_ids[0], np.repeat(input_ids[0, -1:], pad)])[None].astype(np.int32)
        pos = np.concatenate([position_ids[0], position_ids[0, -1] + 1 + np.arange(pad)])[None].astype(np.int32)
        feeds = {self.feature(kv.INPUT_IDS): ids, self.feature(kv.POSITION_IDS): pos}
        for kind in self.layout.kinds():
            if self.state:
                s, s_f, ring = self.layout.slots(kind), self.slots[kind], kind == kv.SLIDING
                feeds[self.feature(kv.mask_name(kind))] = slot_feeds(masks[kind], position_ids[0], n, s, s_f, ring,
                                                                     self.mask_floor)[0]
                feeds[self.feature(write_slots_name(kind))] = write_slots(position_ids[0], n, s, s_f, ring)
            elif self.placed:
                mask, index = slot_feeds(masks[kind], position_ids[0], n, self.layout.slots(kind), self.slots[kind],
                                         kind == kv.SLIDING, self.mask_floor)
                feeds[self.feature(kv.mask_name(kind))] = mask
                feeds[self.feature(keep_name(kind))] = (mask == 0).astype(np.float32)
                feeds[self.feature(slot_index_name(kind))] = index
            else:
                feeds[self.feature(kv.mask_name(kind))] = pad_mask(masks[kind], t, n, self.layout.slots(kind),
                                                                   self.slots[kind], self.mask_floor)
        feeds.update(self.cache_feeds(range(len(self.layout.caches))))
        return feeds

    def run(self, function: Predictor, input_ids: np.ndarray, position_ids: np.ndarray,
            masks: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """One padded call: (logits [t, V], hidden [t, H], new rows per cache k, v, ... [1, H_kv, t, D])."""
        t = input_ids.shape[1]
        feeds = self.feeds(input_ids, position_ids, masks)
        start = time.perf_counter()
        out = function(feeds)
        self.kernel_s += time.perf_counter() - start
        if self.aux_width:
            self._aux = np.asarray(out[self.feature(kv.AUX_HIDDEN)], dtype=np.float32)[0, :t]  # [t, n * H]
        new = [] if self.state else [np.asarray(out[self.feature(name(c.layer))])[:, :, :t]
                                     for c in self.layout.caches for name in (kv.k_new_name, kv.v_new_name)]
        return (np.asarray(out[self.feature(kv.LOGITS)], dtype=np.float32)[0, :t],
                np.asarray(out[self.feature(kv.HIDDEN)], dtype=np.float32)[0, :t], new)

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        t = input_ids.shape[1]
        if self.sink is not None and n_cached == 0 and self.sink_takes(int(input_ids[0, 0])):
            logits, hidden, new = self.first_pass(input_ids, position_ids, masks)
        else:
            logits, hidden, new = self.run(self.functions[self.length_for(t)], input_ids, position_ids, masks)
        if self.aux_sink is not None:
            self.aux_sink(input_ids[0], position_ids[0], self._aux)
        if not self.state:
            self._pending = new
        rows = slice(t - 1, t) if last_only else slice(0, t)
        return StepOutput(logits[rows].copy(), hidden[rows].copy())

    def sink_takes(self, token: int) -> bool:
        """Whether the sink holds position 0 for `token`; if not, the pass runs through the graphs, with a notice
        (once per backend): position 0's row then goes through the quantized graphs, which were calibrated without it."""
        if self.sink_tokens is None or token in self.sink_tokens:
            return True
        if not self._told:
            self._told = True
            logging.getLogger(NOTICES).warning(
                f"notice: this bundle precomputes position 0 only for first tokens {sorted(self.sink_tokens)}; this "
                f"prompt starts with {token}, so its first row runs through the quantized graphs (answers may degrade; "
                "use --chat, or a bundle exported with --qnn-position0 graph)")
        return False

    def first_pass(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray]):
        """A pass from position 0 over an empty cache: row 0 through `sink`, then (t > 1) rows 1.. through the
        graphs, with row 0's keys and values in slot 0 (position 0's slot in full layers and rings) and its mask
        column moved there; the slot is emptied again afterwards (`commit` writes it)."""
        assert not self.state, "the state binding has no host sink"
        t = input_ids.shape[1]
        s = {kind: self.layout.slots(kind) for kind in self.layout.kinds()}
        # [1, 1, 1, s + 1]: row 0 sees its own new column
        first = {kind: np.concatenate([m[:, :, :1, :s[kind]], m[:, :, :1, s[kind]:s[kind] + 1]], axis=-1)
                 for kind, m in masks.items()}
        logits, hidden, new = self.run(self.sink, input_ids[:, :1], position_ids[:, :1], first)
        aux = self._aux  # [1, aux_width] (an eagle3 bundle's; None otherwise)
        if t == 1:
            return logits, hidden, new
        rest = {}
        for kind, m in masks.items():  # [1, 1, t - 1, s + t - 1]: new column 0 becomes cache slot 0
            cache = m[:, :, 1:, :s[kind]].copy()
            cache[..., 0] = m[:, :, 1:, s[kind]]
            rest[kind] = np.concatenate([cache, m[:, :, 1:, s[kind] + 1:]], axis=-1)
        for i in range(len(self.layout.caches)):
            self.k[i][:, :, :1], self.v[i][:, :, :1] = new[2 * i], new[2 * i + 1]
        try:
            more = self.run(self.functions[self.length_for(t - 1)], input_ids[:, 1:], position_ids[:, 1:], rest)
        finally:
            for i in range(len(self.layout.caches)):
                self.k[i][:, :, :1], self.v[i][:, :, :1] = 0.0, 0.0
        if self.aux_width:
            self._aux = np.concatenate([aux, self._aux])  # [t, aux_width]
        return (np.concatenate([logits, more[0]]), np.concatenate([hidden, more[1]]),
                [np.concatenate([a, b], axis=2) for a, b in zip(new, more[2])])

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        if self.state:  # the program wrote every row; KVState records which were accepted
            return
        assert self._pending is not None, "commit without a forward"
        for i, c in enumerate(self.layout.caches):
            rows, slots = plan[c.kind]
            self.k[i][:, :, slots] = self._pending[2 * i][:, :, rows]
            self.v[i][:, :, slots] = self._pending[2 * i + 1][:, :, rows]
        self._pending = None

    def reset(self) -> None:
        self._pending = None


class FixedDrafter:
    """edge_spec.contract.backend.DrafterBackend over a fixed-shape drafter step graph, fed the target backend's caches."""

    def __init__(self, predictor: Predictor, target: FixedBackend, sources: dict[str, int]):
        self.predictor, self.target = predictor, target
        self.sources = kv.source_caches(target.layout, sources)
        self.kernel_s = 0.0
        self._feeds = None

    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        name, floor = self.target.feature, self.target.mask_floor
        feeds = {name(kv.POSITION_IDS): np.array([[position]], dtype=np.int32)}
        for kind in self.sources:  # [1, 1, 1, S] -> [1, 1, 1, S_f], the headroom masked
            s, s_f = self.target.layout.slots(kind), self.target.slots[kind]
            mask = np.full((1, 1, 1, s_f), floor, dtype=np.float32)
            mask[..., :s] = np.maximum(masks[kind][..., :s], floor)
            feeds[name(kv.mask_name(kind))] = mask
        self._feeds = feeds

    def feeds(self, token: int, hidden: np.ndarray) -> dict[str, np.ndarray]:
        name = self.target.feature
        feeds = dict(self._feeds)
        feeds[name(kv.INPUT_IDS)] = np.array([[token]], dtype=np.int32)
        feeds[name(kv.HIDDEN)] = hidden.reshape(1, 1, -1).astype(np.float32)
        feeds.update(self.target.cache_feeds(self.sources.values()))  # the committed caches, read in place
        return feeds

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        name = self.target.feature
        feeds = self.feeds(token, hidden)
        start = time.perf_counter()
        out = self.predictor(feeds)
        self.kernel_s += time.perf_counter() - start
        return DraftStep(np.asarray(out[name(kv.DRAFT_TOKEN_IDS)]).astype(np.int64),
                         np.asarray(out[name(kv.DRAFT_LOGITS)], dtype=np.float32),
                         np.asarray(out[name(kv.DRAFT_HIDDEN)], dtype=np.float32)[0, 0].copy())
