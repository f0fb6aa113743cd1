"""int4 weights that keep a block's min and max exact, on kernels that only take symmetric int4 (XNNPACK's
qd8-f32-qb4w, through torchao's IntxUnpackedToInt8Tensor): w = lo + scale * q per block of 32 along the input
(q in 0..15) is split into a symmetric part scale * (q - 8) and an offset per block, lo + 8 * scale:

    x @ w.T = x @ (scale * (q - 8)).T  +  blocksums(x) @ offsets.T        blocksums(x)[.., b] = sum of block b of x

SmolLM2's built-in GGUF is Q4_1 (lo + d * q, codes 0 and 15 in every block), so its weights come back bit-exact;
torchao's own symmetric int4 moves them onto another grid (top-1 agreement with fp32 over the bench prompts 0.83
instead of 0.96 here, docs/architecture.md "ExecuTorch path"). The ONNX int4 path does the same split
(exporters/onnx_passes.quantize_blocks).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32


def q4_codes(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] (K % group == 0) -> (codes [N, K] int8 in [-8, 7], scales [N, K / group], offsets [N, K / group])
    with w ~= scales * codes + offsets per block, exact at each block's min and max."""
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // group, group)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(hi))
    q = torch.clamp(torch.round((blocks - lo[..., None]) / scale[..., None]), 0, 15)
    return (q - 8).to(torch.int8).reshape(n, k), scale, lo + 8 * scale


def dequantize(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    n, k = codes.shape
    blocks = codes.float().reshape(n, k // group, group)
    return (blocks * scales[..., None] + offsets[..., None]).reshape(n, k)


class OffsetLinear(nn.Module):
    """A Linear as symmetric int4 (int8 dynamic activations unless `weight_only`) + its fp32 block-offset term."""

    def __init__(self, linear: nn.Linear, group: int = GROUP, weight_only: bool = False):
        super().__init__()
        from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
            IntxUnpackedToInt8Tensor, IntxUnpackedToInt8TensorActivationQuantization)

        n, k = linear.weight.shape
        codes, scales, offsets = q4_codes(linear.weight, group)
        act = None if weight_only else IntxUnpackedToInt8TensorActivationQuantization.INT8_ASYM_PER_TOKEN
        self.main = nn.Linear(k, n, bias=False)
        self.main.weight = nn.Parameter(IntxUnpackedToInt8Tensor(
            codes, scales, torch.zeros_like(scales, dtype=torch.int8), torch.int4, (1, group), torch.float32, act),
            requires_grad=False)
        indicator = torch.zeros(k // group, k)  # blocksums(x) = x @ indicator.T
        indicator[torch.arange(k) // group, torch.arange(k)] = 1.0
        self.block_sums = nn.Linear(k, k // group, bias=False)
        self.block_sums.weight = nn.Parameter(indicator, requires_grad=False)
        self.offsets = nn.Linear(k // group, n, bias=linear.bias is not None)
        self.offsets.weight = nn.Parameter(offsets.contiguous(), requires_grad=False)
        if linear.bias is not None:
            self.offsets.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., K] -> [..., N]
        return self.main(x) + self.offsets(self.block_sums(x))


def swap_linears(module: nn.Module, keep, group: int = GROUP) -> int:
    """Replace every nn.Linear `keep(fqn, linear)` accepts by an OffsetLinear, in place; returns how many."""
    count = 0
    for parent_name, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, nn.Linear) and keep(fqn, child):
                setattr(parent, name, OffsetLinear(child, group))
                count += 1
    return count
