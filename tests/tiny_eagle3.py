"""Tiny random EAGLE-3 drafters in Speculators' format, built with the `speculators` package itself (the oracle).

Speculators' Eagle3DraftModel starts embed_tokens and lm_head as NaN (it copies them from the verifier) and its norms
at 1: every tensor is redrawn here so that each norm option changes the output.
"""

from __future__ import annotations

from pathlib import Path

import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB, DRAFT_VOCAB = 64, 4, 2, 16, 256, 128


def layer_config(layer: str = "llama", num_layers: int = 1, vocab_size: int = VOCAB, hidden_size: int = HIDDEN,
                 rope: dict | None = None):
    """A tiny transformer_layer_config (transformers' LlamaConfig / Qwen3Config), eager attention."""
    from transformers import LlamaConfig, Qwen3Config

    cls = LlamaConfig if layer == "llama" else Qwen3Config
    cfg = cls(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
              num_hidden_layers=num_layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              head_dim=hidden_size // HEADS, max_position_embeddings=512, rms_norm_eps=1e-6,
              rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})
    cfg._attn_implementation = "eager"  # speculators' default is flex attention (compiled kernels)
    return cfg


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Redraw every float tensor: Linears ~ N(0, 1 / fan_in), embeddings ~ N(0, 1), norms ~ 1 + N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1 + 0.3 * z)
            elif "embed" in name:
                p.copy_(z)
            else:
                p.copy_(z / p.shape[-1] ** 0.5)


def vocab_map(vocab: int, draft_vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random reduced vocabulary as Speculators stores it: d2t offsets [Vd] int64, t2d mask [V] bool."""
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(draft_vocab), t2d


def speculators_eagle3(folder: Path | None = None, *, layer: str = "llama", num_layers: int = 1,
                       draft_vocab: int = DRAFT_VOCAB, aux_layers=(0, 1, 2), seed: int = 0, rope: dict | None = None,
                       **options):
    """A random speculators Eagle3DraftModel (eval mode), saved with its own save_pretrained when `folder` is given.
    options: norm_before_residual, norm_before_fc, fc_norm, norm_output."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    tl = layer_config(layer, num_layers, rope=rope)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=draft_vocab,
        eagle_aux_hidden_state_layer_ids=list(aux_layers) if aux_layers is not None else None, **options,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config).eval()
    randomize(model, seed)
    if model.use_draft_vocab:
        d2t, t2d = vocab_map(VOCAB, draft_vocab, seed)
        model.load_vocab_mappings(t2d, d2t)
    if folder is not None:
        model.save_pretrained(folder)
    return model


def speculators_draft_logits(model, aux: torch.Tensor, input_ids: torch.Tensor, ttt_steps: int):
    """Speculators' own forward over one document: aux [1, T, n * H], input_ids [1, T] -> (logits per TTT step
    [1, T, Vd] (an lm_head hook), draft tokens per step [1, T] (its return value, draft-vocabulary ids))."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            tokens = model(aux, input_ids, torch.zeros_like(input_ids), ttt_steps=ttt_steps)
    finally:
        hook.remove()
    return seen, tokens
