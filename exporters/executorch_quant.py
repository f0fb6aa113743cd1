"""8da4w for the ExecuTorch program (exporters/executorch.py): every Linear as int8 dynamic activations x int4 weights,
and the vocabulary tables as integer codes read by ExecuTorch's own quantized embedding ops, so no vocabulary-sized
fp32 array is left in the .pte.

    TABLE_BITS 8: the output head an 8da8w Linear (int8 per row, XNNPACK qd8-f32-qc8w); the embedding and the
                  drafter's gathered rows read the head's codes and scales through quantized_decomposed::embedding_byte
    TABLE_BITS 4: codes q in [-8, 7], scales s and offsets o per block of 32 (edge_spec.exporters.exact_int4);
                  embedding_4bit (packed nibbles [V, H / 2], zero points -o / s) = (q - zp) * s ~= s * q + o, and
                  the head an 8da4w Linear of the same codes

The embedding ops are portable kernels of executorch's quantized library (`kernels_quantized`: the native runner
links it, the Python runtime registers it by importing executorch.kernels.quantized); XNNPACK does not take them,
so the table's codes are stored twice (the program's constant and XNNPACK's packed head).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edge_spec.errors import ExportError
from edge_spec.logs import IMPORT_NOISE, quiet

QUANT_GROUP = 32
Q_MIN, Q_MAX = -8, 7
# The vocabulary table's codes: 8 (the 8-bit head's own codes and scales; one copy per reader) or 4 (groups of 32,
# the head a 4-bit Linear of the same codes). SmolLM2-135M 8da4w, top-1 agreement with the fp32 .pte over the
# held-out everyday prompts (64 tokens) / bundle bytes / decode step (2 threads): fp32 table + 8-bit head (before)
# 0.902 / 225 MB / 24 ms; 8 0.909 / 141 MB / 24 ms; 4 0.833 / 124 MB / 12 ms (the 4-bit head costs the agreement:
# eager, 4-bit head 0.87 vs 8-bit 0.96-0.98).
TABLE_BITS = 8


def quantized_embedding_ops() -> None:
    """Register quantized_decomposed::embedding_byte / embedding_4bit with torch (tracing) and their ExecuTorch kernels
    (running)."""
    with quiet(*IMPORT_NOISE):
        import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401  (the torch op)
        import executorch.kernels.quantized  # noqa: F401  (the runtime kernels, Python bindings)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """codes [V, H] int8 in [-8, 7] -> [V, H / 2] uint8, column 2j in the high nibble (embedding_4bit's layout)."""
    v, h = codes.shape
    shifted = (codes.to(torch.int16) + 8).view(v, h // 2, 2)
    return (shifted[..., 0] * 16 + shifted[..., 1]).to(torch.uint8)


class QuantizedTable(nn.Module):
    """A [V, H] table as integer codes: `forward(ids)` is an embedding lookup; `index_select(0, ids)` and `@` read it
    as the fp32 table they replace (the drafter's head gathers rows: only those are dequantized).

    `from_int8(codes, scales)`: 8-bit codes with a scale per row, what the output head's 8da8w Linear holds
    (quantized_decomposed::embedding_byte); `from_table(table)`: 4-bit codes in groups of 32 with each block's min
    and max exact (embedding_4bit, zero points -offset / scale)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, bits: int):
        super().__init__()
        self.bits = bits
        self.register_buffer("codes", codes)  # [V, H] int8 (8-bit) | [V, H / 2] uint8 nibbles (4-bit)
        self.register_buffer("scales", scales)  # [V] (8-bit) | [V, H / 32] (4-bit), fp32
        self.register_buffer("zero_points", zero_points)  # None | [V, H / 32] fp32
        self.num_embeddings = codes.shape[0]

    @classmethod
    def from_int8(cls, codes: torch.Tensor, scales: torch.Tensor) -> "QuantizedTable":
        """codes [V, H] int8, scales [V] or [V, 1] fp32: w = codes * scales (symmetric per row)."""
        return cls(codes.contiguous(), scales.reshape(-1).float().contiguous(), None, 8)

    @classmethod
    def from_table(cls, table: torch.Tensor, group: int = QUANT_GROUP) -> "QuantizedTable":
        """table [V, H] fp32 -> 4-bit codes in groups of `group` (H % group == 0)."""
        from edge_spec.exporters.exact_int4 import q4_codes

        if table.shape[1] % group:
            raise ExportError(f"a table of width {table.shape[1]} does not split into groups of {group}",
                              "export with --quant fp32, or keep this table fp32 (`quantize_tables` skips it)")
        codes, scales, offsets = q4_codes(table.detach(), group)  # [V, H] int8, [V, H / group] x 2
        # fp32 both: the kernel takes zero points of its output's dtype, torch's reference op of the scales'
        return cls(pack_nibbles(codes), scales.contiguous(), (-offsets / scales).contiguous(), 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] int64 -> rows [..., H] fp32."""
        if self.bits == 8:
            return torch.ops.quantized_decomposed.embedding_byte.dtype(
                self.codes, self.scales, None, -128, 127, ids, dtype=torch.float32)
        return torch.ops.quantized_decomposed.embedding_4bit.dtype(
            self.codes, self.scales, self.zero_points, Q_MIN, Q_MAX, ids, dtype=torch.float32)

    def index_select(self, dim: int, ids: torch.Tensor) -> torch.Tensor:
        """ids [N] -> rows [N, H] fp32 (what `Tensor.index_select(0, ids)` gives on the fp32 table)."""
        if dim != 0:
            raise ExportError(f"a quantized table gathers rows only (dim 0), not dim {dim}",
                              "read the table by rows, or export with --quant fp32")
        return self(ids)

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        """table @ x, x [H] -> [V] (a dense head scoring every row: the whole table dequantized)."""
        return self(torch.arange(self.num_embeddings)) @ x


def int8_codes(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes [V, H] int8, scales [V, 1]) of a Linear quantized 8da8w per row (symmetric), else None."""
    w = getattr(linear, "weight", None)
    if type(w).__name__ != "IntxUnpackedToInt8Tensor" or w.qdata.dtype != torch.int8 or w.block_size[0] != 1 \
            or w.block_size[1] != w.qdata.shape[1] or bool(w.zero_point.any()):
        return None
    return w.qdata, w.scale


def quantize_tables(model: nn.Module, bits: int = TABLE_BITS, head: nn.Module | None = None,
                    tied: torch.Tensor | None = None, group: int = QUANT_GROUP) -> dict[int, QuantizedTable]:
    """Every nn.Embedding of `model` whose width splits into groups -> a QuantizedTable, in place: 8-bit with the
    codes and scales of the quantized output `head` when the embedding's weight is the head's (`tied`: the fp32
    weight they shared), else 8-bit per row / 4-bit in groups (`bits`) of its own. Returns the new modules keyed by
    id() of the fp32 weight each replaced."""
    made = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Embedding) or child.embedding_dim % group:
                continue
            key = id(child.weight)
            if key not in made:
                shared = int8_codes(head) if head is not None and child.weight is tied else None
                if shared is not None:
                    made[key] = QuantizedTable.from_int8(*shared)
                elif bits == 8:
                    made[key] = QuantizedTable.from_int8(*symmetric_int8(child.weight.detach()))
                else:
                    made[key] = QuantizedTable.from_table(child.weight, group)
            setattr(parent, name, made[key])
    return made


def symmetric_int8(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """table [V, H] fp32 -> (codes [V, H] int8 in [-127, 127], scales [V]) with table ~= codes * scales per row."""
    scales = table.abs().amax(1).clamp_min(1e-12) / 127
    return torch.round(table / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


def output_table(head: nn.Module, weight: torch.Tensor) -> QuantizedTable:
    """The table a drafter scoring with an untied quantized output `head` reads (`weight`: the fp32 [V, H])."""
    shared = int8_codes(head)
    return QuantizedTable.from_int8(*shared) if shared is not None else QuantizedTable.from_table(weight)


# the 8da4w grids (--quant 8da4w | 8da4w-gguf): XNNPACK's own symmetric int4 with scales fitted to the calibration
# prompts' activations, or the GGUF-exact split with its block-offset term (edge_spec.exporters.exact_int4)
GRID_NATIVE, GRID_GGUF = "native", "gguf"
PRECISION_GRIDS = {"8da4w": GRID_NATIVE, "8da4w-gguf": GRID_GGUF}


def symmetric_linear(linear: nn.Linear, stats: tuple[np.ndarray, np.ndarray] | None,
                     group: int = QUANT_GROUP, bias_correction: bool = True) -> nn.Linear:
    """`linear` as int8 per-token dynamic activations x symmetric int4 codes (-8..7) with a bf16 scale per block of
    `group` inputs (XNNPACK's qd8-f32-qb4w), each block's scale fitted (exporters/grid_fit.fit_symmetric_grid) to
    `stats` (its inputs' mean and mean square [K], exporters/calibration.linear_input_stats) or, without them, to
    plain squared error. With stats and `bias_correction`, the rounding's expected output shift (W - Q) @ mean is
    added to the bias (SmolLM2, eager, top-1 vs fp32 on held-out answers: everyday 0.740 -> 0.760, technical 0.827 ->
    0.827 with a smaller worst logit error; `scripts/et_quant_variants.py --variants native+head8 native_bias+head8`,
    docs/benchmarks.md "2026-12-06 (late)")."""
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
        IntxUnpackedToInt8Tensor, IntxUnpackedToInt8TensorActivationQuantization)

    from edge_spec.exporters.grid_fit import fit_symmetric_grid

    n, k = linear.weight.shape
    wt = linear.weight.detach().float().numpy().reshape(n, k // group, group)  # [N, kb, B]
    if stats is None:
        mean, var = np.zeros((k // group, group)), np.ones((k // group, group))
    else:
        mean = np.asarray(stats[0], np.float64).reshape(k // group, group)
        var = np.maximum(np.asarray(stats[1], np.float64).reshape(k // group, group) - mean * mean, 0)
    scales, codes = fit_symmetric_grid(wt, mean, var)  # [N, kb] fp32 (bf16 values), [N, kb, B] int8
    shift = None
    if bias_correction and stats is not None:  # the rounding's expected output shift, (W - Q) @ mean, as a bias
        deq = (codes.astype(np.float64) * scales[..., None]).reshape(n, k)
        shift = torch.from_numpy(((wt.reshape(n, k) - deq) @ mean.reshape(k)).astype(np.float32))
    out = nn.Linear(k, n, bias=linear.bias is not None or shift is not None)
    out.weight = nn.Parameter(IntxUnpackedToInt8Tensor(
        torch.from_numpy(codes.reshape(n, k)), torch.from_numpy(scales), torch.zeros(n, k // group, dtype=torch.int8),
        torch.int4, (1, group), torch.float32, IntxUnpackedToInt8TensorActivationQuantization.INT8_ASYM_PER_TOKEN),
        requires_grad=False)
    if out.bias is not None:
        bias = linear.bias.detach().clone() if linear.bias is not None else torch.zeros(n)
        out.bias = nn.Parameter(bias + (shift if shift is not None else 0), requires_grad=False)
    return out


def swap_symmetric(module: nn.Module, keep, stats: dict | None, group: int = QUANT_GROUP,
                   bias_correction: bool = True) -> int:
    """Replace every nn.Linear `keep(fqn, linear)` accepts by its `symmetric_linear`, in place, each fitted to the
    statistics `stats` holds for it (keyed by exporters/calibration.linear_key; none: plain squared error); returns
    how many."""
    from edge_spec.exporters.calibration import linear_key

    count = 0
    for parent_name, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, nn.Linear) and keep(fqn, child):
                found = (stats or {}).get(linear_key(child.weight.detach().float().numpy()))
                setattr(parent, name, symmetric_linear(child, found, group, bias_correction))
                count += 1
    return count


def quantize_8da4w(module: nn.Module, skip: tuple[str, ...] = (), head: str | None = None,
                   head_bits: int = TABLE_BITS, grid: str = GRID_NATIVE, stats: dict | None = None) -> None:
    """int8 per-token dynamic activations x int4 weights in groups of 32 on every Linear whose input width is a
    multiple of 32, in place, on one of two grids: `native` (XNNPACK's symmetric int4, each block's bf16 scale
    fitted to `stats`, `swap_symmetric`: no extra term) or `gguf` (codes that keep each block's min and max exact:
    symmetric int4 + an fp32 block-offset term, edge_spec.exporters.exact_int4; SmolLM2's Q4_1 codes come back
    bit-exact). The output head `head` gets the same 4-bit codes (`head_bits` 4, what its quantized table holds),
    or int8 weights per channel (`head_bits` 8, torchao 8da8w). Narrower Linears (tiny test models' per-layer
    inputs) stay fp32, and so do the modules named in `skip` (a drafter's lm_head, which its head reads as a table:
    gathered rows, not a Linear call; its centroid scorer, called on one vector, which XNNPACK's dynamic-quant
    lowering does not take)."""
    with quiet(*IMPORT_NOISE):
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerAxis

        from edge_spec.exporters.exact_int4 import swap_linears

    if grid not in (GRID_NATIVE, GRID_GGUF):
        raise ExportError(f"unknown 8da4w grid {grid!r}", f"use {GRID_NATIVE!r} or {GRID_GGUF!r}")

    def eligible(fqn: str, m: nn.Module) -> bool:
        return isinstance(m, nn.Linear) and m.in_features % QUANT_GROUP == 0 and fqn not in skip

    if head is not None and head_bits == 8:
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
        quantize_(module, config, filter_fn=lambda m, fqn: fqn == head and eligible(fqn, m))
    keep = lambda fqn, m: (fqn != head or head_bits == 4) and eligible(fqn, m)  # noqa: E731
    if grid == GRID_NATIVE:
        swap_symmetric(module, keep, stats, QUANT_GROUP)
    else:
        swap_linears(module, keep, QUANT_GROUP)
