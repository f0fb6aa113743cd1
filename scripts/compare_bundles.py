"""Are two ONNX bundles of one model the same program? (e.g. exported before and after a refactor of the exporter)

    python scripts/compare_bundles.py A B [--prompts P.jsonl] [--num-prompts 3] [--max-new-tokens 64] [--rounds 3]

For each graph (target, drafter): the op-type histogram and the weights (sha256 of every initializer's bytes,
names ignored) of A and B. Then both bundles generate greedily on the same prompts, plain and speculative, in one
process with the runs interleaved (A, B, A, B, ...): the tokens must be identical and the decode speed is reported
per bundle (median over rounds). Prints one JSON object; exit 1 when the graphs or tokens differ.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import statistics
import sys
from pathlib import Path

import onnx
from onnx import numpy_helper

from edge_spec.api import load_bundle
from edge_spec.train.evaluate import read_prompts

BENCH_PROMPTS = Path(__file__).resolve().parents[1] / "edge_spec" / "assets" / "prompts" / "bench.jsonl"


def graph_facts(path: Path) -> dict:
    proto = onnx.load(str(path), load_external_data=True)
    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node)
    weights = sorted(hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()[:16]
                     for t in proto.graph.initializer)
    return {"nodes": len(proto.graph.node), "ops": dict(sorted(ops.items())), "weights": weights}


def compare_graphs(a: Path, b: Path) -> dict:
    out = {}
    for name in ("target.onnx", "drafter.onnx"):
        fa, fb = a / "onnx" / name, b / "onnx" / name
        if not fa.exists() and not fb.exists():
            continue
        ga, gb = graph_facts(fa), graph_facts(fb)
        ops_diff = {op: (ga["ops"].get(op, 0), gb["ops"].get(op, 0))
                    for op in set(ga["ops"]) | set(gb["ops"]) if ga["ops"].get(op) != gb["ops"].get(op)}
        out[name] = {"nodes": (ga["nodes"], gb["nodes"]), "ops_differ": ops_diff,
                     "same_weights": ga["weights"] == gb["weights"], "initializers": (len(ga["weights"]), len(gb["weights"]))}
    return out


def decode(engine, prompt: dict, max_new_tokens: int, speculative: bool):
    result = engine.generate(prompt["prompt"], chat=prompt.get("chat", False), max_new_tokens=max_new_tokens,
                             speculative=speculative)
    return list(result.tokens), result.decode_tok_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    report = {"graphs": compare_graphs(args.a, args.b)}
    engines = {"A": load_bundle(args.a), "B": load_bundle(args.b)}
    prompts = read_prompts(Path(args.prompts) if args.prompts else BENCH_PROMPTS)[:args.num_prompts]
    speed = {(k, mode): [] for k in engines for mode in ("plain", "speculative")}
    same_tokens = True
    for _ in range(args.rounds):
        for prompt in prompts:
            for mode in ("plain", "speculative"):
                tokens = {}
                for k, engine in engines.items():  # A then B on the same prompt: interleaved
                    tokens[k], tok_s = decode(engine, prompt, args.max_new_tokens, mode == "speculative")
                    speed[(k, mode)].append(tok_s)
                same_tokens &= tokens["A"] == tokens["B"]
    report["same_tokens"] = same_tokens
    report["decode_tok_s_median"] = {f"{k} {mode}": round(statistics.median(v), 1) for (k, mode), v in speed.items()}
    print(json.dumps(report, indent=1))
    graphs_same = all(not g["ops_differ"] and g["same_weights"] for g in report["graphs"].values())
    return 0 if graphs_same and same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
