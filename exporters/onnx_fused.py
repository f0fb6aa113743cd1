"""The ONNX target graph's fused forms: `FusedOps`, the `Ops` that export to onnxruntime's com.microsoft kernels.

  * RotaryEmbedding over per-position tables (`TableRope`): one node per rotated tensor instead of six element-wise
    ones; the llama family's packed q/k/v heads are rotated 4-D (BNSH) once split;
  * gate/up packed into one projection (and q/k/v for the llama family, whose heads are split once);
  * SkipSimplifiedLayerNormalization for every residual add + the norm after it (llama blocks hand their MLP output
    to the next norm: `Ops.fold_residuals`; Gemma blocks fuse the add before their pre-feed-forward norm);
  * FastGelu for GELU's tanh approximation (Gemma's MLP activation);
  * with `gqa` (the `shared` KV binding: llama, qwen3, Gemma-3): GroupQueryAttention for a layer's rotary +
    attention + cache write, fed the packed q/k/v projection (q and k normed first where the family norms them),
    the caches bound in and out to the same buffers (share-buffer mode), a sliding layer's window as the kernel's
    `local_window_size`: ~20 attention nodes per layer -> 3. Its one-row kernels sum in another order than its multi-row ones, so every
    pass carries one zero dummy row after its own, written one slot past them (kv.SHARED_SPARE_SLOTS).
Same maths in eager (tests/test_model_parity.py, bit for bit); SmolLM2's int8 graph goes from ~46 to ~26 nodes per
layer. The dynamo exporter only (TorchScript cannot emit them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from edge_spec.contract import kv
from edge_spec.model.config import GEMMA_FAMILIES, SLIDING
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

    def __init__(self, model: nn.Module, max_context: int, gqa: bool = False):
        super().__init__()
        self.gqa = gqa
        cfg = model.cfg
        self.fold_residuals = cfg.family not in GEMMA_FAMILIES
        rows = max_context + (kv.SHARED_SPARE_SLOTS if gqa else 0)  # the dummy row may sit at position max_context
        self.tables = {kind: rope_tables(getattr(model, f"inv_freq_{kind}"), rows) for kind in cfg.rope}
        self.packed_qkv, self.packed_gate_up = {}, {}
        self.windows = {SLIDING: cfg.sliding_window}  # GroupQueryAttention's local window per layer kind
        for block in model.model.layers:
            attn = block.self_attn
            # llama, qwen3 (q/k normed once packed: norm_packed); Gemma-3 only for GroupQueryAttention, which takes
            # q/k/v packed (its other layers keep their own projections: the `io` graphs as they were)
            if not attn.reuses_kv and (not attn.gemma or gqa):
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

    def fused_attention(self, attn, qkv, rope: TableRope, i, caches):
        """Under ONNX export with `gqa`: one com.microsoft GroupQueryAttention node. Positions come from position_ids
        (slot == position: the pass writes slots p0 .. p0 + T - 1 and attends over slots [0, p0 + T))."""
        if not self.gqa or not torch.onnx.is_in_onnx_export() or caches[0] is None:
            return None
        h, h_kv, _ = attn.head_counts
        k_cache, v_cache = caches  # [1, H_kv, S, D]
        # + kv.SHARED_SPARE_SLOTS dummy row (zeros, after the pass: causal, so no real row sees it): the kernel never
        # runs one row, and a decode step sums like a verify row (measured: docs/architecture.md "Fused attention")
        rows = torch.cat([qkv, torch.zeros_like(qkv[:, :1])], dim=1)  # [1, T + 1, (H + 2 H_kv) * D]
        last = rope.position_ids[0, -1:] + 1  # [1]: the dummy row's position
        seqlens_k = last.to(torch.int32)  # [1]: keys visible to the last row, minus one
        total = (last[0] + 1).to(torch.int32)  # []: keys visible to the last row
        attrs = {"num_heads": h, "kv_num_heads": h_kv, "scale": float(attn.scale), "do_rotary": 1,
                 "rotary_interleaved": 0}
        if attn.kind in self.windows:  # a query at q sees keys q - W + 1 .. q (kv.py), as the kernel's window W does
            attrs["local_window_size"] = self.windows[attn.kind]
        out, k, v = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::GroupQueryAttention",
            (rows, None, None, k_cache, v_cache, seqlens_k, total, rope.cos, rope.sin), attrs,
            dtypes=(qkv.dtype,) * 3, shapes=((*rows.shape[:2], h * attn.head_dim), k_cache.shape, v_cache.shape),
            version=1)
        return out[:, :-1], (k, v)  # [1, T, H * D]

    def gate_up(self, mlp):
        return self.packed_gate_up.get(mlp)

    def gelu(self, x):
        """Under ONNX export one com.microsoft FastGelu node (GELU's tanh approximation, Gemma's activation) instead
        of the ~8 element-wise nodes it is spelled in."""
        if not torch.onnx.is_in_onnx_export():
            return super().gelu(x)
        return torch.onnx.ops.symbolic("com.microsoft::FastGelu", (x,), {}, dtype=x.dtype, shape=x.shape, version=1)

    def skip_norm(self, x, delta, norm):
        """Under ONNX export one SkipSimplifiedLayerNormalization node (output 0 = normed, output 3 = the sum)."""
        if delta is None or not torch.onnx.is_in_onnx_export() or norm.weight is None:
            return super().skip_norm(x, delta, norm)
        stat = (*x.shape[:-1], 1)
        outs = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::SkipSimplifiedLayerNormalization", (x, delta, norm.weight), {"epsilon": norm.eps},
            dtypes=(x.dtype,) * 4, shapes=(x.shape, stat, stat, x.shape), version=1)
        return outs[0], outs[3]
