"""Block-wise int grids fitted to the layer inputs' statistics, for every exporter that quantizes weights in blocks
(the ONNX exporter's MatMulNBits, the ExecuTorch exporter's XNNPACK int4 Linears). Pure NumPy.

A block is one output column's `B` consecutive weights along the input; its grid is a scale and an integer zero
point z (codes q in [0, 2^bits), w ~= (q - z) * scale). The fit tries scales around the round-to-nearest one and
keeps, per block, the grid whose rounding error e has the least expected output error

    E[(x . e)^2] ~= sum_i var_i e_i^2 + (sum_i mean_i e_i)^2

(diagonal covariance plus the mean: a grid that shifts a whole block one way is charged for the block's mean
activation times that shift). The statistics come from exporters/calibration.linear_input_stats.

    fit_zero_point_grid   z free per block (onnxruntime's native int4 / int8 grid)
    fit_symmetric_grid    z = 2^(bits-1) fixed (XNNPACK's qb4w: codes -8..7 times a scale), the scales rounded to
                          what the kernel stores (bf16 for XNNPACK)
"""

from __future__ import annotations

from typing import Callable

import numpy as np

SCALE_STEPS = np.linspace(0.85, 1.15, 13)  # the fit's scales, x the round-to-nearest one
ZERO_STEPS = (-1, 0, 1)  # ... and zero points around each scale's nearest one (zero-point grids)
FIT_ROWS = 4096  # output columns fitted at once (memory: ~ rows x K x 4 bytes per temporary)


def expected_error(e: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """e [rows, kb, B] rounding errors, mean / var [1, kb, B] -> [rows, kb]: E[(x . e)^2] per block."""
    return (var * e * e).sum(-1) + (mean * e).sum(-1) ** 2


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _search(wt: np.ndarray, mean: np.ndarray, var: np.ndarray, bits: int,
            grids: Callable[[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
    """The least-error grid per block among `grids(w)`'s candidates [(scale [rows, kb], zero [rows, kb])], the first
    candidate winning ties. wt [N, kb, B]; returns (scale [N, kb] float32, zero [N, kb] uint8)."""
    levels = 2 ** bits - 1
    v, mu = var[None].astype(np.float32), mean[None].astype(np.float32)  # [1, kb, B]
    best_scale = np.empty(wt.shape[:2], np.float32)
    best_zero = np.empty(wt.shape[:2], np.uint8)
    for r0 in range(0, wt.shape[0], FIT_ROWS):
        w = wt[r0:r0 + FIT_ROWS]
        cost = np.full(w.shape[:2], np.inf, np.float32)
        scale_out, zero_out = np.ones(w.shape[:2], np.float32), np.zeros(w.shape[:2], np.float32)
        for sc, z in grids(w):
            q = np.clip(np.rint(w / sc[..., None]) + z[..., None], 0, levels)
            c = expected_error((q - z[..., None]) * sc[..., None] - w, mu, v)
            better = c < cost
            cost = np.where(better, c, cost)
            scale_out = np.where(better, sc, scale_out)
            zero_out = np.where(better, z, zero_out)
        best_scale[r0:r0 + FIT_ROWS], best_zero[r0:r0 + FIT_ROWS] = scale_out, zero_out
    return best_scale, best_zero


def fit_zero_point_grid(wt: np.ndarray, mean: np.ndarray, var: np.ndarray, bits: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The zero-point grid per block that minimises the expected squared output error: wt [N, kb, B] (blocks of one
    output column), the input channels' mean and variance [kb, B]. Searches scale x SCALE_STEPS and zero point +
    ZERO_STEPS around round-to-nearest over [min(lo, 0), max(hi, 0)]. Returns (scale [N, kb] float32, zero point
    [N, kb] uint8)."""
    levels = 2 ** bits - 1

    def grids(w: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        lo, hi = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
        base = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
        out = []
        for f in SCALE_STEPS:
            sc = (base * np.float32(f)).astype(np.float32)
            z0 = np.rint(-lo / sc)
            out += [(sc, np.clip(z0 + dz, 0, levels).astype(np.float32)) for dz in ZERO_STEPS]
        return out

    return _search(wt, mean, var, bits, grids)


def fit_symmetric_grid(wt: np.ndarray, mean: np.ndarray, var: np.ndarray, bits: int = 4,
                       round_scale: Callable[[np.ndarray], np.ndarray] = to_bf16) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric grid per block (codes c in [-2^(bits-1), 2^(bits-1)), w ~= c * scale) that minimises the
    expected squared output error: wt [N, kb, B], mean / var [kb, B]. Searches scale x SCALE_STEPS around the
    smallest scale that holds the block unclipped (max(-lo / 2^(bits-1), hi / (2^(bits-1) - 1))), each rounded by
    `round_scale` (what the kernel stores) before it is scored. Returns (scale [N, kb] float32, codes [N, kb, B]
    int8)."""
    mid = 2 ** (bits - 1)

    def grids(w: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        lo, hi = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
        base = np.maximum(-lo / mid, hi / (mid - 1))
        base = np.where(base > 0, base, 1.0).astype(np.float32)
        zero = np.full(base.shape, mid, np.float32)
        return [(round_scale((base * np.float32(f)).astype(np.float32)), zero) for f in SCALE_STEPS]

    scale, _ = _search(wt, mean, var, bits, grids)
    codes = np.clip(np.rint(wt / scale[..., None]), -mid, mid - 1).astype(np.int8)
    return scale, codes
