"""A/B two builds of the native runner on one bundle, or one build on two bundles of the same model (--bundle-b):
decode speed and time to first token, plain and speculative, tokens checked identical.

    .venv/bin/python scripts/native_ab.py --a OLD/edge-spec-run --b build/native/edge-spec-run --bundle B \\
        --prompts edge_spec/assets/prompts/heldout_everyday.jsonl --max-new-tokens 96 --spec-k 4
    .venv/bin/python scripts/native_ab.py --a build/native/edge-spec-run --b build/native/edge-spec-run \\
        --bundle OLD_BUNDLE --bundle-b NEW_BUNDLE --prompts edge_spec/assets/prompts/long_documents.jsonl

Each build runs as one persistent `edge-spec-run --requests -` process (opened and host-checked once); after a warm-up,
every prompt is decoded plain and then speculatively (adaptive k up to --spec-k) by both, in alternating order per
prompt, so drift hits both alike. Prints tokens per second after the first token and the target kernel's share of
the decode (the rest is the C++ loop and the drafter). Build an older commit with `git worktree add /tmp/old REV` and
`cmake -S /tmp/old/runtimes/native -B /tmp/build-old -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/build-old
--target edge-spec-run`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_spec.loading.tokenizer import Tokenizer  # noqa: E402
from edge_spec.train.evaluate import read_prompts  # noqa: E402


class Runner:
    def __init__(self, binary: str, bundle: str, threads: int):
        self.proc = subprocess.Popen([binary, "--bundle", bundle, "--threads", str(threads), "--requests", "-"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.header = json.loads(self.proc.stdout.readline())

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="edge-spec-run of build A (the baseline)")
    ap.add_argument("--b", required=True, help="edge-spec-run of build B")
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--bundle-b", help="B's bundle (default: --bundle), the same model exported another way")
    ap.add_argument("--prompts", required=True, help="JSONL prompts ({prompt, chat})")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--spec-k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    tokenizer = Tokenizer(Path(args.bundle))
    lines = [f"--prompt-ids {','.join(map(str, tokenizer.encode_prompt(p['prompt'], chat=p['chat'])))} "
             f"--max-new-tokens {args.max_new_tokens} --spec-k {args.spec_k}" for p in read_prompts(Path(args.prompts))]
    runners = {"A": Runner(args.a, args.bundle, args.threads), "B": Runner(args.b, args.bundle_b or args.bundle,
                                                                             args.threads)}
    for runner in runners.values():  # warm-up
        runner.ask(lines[0] + " --no-spec")
        runner.ask(lines[0])
    totals = {(name, mode): [0, 0.0, 0.0, 0.0] for name in runners for mode in ("plain", "spec")}
    differ = 0  # --bundle-b: runs whose tokens differ between the bundles
    for i, line in enumerate(lines):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        for mode, flag in (("plain", " --no-spec"), ("spec", "")):
            tokens = {}
            for name in order:
                out = runners[name].ask(line + flag)
                total = totals[(name, mode)]
                total[0] += len(out["tokens"]) - 1
                total[1] += out["total_s"] - out["prefill_s"]
                total[2] += out["target_kernel_s"]
                total[3] += out["prefill_s"]
                tokens[name] = out["tokens"]
            if tokens["A"] != tokens["B"]:
                if not args.bundle_b:  # one bundle: two builds must agree token for token
                    print(f"prompt {i} {mode}: the builds' tokens differ", file=sys.stderr)
                    return 1
                differ += 1  # two exports (other pass lengths, other kernels): each exact, not equal to the other
    bundles = {"A": args.bundle, "B": args.bundle_b or args.bundle}
    for (name, mode), (n, seconds, kernel, prefill) in sorted(totals.items()):
        print(f"{name} ({getattr(args, name.lower())}, {bundles[name]}) {mode:5} {n / seconds:7.1f} tok/s, target "
              f"kernel {kernel / seconds:.1%} of the decode, first token {prefill / len(lines) * 1000:.0f} ms")
    same = "tokens identical in every pair" if not differ else f"tokens differ in {differ} of {2 * len(lines)} pairs"
    print(f"{len(lines)} prompts x {args.max_new_tokens} tokens, {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
