"""Largest |activation| per module kind of a model in eager fp32, over the bench prompts: does any exceed fp16's
largest finite value (65,504)? What a Core ML fp16 package (fp16 compute) would overflow on (docs/coreml.md).

    .venv/bin/python scripts/activation_range.py --model gemma3-270m [--num-prompts 3]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from importlib import resources

import torch

from edge_spec.contract.backend import Session
from edge_spec.loading import checkpoints
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.torch import TorchBackend

FP16_MAX = 65504.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--num-prompts", type=int, default=3)
    args = ap.parse_args()
    loaded = checkpoints.load(args.model)
    peak: dict[str, float] = defaultdict(float)

    def record(kind: str):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            for name, t in ((kind, out), (kind + " input", inputs[0] if inputs else None)):
                if torch.is_tensor(t) and t.is_floating_point():
                    peak[name] = max(peak[name], float(t.abs().max()))
        return hook

    for module in loaded.model.modules():
        module.register_forward_hook(record(type(module).__name__))
    lines = resources.files("edge_spec.assets.prompts").joinpath("bench.jsonl").read_text().splitlines()
    for line in lines[:args.num_prompts]:
        row = json.loads(line)
        ids = loaded.tokenizer.encode_prompt(row["prompt"], chat=row.get("chat", False))
        session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, len(ids) + 8)), prefill_chunk=16)
        session.forward(ids)
    print(f"{'module (output unless noted)':40s} {'max |x|':>12s}")
    for name, value in sorted(peak.items(), key=lambda kv: -kv[1]):
        print(f"{name:40s} {value:12.1f}{'  > fp16 max' if value > FP16_MAX else ''}")


if __name__ == "__main__":
    main()
