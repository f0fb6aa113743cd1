"""Export-time calibration data, shared by the exporters: the shipped bench prompts as the target's own token ids,
and what the exporters measure on them in eager fp32 with the reference runtime (e.g. the residual stream's peak,
for fp16 programs: edge_spec.model.headroom).
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np

from edge_spec.contract.backend import Session
from edge_spec.loading.checkpoints import LoadedModel
from edge_spec.model import headroom
from edge_spec.contract.layout import kv_layout

STREAM_PROMPTS = 3  # bench prompts the fp16 stream peak is measured on (gemma-3-270m: ~1 s each, eager)
STREAM_TOKENS = 96  # each prompt's first tokens (chat prompts: the template's tokens included)


def prompt_ids(target: LoadedModel, n_prompts: int, max_len: int) -> list[list[int]]:
    """The first `n_prompts` shipped bench prompts as `target`'s ids, each cut to `max_len`; a tokenizer that maps the
    text to fewer than 4 distinct ids (tests' word-level ones) gets 8 random ids added (seeded by the prompt's index)."""
    lines = resources.files("edge_spec.assets.prompts").joinpath("bench.jsonl").read_text().splitlines()
    out = []
    for index, line in enumerate(lines[:n_prompts]):
        item = json.loads(line)
        ids = target.tokenizer.encode_prompt(item["prompt"], chat=bool(item.get("chat")))[:max_len]
        if len(set(ids)) < 4:
            rng = np.random.default_rng(index)
            ids = (ids + rng.integers(4, target.config.vocab_size, 8).tolist())[:max_len]
        out.append([int(i) for i in ids])
    return out


def stream_scale(target: LoadedModel) -> tuple[int, float]:
    """(s, peak): the power of two an fp16 program divides the residual stream by (edge_spec.model.headroom), from the
    stream's peak |x| over the first bench prompts in eager fp32."""
    from edge_spec.runtimes.torch import TorchBackend  # the reference runtime (imports torch-side modules)

    prompts = prompt_ids(target, STREAM_PROMPTS, STREAM_TOKENS)
    layout = kv_layout(target.config, max(len(p) for p in prompts) + 1)

    def run(ids: list[int]) -> None:
        Session(TorchBackend(target.model.eval(), layout), prefill_chunk=len(ids)).forward(ids)

    peak = headroom.stream_peak(target.model, run, prompts)
    return headroom.scale_for(peak), peak


LINEAR_PROMPTS = 9  # bench prompts the int4 grids are calibrated on (never the held-out sets the docs score on)
LINEAR_TOKENS = 160


def linear_key(weight: np.ndarray) -> tuple[int, bytes]:
    """A Linear's identity as an exported MatMul shows it: (K, the bytes of its first output row). A packed
    projection (q/k/v, gate/up as one MatMul) starts with its first member's row, whose input it shares.
    weight: [N, K] (torch's layout)."""
    return weight.shape[1], np.ascontiguousarray(weight[0], dtype=np.float32).tobytes()


def linear_input_stats(target: LoadedModel) -> dict[tuple[int, bytes], tuple[np.ndarray, np.ndarray]]:
    """Per Linear of the target (by `linear_key`): each input channel's mean and mean square, [K] float64 each, over
    the bench prompts' tokens in eager fp32 - what the int4 grid fit weighs rounding errors by
    (exporters/grid_fit: the ONNX int4 and ExecuTorch 8da4w grids)."""
    import torch

    from edge_spec.runtimes.torch import TorchBackend  # the reference runtime (imports torch-side modules)

    prompts = prompt_ids(target, LINEAR_PROMPTS, LINEAR_TOKENS)
    layout = kv_layout(target.config, max(len(p) for p in prompts) + 1)
    sums: dict[torch.nn.Module, list] = {}

    def record(module, inputs):
        x = inputs[0].detach().double().reshape(-1, inputs[0].shape[-1])  # [tokens, K]
        acc = sums.setdefault(module, [0, 0.0, 0.0])
        acc[0] += x.shape[0]
        acc[1] = acc[1] + x.sum(0)
        acc[2] = acc[2] + (x * x).sum(0)

    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    hooks = [m.register_forward_pre_hook(record) for m in linears]
    try:
        with torch.no_grad():
            for ids in prompts:
                Session(TorchBackend(target.model.eval(), layout), prefill_chunk=len(ids)).forward(ids)
    finally:
        for h in hooks:
            h.remove()
    return {linear_key(module.weight.detach().float().numpy()): ((s1 / n).numpy(), (s2 / n).numpy())
            for module, (n, s1, s2) in sums.items()}
