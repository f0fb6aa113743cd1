"""Top-1 agreement of quantized bundles with an fp32 bundle (README, docs/architecture.md "Quantization"): over the
bench prompts and the fp32 bundle's greedy continuation of each, teacher-forced (every bundle reads the same token
sequence), the share of positions whose argmax equals fp32's (the continuation's positions; `--all-positions`: the
prompt's too), and the max |logit diff|.

    .venv/bin/python scripts/quant_agreement.py bundles/smollm2-fp32 bundles/smollm2-int8 bundles/smollm2-int4
"""

from __future__ import annotations

import argparse

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import DEFAULT_PROMPTS
from edge_spec.train.evaluate import read_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference")
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--all-positions", action="store_true", help="also score the prompt's positions")
    args = ap.parse_args()
    ref = load_bundle(args.reference, threads=args.threads, host_check=False)
    others = {b: load_bundle(b, threads=args.threads, host_check=False) for b in args.bundles}
    agree = {b: [] for b in others}
    worst = {b: 0.0 for b in others}
    prompts = read_prompts(DEFAULT_PROMPTS)
    for p in prompts:
        ids = ref.encode(p["prompt"], chat=p["chat"])
        out = ref.generate(ids, max_new_tokens=args.max_new_tokens, speculative=False)
        seq = ids + out.tokens[:-1]
        chunk = ref.session.state.layout.max_pass or len(seq)
        logits = {}
        for name, engine in [("ref", ref), *others.items()]:
            s = engine.session
            s.reset()
            rows = []
            for start in range(0, len(seq), chunk):
                rows.append(s.forward(seq[start:start + chunk]).logits)
                s.commit(len(seq[start:start + chunk]))
            logits[name] = np.concatenate(rows)[0 if args.all_positions else len(ids) - 1:]
            s.reset()
        for b in others:
            agree[b] += list(logits[b].argmax(-1) == logits["ref"].argmax(-1))
            worst[b] = max(worst[b], float(np.abs(logits[b] - logits["ref"]).max()))
    print(f"{len(prompts)} prompts x {args.max_new_tokens} greedy tokens of {args.reference}, teacher-forced"
          f"{', prompt positions included' if args.all_positions else ''}")
    print("| bundle | top-1 agreement | max abs logit diff |\n|---|---|---|")
    for b in others:
        print(f"| {b} | {np.mean(agree[b]):.4f} | {worst[b]:.2f} |")


if __name__ == "__main__":
    main()
