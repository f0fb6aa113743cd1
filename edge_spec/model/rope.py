"""Rotary position embedding (rotate-half, Hugging Face layout) in the two forms the model uses.

`Rope` (cos / sin of this forward's positions, computed in the graph) is what eager training and the torch
runtime use; `TableRope` (per-position tables + position ids) is what exported graphs hand onnxruntime's fused
com.microsoft RotaryEmbedding kernel (`rotate`, `rotate_heads`; `Transformer.use_fused_ops`). Both give the same
values in eager (tested bit for bit, tests/test_model_parity.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rope(NamedTuple):
    """Rotary embedding of one forward, one attention kind: cos, sin [1, T, 1, D] (see `rope_cos_sin`)."""
    cos: torch.Tensor
    sin: torch.Tensor


class TableRope(NamedTuple):
    """The same rotation read from per-position tables: what exported graphs hand onnxruntime's fused
    RotaryEmbedding kernel (`rotate`). cos, sin: [max_context, D/2]; position_ids: [1, T]."""
    cos: torch.Tensor
    sin: torch.Tensor
    position_ids: torch.Tensor

    def rope(self) -> Rope:
        """The eager form: the tables' rows at `position_ids` as cos, sin [1, T, 1, D] (same values as
        `rope_cos_sin` at those positions)."""
        cos, sin = self.cos[self.position_ids], self.sin[self.position_ids]  # [1, T, D/2]
        return Rope(torch.cat([cos, cos], -1)[:, :, None], torch.cat([sin, sin], -1)[:, :, None])


def rope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> Rope:
    """position_ids: [1, T]; inv_freq: [D/2] -> cos, sin: [1, T, 1, D] (broadcast over heads)."""
    freqs = position_ids[..., None].float() * inv_freq  # [1, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
    return Rope(emb.cos(), emb.sin())


def rope_tables(inv_freq: torch.Tensor, max_context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """inv_freq: [D/2] -> cos, sin tables [max_context, D/2] (row p = position p), computed like `rope_cos_sin`."""
    freqs = torch.arange(max_context, dtype=torch.int64)[:, None].float() * inv_freq
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [1, T, H, D], rotate-half convention (Hugging Face layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)  # cos/sin stay fp32; a bf16 teacher keeps bf16 activations


def _ort_rotary(x: torch.Tensor, rope: TableRope, **attrs) -> torch.Tensor:
    """One com.microsoft RotaryEmbedding node over x (3-D [1, T, N * D] with num_heads, or 4-D [1, N, T, D])."""
    return torch.onnx.ops.symbolic("com.microsoft::RotaryEmbedding", (x, rope.position_ids, rope.cos, rope.sin),
                                   {"interleaved": 0, **attrs}, dtype=x.dtype, shape=x.shape, version=1)


def rotate(x: torch.Tensor, rope: Rope | TableRope, head_dim: int) -> torch.Tensor:
    """x: [1, T, N * D] (N heads of `head_dim`) -> x rotated by `rope`, same shape. A TableRope under ONNX export
    is one com.microsoft RotaryEmbedding node (it replaces six element-wise nodes per tensor); in eager it reads
    the tables and applies the same maths as `apply_rope`."""
    b, t, nd = x.shape
    if isinstance(rope, TableRope):
        if torch.onnx.is_in_onnx_export():
            return _ort_rotary(x, rope, num_heads=nd // head_dim)
        rope = rope.rope()
    return apply_rope(x.view(b, t, -1, head_dim), rope.cos, rope.sin).view(b, t, nd)


def rotate_heads(x: torch.Tensor, rope: TableRope) -> torch.Tensor:
    """x: [1, N, T, D] (heads first) -> rotated, same shape: one RotaryEmbedding node on its 4-D (BNSH) input
    under ONNX export, the `apply_rope` maths in eager."""
    if torch.onnx.is_in_onnx_export():
        return _ort_rotary(x, rope)
    cos, sin = rope.rope()  # [1, T, 1, D] -> [1, 1, T, D] for heads-first x
    return apply_rope(x, cos.transpose(1, 2), sin.transpose(1, 2))
