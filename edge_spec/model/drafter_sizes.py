"""Drafter sizes from shapes alone: parameters in the graph vs stored in the checkpoint, and checkpoint bytes.

Nothing is allocated: the drafter is built on the meta device. `python -m edge_spec.model.drafter_sizes` prints the
sizes of the Gemma-4-E2B-assistant-shaped drafter of gemma3-270m with its own token table and with the table derived
from the target's embedding (`table_from="target"`), as docs/drafter.md quotes them.
"""

from __future__ import annotations

import json

import torch

from edge_spec.model.config import ModelConfig, from_hf_dict
from edge_spec.model.drafter import Drafter, drafter_config_dict, drafter_config_from_dict

# gemma-3-270m's shape (the config edge_spec.loading.gguf_gemma3 writes for the built-in GGUF): no weights needed
GEMMA3_270M = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
    "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "sliding_window": 512,
    "layer_types": ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(18)],
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
    "attention_dropout": 0.0, "use_bidirectional_attention": False, "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0, "torch_dtype": "float32"}

# issue #31: the Gemma-4 E2B assistant's shape (hidden 256, 4 layers: 3 sliding + 1 full, 4 query heads,
# 2,048 clusters, top 32 kept per step)
E2B_ASSISTANT = dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=2048, num_centroids=2048,
                     top_k_clusters=32, head_from="drafter")

BUDGET_BYTES = 25 * 10**6  # what may be committed for one drafter


def gemma3_270m_config() -> ModelConfig:
    return from_hf_dict(GEMMA3_270M, "gemma3-270m (known shape)")


def drafter_sizes(raw: dict) -> dict:
    """Sizes of the drafter a `gemma4_assistant` config.json describes (edge-spec extensions included):
    graph_parameters (what an exported graph holds: stored parameters + a target-derived table),
    stored_parameters (floating-point numbers in model.safetensors), table_parameters (the token table [V, Ha]),
    stored_bytes {float32, bfloat16}: tensor data of model.safetensors when its floating-point tensors are stored
    in that dtype (integer buffers such as token_ordering as they are; save_drafter's `dtype`); the file adds a
    JSON header of a few kB."""
    cfg = drafter_config_from_dict(raw, "drafter_sizes")
    with torch.device("meta"):
        drafter = Drafter(cfg)
    state = {k: v for k, v in drafter.state_dict().items() if k != "lm_head.weight"}  # what save_drafter writes
    floats = {k: v for k, v in state.items() if v.is_floating_point()}
    others = {k: v for k, v in state.items() if not v.is_floating_point()}
    stored = sum(v.numel() for v in floats.values())
    table = cfg.vocab_size * cfg.hidden_size if cfg.head_from == "drafter" else 0
    derived = table if cfg.table_from == "target" else 0
    other_bytes = sum(v.numel() * v.element_size() for v in others.values())
    return {"table_from": cfg.table_from, "graph_parameters": stored + derived, "stored_parameters": stored,
            "table_parameters": table, "stored_integer_bytes": other_bytes,
            "stored_bytes": {"float32": stored * 4 + other_bytes, "bfloat16": stored * 2 + other_bytes}}


def e2b_sizes_for_gemma3_270m() -> dict[str, dict]:
    """{"own": ..., "target": ...}: drafter_sizes of the E2B-assistant-shaped drafter of gemma3-270m."""
    target = gemma3_270m_config()
    return {t: drafter_sizes(drafter_config_dict(target, **E2B_ASSISTANT, table_from=t)) for t in ("own", "target")}


if __name__ == "__main__":
    print(json.dumps(e2b_sizes_for_gemma3_270m(), indent=2))
