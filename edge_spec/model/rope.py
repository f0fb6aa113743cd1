"""Rotary position embedding (rotate-half, Hugging Face layout): cos / sin of one forward's positions.

`edge_spec.model.ops.Ops` applies it; a runtime with a fused rotary kernel reads the same angles from
per-position tables instead (its `Ops` subclass; tested equal in eager).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rope(NamedTuple):
    """Rotary embedding of one forward, one attention kind: cos, sin [1, T, 1, D] (see `rope_cos_sin`)."""
    cos: torch.Tensor
    sin: torch.Tensor


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
