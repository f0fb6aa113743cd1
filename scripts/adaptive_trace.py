"""Adaptive draft length vs a fixed k, prompt by prompt, with what the cost model saw: the k it chose per pass,
its per-position acceptance for the MTP drafter and for retrieval, the verify costs it measured.

    .venv/bin/python scripts/adaptive_trace.py BUNDLE [--prompts 4] [--k 4] [--max-new-tokens 64] [--threads 2]

Greedy, hybrid drafting (the default), the shipped bench prompts (edge_spec/assets/prompts/bench.jsonl); speeds are
decode tokens per second of one run each (fixed k first, then adaptive), so run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.decoding import speculative


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    models = []  # every CostModel the loop makes, to read what it measured
    init = speculative.CostModel.__post_init__

    def keep(self):
        init(self)
        models.append(self)

    speculative.CostModel.__post_init__ = keep
    engine = load_bundle(args.bundle, threads=args.threads)
    lines = resources.files("edge_spec.assets.prompts").joinpath("bench.jsonl").read_text().splitlines()
    for index, line in enumerate(lines[:args.prompts]):
        item = json.loads(line)
        ids = engine.tokenizer.encode_prompt(item["prompt"], chat=bool(item.get("chat")))
        for adaptive in (False, True):
            r = engine.generate(ids, max_new_tokens=args.max_new_tokens, spec_k=args.k, adaptive=adaptive)
            st = r.extra["spec"]
            row = (f"prompt {index} {'adaptive' if adaptive else f'k = {args.k}':>8}: {len(r.tokens) / st.decode_s:6.1f} "
                   f"tok/s, tau {st.tau:.2f}, {st.lookup_passes}/{st.target_calls} passes from retrieval")
            if adaptive:
                m = models[-1]
                verify = {t: round(v * 1e3, 1) for t, v in sorted(m.verify_s.items())}
                retrieval = getattr(m, "lookup_accept", None)  # (not measured apart before 2026-12-05)
                row += (f", mean k {np.mean(st.k_chosen):.2f}, k per pass {''.join(map(str, st.k_chosen))}\n"
                        f"    acceptance by position: drafter {np.round(m.accept, 2).tolist()}, retrieval "
                        f"{'-' if retrieval is None else np.round(retrieval, 2).tolist()}; verify ms by T {verify}; draft ms "
                        f"{(m.draft_s or 0) * 1e3:.2f}")
            print(row, flush=True)


if __name__ == "__main__":
    main()
