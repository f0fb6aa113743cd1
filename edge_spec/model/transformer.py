"""The target model: one export-friendly nn.Module for the llama, qwen3, gemma3 and gemma4 families.

Stateless per the KV contract (edge_spec/contract/kv.py): the caller passes the caches and per-kind masks,
the forward returns logits, final hidden states and the *new* K/V rows of every cached layer.
Parameter names mirror Hugging Face's, so checkpoints load with a plain `load_state_dict`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from edge_spec.model.config import GEMMA4, GEMMA_FAMILIES, QK_NORM_FAMILIES, REUSE, STORE, ModelConfig
from edge_spec.model.forms import SPLIT, Form, Pass
from edge_spec.model.ops import EAGER, Ops, project


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # [1, T, V] (T = 1 when last_only)
    hidden: torch.Tensor  # [1, T, H] final hidden states after the final norm (same T as logits)
    new_k: list[torch.Tensor]  # per cached layer, in cfg.cached_layers() order: [1, H_kv, T, D] (a fused-attention
    #                            Ops: the written caches [1, H_kv, S, D], Ops.fused_attention)
    new_v: list[torch.Tensor]
    # [1, T, n * H] when forward is given aux_layers (an EAGLE-3 drafter's input, edge_spec/model/eagle3.py): the
    # residual stream entering each of those layers (id num_layers: leaving the last one, before the final norm),
    # concatenated in their order, for every row even when last_only; None otherwise
    aux: torch.Tensor | None = None


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in fp32 (llama, qwen3 and gemma4 agree: no `1 + w` here; gemma3's `1 + w`
    is folded into the weight when its checkpoint loads: ModelConfig.norm_weight_offset).

    Written as a division (not x * rsqrt): the pattern runtimes' graph optimizers fuse into one normalization
    kernel (61 nodes x 6 ops -> 61 ops in SmolLM2's ONNX graph)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() / torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.kind = cfg.layer_kinds[layer]
        self.head_dim = d = cfg.head_dims[layer]
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else d ** -0.5
        self.reuses_kv = cfg.kv_sharing[layer] == REUSE
        self.stores_kv = cfg.kv_sharing[layer] == STORE
        self.gemma = cfg.family in GEMMA_FAMILIES
        self.qk_norm = cfg.family in QK_NORM_FAMILIES  # per-head RMSNorm of q and k between projection and rotation
        kv_out = cfg.kv_heads[layer] * d
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.head_counts = (cfg.num_heads, cfg.kv_heads[layer], cfg.kv_heads[layer])
        if self.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        if not self.reuses_kv:
            self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
            k_eq_v = cfg.attention_k_eq_v and self.kind != "sliding"
            self.v_proj = None if k_eq_v else nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
            if self.qk_norm:
                self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
            # Gemma-4 normalises values too (no scale); Gemma-3 does not
            self.v_norm = RMSNorm(d, cfg.rms_norm_eps, with_scale=False) if cfg.family == GEMMA4 else None

    def forward(self, x, rope, run: Pass, ops: Ops, i: int | None, caches: tuple):
        """x: [1, T, H]; rope: what `ops.rotate` takes; run: this forward's attention form and masks; i: this layer's
        cache index (None: none); caches: (k, v) [1, H_kv, S, D] or (None, None).
        Returns (out [1, T, H], new rows (k, v) [1, H_kv, T, D] or None)."""
        b, t = x.shape[:2]
        d = self.head_dim
        packed = ops.qkv(self)
        if packed is not None:  # one projection, heads split once, k and v come out head-major
            qkv = project(packed, x)  # [1, T, (H + 2 H_kv) * D]
            if self.qk_norm:  # qwen3 (gemma layers are never packed): normed before any kernel rotates them
                qkv = self.norm_packed(qkv)
            fused = ops.fused_attention(self, qkv, rope, i, caches)
            if fused is not None:  # a runtime kernel that rotates, attends and writes the caches (Ops.fused_attention)
                return self.o_proj(fused[0]), fused[1]
            heads = qkv.view(b, t, -1, d).transpose(1, 2)  # [1, H + 2 H_kv, T, D]
            q, k, v = heads.split(self.head_counts, dim=1)
            # head-major keys reach the score matmul transposed: no zero key needed (attention.attend_slots)
            out, new = run.attend(self, i, ops.rotate_heads(q, rope), ops.rotate_heads(k, rope), v, caches, False)
            return self.o_proj(out), new
        q = self.q_proj(x)  # [1, T, H * D]
        if self.qk_norm:
            q = self.q_norm(q.view(b, t, -1, d)).view(b, t, -1)
        q = ops.rotate(q, rope, d).view(b, t, -1, d).transpose(1, 2)  # [1, H, T, D]
        k = v = None
        if not self.reuses_kv:
            k = self.k_proj(x)  # [1, T, H_kv * D]
            v = self.v_proj(x) if self.v_proj is not None else k
            if self.qk_norm:
                k = self.k_norm(k.view(b, t, -1, d)).view(b, t, -1)
            if self.v_norm is not None:
                v = self.v_norm(v.view(b, t, -1, d)).view(b, t, -1)
            k = ops.rotate(k, rope, d).view(b, t, -1, d).transpose(1, 2)  # [1, H_kv, T, D]
            v = v.view(b, t, -1, d).transpose(1, 2)
        out, new = run.attend(self, i, q, k, v, caches)
        return self.o_proj(out), new

    def norm_packed(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv [1, T, (H + 2 H_kv) * D] -> the same with every q and k head normed (q_norm / k_norm), v as it was."""
        b, t = qkv.shape[:2]
        q, k, v = qkv.view(b, t, -1, self.head_dim).split(self.head_counts, dim=2)  # [1, T, H | H_kv | H_kv, D]
        return torch.cat([self.q_norm(q), self.k_norm(k), v], dim=2).view(b, t, -1)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = act

    def forward(self, x, ops: Ops = EAGER):
        packed = ops.gate_up(self)
        if packed is not None:
            g, u = project(packed, x).chunk(2, dim=-1)  # gate and up: the same width
        else:
            g, u = self.gate_proj(x), self.up_proj(x)
        g = F.silu(g) if self.act == "silu" else ops.gelu(g)
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

    def forward(self, x, weights, ops: Ops = EAGER):  # x: [N, H], weights: [N, E] -> [N, H]
        gate, up = torch.einsum("nh,emh->enm", x, self.gate_up_proj).chunk(2, dim=-1)
        y = torch.einsum("enm,ehm->enh", ops.gelu(gate) * up, self.down_proj)
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
        if self.ple:
            self.per_layer_input_gate = nn.Linear(cfg.hidden_size, cfg.per_layer_input_size, bias=False)
            self.per_layer_projection = nn.Linear(cfg.per_layer_input_size, cfg.hidden_size, bias=False)
            self.post_per_layer_input_norm = RMSNorm(cfg.hidden_size, eps)

    def forward_folded(self, x, delta, rope, run: Pass, ops: Ops, i, caches):
        """The llama block with each residual add folded into the norm after it (`ops.skip_norm`): x is the residual
        stream *before* the previous block's MLP output `delta` (None for the first block) is added. Returns (x,
        this block's MLP output, new rows): the stream after the block is x + delta."""
        h, x = ops.skip_norm(x, delta, self.input_layernorm)
        attn, new = self.self_attn(h, rope, run, ops, i, caches)
        h, x = ops.skip_norm(x, attn, self.post_attention_layernorm)
        return x, self.mlp(h, ops), new

    def forward(self, x, rope, run: Pass, ops: Ops, i: int | None, caches: tuple, per_layer_input=None):
        """x: [1, T, H] -> (x, new rows or None); see Attention.forward for the rest."""
        attn, new = self.self_attn(self.input_layernorm(x), rope, run, ops, i, caches)
        if not self.gemma:
            x = x + attn
            return x + self.mlp(self.post_attention_layernorm(x), ops), new
        h, x = ops.skip_norm(x, self.post_attention_layernorm(attn), self.pre_feedforward_layernorm)  # norm(x + a)
        y = self.mlp(h, ops)
        if self.moe:
            flat = x.reshape(-1, x.shape[-1])  # the router reads the pre-MLP residual stream
            experts = self.experts(self.pre_feedforward_layernorm_2(flat), self.router(flat), ops).reshape(x.shape)
            y = self.post_feedforward_layernorm_1(y) + self.post_feedforward_layernorm_2(experts)
        x = x + self.post_feedforward_layernorm(y)
        if self.ple:
            g = ops.gelu(self.per_layer_input_gate(x)) * per_layer_input
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

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks: dict, k_caches: list, v_caches: list,
                last_only: bool = False, with_logits: bool = True, form: Form = SPLIT, ops: Ops = EAGER,
                aux_layers: tuple[int, ...] = (), rows: torch.Tensor | None = None) -> ModelOutput:
        """input_ids, position_ids: [1, T]; masks: kind -> [1, 1, T, S_kind + T] (or the form's `Mask`);
        k_caches[i], v_caches[i]: [1, H_kv, S, D] for cached layer i (cfg.cached_layers() order; empty lists when
        the form owns the caches: `forms.State`). form: how layers attend (edge_spec.model.forms); ops: how rotary,
        projections and residual norms are computed (edge_spec.model.ops); aux_layers: ModelOutput.aux; rows: [R]
        int64, the rows that get the final norm and the head (logits / hidden [1, R, ...]; kv.LOGIT_ROWS)."""
        x = self.embed(input_ids)  # [1, T, H]
        ple = self.per_layer_inputs(input_ids, x) if self.cfg.per_layer_input_size else None
        rope = {kind: ops.rope(self, kind, position_ids) for kind in self.cfg.rope}
        run = form.begin(position_ids, masks)
        cache_index = {layer: i for i, layer in enumerate(self.cached_layers)}
        new_k, new_v = [], []
        fold = ops.fold_residuals and self.cfg.family not in GEMMA_FAMILIES
        delta = None  # fold: the last block's MLP output, added to x by the next norm
        states = {}  # aux layer id -> the residual stream entering it [1, T, H]
        for layer, block in enumerate(self.model.layers):
            if layer in aux_layers:
                states[layer] = x if delta is None else x + delta
            kind = self.cfg.layer_kinds[layer]
            i = cache_index.get(layer)
            caches = (k_caches[i], v_caches[i]) if i is not None and k_caches else (None, None)
            if fold:
                x, delta, new = block.forward_folded(x, delta, rope[kind], run, ops, i, caches)
            else:
                x, new = block(x, rope[kind], run, ops, i, caches, ple[:, :, layer] if ple is not None else None)
            if new is not None:
                new_k.append(new[0])
                new_v.append(new[1])
        aux = None
        if aux_layers:
            states[len(self.model.layers)] = x if delta is None else x + delta
            aux = torch.cat([states[i] for i in aux_layers], dim=-1)  # [1, T, n * H]
        if last_only:
            x, delta = x[:, -1:], delta[:, -1:] if delta is not None else None
        elif rows is not None:  # [1, T, H] -> [1, R, H]
            x, delta = x.index_select(1, rows), delta.index_select(1, rows) if delta is not None else None
        hidden, _ = ops.skip_norm(x, delta, self.model.norm)
        if not with_logits:  # teacher passes that only need hidden states / K/V
            return ModelOutput(hidden[..., :0], hidden, new_k, new_v, aux)
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return ModelOutput(logits, hidden, new_k, new_v, aux)
