"""Model facts in one frozen dataclass, parsed from a Hugging Face config.json.

Everything that varies per layer (attention kind, head dim, KV heads, MLP width, KV sharing) is a
tuple indexed by layer, so the model code never re-derives it. The families:
`llama` (SmolLM2, Llama-2/3 style), `qwen3` (Qwen3ForCausalLM: llama blocks with a per-head RMSNorm of q and of
k between the projections and the rotation, a head dim of their own), `gemma4` (Gemma-4 text: sliding/full layers
with their own head dims and RoPE, KV sharing, per-layer input embeddings, optional MoE block, soft-capping) and
`gemma3` (Gemma-3 text: the same sandwich-norm blocks with q/k norms, one head dim, no value norm, per-layer inputs or
KV sharing, attention scaled by query_pre_attn_scalar ** -0.5, norms that scale by 1 + weight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edge_spec.errors import CheckpointError

# Attention kinds, a fact of each layer (ModelConfig.layer_kinds); the KV contract sizes caches by them.
FULL = "full"
SLIDING = "sliding"
# the attention forms a target graph is traced with (edge_spec/model/forms.py implements them; a format's registry row
# names one: contract/formats.py). Spelled here, torch-free, so that reading a manifest imports no torch.
ATTENTION_FORMS = ("split", "slots", "placed", "state")

LLAMA = "llama"
QWEN3 = "qwen3"
GEMMA3 = "gemma3"
GEMMA4 = "gemma4"
GEMMA_FAMILIES = (GEMMA3, GEMMA4)  # sandwich-norm blocks, q/k norms, embeddings scaled by sqrt(hidden)
QK_NORM_FAMILIES = (QWEN3, *GEMMA_FAMILIES)  # a per-head RMSNorm of q and of k before the rotation
SUPPORTED_MODEL_TYPES = {"llama": LLAMA, "qwen3": QWEN3, "gemma3_text": GEMMA3, "gemma4_text": GEMMA4, "gemma4": GEMMA4}
QWEN3_HEAD_DIM = 128  # Qwen3Config's default head_dim (not hidden / heads), for a config.json without one

# KV sharing roles (Gemma-4's kv_sharing_modes): a "store" layer's keys/values are reused by
# later "reuse" layers of the same kind; "reuse" layers own no cache and no k/v projections.
STORE = "store"
REUSE = "reuse"


@dataclass(frozen=True)
class RopeSpec:
    """RoPE for one attention kind. `inv_freq()` -> [head_dim // 2] (zeros = unrotated pairs)."""

    theta: float
    head_dim: int
    rope_type: str = "default"  # default | proportional (Gemma-4 global) | llama3
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # default RoPE through torch's float32 pow, bit-identical to transformers' inv_freq. numpy's pow is 1 ulp off in
    # some entries (gemma-3-270m: 19 of 128 local, 26 of 128 global), which moves cos by up to 1.2e-4 at position
    # 1024 and gemma-3-270m's logits on a 784-token prompt by 2.6e-3 from transformers' (1.5e-4 with torch's pow).
    # On for gemma3 (and drafters built for it: rope params {"torch_pow": true}); llama / gemma4 keep numpy's.
    torch_pow: bool = False

    def inv_freq(self) -> np.ndarray:
        d = self.head_dim
        if self.torch_pow and self.rope_type == "default":
            import torch

            return (1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)).numpy()
        if self.rope_type == "proportional":
            # rotate the first `n` frequency pairs with exponents over the *full* head dim; the rest stay put
            n = int(self.partial_rotary_factor * d // 2)
            rotated = 1.0 / self.theta ** (np.arange(0, 2 * n, 2, dtype=np.float32) / d)
            return (np.concatenate([rotated, np.zeros(d // 2 - n, np.float32)]) / self.factor).astype(np.float32)
        inv = (1.0 / self.theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d)).astype(np.float32)
        if self.rope_type == "llama3":
            inv = _llama3_scale(inv, self)
        return inv.astype(np.float32)


def _llama3_scale(inv: np.ndarray, r: RopeSpec) -> np.ndarray:
    """Llama-3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth ramp in between."""
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / r.factor, inv)
    smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class ModelConfig:
    family: str  # LLAMA | QWEN3 | GEMMA3 | GEMMA4
    vocab_size: int
    hidden_size: int
    num_heads: int
    layer_kinds: tuple[str, ...]  # per layer: FULL | SLIDING
    head_dims: tuple[int, ...]  # per layer
    kv_heads: tuple[int, ...]  # per layer
    intermediate_sizes: tuple[int, ...]  # per layer
    kv_sharing: tuple[str | None, ...]  # per layer: None | STORE | REUSE
    rope: dict[str, RopeSpec]  # kind -> spec
    sliding_window: int | None
    rms_norm_eps: float
    hidden_act: str  # "silu" | "gelu_tanh"
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_scale: float | None = None  # None -> head_dim ** -0.5
    final_logit_softcapping: float | None = None
    # Gemma-3 checkpoints store every RMSNorm weight as w for a norm that scales by (1 + w): the loader adds this
    # offset to them (checkpoints.load_weights), so our RMSNorm (scale by weight) computes the same function
    norm_weight_offset: float = 0.0
    # Gemma-4 only
    per_layer_input_size: int = 0  # 0 = no per-layer input embeddings
    per_layer_vocab_size: int = 0
    attention_k_eq_v: bool = False  # full layers use their key projection as values
    num_experts: int = 0  # 0 = no MoE block
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    raw: dict = field(default_factory=dict, compare=False, repr=False)  # the config.json it came from

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def cached_layers(self) -> tuple[int, ...]:
        return tuple(i for i, mode in enumerate(self.kv_sharing) if mode != REUSE)

    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.layer_kinds)))


# ---- parsing ------------------------------------------------------------------------------------
def _require(d: dict, key: str, source: str):
    if key not in d or d[key] is None:
        raise CheckpointError(f"{source}: required field {key!r} is missing",
                              "use the config.json that came with the checkpoint")
    return d[key]


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def _rope_spec(params: dict | None, head_dim: int, default_theta: float, torch_pow: bool = False) -> RopeSpec:
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "proportional", "llama3"):
        raise CheckpointError(f"unsupported RoPE type {rope_type!r}",
                              "supported: default, proportional (Gemma-4), llama3")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "partial_rotary_factor")
    extra = {k: params[k] for k in keys if params.get(k) is not None}
    return RopeSpec(theta=float(params.get("rope_theta", default_theta)), head_dim=head_dim, rope_type=rope_type,
                    torch_pow=bool(params.get("torch_pow", torch_pow)), **extra)


def from_hf_dict(d: dict, source: str = "config.json") -> ModelConfig:
    model_type = d.get("model_type")
    if model_type == "gemma4" and isinstance(d.get("text_config"), dict):
        d = {**d["text_config"], "model_type": "gemma4_text"}  # the multimodal wrapper: take the text part
        model_type = "gemma4_text"
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{source}: unsupported model_type {model_type!r}",
                              f"edge-spec supports {sorted(SUPPORTED_MODEL_TYPES)}")
    parse = {LLAMA: _parse_llama, QWEN3: _parse_qwen3, GEMMA3: _parse_gemma3,
             GEMMA4: _parse_gemma4}[SUPPORTED_MODEL_TYPES[model_type]]
    return parse(d, source)


def _parse_llama(d: dict, source: str, family: str = LLAMA, torch_pow: bool = False) -> ModelConfig:
    hidden = _require(d, "hidden_size", source)
    heads = _require(d, "num_attention_heads", source)
    layers = _require(d, "num_hidden_layers", source)
    head_dim = d.get("head_dim") or (QWEN3_HEAD_DIM if family == QWEN3 else hidden // heads)
    kv_heads = d.get("num_key_value_heads") or heads
    rope_params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = rope_params.get("rope_theta", d.get("rope_theta", 10000.0))
    if d.get("sliding_window") not in (None, 0) and d.get("use_sliding_window", False):
        raise CheckpointError(f"{source}: llama with sliding_window is not supported", "use a full-attention checkpoint")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported for {family}", "expected 'silu'")
    return ModelConfig(
        family=family, vocab_size=_require(d, "vocab_size", source), hidden_size=hidden, num_heads=heads,
        layer_kinds=(FULL,) * layers, head_dims=(head_dim,) * layers, kv_heads=(kv_heads,) * layers,
        intermediate_sizes=(_require(d, "intermediate_size", source),) * layers, kv_sharing=(None,) * layers,
        rope={FULL: _rope_spec({**rope_params, "rope_theta": theta}, head_dim, 10000.0, torch_pow)},
        sliding_window=None,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), hidden_act="silu",
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        bos_token_id=d.get("bos_token_id"), eos_token_ids=_eos_ids(d.get("eos_token_id")),
        pad_token_id=d.get("pad_token_id"), attention_bias=bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)), raw=d)


def _parse_qwen3(d: dict, source: str) -> ModelConfig:
    """Qwen3Config: the llama fields, q/k norms implied by the family. Its sliding_window and max_window_layers apply
    only with use_sliding_window true, which is refused (as are layer_types other than full attention); RoPE through
    torch's pow like transformers' (RopeSpec.torch_pow), so that inv_freq is theirs bit for bit."""
    if d.get("use_sliding_window"):
        raise CheckpointError(f"{source}: qwen3 with use_sliding_window true is not supported (sliding-window layers "
                              f"from max_window_layers={d.get('max_window_layers')} on)",
                              "use a full-attention checkpoint: use_sliding_window false, as Qwen3 releases ship")
    types = set(d.get("layer_types") or ["full_attention"])
    if types != {"full_attention"}:
        raise CheckpointError(f"{source}: qwen3 layer_types {sorted(types)} include layers other than full attention",
                              "use a full-attention checkpoint (every layer_types entry 'full_attention')")
    return _parse_llama(d, source, family=QWEN3, torch_pow=True)


def _gemma4_kv_sharing(kinds: tuple[str, ...], num_shared: int, source: str) -> tuple[str | None, ...]:
    n = len(kinds)
    if num_shared == 0:
        return (None,) * n
    first_shared = n - num_shared
    modes: list[str | None] = [None if i < first_shared else REUSE for i in range(n)]
    producers = {kind: max((i for i in range(first_shared) if kinds[i] == kind), default=None) for kind in set(kinds)}
    if any(p is None for p in producers.values()):
        raise CheckpointError(f"{source}: num_kv_shared_layers={num_shared} leaves a layer kind with no layer to share from",
                              "every attention kind must appear before the first KV-shared layer")
    for p in producers.values():
        modes[p] = STORE
    return tuple(modes)


def _parse_gemma4(d: dict, source: str) -> ModelConfig:
    layers = _require(d, "num_hidden_layers", source)
    hidden = _require(d, "hidden_size", source)
    heads = _require(d, "num_attention_heads", source)
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    types = list(types)
    types[-1] = "full_attention"  # the reference forces the last layer to be global
    kinds = tuple(FULL if t == "full_attention" else SLIDING for t in types)
    head_dim = d.get("head_dim", 256)
    kv_heads = d.get("num_key_value_heads", 4)
    k_eq_v = bool(d.get("attention_k_eq_v", False))
    # Full layers take their head dim / KV heads from per_layer_config (new files; transformers writes {} when no layer
    # differs from the base, e.g. global_head_dim == head_dim) or global_* (older files, without the key).
    per_layer = {int(k): v for k, v in (d.get("per_layer_config") or {}).items() if str(k).isdigit()}
    if "per_layer_config" not in d:
        override = {"head_dim": d.get("global_head_dim", 512)}
        if k_eq_v and d.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = d["num_global_key_value_heads"]
        per_layer = {i: override for i, k in enumerate(kinds) if k == FULL}
    head_dims = tuple(per_layer.get(i, {}).get("head_dim", head_dim) for i in range(layers))
    kv_heads_l = tuple(per_layer.get(i, {}).get("num_key_value_heads", kv_heads) for i in range(layers))
    sharing = _gemma4_kv_sharing(kinds, int(d.get("num_kv_shared_layers", 0) or 0), source)
    inter = _require(d, "intermediate_size", source)
    double = bool(d.get("use_double_wide_mlp", False))
    inters = tuple(inter * (2 if double and sharing[i] == REUSE else 1) for i in range(layers))
    rope_params = d.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    rope = {}
    for kind, name in ((FULL, "full_attention"), (SLIDING, "sliding_attention")):
        if kind in kinds:
            layer = kinds.index(kind)
            rope[kind] = _rope_spec(rope_params.get(name), head_dims[layer], 10_000.0)
    if d.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: bidirectional attention is not supported", "use a causal text checkpoint")
    act = d.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported", "expected 'gelu_pytorch_tanh'")
    moe = bool(d.get("enable_moe_block", False))
    ple = int(d.get("hidden_size_per_layer_input") or 0)
    return ModelConfig(
        family=GEMMA4, vocab_size=_require(d, "vocab_size", source), hidden_size=hidden, num_heads=heads,
        layer_kinds=kinds, head_dims=head_dims, kv_heads=kv_heads_l, intermediate_sizes=inters, kv_sharing=sharing,
        rope=rope, sliding_window=int(d.get("sliding_window", 512)), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        hidden_act="gelu_tanh", tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
        bos_token_id=d.get("bos_token_id", 2), eos_token_ids=_eos_ids(d.get("eos_token_id", 1)),
        pad_token_id=d.get("pad_token_id", 0), attention_bias=bool(d.get("attention_bias", False)),
        attention_scale=1.0, final_logit_softcapping=d.get("final_logit_softcapping"),
        per_layer_input_size=ple, per_layer_vocab_size=int(d.get("vocab_size_per_layer_input") or 0) if ple else 0,
        attention_k_eq_v=k_eq_v, num_experts=int(d.get("num_experts") or 0) if moe else 0,
        top_k_experts=int(d.get("top_k_experts") or 0) if moe else 0,
        moe_intermediate_size=int(d.get("moe_intermediate_size") or 0) if moe else 0, raw=d)


def _parse_gemma3(d: dict, source: str) -> ModelConfig:
    """Gemma3TextConfig: 5 sliding layers (local RoPE base 1e4) to 1 full (1e6) unless layer_types says otherwise."""
    layers = _require(d, "num_hidden_layers", source)
    hidden = _require(d, "hidden_size", source)
    heads = _require(d, "num_attention_heads", source)
    pattern = int(d.get("sliding_window_pattern") or 6)
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    kinds = tuple(FULL if t == "full_attention" else SLIDING for t in types)
    head_dim = int(d.get("head_dim") or 256)
    rope_params = d.get("rope_parameters") or {}
    if "full_attention" not in rope_params:  # older files: rope_theta / rope_local_base_freq / rope_scaling
        rope_params = {"full_attention": {**(d.get("rope_scaling") or {}), "rope_theta": d.get("rope_theta", 1e6)},
                       "sliding_attention": {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", 1e4)}}
    defaults = {FULL: 1_000_000.0, SLIDING: 10_000.0}
    rope = {kind: _rope_spec(rope_params.get(name), head_dim, defaults[kind], torch_pow=True)
            for kind, name in ((FULL, "full_attention"), (SLIDING, "sliding_attention")) if kind in kinds}
    if d.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: bidirectional attention is not supported", "use a causal text checkpoint")
    if d.get("attn_logit_softcapping"):
        raise CheckpointError(f"{source}: attn_logit_softcapping is not supported (Gemma-2 style attention)",
                              "use a Gemma-3 checkpoint without it (Gemma-3 sets it to null)")
    act = d.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported", "expected 'gelu_pytorch_tanh'")
    kv_heads = int(d.get("num_key_value_heads") or 4)
    return ModelConfig(
        family=GEMMA3, vocab_size=_require(d, "vocab_size", source), hidden_size=hidden, num_heads=heads,
        layer_kinds=kinds, head_dims=(head_dim,) * layers, kv_heads=(kv_heads,) * layers,
        intermediate_sizes=(_require(d, "intermediate_size", source),) * layers, kv_sharing=(None,) * layers,
        rope=rope, sliding_window=int(d.get("sliding_window") or 4096), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        hidden_act="gelu_tanh", tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
        max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
        bos_token_id=d.get("bos_token_id", 2), eos_token_ids=_eos_ids(d.get("eos_token_id", 1)),
        pad_token_id=d.get("pad_token_id", 0), attention_bias=bool(d.get("attention_bias", False)),
        attention_scale=float(d.get("query_pre_attn_scalar") or 256) ** -0.5,
        final_logit_softcapping=d.get("final_logit_softcapping"), norm_weight_offset=1.0, raw=d)

