"""The three factors of speculative speed, per bench run, from `edge-spec bench --json` files: a Markdown table.

    .venv/bin/python scripts/three_factors.py docs/bench/smollm2-int8-amd.json docs/bench/smollm2-int8-lookup-amd.json

speculative tok/s = plain tok/s x tau / (verify cost(T) + drafting cost), all per plain step. From each row of a run
(no new measurement):
  * plain step: 1000 / plain tok/s (ms per token, the whole loop), and the target kernel's share of it;
  * verify cost at T = k + 1: the target kernel time per speculative pass (spec decode time x its target share /
    passes, passes = tokens / tau) over the target kernel time of one plain step (`target_step_ms`);
  * drafting cost: drafter kernel time per pass over the plain target step (k drafter steps, or none when retrieval
    drafted);
  * tau: tokens per target pass.
The rows of one file come from one run (interleaved), so its ratios are within-run; across files the machine's speed
may drift (compare the ratios, not the ms).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def factors(row: dict) -> dict:
    """One bench row's factors (see the module doc)."""
    spec_s = row["tokens"]["spec"] / row["spec_tok_s"]
    passes = row["tokens"]["spec"] / row["tau"]
    split = row["time_split"]["spec"]
    step = row["target_step_ms"]
    return {"plain_ms": 1000 / row["plain_tok_s"], "verify": 1000 * spec_s * split["target"] / passes / step,
            "drafting": 1000 * spec_s * split["drafter"] / passes / step, "tau": row["tau"],
            "speedup": row["spec_tok_s"] / row["plain_tok_s"]}


def table(paths: list[Path]) -> str:
    lines = ["| run | precision | k | plain ms / token | verify pass / plain step | drafting / plain step | tau | "
             "spec / plain |", "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for row in json.loads(path.read_text()):
            if "peer" in row or row.get("temperature") != 0 or not row.get("tau"):
                continue
            f = factors(row)
            k = row["k"] if isinstance(row["k"], int) else f"adaptive (mean {row.get('mean_k', 0):.1f})"
            lines.append(f"| {path.stem} | {row['precision']} | {k} | {f['plain_ms']:.1f} | {f['verify']:.2f} | "
                         f"{f['drafting']:.2f} | {f['tau']:.2f} | {f['speedup']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="edge-spec bench --json files")
    print(table(parser.parse_args().json))


if __name__ == "__main__":
    main()
