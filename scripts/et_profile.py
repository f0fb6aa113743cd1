"""Where an ExecuTorch program's milliseconds go (issue #32 item 1, the ExecuTorch half): ETDump events of plain T = 1
decode steps, per step, split into the XNNPACK delegate (by kernel kind) and the portable / custom kernels between
its subgraphs, one table.

    .venv/bin/python scripts/et_profile.py --bundle B [--tokens 40] [--threads 2]       # our program (`target`)
    .venv/bin/python scripts/et_profile.py --pte P.pte [--tokens 40] [--context 48]    # ExecuTorch's own Llama export
                                                                                        # (forward(tokens, input_pos))

The program is loaded through executorch's pybindings with ETDump on (the Program API our runtime uses has no event
tracer). --bundle: the bundle's session prefills the first bench prompt and decodes --tokens plain steps through
that module; --pte: --context single-token steps fill its KV cache, then --tokens more are measured. Each source runs twice,
with and without the --tokens measured steps; the per-step figures are the difference / --tokens, so the prefill /
--context calls and the program's loading are left out. XNNPACK's own operator events are present
when executorch was built with its runtime profiling (the 1.5.1 wheel is).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from edge_spec.benchmark.bench import DEFAULT_PROMPTS, machine
from edge_spec.train.evaluate import read_prompts

TOTAL, DELEGATE, OPERATOR = "Method::execute", "DELEGATE_CALL", "OPERATOR_CALL"


class _TracedMethod:
    """`method.execute(inputs)` over the ETDump-enabled module's run_method (same program, same buffers)."""

    def __init__(self, module, name: str):
        self.module, self.name = module, name

    def execute(self, inputs):
        return self.module.run_method(self.name, tuple(inputs))


def run_bundle(bundle: str, tokens: int, threads: int):
    from executorch.extension.pybindings import portable_lib

    from edge_spec.api import load_bundle

    engine = load_bundle(bundle, threads=threads, host_check=False)
    entry = engine.manifest.graphs["target"]
    module = portable_lib._load_for_executorch(str(Path(bundle) / entry.file), enable_etdump=True)
    engine.session.backend.method = _TracedMethod(module, entry.method)
    prompt = read_prompts(DEFAULT_PROMPTS)[0]
    ids = engine.encode(prompt["prompt"], chat=prompt["chat"])
    engine.generate(ids, max_new_tokens=tokens + 1, speculative=False)  # the prefill, then `tokens` steps
    return module, f"{bundle}, {len(ids)}-token prompt"


def run_pte(pte: str, tokens: int, context: int, threads: int):
    import torch
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama::custom_sdpa, update_cache)
    from executorch.extension.pybindings import portable_lib

    from edge_spec.runtimes.executorch import set_threads

    module = portable_lib._load_for_executorch(pte, enable_etdump=True)
    set_threads(threads)
    token = torch.tensor([[1]], dtype=torch.long)
    for pos in range(context + tokens):
        logits = module.run_method("forward", (token, torch.tensor([pos], dtype=torch.long)))[0]
        token = torch.tensor([[int(logits.reshape(-1, logits.shape[-1])[-1].argmax())]], dtype=torch.long)
    return module, f"{pte}, after {context} single-token steps"


def kind(name: str) -> str:
    """An event name -> the row it is summed into."""
    if name in (TOTAL, DELEGATE, OPERATOR):
        return name
    m = re.match(r"(Fully Connected|Batch Matrix Multiply) \(NC, ([^)]*)\)", name)
    if m:
        return f"xnnpack {m.group(1)} ({m.group(2)})"
    if name.startswith(("native_call_", "llama::", "custom_")) or "::" in name:
        return "portable / custom kernels (inside OPERATOR_CALL)"
    return "xnnpack other ops (norms, rope, softmax, reshapes, ...)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle")
    src.add_argument("--pte")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--context", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from executorch.devtools import Inspector

    def events(tokens: int) -> dict[str, list[float]]:
        if args.bundle:
            module, what = run_bundle(args.bundle, tokens, args.threads)
        else:
            module, what = run_pte(args.pte, tokens, args.context, args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "etdump.etdp"
            module.write_etdump_result_to_file(str(path))
            inspector = Inspector(etdump_path=str(path))
            raw: dict[str, list[float]] = defaultdict(list)
            for block in inspector.event_blocks:
                for event in block.events:
                    if block.name == "Execute" and event.perf_data is not None:
                        raw[event.name].extend(event.perf_data.raw)
        return raw, what

    base, _ = events(0)
    raw, what = events(args.tokens)
    steps = len(raw[TOTAL]) - len(base[TOTAL])
    per_step: dict[str, float] = defaultdict(float)
    count: dict[str, float] = defaultdict(float)
    for name, values in raw.items():
        per_step[kind(name)] += (sum(values) - sum(base.get(name, []))) / steps
        count[kind(name)] += (len(values) - len(base.get(name, []))) / steps
    total = per_step[TOTAL]
    print(f"{machine()}; {what}; {steps} T = 1 steps measured, {args.threads} threads")
    print("| where | events per step | ms per step | share of the step |")
    print("|---|---|---|---|")
    rows = [(TOTAL + " (the step)", TOTAL), ("XNNPACK delegate (DELEGATE_CALL)", DELEGATE),
            ("portable / custom kernels (OPERATOR_CALL)", OPERATOR)]
    for label, key in rows:
        print(f"| {label} | {count[key]:.0f} | {per_step[key]:.2f} | {per_step[key] / total:.1%} |")
    rest = total - per_step[DELEGATE] - per_step[OPERATOR]
    print(f"| runtime between kernels (the step - both) | - | {rest:.2f} | {rest / total:.1%} |")
    for key in sorted((k for k in per_step if k not in (TOTAL, DELEGATE, OPERATOR)), key=lambda k: -per_step[k]):
        print(f"| - {key} | {count[key]:.0f} | {per_step[key]:.2f} | {per_step[key] / total:.1%} |")


if __name__ == "__main__":
    main()
