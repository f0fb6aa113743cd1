"""The EAGLE-3 drafter (Red Hat Speculators' `eagle3` format) as a plain eager nn.Module, with its own KV cache.

One draft row (Speculators' `Eagle3DraftModel`, at inference):

    fused  = fc(cat(aux_1, .., aux_n))                 # [1, T, n * H] -> [1, T, H]: target states at the aux layers
    x      = cat(input_layernorm(embed(token)), hidden_norm(hidden))                         # [1, T, 2H]
    a      = attention(x) over this drafter's own cache and the new rows (q/k/v read 2H)      # [1, T, H]
    h      = residual + a     (residual: hidden, or hidden_norm(hidden) when norm_before_residual)
    h      = h + mlp(post_attention_layernorm(h));   layers 1..: plain llama / qwen3 blocks   # [1, T, H]
    logits = lm_head(norm(h))                        # [1, T, Vd], the draft vocabulary
    token  = d + d2t[d]                              # draft id d -> target id (`draft_to_target`)

`hidden` is `fused` for a row that pairs a target state with the token after it, and the previous row's output (h,
or norm(h) when norm_output) for a chained draft. Alignment (speculators' `shift_batch`): the row at position p
holds the target's aux states at p - 1 and token p, and predicts token p + 1; position 0 has no row. RoPE rotates by
that position (relative, so any constant offset gives the same scores).

Stateless like the target (edge_spec/model/transformer.py): the caller passes each layer's caches [1, H_kv, S, D]
and an additive mask [1, 1, T, S + T]; `forward` returns the logits, the hidden it chains, and the new K/V rows,
which the caller commits (or drops on rejection). Parameter names are Speculators' own, so its safetensors load with
a plain `load_state_dict` (edge_spec/loading/speculators_eagle3.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from edge_spec.errors import ConfigError
from edge_spec.model.attention import attend
from edge_spec.model.config import ModelConfig
from edge_spec.model.rope import Rope, apply_rope, rope_cos_sin
from edge_spec.model.transformer import MLP, RMSNorm

NEG = -1e30  # a masked score: finite, as the KV contract's masks (edge_spec/contract/kv.py NEG_INF)


@dataclass(frozen=True)
class Eagle3Config:
    layers: ModelConfig  # the decoder layers' facts (llama-style: hidden, heads, head dim, RoPE, eps, MLP)
    qk_norm: bool  # qwen3 layers: per-head RMSNorm of q and k before the rotation
    draft_vocab_size: int  # Vd; == layers.vocab_size: no vocabulary map
    num_aux: int  # auxiliary target states concatenated into fc
    aux_layer_ids: tuple[int, ...] | None  # which target layers (None: the target decides, `default_aux_layers`)
    norm_before_residual: bool = False  # layer 0's residual is hidden_norm(hidden) instead of hidden
    norm_before_fc: bool = False  # one RMSNorm over cat(aux) [n * H] before fc
    fc_norm: bool = False  # one RMSNorm per aux state [H] before the concatenation
    norm_output: bool = False  # chain norm(h) to the next draft step instead of h (Eagle 3.1)

    @property
    def hidden_size(self) -> int:
        return self.layers.hidden_size

    @property
    def target_vocab_size(self) -> int:
        return self.layers.vocab_size

    @property
    def mapped(self) -> bool:
        """A reduced draft vocabulary (d2t / t2d buffers)."""
        return self.draft_vocab_size != self.target_vocab_size


def default_aux_layers(num_target_layers: int) -> tuple[int, ...]:
    """Speculators' default auxiliary layers (low / middle / high): (2, L // 2, L - 3)."""
    return 2, num_target_layers // 2, num_target_layers - 3


def check_eagle3_pair(target: ModelConfig, cfg: Eagle3Config, target_name: str = "the target",
                      drafter_name: str = "the eagle3 drafter") -> tuple[int, ...]:
    """Refuse a drafter that does not fit the target (hidden size, vocabulary, aux layer ids), naming both sides;
    returns the aux layer ids it reads (its config's, or `default_aux_layers` of the target)."""
    problems = []
    if cfg.hidden_size != target.hidden_size:
        problems.append(f"hidden size: the drafter's is {cfg.hidden_size}, the target's {target.hidden_size}")
    if cfg.target_vocab_size != target.vocab_size:
        problems.append(f"vocabulary: the drafter's is {cfg.target_vocab_size} tokens, the target's "
                        f"{target.vocab_size}")
    n = target.num_layers
    ids = cfg.aux_layer_ids or default_aux_layers(n)
    if any(not 0 <= i <= n for i in ids):
        where = "its eagle_aux_hidden_state_layer_ids" if cfg.aux_layer_ids else "Speculators' default aux layers"
        problems.append(f"aux layers: {where} {tuple(ids)} are outside the target's layer ids [0, {n}] "
                        f"({n} layers; id {n} is the stream leaving the last one)")
    if problems:
        raise ConfigError(f"{drafter_name} does not fit {target_name}: " + "; ".join(problems),
                          "pass the EAGLE-3 drafter trained for this target (its transformer_layer_config's "
                          "hidden_size and vocab_size must equal the target's), or train one for it with Speculators")
    return tuple(ids)


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocabulary ids -> target ids: d + d2t[d] (Speculators stores d2t as offsets); d2t None: identity."""
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def chain_mask(visible: int, capacity: int, t: int) -> torch.Tensor:
    """Additive mask [1, 1, t, capacity + t] for t new rows after a cache of `capacity` slots whose first `visible`
    hold committed rows: those slots and the new rows up to each row's own are visible (0), the rest NEG."""
    cache = torch.arange(capacity) < visible  # [S]
    new = torch.ones(t, t, dtype=torch.bool).tril()  # [t, t]
    keep = torch.cat([cache.expand(t, capacity), new], dim=1)  # [t, S + t]
    return torch.where(keep, 0.0, NEG)[None, None]


class Eagle3Output(NamedTuple):
    logits: torch.Tensor  # [1, T, Vd] draft-vocabulary logits
    hidden: torch.Tensor  # [1, T, H] what the next chained draft step takes as `hidden`
    new_k: list[torch.Tensor]  # per layer: [1, H_kv, T, D]
    new_v: list[torch.Tensor]


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config, in_features: int):
        super().__init__()
        c = cfg.layers
        self.head_dim = d = c.head_dims[0]
        self.scale = d ** -0.5
        self.q_proj = nn.Linear(in_features, c.num_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(in_features, c.kv_heads[0] * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(in_features, c.kv_heads[0] * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * d, c.hidden_size, bias=c.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps)
            self.k_norm = RMSNorm(d, c.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, rope, mask, k_cache, v_cache, store=None, attention=attend):
        """x: [1, T, in]; rope: cos, sin [1, T, 1, D]; mask: [1, 1, T, S + T]; caches [1, H_kv, S, D]
        -> (out [1, T, H], new k, new v [1, H_kv, T, D]). `store` (a program that owns the cache, the `state`
        binding): (new k, new v) -> the cache [1, H_kv, S, D] after it wrote them into their slots, which the mask
        hides among its first S columns (the new rows are its last T either way). `attention`: `attend`, or
        `attend_concat` (4-D ops only: what the HTP compiles, exporters/qnn.py)."""
        b, t = x.shape[:2]
        d = self.head_dim
        q = self.q_proj(x).view(b, t, -1, d)  # [1, T, H, D]
        k = self.k_proj(x).view(b, t, -1, d)  # [1, T, H_kv, D]
        v = self.v_proj(x).view(b, t, -1, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, rope.cos, rope.sin).transpose(1, 2)  # [1, H, T, D]
        k = apply_rope(k, rope.cos, rope.sin).transpose(1, 2)  # [1, H_kv, T, D]
        v = v.transpose(1, 2)
        if store is not None:
            k_cache, v_cache = store(k, v)
        out = attention(q, (k_cache, k), (v_cache, v), mask, self.scale)  # [1, T, H * D]
        return self.o_proj(out), k, v


class Eagle3Layer(nn.Module):
    """A llama / qwen3 decoder layer; the first one (`first`) reads cat(embedding, hidden) [2H]."""

    def __init__(self, cfg: Eagle3Config, first: bool):
        super().__init__()
        c = cfg.layers
        h = c.hidden_size
        self.first = first
        self.norm_before_residual = cfg.norm_before_residual
        self.self_attn = Eagle3Attention(cfg, 2 * h if first else h)
        self.mlp = MLP(h, c.intermediate_sizes[0], c.hidden_act, c.mlp_bias)
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(h, c.rms_norm_eps)

    def forward(self, x, embeds, rope, mask, k_cache, v_cache, store=None, attention=attend):
        """x: [1, T, H] (the hidden); embeds: [1, T, H] (layer 0 only, else None) -> (x [1, T, H], new k, new v)."""
        if self.first:
            normed = self.hidden_norm(x)
            residual = normed if self.norm_before_residual else x
            h = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [1, T, 2H]
        else:
            residual, h = x, self.input_layernorm(x)
        a, k, v = self.self_attn(h, rope, mask, k_cache, v_cache, store, attention)
        x = residual + a
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        c, h = cfg.layers, cfg.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, h)
        self.fc = nn.Linear(cfg.num_aux * h, h, bias=False)
        self.input_norm = RMSNorm(cfg.num_aux * h, c.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(h, c.rms_norm_eps) for _ in range(cfg.num_aux)) if cfg.fc_norm else None
        self.layers = nn.ModuleList(Eagle3Layer(cfg, first=i == 0) for i in range(c.num_layers))
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        mapped = cfg.mapped
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long) if mapped else None)
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool) if mapped else None)
        spec = next(iter(c.rope.values()))
        with torch.device("cpu"):
            self.register_buffer("inv_freq", torch.from_numpy(spec.inv_freq()), persistent=False)

    def empty_caches(self, capacity: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed caches (k, v) per layer [1, H_kv, capacity, D] (a mask hides slots not yet written)."""
        c = self.cfg.layers
        shape = (1, c.kv_heads[0], capacity, c.head_dims[0])
        return ([torch.zeros(shape) for _ in self.layers], [torch.zeros(shape) for _ in self.layers])

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """aux: [1, T, n * H], the target's states at the aux layers concatenated in aux_layer_ids order -> [1, T, H]."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            parts = aux.chunk(len(self.fc_norm), dim=-1)  # n x [1, T, H]
            aux = torch.cat([norm(p) for norm, p in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(aux)

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                k_caches: list, v_caches: list, embeds: torch.Tensor | None = None, store=None, rope: Rope | None = None,
                attention=attend) -> Eagle3Output:
        """hidden: [1, T, H] (`fuse` of the aux states, or the previous draft row's `hidden`); input_ids,
        position_ids: [1, T] (target-vocabulary ids); mask: [1, 1, T, S + T] additive; k_caches[i], v_caches[i]:
        [1, H_kv, S, D] per layer; embeds: the tokens' embeddings [1, T, H] when the caller gathers them (from the
        target's table, which equals embed_tokens), else embed_tokens(input_ids); store: (layer, new k, new v) -> that
        layer's cache after writing them (Eagle3Attention.forward; k_caches / v_caches are then unused); rope: cos,
        sin [1, T, 1, D] when the caller reads them from tables (else computed from position_ids); attention: as
        Eagle3Attention.forward."""
        embeds = self.embed_tokens(input_ids) if embeds is None else embeds  # [1, T, H]
        rope = rope_cos_sin(position_ids, self.inv_freq) if rope is None else rope  # cos, sin [1, T, 1, D]
        x, new_k, new_v = hidden, [], []
        for i, layer in enumerate(self.layers):
            layer_store = None if store is None else functools.partial(store, i)
            x, k, v = layer(x, embeds if i == 0 else None, rope, mask, k_caches[i], v_caches[i], layer_store, attention)
            new_k.append(k)
            new_v.append(v)
        normed = self.norm(x)
        return Eagle3Output(self.lm_head(normed), normed if self.cfg.norm_output else x, new_k, new_v)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids (any shape) -> target ids."""
        return draft_to_target(draft_ids, self.d2t)
