"""Plain / speculative decode speed and the cost of one verify pass by T, for bundles (and row modes) interleaved in
one process, so the ratios come from one run.

    .venv/bin/python scripts/verify_cost.py bundles/smollm2-int4 bundles/smollm2-int8 --rows 1 2 --threads 2

Each bundle runs in each requested row mode (`Session.min_rows`: 1 = one-token passes as they are, 2 = with a
masked dummy row, the mode the host check picks where one-row kernels differ). Per (bundle, mode): median plain
tok/s and speculative tok/s (k = --spec-k) over --rounds x the first --prompts bench prompts, greedy exactness of
speculative vs plain *in that mode*, and the median time of one `session.forward` over T tokens after a 150-token
context, as a ratio to T = 1. Used for docs/benchmarks.md ("Exactness on every CPU", "verify pass cost by T").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import DEFAULT_PROMPTS, machine
from edge_spec.train.evaluate import read_prompts


def measure(configs: list[tuple[str, object, int]], prompts: list[dict], *, spec_k: int, rounds: int,
            max_new_tokens: int, ts: list[int]) -> list[dict]:
    """configs: (label, engine, min_rows), measured round-robin. Returns one row per config."""
    res = [{"plain": [], "spec": [], "exact": 0, "runs": 0, "verify_ms": {t: [] for t in ts}} for _ in configs]
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 40000, 150 + max(ts))]
    for _ in range(rounds):
        for (label, engine, rows), r in zip(configs, res):
            engine.session.min_rows = rows
            for p in prompts:
                plain = engine.generate(p["prompt"], chat=p["chat"], max_new_tokens=max_new_tokens, speculative=False)
                spec = engine.generate(p["prompt"], chat=p["chat"], max_new_tokens=max_new_tokens, spec_k=spec_k,
                                       allow_inexact=True)
                r["plain"].append(plain.decode_tok_s)
                r["spec"].append(spec.decode_tok_s)
                r["exact"] += plain.tokens == spec.tokens
                r["runs"] += 1
            s = engine.session
            s.reset()
            s.prefill(ids[:150])
            for t in ts:
                for _ in range(2):
                    s.forward(ids[150:150 + t])
                begin = time.perf_counter()
                for _ in range(6):
                    s.forward(ids[150:150 + t])
                r["verify_ms"][t].append((time.perf_counter() - begin) / 6 * 1e3)
            s.reset()
    out = []
    for (label, _, rows), r in zip(configs, res):
        base = float(np.median(r["verify_ms"][ts[0]]))
        out.append({"config": label, "min_rows": rows, "plain_tok_s": float(np.median(r["plain"])),
                    "spec_tok_s": float(np.median(r["spec"])), "greedy_exact": f"{r['exact']}/{r['runs']}",
                    "t1_ms": base, "ratios": {t: float(np.median(v)) / base for t, v in r["verify_ms"].items()}})
    return out


def table(rows: list[dict], ts: list[int]) -> str:
    lines = ["| config | rows | plain tok/s | spec tok/s | greedy exact | T=1 ms | " +
             " | ".join(f"T={t}" for t in ts[1:]) + " |", "|---" * (6 + len(ts) - 1) + "|"]
    for row in rows:
        lines.append(f"| {row['config']} | {row['min_rows']} | {row['plain_tok_s']:.1f} | {row['spec_tok_s']:.1f} | "
                     f"{row['greedy_exact']} | {row['t1_ms']:.2f} | " +
                     " | ".join(f"{row['ratios'][t]:.2f}" for t in ts[1:]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2], help="row modes to measure (default 1 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec-k", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--t", type=int, nargs="+", default=[1, 2, 3, 5, 9])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    engines = {b: load_bundle(b, threads=args.threads, host_check=False) for b in args.bundles}
    configs = [(Path(b).name, engines[b], rows) for b in args.bundles for rows in args.rows]
    rows = measure(configs, read_prompts(DEFAULT_PROMPTS)[:args.prompts], spec_k=args.spec_k, rounds=args.rounds,
                   max_new_tokens=args.max_new_tokens, ts=args.t)
    print(f"{machine()}, {args.threads} threads, {args.rounds} rounds x {args.prompts} prompts x "
          f"{args.max_new_tokens} tokens, spec k={args.spec_k}")
    print(table(rows, args.t))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
