"""exporters/grid_fit.py (pure NumPy) and the ExecuTorch native int4 grid built on it (exporters/executorch_quant.
symmetric_linear): bf16 rounding, the symmetric fit's codes and scales, never worse than the unclipped grid, and the
bias correction's claim (the expected output at the calibration mean is kept)."""

from __future__ import annotations

import numpy as np
import torch

from edge_spec.exporters import grid_fit


def test_to_bf16_rounds_as_torch_does():
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.normal(size=4096).astype(np.float32) * 10.0 ** rng.integers(-8, 8, 4096),
                        np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, 0.0])])  # ties: to even both ways
    want = torch.from_numpy(a).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(grid_fit.to_bf16(a), want)


def _error(wt, scale, codes, mean, var):
    return grid_fit.expected_error(codes * scale[..., None] - wt, mean[None], var[None])


def test_symmetric_fit_keeps_bf16_scales_and_codes_in_range_and_never_loses_to_the_unclipped_grid():
    """Codes in [-8, 7], scales bf16 values; per block, the expected output error is no larger than the unclipped
    round-to-nearest grid's (a candidate: the smallest scale holding the block, bf16-rounded), and on blocks fed
    by activations with a large mean it is clearly smaller in total."""
    rng = np.random.default_rng(1)
    n, kb, block = 24, 6, 32
    lo, d = rng.normal(size=(n, kb, 1)) * 0.1, rng.uniform(0.005, 0.02, (n, kb, 1))
    wt = (lo + d * rng.integers(0, 16, (n, kb, block))).astype(np.float32)  # Q4_1-like blocks
    mean = rng.normal(size=(kb, block)) * 3 + 2
    var = rng.uniform(0.5, 2, (kb, block))
    scale, codes = grid_fit.fit_symmetric_grid(wt, mean, var)
    assert scale.shape == (n, kb) and codes.shape == wt.shape and codes.dtype == np.int8
    assert codes.min() >= -8 and codes.max() <= 7
    np.testing.assert_array_equal(grid_fit.to_bf16(scale), scale)
    lo_, hi_ = np.minimum(wt.min(-1), 0), np.maximum(wt.max(-1), 0)
    base = grid_fit.to_bf16(np.maximum(-lo_ / 8, hi_ / 7).astype(np.float32))
    base_codes = np.clip(np.rint(wt / base[..., None]), -8, 7)
    fitted, plain = _error(wt, scale, codes, mean, var), _error(wt, base, base_codes, mean, var)
    assert (fitted <= plain * (1 + 1e-5)).all()
    assert fitted.sum() < 0.8 * plain.sum()


def test_native_linear_keeps_the_expected_output_at_the_calibration_mean():
    """symmetric_linear with statistics: its dequantized weight plus the bias correction gives W @ mean exactly (to
    fp32 rounding); without the correction it does not."""
    from edge_spec.exporters.executorch_quant import symmetric_linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 16, bias=True)
    mean = np.random.default_rng(2).normal(size=64) * 2 + 1
    stats = (mean, mean * mean + 1.0)
    want = linear.weight.detach().double().numpy() @ mean + linear.bias.detach().double().numpy()
    for correct in (True, False):
        q = symmetric_linear(linear, stats, bias_correction=correct)
        w = q.weight
        deq = (w.qdata.double().reshape(16, 2, 32) * w.scale.double()[..., None]).reshape(16, 64).numpy()
        got = deq @ mean + q.bias.detach().double().numpy()
        if correct:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        else:
            assert np.abs(got - want).max() > 1e-3
