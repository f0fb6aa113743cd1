"""Plain greedy decode through the Python runtime beside onnxruntime-genai's Python API, interleaved in one process:
each round decodes every prompt through each bundle, then through genai, so a machine whose speed drifts between runs
(a shared VM) moves both sides alike. Prints each round's decode tok/s (tokens after the first / time after the first)
and the median ratio to genai.

    .venv/bin/python scripts/python_plain_vs_genai.py bundles/smollm2-int4-shared [B2 ...] \
        [--genai ~/.cache/edge-spec/peers/genai-0.18.0-smollm2-135m-instruct-int4] [--rounds 5] [--max-new-tokens 64]

Both sides spin their idle threads as each does by default (one process, run one after the other). Speculation is off:
this compares plain steps. `edge-spec bench` gives the same comparison with every speculative configuration, one run.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from edge_spec.api import load_bundle
from edge_spec.peers.genai import OrtGenaiPeer
from edge_spec.train.evaluate import read_prompts

GENAI = Path.home() / ".cache/edge-spec/peers/genai-0.18.0-smollm2-135m-instruct-int4"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--genai", default=str(GENAI), help="onnxruntime-genai's model folder of the same checkpoint")
    ap.add_argument("--prompts", default="edge_spec/assets/prompts/demo.jsonl")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    engines = {b: load_bundle(b, threads=args.threads) for b in args.bundles}
    genai = OrtGenaiPeer(Path(args.genai), threads=args.threads, precision="int4")
    first = next(iter(engines.values()))
    ids = [first.tokenizer.encode_prompt(p["prompt"], chat=p["chat"]) for p in read_prompts(args.prompts)]
    genai.warm_up(ids[0])
    for e in engines.values():
        e.generate(ids[0], max_new_tokens=8, speculative=False)
    speeds: dict[str, list[float]] = {name: [] for name in [*engines, "genai"]}
    for rnd in range(args.rounds):
        for name, engine in engines.items():
            runs = [engine.generate(i, max_new_tokens=args.max_new_tokens, speculative=False) for i in ids]
            speeds[name].append(statistics.mean(r.decode_tok_s for r in runs))
        runs = [genai._generate(i, args.max_new_tokens) for i in ids]
        speeds["genai"].append(statistics.mean((len(out) - 1) / (end - t_first) for out, _, t_first, end in runs))
        print(f"round {rnd}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in speeds.items()), flush=True)
    for name, v in speeds.items():
        ratios = [a / g for a, g in zip(v, speeds["genai"])]
        print(f"{name}: median {statistics.median(v):.1f} tok/s, {statistics.median(ratios):.3f}x genai "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
