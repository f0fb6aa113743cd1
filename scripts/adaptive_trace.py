"""Adaptive draft length vs a fixed k, prompt by prompt, with what the cost model saw: the k it chose per pass,
its per-position acceptance for the MTP drafter and for retrieval, the verify costs it measured.

    .venv/bin/python scripts/adaptive_trace.py BUNDLE [--prompts 4] [--k 4] [--max-new-tokens 64] [--threads 2]
        [--against OLD.py]   # e.g. git show 82bfed0:edge_spec/decoding/speculative.py > OLD.py

Greedy, hybrid drafting (the default), the shipped bench prompts (edge_spec/assets/prompts/bench.jsonl); speeds are
decode tokens per second of one run each (plain, fixed k, adaptive, then `--against`'s adaptive: another revision of
edge_spec/decoding/speculative.py, interleaved per prompt), so run it on an idle machine; the last line sums each.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    ap.add_argument("--against", help="another revision's edge_spec/decoding/speculative.py, run as a fourth row")
    args = ap.parse_args()
    import importlib.util

    import edge_spec.api as api

    ours = api.generate_speculative
    models = []  # every CostModel the loops make, to read what it measured
    other = None
    if args.against:
        spec = importlib.util.spec_from_file_location("speculative_against", args.against)
        other = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = other  # (dataclasses look their module up there)
        spec.loader.exec_module(other)
        other_init = other.CostModel.__post_init__

        def keep_other(self):
            other_init(self)
            models.append(self)

        other.CostModel.__post_init__ = keep_other
    init = speculative.CostModel.__post_init__

    def keep(self):
        init(self)
        models.append(self)

    speculative.CostModel.__post_init__ = keep
    engine = load_bundle(args.bundle, threads=args.threads)
    totals: dict[str, list] = {}
    lines = resources.files("edge_spec.assets.prompts").joinpath("bench.jsonl").read_text().splitlines()
    for index, line in enumerate(lines[:args.prompts]):
        item = json.loads(line)
        ids = engine.tokenizer.encode_prompt(item["prompt"], chat=bool(item.get("chat")))
        runs = [("plain", False, ours), (f"k = {args.k}", False, ours), ("adaptive", True, ours)]
        runs += [("against", True, other.generate_speculative)] if other else []
        for name, adaptive, loop in runs:
            api.generate_speculative = loop
            r = engine.generate(ids, max_new_tokens=args.max_new_tokens, spec_k=args.k, adaptive=adaptive,
                                speculative=name != "plain")
            seconds = r.extra["spec"].decode_s if "spec" in r.extra else r.total_s - r.prefill_s
            totals[name] = [totals.get(name, [0, 0.0])[0] + len(r.tokens) - 1, totals.get(name, [0, 0.0])[1] + seconds]
            row = f"prompt {index} {name:>8}: {(len(r.tokens) - 1) / seconds:6.1f} tok/s"
            if "spec" in r.extra:
                st = r.extra["spec"]
                row += f", tau {st.tau:.2f}, {st.lookup_passes}/{st.target_calls} passes from retrieval"
            if adaptive:
                st, m = r.extra["spec"], models[-1]
                verify = {t: round(v * 1e3, 1) for t, v in sorted(m.verify_s.items())}
                retrieval = getattr(m, "lookup_accept", None)  # (not measured apart before 2026-12-05)
                row += (f", mean k {np.mean(st.k_chosen):.2f}, k per pass {''.join(map(str, st.k_chosen))}\n"
                        f"    acceptance by position: drafter {np.round(m.accept, 2).tolist()}, retrieval "
                        f"{'-' if retrieval is None else np.round(retrieval, 2).tolist()}; verify ms by T {verify}; "
                        f"draft ms {(m.draft_s or 0) * 1e3:.2f}")
            print(row, flush=True)
    print("all prompts: " + ", ".join(f"{name} {n / s:.1f} tok/s" for name, (n, s) in totals.items()))

if __name__ == "__main__":
    main()
