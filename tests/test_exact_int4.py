"""edge_spec.exporters.exact_int4: Q4_1-grid weights (lo + d * q per block of 32) survive the symmetric-int4 + offset split
bit-exactly; torchao's own symmetric int4 does not (the negative control)."""

import torch

from edge_spec.exporters.exact_int4 import OffsetLinear, dequantize, q4_codes, swap_linears


def q4_1_grid(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random weights on a Q4_1 grid, as llama.cpp writes them: codes 0 and 15 in every block."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    d = torch.rand(n, k // 32, 1, generator=g) * 0.02 + 1e-3
    lo = -torch.rand(n, k // 32, 1, generator=g) * 0.1
    return (lo + d * q).reshape(n, k)


def test_q4_1_weights_round_trip_exactly():
    w = q4_1_grid(48, 96)
    codes, scales, offsets = q4_codes(w)
    assert codes.dtype == torch.int8 and int(codes.min()) == -8 and int(codes.max()) == 7
    torch.testing.assert_close(dequantize(codes, scales, offsets), w, rtol=0, atol=2e-7)


def test_offset_linear_weight_only_is_the_linear_and_torchao_symmetric_is_not():
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    linear = torch.nn.Linear(96, 48, bias=True)
    linear.weight.data = q4_1_grid(48, 96, seed=1)
    x = torch.randn(5, 96)
    with torch.no_grad():
        want = linear(x)
        ours = OffsetLinear(linear, weight_only=True)(x)
        torch.testing.assert_close(ours, want, rtol=0, atol=1e-5)
        symmetric = torch.nn.Sequential(torch.nn.Linear(96, 48))
        symmetric[0].load_state_dict(linear.state_dict())
        quantize_(symmetric, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
        assert (symmetric(x) - want).abs().max() > 100 * (ours - want).abs().max()


def test_swap_linears_replaces_only_what_it_is_told():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    assert swap_linears(model, lambda fqn, m: fqn == "0") == 1
    assert isinstance(model[0], OffsetLinear) and isinstance(model[2], torch.nn.Linear)
