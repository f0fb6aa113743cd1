"""Residual headroom for fp16 programs: the same model with its residual stream carried divided by a power of two.

Why: a program that computes in fp16 holds the residual stream (the embeddings plus every block's contribution, the
input of each norm) in fp16, whose largest finite value is 65,504. gemma-3-270m's stream reaches 104,061 in eager
fp32 on the bench prompts (`scripts/activation_range.py`): in fp16 it becomes inf and the next norm inf / inf.

What changes, exact in real arithmetic (RMSNorm(x / s) with eps / s^2 == RMSNorm(x)):
    x_0 = embed(ids) * (embed_scale / s)                      the stream starts divided by s
    llama:  o_proj, down_proj (weight, bias) / s               each block adds its output / s
    gemma:  post-attention / post-feedforward / post-per-layer-input norm weights / s
    every norm that reads the stream (the blocks' pre-norms, the MoE router and pre-norm, the per-layer-input
    projection norm, the final norm): eps / s^2                -> hidden states and logits unchanged
    gemma-4 per-layer inputs: the gate that reads the stream unnormalized (before a GELU) * s
So every K / V row, the final hidden state and the logits are the unscaled model's; only the stream is smaller. A
power of two keeps the scaling itself exact in binary floating point (weights / s lose no bits unless subnormal).
"""

from __future__ import annotations

import copy
import math
from typing import Iterable

import torch

from edge_spec.model.config import GEMMA_FAMILIES
from edge_spec.model.transformer import Block, Transformer

FP16_MAX = 65504.0
# the stream's measured peak times this must stay below FP16_MAX: prompts unlike the calibration ones reach further
HEADROOM = 8.0


def stream_peak(model: Transformer, run: callable, prompts: Iterable[list[int]]) -> float:
    """The largest |x| of the residual stream (embedding output and every block's output) while `run(ids)` runs
    each prompt through `model` (eager, fp32)."""
    peak = [0.0]

    def record(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        peak[0] = max(peak[0], float(out.detach().abs().max()))

    hooks = [b.register_forward_hook(record) for b in model.model.layers]
    hooks.append(model.model.embed_tokens.register_forward_hook(
        lambda m, i, out: record(m, i, out * float(model.embed_scale))))
    try:
        with torch.no_grad():
            for ids in prompts:
                run(ids)
    finally:
        for h in hooks:
            h.remove()
    return peak[0]


def scale_for(peak: float, limit: float = FP16_MAX, headroom: float = HEADROOM) -> int:
    """The smallest power of two s with peak * headroom / s <= limit (1 when the stream already fits)."""
    if not math.isfinite(peak):
        raise ValueError(f"the residual stream's peak is {peak} in fp32: the model itself overflows")
    need = peak * headroom / limit
    return 1 if need <= 1 else 2 ** math.ceil(math.log2(need))


def _divide(module: torch.nn.Module | None, s: int, names: tuple[str, ...] = ("weight", "bias")) -> None:
    if module is None:
        return
    for name in names:
        p = getattr(module, name, None)
        if p is not None:
            p.data = p.data / s


def _readers(block: Block, gemma: bool) -> list:
    """The norms of a block that read the residual stream."""
    if not gemma:
        return [block.input_layernorm, block.post_attention_layernorm]
    out = [block.input_layernorm, block.pre_feedforward_layernorm]
    if block.moe:
        out += [block.pre_feedforward_layernorm_2, block.router.norm]
    return out


def _writers(block: Block, gemma: bool) -> list:
    """The last module of each branch that adds into the stream."""
    if not gemma:
        return [block.self_attn.o_proj, block.mlp.down_proj]
    out = [block.post_attention_layernorm, block.post_feedforward_layernorm]
    if block.ple:
        out.append(block.post_per_layer_input_norm)
    return out


def scaled_stream(model: Transformer, s: int) -> Transformer:
    """A copy of `model` whose residual stream is carried divided by `s` (a power of two); `model` is unchanged.
    Same K / V rows, hidden states and logits up to rounding (exact in real arithmetic); s = 1 returns `model`."""
    if s == 1:
        return model
    if s < 1 or s & (s - 1):
        raise ValueError(f"the stream scale must be a power of two >= 1, got {s}")
    out = copy.deepcopy(model)
    gemma = out.cfg.family in GEMMA_FAMILIES
    out.embed_scale = float(out.embed_scale) / s
    with torch.no_grad():
        for block in out.model.layers:
            for norm in _readers(block, gemma):
                norm.eps = norm.eps / s ** 2
            for module in _writers(block, gemma):
                _divide(module, s)
            if gemma and block.ple:  # its gate reads the stream with no norm (then a GELU): undo the scale there
                block.per_layer_input_gate.weight.data = block.per_layer_input_gate.weight.data * s
        out.model.norm.eps = out.model.norm.eps / s ** 2
        if out.cfg.per_layer_input_size:  # reads the (scaled) embedding output through a projection
            out.model.per_layer_projection_norm.eps /= s ** 2
    return out
