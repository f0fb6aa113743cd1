"""A QNN bundle of SmolLM2 (or --model gemma3-270m) against eager fp32 (and the simulated HTP against the CPU provider), on the chat prompt
"What is the capital of France?"; one JSON line per measurement, errors relative to the logits' scale.

    .venv/bin/python scripts/qnn_bundle_quality.py BUNDLE                  # CPU QDQ vs eager, teacher-forced
    .venv/bin/python scripts/qnn_bundle_quality.py BUNDLE --answers        # ... on eager's own greedy answers
    .venv/bin/python scripts/qnn_bundle_quality.py BUNDLE --htp 9 2        # HTP vs CPU QDQ: 2 passes of 9 (slow)
    .venv/bin/python scripts/qnn_bundle_quality.py BUNDLE --htp-answers    # --answers on the simulated HTP (~15 min)

Teacher-forced: the prompt in committed passes of each --lengths value, every position's top-1 against eager's.
--answers: eager greedy-decodes 30 tokens for two prompts; the bundle is teacher-forced over prompt + answer and
scored on the answer's tokens (first miss and the bundle's top 3 there). --htp T N: N passes of T tokens through
both providers side by side (the simulator takes ~7 s per row of SmolLM2). --htp-answers: --answers (ANSWER_TOKENS = 32,
issue #50's "2 prompts x 32 steps") through the simulated HTP and the CPU provider, in passes of the bundle's max_pass.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from edge_spec.loading import checkpoints
from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.runtimes.torch import TorchBackend

PROMPTS = ("What is the capital of France?", "Explain speculative decoding in two sentences.")
ANSWER_TOKENS = 32


def passes(session, ids: list[int], t: int) -> np.ndarray:
    """[len(ids), V] logits of every position, in committed passes of t tokens."""
    out = []
    for i in range(0, len(ids), t):
        out.append(session.forward(ids[i:i + t]).logits)
        session.commit(len(ids[i:i + t]))
    return np.concatenate(out)


def greedy(session, ids: list[int], n: int, chunk: int) -> list[int]:
    logits, out = passes(session, ids, chunk), []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = session.forward([out[-1]]).logits
        session.commit(1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 3, 5, 9])
    parser.add_argument("--answers", action="store_true")
    parser.add_argument("--htp", type=int, nargs=2, metavar=("T", "N"))
    parser.add_argument("--htp-answers", action="store_true")
    parser.add_argument("--model", default="smollm2-135m", help="the bundle's target, as eager's oracle")
    args = parser.parse_args()
    cpu = load_bundle(args.bundle, provider="cpu", host_check=False)
    target = checkpoints.load(args.model)
    chunk = cpu.session.state.layout.max_pass  # eager's passes too: the bundle's rings are sized for it

    def eager() -> Session:
        return Session(TorchBackend(target.model, cpu.session.state.layout))

    ids = cpu.encode(PROMPTS[0], chat=True)
    ref = passes(eager(), ids, 1)
    scale = np.abs(ref).max()
    if args.htp_answers:
        htp = load_bundle(args.bundle, provider="qnn", host_check=False)
        for prompt in PROMPTS:
            ids = cpu.encode(prompt, chat=True)
            answer = greedy(eager(), ids, ANSWER_TOKENS, chunk)
            row = {"prompt": prompt, "eager": target.tokenizer.decode(answer)}
            for name, engine in (("cpu", cpu), ("htp", htp)):
                engine.session.reset()
                start = time.perf_counter()
                a = passes(engine.session, ids + answer, chunk)[len(ids) - 1:-1]  # [32, V]: what predicts each token
                agree = a.argmax(-1) == np.array(answer)
                row |= {f"{name}_top1": round(float(agree.mean()), 3),
                        f"{name}_first_miss": int(np.argmin(agree)) if not agree.all() else None,
                        f"{name}_s": round(time.perf_counter() - start)}
            print(json.dumps(row), flush=True)
        return
    if args.htp:
        t, n = args.htp
        htp, ids = load_bundle(args.bundle, provider="qnn", host_check=False), ids[:t * n]
        cpu.session.reset()
        for i in range(0, len(ids), t):
            start = time.perf_counter()
            a = htp.session.forward(ids[i:i + t]).logits
            seconds = time.perf_counter() - start
            b = cpu.session.forward(ids[i:i + t]).logits
            for s in (htp.session, cpu.session):
                s.commit(len(ids[i:i + t]))
            diff = np.abs(a - b) / scale
            print(json.dumps({"htp_vs_cpu": True, "start": i, "rows": len(a), "max": round(float(diff.max()), 4),
                              "mean": round(float(diff.mean()), 4),
                              "top1_agree": int((a.argmax(-1) == b.argmax(-1)).sum()),
                              "vs_eager_htp": int((a.argmax(-1) == ref[i:i + t].argmax(-1)).sum()),
                              "vs_eager_cpu": int((b.argmax(-1) == ref[i:i + t].argmax(-1)).sum()),
                              "htp_s": round(seconds, 1)}), flush=True)
        return
    for t in args.lengths:
        cpu.session.reset()
        a = passes(cpu.session, ids, t)
        top1 = float((a.argmax(-1) == ref.argmax(-1)).mean())
        print(json.dumps({"pass": t, "positions": len(ids), "top1": round(top1, 3),
                          "mean": round(float(np.abs(a - ref).mean() / scale), 4)}), flush=True)
    if args.answers:
        for prompt in PROMPTS:
            ids = cpu.encode(prompt, chat=True)
            answer = greedy(eager(), ids, ANSWER_TOKENS, chunk)
            cpu.session.reset()
            a = passes(cpu.session, ids + answer, chunk)[len(ids) - 1:-1]  # [30, V]: the logits that predict each
            agree = a.argmax(-1) == np.array(answer)
            miss = int(np.argmin(agree)) if not agree.all() else None
            top3 = None if miss is None else [target.tokenizer.decode([int(x)]) for x in np.argsort(-a[miss])[:3]]
            print(json.dumps({"prompt": prompt, "eager": target.tokenizer.decode(answer),
                              "top1": round(float(agree.mean()), 3), "first_miss": miss, "bundle_top3_there": top3}),
                  flush=True)


if __name__ == "__main__":
    main()
