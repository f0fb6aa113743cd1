"""The target model: one export-friendly nn.Module for the llama, gemma3 and gemma4 families.

Stateless per the KV contract (edge_spec/contract/kv.py): the caller passes the caches and per-kind masks,
the forward returns logits, final hidden states and the *new* K/V rows of every cached layer.
Parameter names mirror Hugging Face's, so checkpoints load with a plain `load_state_dict`.
"""

from __future__ import annotations

import contextlib

import functools

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.model.config import GEMMA4, GEMMA_FAMILIES, REUSE, STORE, ModelConfig
from edge_spec.contract.kv import FULL
from edge_spec.model.rope import TableRope, rope_cos_sin, rope_tables, rotate, rotate_heads


STATE = "state"  # marks a KV-sharing source whose cache lives in a program (`state` binding): see Attention._attend


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # [1, T, V] (T = 1 when last_only)
    hidden: torch.Tensor  # [1, T, H] final hidden states after the final norm (same T as logits)
    new_k: list[torch.Tensor]  # per cached layer, in cfg.cached_layers() order: [1, H_kv, T, D]
    new_v: list[torch.Tensor]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in fp32 (llama and gemma4 agree: no `1 + w` here; gemma3's `1 + w`
    is folded into the weight when its checkpoint loads: ModelConfig.norm_weight_offset).

    Written as a division (not x * rsqrt): onnxruntime fuses exactly this pattern into one
    SimplifiedLayerNormalization kernel (61 nodes x 6 ops -> 61 ops in SmolLM2's graph)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() / torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.type_as(x)


def packed_linear(*layers: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sibling projections of one input as one (weight [sum N, K], bias [sum N] or None): one MatMul + Split."""
    weight = torch.cat([m.weight.detach() for m in layers])
    bias = torch.cat([m.bias.detach() for m in layers]) if layers[0].bias is not None else None
    return weight, bias


def skip_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, norm: "RMSNorm") -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + delta), x + delta): a residual add and the norm after it. Under ONNX export one com.microsoft
    SkipSimplifiedLayerNormalization node (output 0 = normed, output 3 = the sum); delta None: norm(x), x."""
    if delta is None:
        return norm(x), x
    if torch.onnx.is_in_onnx_export() and norm.weight is not None:
        stat = (*x.shape[:-1], 1)
        outs = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::SkipSimplifiedLayerNormalization", (x, delta, norm.weight), {"epsilon": norm.eps},
            dtypes=(x.dtype,) * 4, shapes=(x.shape, stat, stat, x.shape), version=1)
        return outs[0], outs[3]
    s = x + delta
    return norm(s), s


def attend(q: torch.Tensor, ks: tuple, vs: tuple, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention over keys cat(ks) / values cat(vs), without building the concatenation.

    q: [B, H, T, D]; ks[i], vs[i]: [B, H_kv, S_i, D] (the cache, then the new rows);
    mask: [B or 1, 1, T, sum S_i] additive -> [B, T, H * D]. Grouped-query attention without copying
    K/V: query heads are folded to [B, H_kv, G, T, D]. (Runtimes use B = 1; training batches sequences.)
    Scoring the parts separately avoids copying the whole cache every step (eager and exported graphs).
    """
    b, h, t, d = q.shape
    h_kv = ks[0].shape[1]
    qg = q.reshape(b, h_kv, h // h_kv, t, d)
    scores = torch.cat([torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) for k in ks], dim=-1) * scale
    probs = torch.softmax(scores.float() + mask.unsqueeze(1), dim=-1).type_as(q)  # [B, H_kv, G, T, sum S_i]
    out, start = None, 0
    for v in vs:
        n = v.shape[2]
        part = torch.matmul(probs[..., start:start + n], v.unsqueeze(2))  # [B, H_kv, G, T, D]
        out = part if out is None else out + part
        start += n
    return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)


def attend_concat(q: torch.Tensor, ks: tuple, vs: tuple, mask: torch.Tensor, scale: float,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over cat(ks) / cat(vs) in 4-D tensors and the ops an accelerator compiler takes (MatMul, Concat,
    Add, Mul, Softmax, Reshape, Transpose: no scatter, tile, expand or 5-D view): the QNN graphs' form.

    q: [1, H, T, D]; ks[i], vs[i]: [1, H_kv, S_i, D] (the cache, then the new rows); mask: [1, 1, T, sum S_i]
    additive -> [1, T, H * D]. Query rows are group-major per KV head (row g*T + t: query head g at step t), the
    mask repeated by concatenation. Masked entries must be finite and low enough that exp() of them is 0 against
    the row's real scores (a quantized mask input has a calibrated range: edge_spec.runtimes.qnn_htp.MASK_FLOOR).
    `keep` [1, 1, T, sum S_i], 1 where the mask is 0 and 0 elsewhere (an input: exact 0 / 1 after quantization)
    makes what a masked slot holds unable to reach a row, whatever the kernels do with zeros: masked scores are
    zeroed before the mask is added, masked probabilities after the softmax, and each row's values are multiplied
    by its own keep before the value matmul (`masked_values`). Measured on the simulated HTP: without the keep,
    masked keys and values leaked ~2e-3 into visible rows' logits (its softmax leaves masked entries a small
    weight); with zero probabilities alone, masked values still leaked ~2e-3 through its P.V matmul (a verify
    row's masked slots hold the pass's later rows, so verify rows differed from decode steps); a keep computed in
    the graph from the mask was not exact enough."""
    b, h, t, d = q.shape
    h_kv = ks[0].shape[1]
    g = h // h_kv
    qg = q.reshape(b, h_kv, g * t, d)  # [1, H_kv, G*T, D]
    keys = torch.cat(ks, dim=2) if len(ks) > 1 else ks[0]  # [1, H_kv, S + T, D]
    values = torch.cat(vs, dim=2) if len(vs) > 1 else vs[0]
    grouped = torch.cat([mask] * g, dim=2) if g > 1 else mask  # [1, 1, G*T, S + T]
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale
    if keep is None:
        probs = torch.softmax(scores + grouped, dim=-1)
        out = torch.matmul(probs, values)  # [1, H_kv, G*T, D]
        return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)
    kept = torch.cat([keep] * g, dim=2) if g > 1 else keep
    probs = torch.softmax(scores * kept + grouped, dim=-1) * kept  # [1, H_kv, G*T, S]
    return masked_values(probs, values, keep, g)


def masked_values(probs: torch.Tensor, values: torch.Tensor, keep: torch.Tensor, g: int) -> torch.Tensor:
    """P.V with each row's masked values zeroed: probs [1, H_kv, G*T, S] (group-major rows), values [1, H_kv, S, D],
    keep [1, 1, T, S] -> [1, T, H * D]. A batched matmul per (KV head, step) over [H_kv, T, S, D] values: T times
    the values' size (SmolLM2, 256 slots, a pass of 9: 0.9 MB per layer at 16 bits)."""
    _, h_kv, rows, s = probs.shape
    t, d = rows // g, values.shape[-1]
    per_step = probs.reshape(h_kv, g, t, s).transpose(1, 2)  # [H_kv, T, G, S]
    zeroed = values.reshape(h_kv, 1, s, d) * keep.reshape(1, t, s, 1)  # [H_kv, T, S, D]
    out = torch.matmul(per_step, zeroed)  # [H_kv, T, G, D]
    return out.transpose(0, 1).reshape(1, t, h_kv * g * d)  # heads in order kv * G + g


def place_rows(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [1, H_kv, S, D] with the new rows [1, H_kv, T, D] in their slots, by data movement only: slot j takes
    row index[j] of cat(cache, new) (index [S] ints: j, or S + r where row r writes slot j). `write_rows` without a
    scatter (which the HTP does not compile) and without arithmetic (which would rescale quantized values). The
    gather runs on axis 0 of a [S + T, H_kv * D] view: the QNN EP 2.7.0's HTP Gather on axis 2 of a 4-D tensor
    returns garbage (measured: 3.9 off the CPU provider on the same QDQ graph; axis 0: 1e-3)."""
    both = torch.cat([cache, new], dim=2)  # [1, H_kv, S + T, D]
    _, h, n, d = both.shape
    picked = both.transpose(1, 2).reshape(n, h * d).index_select(0, index.long())  # [S, H_kv * D]
    return picked.reshape(1, -1, h, d).transpose(1, 2)  # [1, H_kv, S, D]


def slot_mask(mask: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Fold the new-row columns of a mask into the slots those rows take: [1, 1, T, S + T] -> [1, 1, T, S].

    slots: [T] (full attention: slot == position). The slots' own cache columns are masked (empty) already.
    """
    t = slots.shape[0]
    s = mask.shape[-1] - t
    return mask[..., :s].scatter(-1, slots.view(1, 1, 1, t).expand(1, 1, t, t), mask[..., s:])


def write_rows(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache [1, H_kv, S, D] with rows [1, H_kv, T, D] written to slots [T] (out of place: a graph input stays read-only)."""
    index = slots.view(1, 1, -1, 1).expand(rows.shape)
    return cache.scatter(2, index, rows)


def group_mask(mask: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, 1, T, S] additive mask -> (additive, keep) [1, 1, G*T, S] for query rows laid out group-major
    (row g*T + t is query head g of a KV head at step t), as `attend_slots` scores them. Built once per forward
    and group count, so no layer reshapes its scores to broadcast the mask."""
    tiled = mask.repeat(1, 1, groups, 1)
    return tiled, tiled == 0


def attend_slots(q: torch.Tensor, k_cache: torch.Tensor, k_new: torch.Tensor, slots: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor, keep: torch.Tensor, scale: float, pad_keys: bool = True) -> torch.Tensor:
    """Batch-invariant attention: row t of the output is bit-identical whatever T is (decode T=1 == verify T=k+1).

    q: [1, H, T, D]; k_cache: [1, H_kv, S, D] as bound (the new rows' slots hold stale values); k_new: [1, H_kv, T, D],
    the new rows, which belong in `slots` [T], or None when k_cache already holds them there (the `state` binding:
    the program wrote them into its cache buffers first); v: [1, H_kv, S, D] with the new rows already in their slots
    (`write_rows`); mask, keep: [1, 1, G*T, S] (`group_mask` of the [1, 1, T, S] mask, G = H / H_kv) -> [1, T, H * D].
    Why (measured, docs/architecture.md "Exactness of quantized bundles"): every key's score and every value sits
    in the same column in both cases (no cache-part / new-part split of the value sum, which would run in another
    order), the matmuls always have >= 2 rows (a 1-row matmul takes another CPU kernel with another summation
    order), masked probabilities are exact zeros, and extra masked columns at the end only add zeros. The new
    keys' scores are computed apart and written into their slots' columns (a score is one dot product over D
    whichever matmul computes it), so only the small score matrix is copied per layer, not the K cache. For the
    same reason the new keys' scores must not be a single-column matmul at T = 1 (onnxruntime takes a
    matrix-vector kernel for an untransposed [D, 1] operand: measured on Gemma-4, ~4e-7 in fp32): `pad_keys`
    appends a zero key. The packed-qkv path (llama family, `use_fused_ops`) passes False: its head-major keys
    reach the matmul as a transposed operand (FusedMatMul transB), which keeps the blocked kernel (tested bit for
    bit; the pad cost ~1% of int8 decode there).
    """
    b, h, t, d = q.shape
    h_kv = k_cache.shape[1]
    g = h // h_kv
    pad = g == 1  # one query head per KV head: add a zero row so that T = 1 still runs a >= 2-row matmul
    qg = q.reshape(b, h_kv, g * t, d)  # [1, H_kv, G*T, D]
    if pad:
        qg = torch.cat([qg, torch.zeros_like(qg[:, :, :1])], dim=2)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)) * scale  # [1, H_kv, G*T (+1), S]
    if k_new is None:  # `state` binding: the cache already holds the new keys in their slots
        scores = scores[:, :, :g * t]
    elif pad_keys:  # [1, H_kv, T + 1, D]: >= 2 columns, the extra one dropped again
        k_pad = torch.cat([k_new, torch.zeros_like(k_new[:, :, :1])], dim=2)
        new_scores = (torch.matmul(qg, k_pad.transpose(-1, -2)) * scale)[..., :t]  # [1, H_kv, G*T (+1), T]
    else:
        new_scores = torch.matmul(qg, k_new.transpose(-1, -2)) * scale  # [1, H_kv, G*T (+1), T]
    if k_new is not None:
        index = slots.view(1, 1, 1, t).expand(new_scores.shape)
        scores = scores.scatter(-1, index, new_scores)[:, :, :g * t]  # [1, H_kv, G*T, S]
    probs = torch.where(keep, torch.softmax(scores.float() + mask, dim=-1), 0.0).type_as(q)  # [1, H_kv, G*T, S]
    if pad:
        probs = torch.cat([probs, torch.zeros_like(probs[:, :, :1])], dim=2)
    out = torch.matmul(probs, v)[:, :, :g * t]  # [1, H_kv, G*T, D]
    return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.kind = cfg.layer_kinds[layer]
        self.head_dim = d = cfg.head_dims[layer]
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else d ** -0.5
        self.reuses_kv = cfg.kv_sharing[layer] == REUSE
        self.stores_kv = cfg.kv_sharing[layer] == STORE
        self.gemma = cfg.family in GEMMA_FAMILIES
        kv_out = cfg.kv_heads[layer] * d
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.qkv = None  # (weight, bias) of q/k/v packed (`Transformer.use_fused_ops`, llama family)
        self.concat = False  # `attend_concat` / `place_rows` instead of `attend` (QNN graphs: exporters/static.fixed_models)
        self.head_counts = (cfg.num_heads, cfg.kv_heads[layer], cfg.kv_heads[layer])
        if self.gemma:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        if not self.reuses_kv:
            self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
            k_eq_v = cfg.attention_k_eq_v and self.kind != "sliding"
            self.v_proj = None if k_eq_v else nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
            if self.gemma:
                self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
            # Gemma-4 normalises values too (no scale); Gemma-3 does not
            self.v_norm = RMSNorm(d, cfg.rms_norm_eps, with_scale=False) if cfg.family == GEMMA4 else None

    def forward(self, x, rope, mask, k_cache, v_cache, shared: dict, slots: torch.Tensor | None = None, write=None):
        """x: [1, T, H]; rope: Rope | TableRope (`rotate`); k_cache/v_cache: [1, H_kv, S, D] or None for a
        KV-reusing layer.

        slots: [T] slots of the new rows when attention runs batch-invariant (`attend_slots`; `mask` is then
        the (additive, keep) pair of `group_mask`), else None (split cache / new-row attention, mask
        [1, 1, T, S + T]).
        write: the `state` binding's cache writer (`Transformer.forward`): writes this layer's new rows into its cache
        at `slots` and returns the cache views (k, v) to attend over; None: caches are inputs (`io` binding).
        Returns (out [1, T, H], new rows (k, v) [1, H_kv, T, D] or None).
        """
        b, t = x.shape[:2]
        d = self.head_dim
        if self.qkv is not None:  # one projection, heads split once, k and v come out head-major
            heads = F.linear(x, *self.qkv).view(b, t, -1, d).transpose(1, 2)  # [1, H + 2 H_kv, T, D]
            q, k, v = heads.split(self.head_counts, dim=1)
            return self._attend(rotate_heads(q, rope), rotate_heads(k, rope), v, mask, k_cache, v_cache, shared, slots,
                                write)
        q = self.q_proj(x)  # [1, T, H * D]
        if self.gemma:
            q = self.q_norm(q.view(b, t, -1, d)).view(b, t, -1)
        q = rotate(q, rope, d).view(b, t, -1, d).transpose(1, 2)  # [1, H, T, D]
        if self.reuses_kv:
            return self._attend(q, None, None, mask, k_cache, v_cache, shared, slots, write)
        k = self.k_proj(x)  # [1, T, H_kv * D]
        v = self.v_proj(x) if self.v_proj is not None else k
        if self.gemma:
            k = self.k_norm(k.view(b, t, -1, d)).view(b, t, -1)
        if self.v_norm is not None:
            v = self.v_norm(v.view(b, t, -1, d)).view(b, t, -1)
        k = rotate(k, rope, d).view(b, t, -1, d).transpose(1, 2)  # [1, H_kv, T, D]
        v = v.view(b, t, -1, d).transpose(1, 2)
        return self._attend(q, k, v, mask, k_cache, v_cache, shared, slots, write)

    def _attend(self, q, k, v, mask, k_cache, v_cache, shared: dict, slots, write=None):
        """q: [1, H, T, D]; k, v: this step's rows [1, H_kv, T, D] (None: a KV-reusing layer) -> (out, new rows).

        write: the `state` binding's attention over the program's own cache (`Transformer.forward`)."""
        new = None
        if self.reuses_kv:
            ks, vs = shared[self.kind]  # ((k parts), (v parts)) of the layer this one shares with
            if ks == STATE:  # the layer it shares with attends over a program buffer: the same buffer, no write
                return self.o_proj(vs(q, None, None, slots, mask, self.scale)), None
        else:
            new = (k, v)
            if write is not None:  # `state`: the hook writes the new rows into its cache buffer and attends over it
                if self.stores_kv:
                    shared[self.kind] = (STATE, write)
                return self.o_proj(write(q, k, v, slots, mask, self.scale)), new
            if slots is not None:  # keys: the cache + the new rows (scored apart); values: new rows in their slots
                ks, vs = (k_cache, k), (write_rows(v_cache, v, slots),)
            else:
                ks, vs = (k_cache, k), (v_cache, v)  # keys = cache slots [S] then new rows [T]
            if self.stores_kv:
                shared[self.kind] = (ks, vs)
        if slots is not None:
            out = attend_slots(q, ks[0], ks[1], slots, vs[0], *mask, self.scale, pad_keys=self.qkv is None)
            return self.o_proj(out), new
        if self.concat:
            mask, keep, index = mask if isinstance(mask, tuple) else (mask, None, None)
            if index is not None and new is not None:  # the new rows go into their slots: S columns, fixed positions
                ks, vs = (place_rows(ks[0], ks[1], index),), (place_rows(vs[0], vs[1], index),)
                if self.stores_kv:
                    shared[self.kind] = (ks, vs)
            return self.o_proj(attend_concat(q, ks, vs, mask, self.scale, keep)), new
        return self.o_proj(attend(q, ks, vs, mask, self.scale)), new


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (Gemma's activation)."""
    return F.gelu(x, approximate="tanh")


def gelu_tanh_spelled(x: torch.Tensor) -> torch.Tensor:
    """The same function written out. ExecuTorch's XNNPACK lowering turns F.gelu(approximate="tanh") into the exact
    (erf) GELU (measured up to 4.7e-4 apart on N(0, 9) inputs), and coremltools 9.0 drops the `approximate` keyword
    of torch.export's gelu node (exact GELU again: Gemma-4 hidden states 1e-3 off), so those exporters swap this in."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@contextlib.contextmanager
def spelled_gelu(*modules: nn.Module):
    """Every `gelu` attribute that is `gelu_tanh` inside `modules` set to `gelu_tanh_spelled` for the block."""
    swapped = [m for root in modules for m in root.modules() if getattr(m, "gelu", None) is gelu_tanh]
    for m in swapped:
        m.gelu = gelu_tanh_spelled
    try:
        yield
    finally:
        for m in swapped:
            m.gelu = gelu_tanh


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = act
        self.gelu = gelu_tanh  # the activation's implementation (exporters may swap in an equivalent form)
        self.gate_up = None  # (weight, bias) of gate/up packed (`Transformer.use_fused_ops`)

    def forward(self, x):
        if self.gate_up is not None:
            g, u = F.linear(x, *self.gate_up).split(self.down_proj.in_features, dim=-1)
        else:
            g, u = self.gate_proj(x), self.up_proj(x)
        g = F.silu(g) if self.act == "silu" else self.gelu(g)
        return self.down_proj(g * u)


class Router(nn.Module):
    """Gemma-4 MoE router: top-k experts per token, weights renormalised then scaled per expert."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.top_k = cfg.top_k_experts
        self.root = cfg.hidden_size ** -0.5

    def forward(self, x):  # x: [N, H] -> dense expert weights [N, E] (zero outside the top-k)
        probs = torch.softmax(self.proj(self.norm(x) * self.scale * self.root).float(), dim=-1)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True) * self.per_expert_scale[top_i]
        return torch.zeros_like(probs).scatter(-1, top_i, top_w)


class Experts(nn.Module):
    """All experts evaluated densely and mixed by the router's (mostly zero) weights: static shapes."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e, h, m = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * m, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, m))
        self.gelu = gelu_tanh

    def forward(self, x, weights):  # x: [N, H], weights: [N, E] -> [N, H]
        gate, up = torch.einsum("nh,emh->enm", x, self.gate_up_proj).chunk(2, dim=-1)
        y = torch.einsum("enm,ehm->enh", self.gelu(gate) * up, self.down_proj)
        return torch.einsum("enh,ne->nh", y, weights.to(y.dtype))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.gemma = cfg.family in GEMMA_FAMILIES
        eps = cfg.rms_norm_eps
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_sizes[layer], cfg.hidden_act, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        if not self.gemma:
            return
        # Gemma "sandwich" norms; Gemma-4 only: optional MoE branch, per-layer input, per-layer output scalar
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.register_buffer("layer_scalar", torch.ones(1) if cfg.family == GEMMA4 else None)
        self.moe = cfg.num_experts > 0
        if self.moe:
            self.router = Router(cfg)
            self.experts = Experts(cfg)
            self.post_feedforward_layernorm_1 = RMSNorm(cfg.hidden_size, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(cfg.hidden_size, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(cfg.hidden_size, eps)
        self.ple = cfg.per_layer_input_size > 0
        self.gelu = gelu_tanh
        if self.ple:
            self.per_layer_input_gate = nn.Linear(cfg.hidden_size, cfg.per_layer_input_size, bias=False)
            self.per_layer_projection = nn.Linear(cfg.per_layer_input_size, cfg.hidden_size, bias=False)
            self.post_per_layer_input_norm = RMSNorm(cfg.hidden_size, eps)

    def forward_pending(self, x, delta, rope, mask, k_cache, v_cache, shared, slots=None, write=None):
        """The llama block with each residual add folded into the norm after it (`skip_rms_norm`, exported as one
        fused node): x is the residual stream *before* the previous block's MLP output `delta` (None for the first
        block) is added. Returns (x, this block's MLP output, new rows): the stream after the block is x + delta."""
        h, x = skip_rms_norm(x, delta, self.input_layernorm)
        attn, new = self.self_attn(h, rope, mask, k_cache, v_cache, shared, slots, write)
        h, x = skip_rms_norm(x, attn, self.post_attention_layernorm)
        return x, self.mlp(h), new

    def forward(self, x, rope, mask, k_cache, v_cache, shared, per_layer_input, slots=None, write=None):
        attn, new = self.self_attn(self.input_layernorm(x), rope, mask, k_cache, v_cache, shared, slots, write)
        if not self.gemma:
            x = x + attn
            return x + self.mlp(self.post_attention_layernorm(x)), new
        x = x + self.post_attention_layernorm(attn)
        y = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:
            flat = x.reshape(-1, x.shape[-1])  # the router reads the pre-MLP residual stream
            experts = self.experts(self.pre_feedforward_layernorm_2(flat), self.router(flat)).reshape(x.shape)
            y = self.post_feedforward_layernorm_1(y) + self.post_feedforward_layernorm_2(experts)
        x = x + self.post_feedforward_layernorm(y)
        if self.ple:
            g = self.gelu(self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return (x if self.layer_scalar is None else x * self.layer_scalar), new


class Backbone(nn.Module):
    """Named `model` inside Transformer so parameter names match Hugging Face checkpoints."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.per_layer_input_size:
            n, p = cfg.num_layers, cfg.per_layer_input_size
            self.embed_tokens_per_layer = nn.Embedding(cfg.per_layer_vocab_size, n * p)
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, n * p, bias=False)
            self.per_layer_projection_norm = RMSNorm(p, cfg.rms_norm_eps)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.cached_layers = cfg.cached_layers()
        for kind, spec in cfg.rope.items():
            self.register_buffer(f"inv_freq_{kind}", torch.from_numpy(spec.inv_freq()), persistent=False)
        self.embed_scale = cfg.hidden_size ** 0.5 if cfg.family in GEMMA_FAMILIES else 1.0
        # Batch-invariant attention (attend_slots): exported graphs turn it on so that a verify pass reproduces
        # decode steps bit for bit; eager training / the torch runtime keep the split form. Full layers keep
        # position p in slot p; sliding layers in slot p % sliding_ring (the layout's ring size: it must hold
        # W + T - 1 keys for every forward of T tokens, `kv.ring_slots`), or keep the split form when None.
        self.slot_attention = False
        self.sliding_ring: int | None = None
        # onnxruntime's fused kernels (`use_fused_ops`): kind -> rope tables (cos, sin) [max_context, D/2], or None
        self.rope_tables: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    def use_fused_ops(self, max_context: int | None) -> None:
        """Forward through the forms that export to onnxruntime's fused kernels (dynamo exporter only):
        RotaryEmbedding over rope tables of `max_context` rows (`rotate`, `TableRope`); gate/up packed into one
        projection; and for the llama family q/k/v packed into one projection whose heads are split once
        (`rotate_heads` on the 4-D heads) and SkipSimplifiedLayerNormalization for every residual add + the norm
        after it (`Block.forward_pending`). Same maths in eager (tested); SmolLM2's int8 graph goes from ~46 to
        ~26 nodes per layer. None turns it off."""
        for block in self.model.layers:
            attn = block.self_attn
            llama = not attn.gemma and not attn.reuses_kv
            attn.qkv = packed_linear(attn.q_proj, attn.k_proj, attn.v_proj) if max_context and llama else None
            block.mlp.gate_up = packed_linear(block.mlp.gate_proj, block.mlp.up_proj) if max_context else None
        if max_context is None:
            self.rope_tables = None
            return
        self.rope_tables = {kind: rope_tables(getattr(self, f"inv_freq_{kind}"), max_context) for kind in self.cfg.rope}

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [1, T] -> the scaled input embeddings [1, T, H] (what the drafter also reads)."""
        return self.model.embed_tokens(input_ids) * self.embed_scale

    def per_layer_inputs(self, input_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Gemma-4 per-layer inputs: [1, T, L, P] = (context projection + token table) / sqrt(2)."""
        n, p = self.cfg.num_layers, self.cfg.per_layer_input_size
        table = self.model.embed_tokens_per_layer(input_ids) * p ** 0.5
        proj = self.model.per_layer_model_projection(x) * self.cfg.hidden_size ** -0.5
        proj = self.model.per_layer_projection_norm(proj.reshape(*x.shape[:-1], n, p))
        return (proj + table.reshape(*x.shape[:-1], n, p)) * 2 ** -0.5

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks: dict[str, torch.Tensor],
                k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], last_only: bool = False,
                with_logits: bool = True, write=None) -> ModelOutput:
        """input_ids, position_ids: [1, T]; masks: kind -> [1, 1, T, S_kind + T];
        k_caches[i], v_caches[i]: [1, H_kv, S, D] for cached layer i (cfg.cached_layers() order).

        write(i, q, k_new, v_new, slots, mask, scale) -> out [1, T, H * D]: the `state` binding (slot attention only):
        cached layer i's attention over the program's own cache: it writes the new rows [1, H_kv, T, D] (None from a
        KV-sharing layer, which reads its source's cache) at `slots` and attends q [1, H, T, D] over the cache with
        `mask` (group_mask's (additive, keep) pair); k_caches / v_caches are unused (pass empty lists)."""
        x = self.embed(input_ids)  # [1, T, H]
        ple = self.per_layer_inputs(input_ids, x) if self.cfg.per_layer_input_size else None
        if self.rope_tables is not None:
            rope = {kind: TableRope(*self.rope_tables[kind], position_ids) for kind in self.cfg.rope}
        else:
            rope = {kind: rope_cos_sin(position_ids, getattr(self, f"inv_freq_{kind}")) for kind in self.cfg.rope}
        slots = {kind: None for kind in masks}  # kind -> [T] slots of the new rows (slot attention) or None
        if self.slot_attention:
            for kind in masks:
                if kind == FULL:
                    slots[kind] = position_ids[0]
                elif self.sliding_ring is not None:
                    slots[kind] = position_ids[0] % self.sliding_ring
            masks = {kind: m if slots[kind] is None else slot_mask(m, slots[kind]) for kind, m in masks.items()}
        grouped = {}  # (kind, group count) -> group_mask of that kind's [1, 1, T, S] mask (slot attention)
        cache_index = {layer: i for i, layer in enumerate(self.cached_layers)}
        shared: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        new_k, new_v = [], []
        pending = self.rope_tables is not None and self.cfg.family not in GEMMA_FAMILIES
        delta = None  # pending: the last block's MLP output, added to x by the next norm
        for layer, block in enumerate(self.model.layers):
            kind = self.cfg.layer_kinds[layer]
            i = cache_index.get(layer)
            mask = masks[kind]
            if slots[kind] is not None:
                key = (kind, self.cfg.num_heads // self.cfg.kv_heads[layer])
                if key not in grouped:
                    grouped[key] = group_mask(mask, key[1])
                mask = grouped[key]
            caches = (k_caches[i], v_caches[i]) if i is not None and write is None else (None, None)
            writer = functools.partial(write, i) if write is not None and i is not None else None
            if pending:
                x, delta, new = block.forward_pending(x, delta, rope[kind], mask, *caches, shared, slots[kind], writer)
            else:
                x, new = block(x, rope[kind], mask, *caches, shared, ple[:, :, layer] if ple is not None else None,
                               slots[kind], writer)
            if new is not None:
                new_k.append(new[0])
                new_v.append(new[1])
        if last_only:
            x, delta = x[:, -1:], delta[:, -1:] if delta is not None else None
        hidden, _ = skip_rms_norm(x, delta, self.model.norm)
        if not with_logits:  # teacher passes that only need hidden states / K/V
            return ModelOutput(hidden[..., :0], hidden, new_k, new_v)
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return ModelOutput(logits, hidden, new_k, new_v)
