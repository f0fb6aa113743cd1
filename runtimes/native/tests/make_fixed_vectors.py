"""Shared test vectors for the fixed-shape runtime half: runtimes/fixed.py (Python) writes them, the C++ runner's
fixed_vectors_test replays them against runtimes/native/src/fixed.cpp and tensor.cpp, so the padding and commit
bookkeeping the Core ML backend (coreml_backend.mm, which cannot be compiled on Linux) stands on is checked here.

    .venv/bin/python runtimes/native/tests/make_fixed_vectors.py runtimes/native/tests/vectors/fixed_cases.json

Each case is a fixed-shape bundle's layout (`io` with full layers; `io` with a sliding ring; `state` with rings),
its exported pass lengths and slots (runtimes/fixed.py pass_lengths, function_slots / state_slots), and a seeded
sequence of what a session does: a forward of t tokens through `FixedBackend` (its predictors are fakes that
record the feeds - the chosen length, padded ids and positions, each mask ('0' visible, '-' masked), `state`'s
write slots - and return new K / V rows that encode (position, layer, head, dim)), a commit of a prefix (the
caches' slot contents after it, `io`), a drafter step through `FixedDrafter` (its masks), rewinds and resets.
Pure cases: `length_for` (refusal text included), `fixed_shapes`' ring refusal, `state_slots`, the placed form's
slot index, and float -> float16 conversions as numpy rounds them. tests/test_native_coreml.py checks that this
file is what runtimes/fixed.py computes today and that the C++ replay passes.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.kv_state import KVState
from edge_spec.errors import EdgeSpecError
from edge_spec.runtimes import fixed

VERSION = 1
VOCAB, HIDDEN, CANDIDATES = 11, 6, 3
FIX = "re-export with --max-pass"  # runtimes/coreml.py's FixedBackend fix


def _layouts() -> dict[str, tuple[kv.KVLayout, int]]:
    def cache(layer, kind, slots, window=None):
        return kv.CacheSpec(layer, kind, 2, 4, slots, window)

    io_ring = kv.ring_slots(4, 24, 6, kv.BINDING_IO)
    state_ring = kv.ring_slots(3, 20, 6, kv.BINDING_STATE)
    return {  # name -> (layout, max_draft_len)
        "full-io": (kv.KVLayout((cache(0, kv.FULL, 16), cache(1, kv.FULL, 16)), 16, 6, kv.BINDING_IO), 4),
        "ring-io": (kv.KVLayout((cache(0, kv.SLIDING, io_ring, 4), cache(1, kv.FULL, 24)), 24, 6, kv.BINDING_IO), 4),
        "ring-state": (kv.KVLayout((cache(0, kv.SLIDING, state_ring, 3), cache(1, kv.FULL, 20),
                                    cache(2, kv.SLIDING, state_ring, 3)), 20, 6, kv.BINDING_STATE), 2),
    }


def fake_k(positions: np.ndarray, layer: int, heads: int, dim: int) -> np.ndarray:
    """[1, H, n, D] new K rows that say where they came from (exact in float32); V is -K - 0.5."""
    p = positions.astype(np.int64)[None, None, :, None]
    h = np.arange(heads)[None, :, None, None]
    d = np.arange(dim)[None, None, None, :]
    return (((p + 1) * 8 + layer) * 16 + h * 4 + d).astype(np.float32)


def _mask_rows(mask: np.ndarray) -> list[str]:
    rows = mask.reshape(-1, mask.shape[-1])
    return ["".join("0" if v == 0 else "-" if v == kv.NEG_INF else "?" for v in row) for row in rows]


def _target(n: int, layout: kv.KVLayout, seen: list):
    def predict(feeds: dict) -> dict:
        seen.append({"n": n, "feeds": {k: np.array(v) for k, v in feeds.items()}})
        out = {kv.feature_name(kv.LOGITS): np.zeros((1, n, VOCAB), np.float32),
               kv.feature_name(kv.HIDDEN): np.zeros((1, n, HIDDEN), np.float32)}
        if layout.binding == kv.BINDING_IO:
            pos = feeds[kv.feature_name(kv.POSITION_IDS)][0]
            for c in layout.caches:
                k = fake_k(pos, c.layer, c.num_kv_heads, c.head_dim)
                out[kv.feature_name(kv.k_new_name(c.layer))] = k
                out[kv.feature_name(kv.v_new_name(c.layer))] = -k - 0.5
        return out
    return predict


def _drafter(seen: list):
    def predict(feeds: dict) -> dict:
        seen.append({k: np.array(v) for k, v in feeds.items()})
        return {kv.feature_name(kv.DRAFT_TOKEN_IDS): np.arange(CANDIDATES, dtype=np.int32),
                kv.feature_name(kv.DRAFT_LOGITS): np.zeros(CANDIDATES, np.float32),
                kv.feature_name(kv.DRAFT_HIDDEN): np.zeros((1, 1, HIDDEN), np.float32)}
    return predict


def _forward_record(call: dict, layout: kv.KVLayout, lengths: dict[int, str]) -> dict:
    feeds, name = call["feeds"], kv.feature_name
    rec = {"n": call["n"], "function": lengths[call["n"]], "padded_ids": feeds[name(kv.INPUT_IDS)][0].tolist(),
           "positions": feeds[name(kv.POSITION_IDS)][0].tolist(),
           "masks": {kind: _mask_rows(feeds[name(kv.mask_name(kind))]) for kind in layout.kinds()}}
    if layout.binding == kv.BINDING_STATE:
        rec["write_slots"] = {kind: feeds[name(fixed.write_slots_name(kind))].tolist() for kind in layout.kinds()}
    return rec


def _caches(backend: fixed.FixedBackend) -> list[list[list[float]]]:
    """Per cache: K[0, h, slot, 0] for every head and slot (the row each slot holds)."""
    return [k[0, :, :, 0].tolist() for k in backend.k]


def _case(name: str, layout: kv.KVLayout, max_draft_len: int, seed: int, steps: int = 40) -> dict:
    rng = np.random.default_rng(seed)
    lengths_t = fixed.pass_lengths(max_draft_len, layout.max_pass)
    lengths = {t: f"target_{t}" for t in lengths_t}
    state_binding = layout.binding == kv.BINDING_STATE
    slots = fixed.state_slots(layout) if state_binding else fixed.function_slots(layout, lengths_t)
    seen, drafted = [], []
    functions = {t: _target(t, layout, seen) for t in lengths_t}
    backend = fixed.FixedBackend(functions, layout, slots, "vectors", name="coreml", feature=kv.feature_name, fix=FIX)
    sources = {kv.FULL: layout.caches[-1].layer} if not state_binding else {kv.SLIDING: 0}
    drafter = fixed.FixedDrafter(_drafter(drafted), backend, sources)
    state = KVState(layout)
    ops = []
    for _ in range(steps):
        roll = rng.random()
        if state.length > 0.7 * layout.max_context and rng.random() < 0.5:
            roll = 0.75 if rng.random() < 0.7 else 0.95
        room = layout.max_context - state.length
        if roll < 0.55 and room > 0:  # a forward (padded to an exported length), then a commit of a prefix
            t = int(rng.integers(1, min(layout.max_pass, room) + 1))
            ids = rng.integers(0, VOCAB, t)
            masks = state.masks(t)
            positions = np.arange(state.length, state.length + t)
            backend.forward(ids[None], positions[None], masks, state.length, bool(rng.random() < 0.5))
            if state_binding:
                state.written(t)
            op = {"op": "forward", "ids": ids.tolist()} | _forward_record(seen[-1], layout, lengths)
            ops.append(op)
            m = int(rng.integers(1, t + 1))
            plan = state.plan_commit(m)
            backend.commit(plan)
            state.advance(m, plan)
            ops.append({"op": "commit", "n": m} | ({} if state_binding else {"caches": _caches(backend)}))
        elif roll < 0.7 and state.length > 0:  # a drafter step at the bonus token's position
            masks = state.drafter_masks()
            drafter.begin(state.length, masks, state.length)
            token = int(rng.integers(0, VOCAB))
            drafter.step(token, np.zeros(HIDDEN, np.float32))
            feeds = drafted[-1]
            ops.append({"op": "draft", "position": state.length, "token": token,
                        "input_ids": feeds[kv.feature_name(kv.INPUT_IDS)].reshape(-1).tolist(),
                        "position_ids": feeds[kv.feature_name(kv.POSITION_IDS)].reshape(-1).tolist(),
                        "masks": {kind: _mask_rows(feeds[kv.feature_name(kv.mask_name(kind))])
                                  for kind in sorted(sources)}})
        elif roll < 0.9 and state.length > 0:
            window = min((c.window for c in layout.caches if c.window), default=layout.max_context)
            pos = int(rng.integers(max(0, state.length - window + 2), state.length + 1))
            try:
                state.rewind(pos)
            except EdgeSpecError:
                continue
            backend.reset()
            ops.append({"op": "rewind", "pos": pos})
        else:
            state.reset()
            backend.reset()
            ops.append({"op": "reset"})
    final = {} if state_binding else {"k": [k.reshape(-1).tolist() for k in backend.k],
                                       "v": [v.reshape(-1).tolist() for v in backend.v]}
    return {"name": name, "seed": seed, "layout": layout.to_json(), "max_draft_len": max_draft_len,
            "fixed": {"lengths": {str(t): f for t, f in lengths.items()}, "slots": slots}
            | ({"inputs": [], "states": []} if state_binding else {}),
            "drafter_sources": sources, "ops": ops, "final": final}


def _pure() -> dict:
    layouts = _layouts()
    out = {"length_for": [], "state_slots": [], "fixed_shapes": [], "slot_feeds": [], "half": []}
    backend = fixed.FixedBackend({t: None for t in (1, 2, 3, 5, 9)}, layouts["full-io"][0],
                                 {kv.FULL: 24}, "vectors", name="coreml", fix=FIX)
    for t in (1, 2, 3, 4, 5, 6, 8, 9, 10, 64):
        try:
            out["length_for"].append([[1, 2, 3, 5, 9], t, backend.length_for(t), ""])
        except EdgeSpecError as err:
            out["length_for"].append([[1, 2, 3, 5, 9], t, 0, str(err)])
    for layout, _ in layouts.values():
        out["state_slots"].append([layout.to_json(), fixed.state_slots(layout)])
    layout = layouts["ring-io"][0]
    for ring_slots in (layout.slots(kv.SLIDING), layout.slots(kv.SLIDING) + 1):
        entry = SimpleNamespace(fixed={"lengths": {"1": "target_1"},
                                       "slots": {kv.SLIDING: ring_slots, kv.FULL: 30}})
        try:
            fixed.fixed_shapes(entry, layout, "Core ML package")
            out["fixed_shapes"].append([layout.to_json(), entry.fixed, ""])
        except EdgeSpecError as err:
            out["fixed_shapes"].append([layout.to_json(), entry.fixed, str(err)])
    rng = np.random.default_rng(5)
    for start, t, n, s, s_f, ring in ((0, 3, 5, 8, 9, False), (6, 4, 4, 7, 7, True), (5, 2, 3, 7, 32, True)):
        mask = np.where(rng.random((1, 1, t, s + t)) < 0.5, 0.0, kv.NEG_INF).astype(np.float32)
        positions = np.arange(start, start + t)
        m, index = fixed.slot_feeds(mask, positions, n, s, s_f, ring, kv.NEG_INF)
        out["slot_feeds"].append({"mask": _mask_rows(mask), "positions": positions.tolist(), "n": n, "s": s,
                                  "s_f": s_f, "ring": ring, "out": _mask_rows(m), "index": index.tolist()})
    values = [0.0, -0.0, 1.0, -2.0, 0.5, 65504.0, 65519.99, 65520.0, 1e5, -1e30, 6.1035156e-05, 6.0e-05,
              5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-9, 1.0009765625, 1.00048828125, 1.00146484375,
              3.14159265, float("inf"), float("-inf")]
    values += rng.standard_normal(40).astype(np.float32).tolist()
    values += (rng.standard_normal(20) * 1e-5).astype(np.float32).tolist()
    values += (rng.standard_normal(20) * 3e4).astype(np.float32).tolist()
    for v in values:
        f = np.float32(v)
        out["half"].append([int(f.view(np.uint32)), int(f.astype(np.float16).view(np.uint16))])
    return out


def vectors() -> dict:
    cases = []
    with np.errstate(over="ignore"):
        for i, (name, (layout, max_draft_len)) in enumerate(_layouts().items()):
            for seed in (0, 1):
                cases.append(_case(name, layout, max_draft_len, 100 * i + seed))
        pure = _pure()
    return {"version": VERSION, "written_by": "runtimes/native/tests/make_fixed_vectors.py (runtimes/fixed.py)",
            "vocab": VOCAB, "hidden": HIDDEN, "candidates": CANDIDATES, "cases": cases, "pure": pure}


def main(argv: list[str]) -> int:
    text = json.dumps(vectors(), separators=(",", ":")) + "\n"
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
