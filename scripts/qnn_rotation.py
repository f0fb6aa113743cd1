"""Does rotating SmolLM2's residual stream (QuaRot / SpinQuant's R1) lift what QNN's 8-bit weights and 16-bit
activations leave of its answers? Eager transformers, teacher-forced over fp32's own greedy answers to the held-out
everyday chat prompts; top-1 on the answer tokens against fp32.

The rotation: every RMSNorm's weight folded into the linears that read it, then the stream turned by an orthogonal Q
(x' = x Q): the input table E Q, each reading linear W diag(w) Q, each writing linear (o_proj, down_proj) Q^T W, the
head E diag(w_final) Q (untied). RMSNorm of x' is RMSNorm of x turned by Q, so the float model is unchanged (printed:
its top-1 against fp32 must be 1.0). What it changes is each weight row's and each stream vector's largest entry
against its norm, which is what a per-channel weight grid and a per-tensor activation grid are sized by.

Quantization as onnxruntime's QNN config does it: weights symmetric per output channel (8-bit, the q / k / v
projections 16-bit as `exporters.qnn.WIDE_WEIGHTS` keeps them), the input table per tensor 16-bit; `--acts`
also rounds the residual stream (the input of every norm) to a 16-bit per-tensor grid whose range is the stream's
min / max over the bench prompts (calibration), position 0 left float as the bundle's host sink leaves it.

    .venv/bin/python scripts/qnn_rotation.py [--prompts 12] [--tokens 96] [--acts] [--wide lm_head ...]
        [--rotations none "random orthogonal" ...] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

WIDE = ("q_proj", "k_proj", "v_proj")


def random_orthogonal(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()  # Haar-distributed


def hadamard_like(d: int, seed: int) -> torch.Tensor:
    """H_(2^k) (Sylvester) Kronecker a random orthogonal block of the odd rest, random signs in front: d = 576 =
    64 x 9. Orthonormal."""
    k = d & -d
    h = torch.ones(1, 1)
    while h.shape[0] < k:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = torch.kron(h.contiguous() / k ** 0.5, random_orthogonal(d // k, seed).contiguous())
    g = torch.Generator().manual_seed(seed + 1)
    signs = torch.randint(0, 2, (d,), generator=g).float() * 2 - 1
    return signs[:, None] * h


@torch.no_grad()
def rotate(model, q: torch.Tensor) -> None:
    """Fold the norms and turn the residual stream of a transformers Llama by q (in place; unties the head)."""
    m = model.model
    table = m.embed_tokens.weight.detach().clone()
    for layer in m.layers:
        for norm, readers in ((layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                        layer.self_attn.v_proj)),
                              (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj))):
            for lin in readers:
                lin.weight.copy_((lin.weight * norm.weight[None]) @ q)
            norm.weight.fill_(1.0)
        for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
            lin.weight.copy_(q.T @ lin.weight)
    model.lm_head.weight = torch.nn.Parameter((table * m.norm.weight[None]) @ q)
    m.norm.weight.fill_(1.0)
    m.embed_tokens.weight.copy_(table @ q)


def fake_quant(w: torch.Tensor, bits: int, per_channel: bool) -> torch.Tensor:
    """Symmetric, the grid's zero at 0 (uint8 with zero point 128 / int16), per row or per tensor."""
    top = w.abs().amax(1, keepdim=True) if per_channel else w.abs().max()
    scale = top.clamp(min=1e-12) / (2 ** (bits - 1) - 1)
    return torch.clamp(torch.round(w / scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1) * scale


@torch.no_grad()
def quantize_weights(model, wide: tuple[str, ...] = WIDE) -> None:
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.copy_(fake_quant(mod.weight, 16 if name.endswith(wide) else 8, True))
    model.model.embed_tokens.weight.copy_(fake_quant(model.model.embed_tokens.weight, 16, False))


class StreamGrid:
    """Rounds every norm's input (the residual stream) to one 16-bit grid per norm, range from calibration (position
    0 never reaches it: `logits` runs it through fp32)."""

    def __init__(self, model):
        self.norms = [mod for name, mod in model.named_modules() if name.endswith("norm")]
        self.ranges, self.calibrating, self.handles = {}, True, []
        for norm in self.norms:
            self.handles.append(norm.register_forward_pre_hook(self._hook))

    def _hook(self, norm, args):
        x = args[0]
        if self.calibrating:
            lo, hi = self.ranges.get(id(norm), (0.0, 0.0))
            self.ranges[id(norm)] = (min(lo, x.min().item()), max(hi, x.max().item()))
            return None
        lo, hi = self.ranges[id(norm)]
        scale = (hi - lo) / 65535
        zero = round(-lo / scale)
        rounded = (torch.clamp(torch.round(x / scale) + zero, 0, 65535) - zero) * scale
        return (rounded,)


def heldout_answers(n_prompts: int, tokens: int, threads: int = 2):
    """(fp32 transformers SmolLM2, our tokenizer, prompt ids, prompt + fp32's greedy answer ids, calibration ids: the
    9 bench prompts' first 64 tokens) for the first `n_prompts` held-out everyday chat prompts."""
    from pathlib import Path

    from transformers import LlamaForCausalLM

    from edge_spec.api import load
    from edge_spec.benchmark.bench import DEFAULT_PROMPTS
    from edge_spec.loading import checkpoints
    from edge_spec.loading.gguf_common import cache_root
    from edge_spec.train.evaluate import read_prompts

    torch.set_num_threads(threads)
    load("smollm2-135m", drafter=None)  # converts the built-in GGUF once
    path = str(cache_root() / "smollm2-135m-instruct")
    tok = checkpoints.load(path).tokenizer
    fp32 = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    heldout = Path(__file__).resolve().parents[1] / "edge_spec/assets/prompts/heldout_everyday.jsonl"
    prompts = [tok.encode_prompt(p["prompt"], chat=p["chat"]) for p in read_prompts(heldout)[:n_prompts]]
    with torch.no_grad():
        seqs = [fp32.generate(torch.tensor([p]), max_new_tokens=tokens, do_sample=False)[0].tolist()
                for p in prompts]
    calib = [tok.encode_prompt(p["prompt"], chat=p["chat"])[:64] for p in read_prompts(DEFAULT_PROMPTS)]
    return fp32, tok, prompts, seqs, calib


def answer_logits(model, fp32, prompts, seqs, sink: str) -> list[torch.Tensor]:
    """Answer positions' logits; position 0 through fp32 (`sink` "fp32": the rotation leaves keys and values as they
    are, so fp32's cache serves the rotated model too) or through `model` itself ("model": as the bundle's host sink
    runs it, float activations over the quantized weights), the rest through `model`."""
    out = []
    with torch.no_grad():
        for s, p in zip(seqs, prompts):
            if sink == "model":
                out.append(model(torch.tensor([s])).logits[0, len(p) - 1:-1])
                continue
            past = fp32(torch.tensor([s[:1]]), use_cache=True).past_key_values
            rest = model(torch.tensor([s[1:]]), past_key_values=past).logits[0]
            out.append(rest[len(p) - 2:-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--acts", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wide", nargs="*", default=[], help="more linears at 16 bits, e.g. lm_head down_proj")
    parser.add_argument("--sink", choices=("fp32", "model"), default="fp32",
                        help="position 0 through fp32 or through the quantized model (as the bundle's host sink)")
    parser.add_argument("--rotations", nargs="*", default=["none", "random orthogonal", "hadamard 64 x random 9"])
    args = parser.parse_args()
    fp32, tok, prompts, seqs, calib = heldout_answers(args.prompts, args.tokens)

    def logits(model):
        return answer_logits(model, fp32, prompts, seqs, args.sink)

    ref = logits(fp32)
    n = sum(len(r) for r in ref)
    rotations = {"none": None, "random orthogonal": random_orthogonal(576, args.seed),
                 "hadamard 64 x random 9": hadamard_like(576, args.seed)}
    for name, q in ((n, rotations[n]) for n in args.rotations):
        model = copy.deepcopy(fp32)
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())  # untied
        if q is not None:
            rotate(model, q)
        float_top1 = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(logits(model), ref)) / n
        quantize_weights(model, WIDE + tuple(args.wide))
        if args.acts:
            grid = StreamGrid(model)
            with torch.no_grad():
                for c in calib:
                    model(torch.tensor([c[1:]]), past_key_values=fp32(torch.tensor([c[:1]]), use_cache=True).past_key_values)
            grid.calibrating = False
            worst = max(max(abs(lo), abs(hi)) for lo, hi in grid.ranges.values())
        out = logits(model)
        top1 = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(out, ref)) / n
        row = {"rotation": name, "float top1": round(float_top1, 4), "quantized top1": round(top1, 4),
               "positions": n, "acts": args.acts, "wide": list(WIDE) + args.wide, "sink": args.sink}
        if args.acts:
            row["largest stream range"] = round(worst, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
