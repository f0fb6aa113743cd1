"""Shared test vectors for the KV contract's bookkeeping: edge_spec/contract/kv.py (Python) writes them, the C++ runner's
kv_vectors_test replays them (runtimes/native/src/kv.cpp), so both languages are checked against the same cases.

    .venv/bin/python runtimes/native/tests/make_kv_vectors.py runtimes/native/tests/vectors/kv_cases.json

Each case is a KV layout (io and state bindings, full layers, sliding rings - one of them too small on purpose) and
a seeded sequence of the operations a session performs: masks(n) before a forward, written(n) after a `state`
forward, commit(n), drafter_masks(), rewind(pos), reset(). After every operation the state (length, slot positions,
retained_from) is recorded; masks are rows of '0' (visible) and '-' (masked); refusals record str(error) exactly
(what + fix), so the C++ wording is checked too. tests/test_native.py checks that this file is what edge_spec/contract/kv.py
computes today and that the C++ replay passes.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.kv_state import KVState
from edge_spec.errors import EdgeSpecError

VERSION = 1


def _layouts() -> dict[str, kv.KVLayout]:
    def cache(layer, kind, slots, window=None):
        return kv.CacheSpec(layer, kind, 2, 4, slots, window)

    io_ring = kv.ring_slots(4, 20, 3, kv.BINDING_IO)
    state_ring = kv.ring_slots(3, 24, 4, kv.BINDING_STATE)
    return {
        "full-io": kv.KVLayout((cache(0, kv.FULL, 12), cache(1, kv.FULL, 12)), 12),
        "ring-io": kv.KVLayout((cache(0, kv.SLIDING, io_ring, 4), cache(1, kv.FULL, 20)), 20, 3, kv.BINDING_IO),
        "ring-state": kv.KVLayout((cache(0, kv.SLIDING, state_ring, 3), cache(1, kv.FULL, 24),
                                   cache(2, kv.SLIDING, state_ring, 3)), 24, 4, kv.BINDING_STATE),
        "small-ring-state": kv.KVLayout((cache(0, kv.SLIDING, 4, 3), cache(1, kv.FULL, 24)), 24, 4, kv.BINDING_STATE),
    }


def _mask_rows(mask: np.ndarray) -> list[str]:
    rows = mask.reshape(mask.shape[-2], mask.shape[-1])
    return ["".join("0" if v == 0 else "-" for v in row) for row in rows]


def _snapshot(state: kv.KVState) -> dict:
    return {"length": state.length, "slot_pos": {k: v.tolist() for k, v in state.slot_pos.items()},
            "retained_from": dict(state.retained_from)}


def _case(name: str, layout: kv.KVLayout, seed: int, steps: int = 45) -> dict:
    rng = np.random.default_rng(seed)
    state = KVState(layout)
    cap = layout.max_pass or 6
    ops = []
    pending = 0  # rows of the last forward not yet committed (commit takes at most these)

    def record(op: dict, call) -> None:
        try:
            result = call()
        except EdgeSpecError as err:
            op["error"] = str(err)
        else:
            if isinstance(result, dict):
                op["masks"] = {kind: _mask_rows(m) for kind, m in sorted(result.items())}
        op["state"] = _snapshot(state)
        ops.append(op)

    for _ in range(steps):
        roll = rng.random()
        if state.length > 0.75 * layout.max_context and rng.random() < 0.6:  # room again, mostly
            roll = 0.81 if rng.random() < 0.3 else 0.7
        if roll < 0.45:  # a forward: masks, then (state binding) the rows written, then a commit of a prefix
            n = int(rng.integers(1, cap + 2))  # sometimes one past the cap: refused
            ok = []
            record({"op": "masks", "n": n}, lambda: ok.append(state.masks(n)) or ok[0])
            if ok and layout.binding == kv.BINDING_STATE:
                record({"op": "written", "n": n}, lambda: state.written(n))
            pending = n if ok else 0
            if pending:
                m = int(rng.integers(1, pending + 1))
                record({"op": "commit", "n": m}, lambda: state.advance(m, state.plan_commit(m)))
                pending = 0
        elif roll < 0.6:
            record({"op": "drafter_masks"}, state.drafter_masks)
        elif roll < 0.8:
            low = 0 if state.length > 0.75 * layout.max_context else max(0, state.length - 6)
            pos = int(rng.integers(low, state.length + 2))  # sometimes past the end: refused
            record({"op": "rewind", "pos": pos}, lambda: state.rewind(pos))
        elif roll < 0.83:
            record({"op": "reset"}, state.reset)
        else:  # a long commit straight away (prefill-like), may overflow the context
            n = int(rng.integers(1, 8))
            record({"op": "commit", "n": n}, lambda: state.advance(n, state.plan_commit(n)))
    return {"name": name, "seed": seed, "layout": layout.to_json(), "ops": ops}


def vectors() -> dict:
    cases = []
    for i, (name, layout) in enumerate(_layouts().items()):
        for seed in (0, 1, 2):
            cases.append(_case(name, layout, 100 * i + seed))
    pure = {"bucket_slots": [[need, slots, bucket, kv.bucket_slots(need, slots, bucket)]
                             for need in (0, 1, 63, 64, 65, 130) for slots in (64, 100, 256) for bucket in (32, 64)],
            "ring_slots": [[w, ctx, mp, b, kv.ring_slots(w, ctx, mp, b)]
                           for w in (4, 512) for ctx in (16, 2048) for mp in (2, 9, 64)
                           for b in (kv.BINDING_IO, kv.BINDING_STATE)],
            "commit_slots": [[start, n, slots, ring, *(x.tolist() for x in kv.commit_slots(start, n, slots, ring))]
                             for start in (0, 5, 13) for n in (1, 4, 9) for slots in (6, 32) for ring in (False, True)
                             if ring or start + n <= slots]}
    return {"version": VERSION, "written_by": "runtimes/native/tests/make_kv_vectors.py (edge_spec/contract/kv.py)",
            "cases": cases, "pure": pure}


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
