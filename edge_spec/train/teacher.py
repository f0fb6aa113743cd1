"""Teacher passes over the target: batched greedy generation (regenerated chat data) and hidden-state /
K/V extraction into on-disk shards.

Runs on the device the target's weights are on: a bf16 copy of the target on a GPU, and on a CPU when it has fast
bf16 matmuls (AMX / AVX512-BF16), else fp32; only drafter *quality* depends on this, never decoding correctness.
Inputs go to the model's device, results come back to the CPU (numpy, Python lists).
"""

from __future__ import annotations


import numpy as np
import torch

from edge_spec.errors import ConfigError
from edge_spec.contract.kv import NEG_INF
from edge_spec.model.transformer import Transformer


def autocast_dtype(device: torch.device | None = None) -> torch.dtype:
    """bf16 on a GPU; on the CPU bf16 when it multiplies bf16 much faster than fp32, else fp32 (timed: ranks of a
    distributed run must agree on rank 0's choice, dist.agree)."""
    import time

    if device is not None and device.type == "cuda":
        return torch.bfloat16
    a, b = torch.randn(256, 512), torch.randn(512, 2048)
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        t = time.perf_counter()
        for _ in range(5):
            x @ y
        times[dtype] = time.perf_counter() - t
    return torch.bfloat16 if times[torch.bfloat16] < 0.5 * times[torch.float32] else torch.float32


def with_autocast(cfg, dtype: torch.dtype):
    """A training config (a dataclass with `bf16`) that keeps bf16 autocast only where the timed probe picked bf16
    (`autocast_dtype`): on a CPU without bf16 units it is far slower, not faster (AMD EPYC without avx512_bf16: an
    EAGLE-3 step for gemma-3-270m 31 s under bf16 autocast, 0.8 s in fp32)."""
    import dataclasses

    return dataclasses.replace(cfg, bf16=False) if cfg.bf16 and dtype != torch.bfloat16 else cfg


def cast_model(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of a Transformer/Drafter in `dtype` for teacher passes; RoPE tables stay fp32."""
    import copy

    if dtype == torch.float32:
        return model
    twin = copy.deepcopy(model).to(dtype)
    for name, buf in model.named_buffers():
        if "inv_freq" in name:
            twin.get_buffer(name).data = buf.clone()
    return twin


def _causal_mask(valid: torch.Tensor, n_new: int) -> torch.Tensor:
    """valid: [B, S + T] (False = left padding) -> additive mask [B, 1, T, S + T] for the last T rows."""
    b, total = valid.shape
    q = torch.arange(total - n_new, total, device=valid.device)[:, None]
    k = torch.arange(total, device=valid.device)[None, :]
    ok = (k <= q)[None] & valid[:, None, :]  # [B, T, S + T]
    return torch.where(ok, 0.0, float(NEG_INF))[:, None]


@torch.no_grad()
def batched_greedy(model: Transformer, prompts: list[list[int]], *, max_new_tokens: int, stop_ids: frozenset[int],
                   dtype: torch.dtype = torch.float32) -> list[list[int]]:
    """Greedy continuations of many prompts at once (left-padded batch, growing K/V by concatenation)."""
    cfg = model.cfg
    b = len(prompts)
    width = max(map(len, prompts))
    if "sliding" in cfg.layer_kinds and width + max_new_tokens > cfg.sliding_window:
        # inside the window a sliding layer sees what a full one sees: one causal mask serves both kinds
        raise ConfigError(f"regenerated answers of up to {width} + {max_new_tokens} tokens pass the target's sliding "
                          f"window ({cfg.sliding_window}); batched greedy generation masks every layer alike",
                          f"lower --regen-tokens to at most {cfg.sliding_window - width} (or shorten the prompts)")
    device = next(model.parameters()).device
    ids = torch.zeros(b, width, dtype=torch.long)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        valid[i, width - len(p):] = True
    ids, valid = ids.to(device), valid.to(device)  # [B, S] left-padded
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    n_cached = len(cfg.cached_layers())
    model = cast_model(model, dtype)
    empty = [torch.zeros(b, cfg.kv_heads[l], 0, cfg.head_dims[l], dtype=dtype, device=device)
             for l in cfg.cached_layers()]
    mask = _causal_mask(valid, width)
    out = model(ids, pos, {kind: mask for kind in cfg.kinds()}, empty, list(empty), last_only=True)
    ks, vs = out.new_k, out.new_v
    next_tok = out.logits[:, -1].float().argmax(-1)
    results = [[t] for t in next_tok.tolist()]
    done = torch.tensor([t in stop_ids for t in next_tok.tolist()])
    last_pos = pos[:, -1]
    for _ in range(max_new_tokens - 1):
        if bool(done.all()):
            break
        valid = torch.cat([valid, torch.ones(b, 1, dtype=torch.bool, device=device)], dim=1)
        last_pos = last_pos + 1
        mask = _causal_mask(valid, 1)
        out = model(next_tok[:, None], last_pos[:, None], {kind: mask for kind in cfg.kinds()}, ks, vs)
        ks = [torch.cat([k, n], dim=2) for k, n in zip(ks, out.new_k)]
        vs = [torch.cat([v, n], dim=2) for v, n in zip(vs, out.new_v)]
        next_tok = out.logits[:, -1].float().argmax(-1)
        for i, t in enumerate(next_tok.tolist()):
            if not done[i]:
                results[i].append(t)
                done[i] = t in stop_ids
        assert len(ks) == n_cached
    return results


@torch.no_grad()
def extract(model: Transformer, sequences: np.ndarray, source_layers: list[int], *, dtype: torch.dtype,
            batch: int = 8, store: type = np.float16) -> dict[str, np.ndarray]:
    """sequences: [N, T] int -> hidden [N, T, H] and, per source layer l, k_l / v_l [N, H_kv, T, D] (`store`:
    fp16 for shards, fp32 for exact evaluation).

    `hidden` is the target's final hidden state (after the final norm) at every position."""
    cfg = model.cfg
    device = next(model.parameters()).device
    model = cast_model(model, dtype)
    cached = list(cfg.cached_layers())
    out_h, out_k, out_v = [], {l: [] for l in source_layers}, {l: [] for l in source_layers}
    n, t = sequences.shape
    mask = _causal_mask(torch.ones(1, t, dtype=torch.bool, device=device), t)
    masks = {kind: mask for kind in cfg.kinds()}
    if "sliding" in masks:
        q = torch.arange(t, device=device)[:, None]
        k = torch.arange(t, device=device)[None, :]
        masks["sliding"] = torch.where((k <= q) & (q - k < cfg.sliding_window), 0.0, float(NEG_INF))[None, None]
    for start in range(0, n, batch):
        ids = torch.from_numpy(sequences[start:start + batch].astype(np.int64)).to(device)  # [b, T]
        bsz = ids.shape[0]
        pos = torch.arange(t, device=device)[None].expand(bsz, t)
        empty = [torch.zeros(bsz, cfg.kv_heads[l], 0, cfg.head_dims[l], dtype=dtype, device=device) for l in cached]
        out = model(ids, pos, masks, empty, list(empty), with_logits=False)
        out_h.append(out.hidden.float().cpu().numpy().astype(store))  # [b, T, H]
        for l in source_layers:  # [b, H_kv, T, D]
            out_k[l].append(out.new_k[cached.index(l)].float().cpu().numpy().astype(store))
            out_v[l].append(out.new_v[cached.index(l)].float().cpu().numpy().astype(store))
    result = {"hidden": np.concatenate(out_h)}
    for l in source_layers:
        result[f"k_{l}"] = np.concatenate(out_k[l])
        result[f"v_{l}"] = np.concatenate(out_v[l])
    return result
