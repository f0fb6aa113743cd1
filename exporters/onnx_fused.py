"""The ONNX target graph's fused forms: `FusedOps`, the `Ops` that export to onnxruntime's com.microsoft kernels.

  * RotaryEmbedding over per-position tables (`TableRope`): one node per rotated tensor instead of six element-wise
    ones; the llama family's packed q/k/v heads are rotated 4-D (BNSH) once split;
  * gate/up packed into one projection (and q/k/v for the llama family, whose heads are split once);
  * SkipSimplifiedLayerNormalization for every residual add + the norm after it (llama blocks hand their MLP output
    to the next norm: `Ops.fold_residuals`).
Same maths in eager (tests/test_model_parity.py, bit for bit); SmolLM2's int8 graph goes from ~46 to ~26 nodes per
layer. The dynamo exporter only (TorchScript cannot emit them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from edge_spec.model.config import GEMMA_FAMILIES
from edge_spec.model.ops import Ops, packed_linear
from edge_spec.model.rope import Rope, rope_tables


class TableRope(NamedTuple):
    """One forward's rotation as per-position tables cos, sin [max_context, D/2] + position_ids [1, T]."""
    cos: torch.Tensor
    sin: torch.Tensor
    position_ids: torch.Tensor

    def rope(self) -> Rope:
        """The eager form: the tables' rows at `position_ids` as cos, sin [1, T, 1, D] (the values
        `rope_cos_sin` gives at those positions)."""
        cos, sin = self.cos[self.position_ids], self.sin[self.position_ids]  # [1, T, D/2]
        return Rope(torch.cat([cos, cos], -1)[:, :, None], torch.cat([sin, sin], -1)[:, :, None])


def _rotary(x: torch.Tensor, rope: TableRope, **attrs) -> torch.Tensor:
    """One com.microsoft RotaryEmbedding node over x (3-D [1, T, N * D] with num_heads, or 4-D [1, N, T, D])."""
    return torch.onnx.ops.symbolic("com.microsoft::RotaryEmbedding", (x, rope.position_ids, rope.cos, rope.sin),
                                   {"interleaved": 0, **attrs}, dtype=x.dtype, shape=x.shape, version=1)


class FusedOps(Ops):
    """`model`'s fused forms over rope tables of `max_context` rows (weights packed once, here)."""

    def __init__(self, model: nn.Module, max_context: int):
        super().__init__()
        cfg = model.cfg
        self.fold_residuals = cfg.family not in GEMMA_FAMILIES
        self.tables = {kind: rope_tables(getattr(model, f"inv_freq_{kind}"), max_context) for kind in cfg.rope}
        self.packed_qkv, self.packed_gate_up = {}, {}
        for block in model.model.layers:
            attn = block.self_attn
            if not attn.gemma and not attn.reuses_kv:
                self.packed_qkv[attn] = packed_linear(attn.q_proj, attn.k_proj, attn.v_proj)
            self.packed_gate_up[block.mlp] = packed_linear(block.mlp.gate_proj, block.mlp.up_proj)

    def rope(self, model, kind, position_ids):
        return TableRope(*self.tables[kind], position_ids)

    def rotate(self, x, rope: TableRope, head_dim):
        if torch.onnx.is_in_onnx_export():
            return _rotary(x, rope, num_heads=x.shape[-1] // head_dim)
        return super().rotate(x, rope.rope(), head_dim)

    def rotate_heads(self, x, rope: TableRope):
        if torch.onnx.is_in_onnx_export():
            return _rotary(x, rope)
        return super().rotate_heads(x, rope.rope())

    def qkv(self, attn):
        return self.packed_qkv.get(attn)

    def gate_up(self, mlp):
        return self.packed_gate_up.get(mlp)

    def skip_norm(self, x, delta, norm):
        """Under ONNX export one SkipSimplifiedLayerNormalization node (output 0 = normed, output 3 = the sum)."""
        if delta is None or not torch.onnx.is_in_onnx_export() or norm.weight is None:
            return super().skip_norm(x, delta, norm)
        stat = (*x.shape[:-1], 1)
        outs = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::SkipSimplifiedLayerNormalization", (x, delta, norm.weight), {"epsilon": norm.eps},
            dtypes=(x.dtype,) * 4, shapes=(x.shape, stat, stat, x.shape), version=1)
        return outs[0], outs[3]
