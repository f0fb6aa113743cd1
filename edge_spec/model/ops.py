"""How the model computes rotary embeddings, projections and residual norms: `Ops`, plain eager PyTorch.

A runtime whose kernels fuse these pieces (one rotary node per tensor, packed projections, a residual add fused
with the norm after it) passes its own subclass to `Transformer.forward(ops=...)`, with the same maths in eager
(its exporter tests that), so the model itself names no runtime.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.model.rope import Rope, apply_rope, rope_cos_sin, rope_tables


def packed_linear(*layers: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sibling projections of one input as one (weight [sum N, K], bias [sum N] or None): one MatMul + Split."""
    weight = torch.cat([m.weight.detach() for m in layers])
    bias = torch.cat([m.bias.detach() for m in layers]) if layers[0].bias is not None else None
    return weight, bias


def project(packed, x: torch.Tensor) -> torch.Tensor:
    """x [.., K] through what `Ops.qkv` / `Ops.gate_up` returned: a packed (weight, bias) or a module (a packed
    Linear an exporter quantized as a module, `PackedModuleOps`) -> [.., sum N]."""
    return packed(x) if isinstance(packed, nn.Module) else F.linear(x, *packed)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (Gemma's activation)."""
    return F.gelu(x, approximate="tanh")


def gelu_tanh_spelled(x: torch.Tensor) -> torch.Tensor:
    """The same function written out, for exporters whose lowering turns the fused tanh GELU into the exact (erf)
    one (measured up to 4.7e-4 apart on N(0, 9) inputs; docs/architecture.md names the exporters)."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class Ops:
    fold_residuals = False  # llama blocks hand their MLP output to the next norm (`skip_norm`) instead of adding it

    def __init__(self, spelled_gelu: bool = False):
        self.spelled_gelu = spelled_gelu  # GELU as `gelu_tanh_spelled` (same values, no fused GELU op in the graph)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_spelled(x) if self.spelled_gelu else gelu_tanh(x)

    def rope(self, model: nn.Module, kind: str, position_ids: torch.Tensor):
        """The rotation of one forward for layers of `kind`: position_ids [1, T] -> what `rotate` takes."""
        return rope_cos_sin(position_ids, getattr(model, f"inv_freq_{kind}"))

    def rotate(self, x: torch.Tensor, rope: Rope, head_dim: int) -> torch.Tensor:
        """x: [1, T, N * D] (N heads of `head_dim`) -> rotated, same shape."""
        b, t, nd = x.shape
        return apply_rope(x.view(b, t, -1, head_dim), rope.cos, rope.sin).view(b, t, nd)

    def rotate_heads(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """x: [1, N, T, D] (heads first) -> rotated, same shape."""
        return apply_rope(x, rope.cos.transpose(1, 2), rope.sin.transpose(1, 2))

    def qkv(self, attn: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | nn.Module | None:
        """Packed (weight, bias) of the layer's q/k/v projections (or a module computing them), or None: three
        projections."""
        return None

    def fused_attention(self, attn: nn.Module, qkv: torch.Tensor, rope, i: int | None, caches: tuple):
        """One kernel for a packed-projection layer's rotary + attention + cache write, or None (the model's own).

        qkv: [1, T, (H + 2 H_kv) * D] unrotated; caches (k, v) [1, H_kv, S, D] -> (out [1, T, H * D], caches with
        the T new rows written at slot == position (the `shared` KV binding))."""
        return None

    def gate_up(self, mlp: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | nn.Module | None:
        """Packed (weight, bias) of the MLP's gate/up projections (or a module computing them), or None: two
        projections."""
        return None

    def skip_norm(self, x: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module):
        """(norm(x + delta), x + delta): a residual add and the norm after it; delta None: (norm(x), x)."""
        if delta is None:
            return norm(x), x
        s = x + delta
        return norm(s), s


PACKED_QKV, PACKED_GATE_UP = "packed_qkv", "packed_gate_up"  # the packed Linears' names on a layer (`pack_modules`)


class PackedModuleOps(Ops):
    """Sibling projections as the one packed nn.Linear `pack_modules` put on the layer, looked up at call time, so
    an exporter can quantize it as a module (ExecuTorch's 8da4w: one int4 GEMM per input instead of three / two, and
    8da4w-gguf one block-offset term)."""

    def qkv(self, attn):
        return getattr(attn, PACKED_QKV, None)

    def gate_up(self, mlp):
        return getattr(mlp, PACKED_GATE_UP, None)


def pack_modules(model: nn.Module) -> int:
    """In place on a model copy: each llama attention's q/k/v and each MLP's gate/up Linears -> one packed nn.Linear
    (`packed_linear`'s weight), the originals removed; what `PackedModuleOps` reads. qwen3 attention is packed too
    (its per-head q/k norms run on the packed output: Attention.norm_packed); Gemma attention and layers reusing
    another's KV keep theirs. Returns the packs made."""
    count = 0
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        pairs = []
        if not attn.gemma and not attn.reuses_kv and attn.v_proj is not None:
            pairs.append((attn, PACKED_QKV, ("q_proj", "k_proj", "v_proj")))
        if all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj")):
            pairs.append((mlp, PACKED_GATE_UP, ("gate_proj", "up_proj")))
        for owner, name, parts in pairs:
            weight, bias = packed_linear(*(getattr(owner, n) for n in parts))
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            linear.weight = nn.Parameter(weight, requires_grad=False)
            if bias is not None:
                linear.bias = nn.Parameter(bias, requires_grad=False)
            setattr(owner, name, linear)
            for n in parts:
                delattr(owner, n)
            count += 1
    return count


class TableRopeOps(Ops):
    """Rotary cos / sin read from per-position tables (`rope_tables`, constants of `rows` rows, built once per module
    and kind from its inv_freq) by position_ids, instead of computed as cos(position x inv_freq). Same values (the
    tables compute it the same way). For quantized graphs (exporters/qnn): computed, the angles are an activation
    whose range is the largest position calibration saw, so positions past it clip and every later token is rotated
    wrong; the tables' rows are quantized in [-1, 1] whatever the position."""

    def __init__(self, rows: int, spelled_gelu: bool = True):
        super().__init__(spelled_gelu)
        self.rows, self.tables = rows, {}

    def rope(self, model: nn.Module, kind: str, position_ids: torch.Tensor):
        key = (id(model), kind)
        if key not in self.tables:
            self.tables[key] = rope_tables(getattr(model, f"inv_freq_{kind}"), self.rows)  # [rows, D/2] each
        cos, sin = (torch.cat([t[position_ids], t[position_ids]], dim=-1)[:, :, None, :] for t in self.tables[key])
        return Rope(cos, sin)  # [1, T, 1, D]


EAGER = Ops()
SPELLED_GELU = Ops(spelled_gelu=True)
PACKED_SPELLED_GELU = PackedModuleOps(spelled_gelu=True)
