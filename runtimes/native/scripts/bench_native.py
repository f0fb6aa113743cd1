"""Time the native runner's loop beside the Python runtime's on the same bundle and prompts, in one run.

    .venv/bin/python runtimes/native/scripts/bench_native.py --bundle B [--num-prompts 3] [--spec-k 1 2 4]
        [--max-new-tokens 64] [--threads 2] [--native build/native/edge-spec-run]

Each prompt of edge_spec/assets/prompts/bench.jsonl is encoded once (the Python tokenizer, chat template), then
decoded greedily by both loops back to back, plain and at each fixed k (prompt lookup on, as `edge-spec generate`):
the Python Engine in this process, `edge-spec-run --prompt-ids ... --json` as a subprocess (its own timer, so the
process start and the bundle's open are not counted; both runtimes open the bundle once per run here). Prints decode
tok/s (tokens after the first / decode seconds) per configuration, the mean over prompts, whether the tokens matched,
and the CPU. Run-to-run noise on a shared 2-core machine is +-15-20%: compare within one run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    from edge_spec.api import load_bundle
    from edge_spec.decoding.hostcheck import cpu_identity

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--spec-k", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--native", default=str(ROOT / "build" / "native" / "edge-spec-run"))
    args = p.parse_args(argv)
    prompts = [json.loads(line) for line in (ROOT / "edge_spec/assets/prompts/bench.jsonl").read_text().splitlines()
               if line.strip()][:args.num_prompts]
    engine = load_bundle(args.bundle, threads=args.threads)
    configs = [("plain", None)] + [(f"k={k}", k) for k in args.spec_k]
    rows = {name: {"python": [], "native": [], "same": True, "tau_py": [], "tau_native": []} for name, _ in configs}
    for item in prompts:
        ids = engine.encode(item["prompt"], chat=item.get("chat", False))
        for name, k in configs:
            py = engine.generate(ids, max_new_tokens=args.max_new_tokens, speculative=k is not None,
                                 spec_k=k or 4, adaptive=False)
            flags = ["--no-spec"] if k is None else ["--spec-k", str(k), "--fixed-k"]
            done = subprocess.run([args.native, "--bundle", args.bundle, "--threads", str(args.threads), "--json",
                                   "--max-new-tokens", str(args.max_new_tokens), "--prompt-ids",
                                   ",".join(map(str, ids)), *flags], capture_output=True, text=True)
            if done.returncode:
                sys.stderr.write(done.stderr)
                return done.returncode
            nat = json.loads(done.stdout)
            row = rows[name]
            row["python"].append(py.decode_tok_s)
            row["native"].append(nat["decode_tok_s"])
            row["same"] &= nat["tokens"] == py.tokens
            row["tau_py"].append(py.extra["spec"].tau if "spec" in py.extra else 1.0)
            row["tau_native"].append(nat["tau"])
    print(f"bundle {args.bundle} | {len(prompts)} prompts x {args.max_new_tokens} new tokens | {args.threads} threads | "
          f"cpu {cpu_identity()}")
    print(f"{'config':8} {'python tok/s':>13} {'native tok/s':>13} {'native/python':>14} {'tau py':>7} "
          f"{'tau native':>10}  tokens")
    for name, _ in configs:
        r = rows[name]
        py, nat = statistics.mean(r["python"]), statistics.mean(r["native"])
        print(f"{name:8} {py:13.1f} {nat:13.1f} {nat / py if py else float('nan'):14.2f} "
              f"{statistics.mean(r['tau_py']):7.2f} {statistics.mean(r['tau_native']):10.2f}  "
              f"{'identical' if r['same'] else 'DIFFER'}")
    return 0 if all(r["same"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
