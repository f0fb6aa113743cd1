"""A drafter's configuration: `DrafterConfig`, parsed from a `gemma4_assistant` config.json (Google's assistant
checkpoints and ours share the format; edge-spec's own keys sit under "edge_spec"), and `drafter_config_dict`,
which writes one for a new drafter of a given target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edge_spec.errors import CheckpointError
from edge_spec.model.config import REUSE, ModelConfig, _parse_gemma4


@dataclass(frozen=True)
class DrafterConfig:
    layers: ModelConfig  # the drafter's own decoder stack (gemma4-style blocks, every layer REUSE)
    target_hidden_size: int  # Ht
    clustered: bool  # True: clustered-vocabulary head ("ordered embeddings")
    num_centroids: int  # C (vocab_size % C == 0)
    top_k_clusters: int  # clusters kept per step
    kv_source_layers: dict[str, int] | None = None  # kind -> target layer; None = last cached layer of that kind
    # "drafter": logits from the drafter's hidden vs its own embedding table (Google's assistants);
    # "target": logits from the projected hidden [Ht] vs the *target's* output embedding (no table of its own)
    head_from: str = "drafter"
    # edge-spec extension: projected = post_projection(h) + input hidden (predict the next target state as a
    # delta from the current one: logits start at the target's scale, which makes distillation far easier)
    residual: bool = False
    # edge-spec extension (head_from == "drafter" only): where the drafter's token table [V, Ha] comes from.
    # "own": stored in the checkpoint (Google's assistants). "target": derived when the drafter is paired with its
    # target, table = target_embedding [V, Ht] @ P^T with a learned projection P [Ha, Ht] (`table_projection`); the
    # checkpoint stores P, not the table (a 262144 x 256 table is 268 MB in fp32). See `Drafter.bind_target`.
    table_from: str = "own"
    raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.layers.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.layers.hidden_size

    @property
    def head_dim_in(self) -> int:
        """Width of the vector the head scores: Ha (own table) or Ht (target's table)."""
        return self.target_hidden_size if self.head_from == "target" else self.hidden_size

    @property
    def candidates_per_step(self) -> int:
        """Tokens scored per step: k clusters x (V / C) tokens, or the whole vocabulary."""
        return self.top_k_clusters * (self.vocab_size // self.num_centroids) if self.clustered else self.vocab_size


def drafter_config_from_dict(d: dict, source: str = "config.json") -> DrafterConfig:
    """Parse a `gemma4_assistant` config.json (Google's format, also used for edge-spec's own drafters)."""
    if d.get("model_type") != "gemma4_assistant":
        raise CheckpointError(f"{source}: model_type {d.get('model_type')!r} is not a drafter",
                              "a drafter folder has model_type 'gemma4_assistant'")
    text = dict(d.get("text_config") or {})
    n = text.get("num_hidden_layers")
    if not n:
        raise CheckpointError(f"{source}: text_config.num_hidden_layers is missing", "use the drafter's own config.json")
    # the drafter's layers never compute K/V: parse without sharing, then mark every layer REUSE
    stack = _parse_gemma4({**text, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
                           "enable_moe_block": False, "use_double_wide_mlp": False}, source)
    stack = dataclasses.replace(stack, kv_sharing=(REUSE,) * stack.num_layers, final_logit_softcapping=None)
    clustered = bool(d.get("use_ordered_embeddings", False))
    centroids = int(d.get("num_centroids", 2048))
    if clustered and stack.vocab_size % centroids:
        raise CheckpointError(f"{source}: vocab_size {stack.vocab_size} is not a multiple of num_centroids {centroids}",
                              "re-cluster the vocabulary into equal-size clusters")
    ours = d.get("edge_spec") or {}
    sources = ours.get("kv_source_layers")
    head_from = ours.get("head_from", "drafter")
    if head_from not in ("drafter", "target"):
        raise CheckpointError(f"{source}: edge_spec.head_from must be 'drafter' or 'target', got {head_from!r}")
    table_from = ours.get("table_from", "own")
    if table_from not in ("own", "target"):
        raise CheckpointError(f"{source}: edge_spec.table_from must be 'own' or 'target', got {table_from!r}")
    if table_from == "target" and head_from != "drafter":
        raise CheckpointError(f"{source}: edge_spec.table_from 'target' needs head_from 'drafter' (a head_from "
                              "'target' drafter has no token table of its own)", "drop table_from or head_from")
    return DrafterConfig(head_from=head_from, table_from=table_from, residual=bool(ours.get("residual", False)),
                         layers=stack, target_hidden_size=int(d.get("backbone_hidden_size", 1536)), clustered=clustered,
                         num_centroids=centroids, top_k_clusters=int(d.get("centroid_intermediate_top_k", 32)),
                         kv_source_layers={k: int(v) for k, v in sources.items()} if sources else None, raw=d)


def drafter_config_dict(target: ModelConfig, *, hidden_size: int = 256, num_layers: int = 2, num_heads: int | None = None,
                        intermediate_size: int = 1024, clustered: bool = True, num_centroids: int = 1024,
                        top_k_clusters: int = 32, source_layers: dict[str, int] | None = None,
                        head_from: str = "drafter", residual: bool = False, table_from: str = "own") -> dict:
    """A `gemma4_assistant` config.json for a new drafter of `target` (layers read the target's last
    cached layer of each kind; the last drafter layer is full attention, the others follow the target's kinds)."""
    kinds = ["sliding" if "sliding" in target.layer_kinds and i < num_layers - 1 else "full" for i in range(num_layers)]
    full_src = max(i for i in target.cached_layers() if target.layer_kinds[i] == "full")
    head_dim_full, kv_full = target.head_dims[full_src], target.kv_heads[full_src]
    num_heads = num_heads or max(kv_full, (hidden_size // head_dim_full) // kv_full * kv_full)
    per_layer = {}
    for i, kind in enumerate(kinds):
        src = max(j for j in target.cached_layers() if target.layer_kinds[j] == kind)
        per_layer[str(i)] = {"head_dim": target.head_dims[src], "num_key_value_heads": target.kv_heads[src]}
    rope = {("full_attention" if k == "full" else "sliding_attention"): {
        "rope_type": r.rope_type, "rope_theta": r.theta, "partial_rotary_factor": r.partial_rotary_factor, "factor": r.factor,
        **({"torch_pow": True} if r.torch_pow else {})} for k, r in target.rope.items()}  # the target's inv_freq exactly
    text = {"model_type": "gemma4_text", "vocab_size": target.vocab_size, "hidden_size": hidden_size,
            "intermediate_size": intermediate_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
            "num_key_value_heads": target.kv_heads[full_src], "head_dim": head_dim_full,
            "layer_types": [f"{k}_attention" for k in kinds], "sliding_window": target.sliding_window or 512,
            "rope_parameters": rope, "per_layer_config": per_layer, "rms_norm_eps": 1e-6,
            "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
            "max_position_embeddings": target.max_position_embeddings}
    return {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "text_config": text,
            "backbone_hidden_size": target.hidden_size, "use_ordered_embeddings": clustered,
            "num_centroids": num_centroids, "centroid_intermediate_top_k": top_k_clusters, "tie_word_embeddings": True,
            "edge_spec": {"head_from": head_from, "residual": residual,
                          **({"table_from": table_from} if table_from != "own" else {}),
                          **({"kv_source_layers": source_layers} if source_layers else {})}}
