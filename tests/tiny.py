"""Tiny random checkpoints, built offline with transformers' reference classes, saved as HF folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer: ids 0..3 are specials, then w4, w5, ... (any text maps to something)."""
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<bos>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": "<bos>", "add_bos_token": False}))


def randomize_gemma_norms(model: torch.nn.Module, seed: int = 0) -> None:
    """Random inits leave norms at 1 and layer scalars at 1: perturb them so parity tests see them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "scale" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.fill_(0.8)


def llama_config(**overrides):
    from transformers import LlamaConfig

    args = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=512,
                bos_token_id=3, eos_token_id=2)
    return LlamaConfig(**{**args, **overrides})


def qwen3_config(**overrides):
    """A tiny Qwen3Config: llama's shape with head_dim 32 != hidden / heads (16), so that the loader reads it, tied
    embeddings as in Qwen3-0.6B, RoPE base 1e6 as Qwen3 ships."""
    from transformers import Qwen3Config

    args = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                tie_word_embeddings=True, max_position_embeddings=512, bos_token_id=3, eos_token_id=2)
    cfg = Qwen3Config(**{**args, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def gemma4_config(**overrides):
    from transformers import Gemma4TextConfig

    # 4 layers: one sliding and one full layer with caches, then one of each reading them (KV sharing); every
    # bundle of the suite's Gemma rows exports these, so each layer more costs each export (6 layers until 2026-12-06)
    args = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=6, num_kv_shared_layers=2,
                hidden_size_per_layer_input=8, vocab_size_per_layer_input=320, final_logit_softcapping=30.0,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                max_position_embeddings=512, bos_token_id=3, eos_token_id=2, pad_token_id=0)
    cfg = Gemma4TextConfig(**{**args, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def save_reference(config, folder: Path, seed: int = 0):
    """Build the transformers reference model for `config`, save it as an HF folder, return it (llama, qwen3 or
    gemma4; qwen3's and gemma4's norms perturbed)."""
    from transformers import Gemma4ForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cls = {"llama": LlamaForCausalLM, "qwen3": Qwen3ForCausalLM}.get(config.model_type, Gemma4ForCausalLM)
    model = cls(config).eval()
    if config.model_type != "llama":
        randomize_gemma_norms(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, config.vocab_size)
    return model


def gemma4_assistant(target_config, *, ordered: bool, seed: int = 0, num_assistant_tokens: int = 4):
    """A tiny transformers Gemma4AssistantForCausalLM matching `target_config` (head dims, KV heads, window)."""
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    text = dict(model_type="gemma4_text", vocab_size=target_config.vocab_size, hidden_size=32, intermediate_size=64,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                layer_types=["sliding_attention"] * 3 + ["full_attention"],
                sliding_window=target_config.sliding_window, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, max_position_embeddings=512)
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=target_config.hidden_size,
                                use_ordered_embeddings=ordered, num_centroids=16, centroid_intermediate_top_k=4)
    cfg.text_config._attn_implementation = "eager"
    model = Gemma4AssistantForCausalLM(cfg).eval()
    randomize_gemma_norms(model, seed)
    if ordered:
        with torch.no_grad():
            model.masked_embedding.token_ordering.copy_(torch.randperm(target_config.vocab_size))
    model.generation_config.num_assistant_tokens = num_assistant_tokens
    return model


def e2b_pair(folder: Path):
    """The mission's drafter at its real size: a random Gemma-4 E2B-assistant-shaped drafter (hidden 256, 4 layers
    [3 sliding, 1 full], vocab 262144 in 2048 clusters, top 32: ~75M parameters) beside a shallow Gemma-4 target of
    the same vocabulary (2 layers, hidden 256; its global head dim equals head_dim, so transformers writes an empty
    per_layer_config, which the loader once misread), saved under `folder`. Returns (target, drafter)."""
    from edge_spec.loading import checkpoints
    from edge_spec.model.drafter import new_drafter

    save_reference(gemma4_config(vocab_size=262144, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                 head_dim=64, global_head_dim=64, sliding_window=512, num_kv_shared_layers=0,
                                 hidden_size_per_layer_input=0, vocab_size_per_layer_input=262144,
                                 layer_types=["sliding_attention", "full_attention"]), folder)
    target = checkpoints.load(str(folder))
    drafter = new_drafter(target.config, hidden_size=256, num_layers=4, intermediate_size=2048, num_centroids=2048,
                          top_k_clusters=32)
    assert 70e6 < sum(p.numel() for p in drafter.parameters()) < 80e6
    return target, drafter


def gemma3_config(**overrides):
    """A tiny Gemma3TextConfig: sliding (window 6, RoPE base 1e4) and full (1e6) layers, one KV head shared by four
    query heads as in gemma-3-270m, and query_pre_attn_scalar != head_dim so that the attention scale is seen."""
    from transformers import Gemma3TextConfig

    args = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
                layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                max_position_embeddings=512, bos_token_id=3, eos_token_id=2, pad_token_id=0)
    cfg = Gemma3TextConfig(**{**args, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def save_gemma3_reference(config, folder: Path, seed: int = 0):
    """`save_reference` for Gemma-3: a random transformers Gemma3ForCausalLM (norms perturbed), saved, returned."""
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    randomize_gemma_norms(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, config.vocab_size)
    return model
