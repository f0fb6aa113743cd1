"""How much do 8-bit weights alone cost SmolLM2, per tensor (QNN's MatMul) vs per output channel (QNN's Conv)? Eager
transformers, every linear's weight and the embedding table fake-quantized (asymmetric uint8, as onnxruntime's QNN
config does), top-1 agreement and logit error (relative to the logits' scale) against fp32 over the first 48 tokens
of the first 3 shipped bench prompts - the positions scripts/qnn_quality.py compares. No activation is quantized.

    .venv/bin/python scripts/qnn_weight_quant.py
"""

from __future__ import annotations

import copy
import json

import torch


def fake_quant(w: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """Asymmetric 8-bit (range widened to hold 0), per tensor or per row (a linear's output channel)."""
    lo = (w.amin(1, keepdim=True) if per_channel else w.min()).clamp(max=0)
    hi = (w.amax(1, keepdim=True) if per_channel else w.max()).clamp(min=0)
    scale = (hi - lo) / 255
    zero = torch.round(-lo / scale)
    return (torch.clamp(torch.round(w / scale) + zero, 0, 255) - zero) * scale


def main() -> None:
    from transformers import LlamaForCausalLM

    from edge_spec.loading import checkpoints
    from edge_spec.api import load
    from edge_spec.benchmark.bench import DEFAULT_PROMPTS
    from edge_spec.loading.gguf_common import cache_root
    from edge_spec.train.evaluate import read_prompts

    load("smollm2-135m", drafter=None)  # converts the built-in GGUF once
    path = str(cache_root() / "smollm2-135m-instruct")
    tokenizer = checkpoints.load(path).tokenizer
    fp32 = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    seqs = [tokenizer.encode_prompt(p["prompt"], chat=p["chat"])[:48] for p in read_prompts(DEFAULT_PROMPTS)[:3]]

    def logits(model):
        with torch.no_grad():
            return [model(torch.tensor([s])).logits[0] for s in seqs]

    ref = logits(fp32)
    scale = max(r.abs().max().item() for r in ref)
    # name -> (linears per channel, output head per channel, input table per channel); the head is the tied table
    variants = {"per tensor everywhere": (False, False, False), "per channel everywhere": (True, True, True),
                "linears per tensor, table per channel": (False, True, True),
                "linears per channel, table per tensor": (True, False, False),
                "linears + head per channel, input table per tensor": (True, True, False)}
    for name, (linears, head, table) in variants.items():
        model = copy.deepcopy(fp32)
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())  # untied
        with torch.no_grad():
            for module_name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(fake_quant(module.weight, head if module_name == "lm_head" else linears))
            model.model.embed_tokens.weight.copy_(fake_quant(model.model.embed_tokens.weight, table))
        out = logits(model)
        top1 = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(out, ref)) / sum(map(len, seqs))
        print(json.dumps({"variant": name, "top1": round(top1, 3),
                          "max_rel": round(max((a - b).abs().max().item() for a, b in zip(out, ref)) / scale, 4),
                          "mean_rel": round(sum((a - b).abs().mean().item() for a, b in zip(out, ref)) / 3 / scale, 5)}),
              flush=True)


if __name__ == "__main__":
    main()
