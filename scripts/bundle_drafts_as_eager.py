"""A bundle's drafter against the same drafter run eagerly: greedy speculative == plain through the bundle, and the
drafts accepted at each position, bundle vs eager, on everyday chat prompts (one JSON line per prompt).

    EDGE_SPEC_COREML_EXECUTOR=mil .venv/bin/python scripts/bundle_drafts_as_eager.py BUNDLE \\
        --model smollm2-135m --drafter data/eagle3/smollm2-135m-chunk3

The eager engine speculates with allow_inexact=True (this compares drafts, not the eager kernels' row invariance);
the bundle's engine keeps its host check. k fixed, no retrieval, so every draft is the drafter's.
"""

from __future__ import annotations

import argparse
import json
import time

PROMPTS = ("What is the capital of France?", "Give me three tips for staying focused while studying.")


def run(engine, prompt: str, tokens: int, k: int, inexact: bool) -> dict:
    ids = engine.encode(prompt, chat=True)
    start = time.perf_counter()
    plain = engine.generate(ids, max_new_tokens=tokens, speculative=False)
    spec = engine.generate(ids, max_new_tokens=tokens, speculative=True, lookup=False, spec_k=k, adaptive=False,
                           allow_inexact=inexact)
    stats = spec.extra.get("spec")
    if stats is None:
        raise SystemExit(f"no speculation ran: {spec.extra.get('notice')}")
    return {"same": spec.tokens == plain.tokens, "text": plain.text[:80], "tau": round(float(stats.tau), 3),
            "accepted": stats.accepted.tolist(), "drafted": stats.drafted.tolist(),
            "s": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", required=True, help="the drafter folder the bundle was exported with")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    from edge_spec.api import load, load_bundle

    engines = {"bundle": (load_bundle(args.bundle), False), "eager": (load(args.model, drafter=args.drafter), True)}
    for prompt in PROMPTS:
        row = {name: run(engine, prompt, args.tokens, args.k, inexact) for name, (engine, inexact) in engines.items()}
        row["same_drafts"] = row["bundle"]["accepted"] == row["eager"]["accepted"]
        print(json.dumps({"prompt": prompt, **row}, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
