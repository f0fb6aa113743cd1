"""Which linears keep their weights at 16 bits in a 16a8w QNN bundle: the few whose 8-bit weights cost the model
most for their bytes, measured on the export's own calibration sequences.

8-bit per-channel weights are most of what a 16a8w bundle loses against fp32 (docs/android-qnn.md: 0.966 top-1 with
every activation float), and the loss sits in a few tensors. SmolLM2-135M, mean KL(fp32 || 8-bit weights) over fp32's
own answers to the 12 held-out everyday prompts (1,075 positions; `scripts/qnn_layer_sensitivity.py`, 2026-12-07):
0.00288 with the recipe below; layer 11's down_proj alone at 16 bits 0.00221 (+0.9 MB), the head alone 0.00211
(+28 MB), layer 29's down_proj 0.00268, every other whole layer above 0.0027. Which tensors those are is the model's
own property, so the exporter measures it: eager, the target's weights quantized as the bundle's recipe quantizes
them (8-bit symmetric per output channel, `qnn.WIDE_WEIGHTS` at 16 bits), every position of the calibration sequences
teacher-forced; then each other linear of the decoder layers, and the head, at 16 bits alone. Those whose 16 bits
alone cut the recipe's KL by at least `GAIN` of it are widened, the largest cut per added byte first, while the added
bytes stay within `BUDGET` of the target's parameters.

What runs here is the bundle's weight grid, not its activations: position 0 runs as the host sink runs it (float
activations over the quantized weights) and so does every other position (the 16-bit activations' share is measured
in the bundle: scripts/qnn_activation_ablation.py)."""

from __future__ import annotations

import math
import torch

GAIN = 0.05  # a linear is widened when its weights alone at 16 bits cut the recipe's KL by at least this share
BUDGET = 0.25  # the widened linears' second bytes, at most this share of the target's parameters (SmolLM2: 34 MB)
HEAD = "lm_head"
LOGITS_PER_BATCH = 1 << 26  # logits per eager pass (256 MB in fp32: a 262k-vocabulary head takes 4 sequences of 64)


def fake_quant(w: torch.Tensor, bits: int) -> torch.Tensor:
    """w: [out, in] -> w on a symmetric per-output-channel grid of `bits` (zero at 0: QNN's 8-bit symmetric weights
    with zero point 128, or int16), each row scaled to its largest magnitude."""
    top = w.abs().amax(1, keepdim=True).clamp(min=1e-12)
    scale = top / (2 ** (bits - 1) - 1)
    return torch.clamp(torch.round(w / scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1) * scale


def mean_kl(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """reference, logits: [..., V] -> mean over rows of KL(softmax(reference) || softmax(logits))."""
    p = torch.log_softmax(reference.float(), -1)
    return float((p.exp() * (p - torch.log_softmax(logits.float(), -1))).sum(-1).mean())


def sequence_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """ids: [B, T] -> logits [B, T, V]: one causal pass from position 0, no cache (sliding layers see their window)."""
    cfg, (b, t) = model.cfg, ids.shape
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    masks = {}
    for kind in set(cfg.layer_kinds):
        ok = (k <= q) & ((q - k < cfg.sliding_window) if kind == "sliding" else True)
        masks[kind] = torch.where(ok, 0.0, float("-inf"))[None, None]  # [1, 1, T, T]
    empty = [torch.zeros(b, cfg.kv_heads[i], 0, cfg.head_dims[i]) for i in cfg.cached_layers()]
    with torch.no_grad():
        return model(ids, torch.arange(t)[None].expand(b, t), masks, empty, list(empty)).logits.float()


def _linears(model) -> dict[str, torch.nn.Linear]:
    """The decoder layers' linears by name ("model.layers.3.mlp.down_proj"); the head apart."""
    return {n: m for n, m in model.model.layers.named_modules(prefix="model.layers")
            if isinstance(m, torch.nn.Linear)}


def graph_name(name: str) -> str:
    """"model.layers.11.mlp.down_proj" -> "layers.11/mlp/down_proj", "lm_head" -> "lm_head": the path part of the
    ONNX weight names ("/model/layers.11/mlp/down_proj/MatMul.conv.weight") that `qnn.wide_weights` matches."""
    if name == HEAD:
        return HEAD
    parts = name.split(".")
    return f"layers.{parts[2]}/" + "/".join(parts[3:])


def candidates(model, wide: tuple[str, ...]) -> dict[str, int]:
    """The decoder layers' linears not already at 16 bits (`wide`: class names such as "q_proj"), and the head ->
    their weights' count, the bytes 16 bits there would add."""
    out = {n: m.weight.numel() for n, m in _linears(model).items() if n.split(".")[-1] not in wide}
    return out | {HEAD: model.lm_head.weight.numel()}


def linear_gains(model, sequences: list[list[int]], wide: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    """(the recipe's mean KL against fp32, each candidate linear's mean KL with its weights alone at 16 bits) over
    `sequences`. The model's weights are changed in place and restored bit for bit before it returns."""
    linears = _linears(model)
    saved = {n: m.weight.detach().clone() for n, m in linears.items()}
    head = model.lm_head
    rows = max(1, LOGITS_PER_BATCH // (max(map(len, sequences)) * head.out_features))  # sequences per pass
    same = [[s for s in sequences if len(s) == n] for n in sorted({len(s) for s in sequences})]
    batches = [torch.tensor(group[i:i + rows]) for group in same for i in range(0, len(group), rows)]
    refs = [sequence_logits(model, ids) for ids in batches]  # fp32, [B, T, V] per length
    quantized_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    quantized_head.weight = torch.nn.Parameter(fake_quant(head.weight.detach(), 8), requires_grad=False)

    def recipe_bits(name: str) -> int:
        return 16 if name.split(".")[-1] in wide else 8

    def score() -> float:  # over every position of every sequence
        return sum(mean_kl(r, sequence_logits(model, ids)) * ids.numel() for r, ids in zip(refs, batches)) / \
            sum(ids.numel() for ids in batches)

    try:
        model.lm_head = quantized_head
        with torch.no_grad():
            for n, m in linears.items():
                m.weight.copy_(fake_quant(saved[n], recipe_bits(n)))
            recipe = score()
            gains = {}
            names = [n for n in candidates(model, wide) if n != HEAD]
            for n in names:
                linears[n].weight.copy_(fake_quant(saved[n], 16))
                gains[n] = score()
                linears[n].weight.copy_(fake_quant(saved[n], 8))
            quantized_head.weight.copy_(fake_quant(head.weight.detach(), 16))
            gains[HEAD] = score()
    finally:
        model.lm_head = head
        with torch.no_grad():
            for n, m in linears.items():
                m.weight.copy_(saved[n])
    return recipe, gains


def choose(recipe: float, with_16: dict[str, float], extra: dict[str, int], parameters: int,
           gain: float = GAIN, budget: float = BUDGET) -> tuple[str, ...]:
    """The linears to widen: those whose 16 bits alone cut `recipe`'s KL by >= `gain` of it, the largest cut per
    `extra` second byte first, while those bytes add up to <= `budget` x `parameters`. In `with_16`'s order."""
    chosen, spent = set(), 0
    worth = [n for n in with_16 if math.isfinite(with_16[n]) and recipe - with_16[n] >= gain * recipe]
    for n in sorted(worth, key=lambda n: -(recipe - with_16[n]) / extra[n]):
        if spent + extra[n] <= budget * parameters:
            chosen.add(n)
            spent += extra[n]
    return tuple(n for n in with_16 if n in chosen)
