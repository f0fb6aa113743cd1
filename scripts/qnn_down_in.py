"""down_proj's input (SiLU(gate) x up) on one 16-bit per-tensor grid: what it costs SmolLM2, per layer, and what an
exact per-channel smoothing buys back. Eager transformers, the bundle's weight recipe (`qnn_rotation.quantize_weights`,
q / k / v and `--wide` at 16 bits), teacher-forced over fp32's own greedy answers to the held-out everyday chat
prompts, position 0 float (as the bundle's host sink runs it). Each down_proj input is rounded to a 16-bit grid whose
range is its min / max over the calibration positions (the 9 bench prompts' first 64 tokens, position 0 left out);
values outside it clip, as the bundle's Quantize does.

Smoothing with exponent a: per input channel j of down_proj, s_j = max|x_j|^a / max|W[:, j]|^(1 - a) (SmoothQuant's
rule, scaled so the median channel keeps s = 1); up_proj's row j is divided by s_j and down_proj's column j multiplied
by it, so the float model is unchanged; then the weights are quantized (so down_proj's 8-bit rows see the scales).

    .venv/bin/python scripts/qnn_down_in.py [--prompts 12] [--tokens 96] [--alphas 0.5 0.75] [--per-layer]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qnn_layer_sensitivity import scores  # noqa: E402
from qnn_rotation import WIDE, answer_logits, heldout_answers, quantize_weights  # noqa: E402

CHOSEN = ("layers.0.mlp.down_proj", "layers.11.mlp.down_proj", "lm_head")  # exporters/qnn_sensitivity's SmolLM2 pick


class DownInGrid:
    """Rounds each chosen layer's down_proj input to a 16-bit grid over its calibrated range; position 0 float."""

    def __init__(self, model, layers: set[int] | None = None, headroom: float = 1.0):
        self.stats, self.calibrating, self.clipped, self.n, self.headroom = {}, True, 0, 0, headroom
        for i, layer in enumerate(model.model.layers):
            if layers is None or i in layers:
                layer.mlp.down_proj.register_forward_pre_hook(self._hook(i))

    def _hook(self, i: int):
        def hook(module, args):
            x = args[0]  # [1, T, inter]
            rest = x[:, 1:]
            if self.calibrating:
                lo, hi, top = self.stats.get(i, (0.0, 0.0, torch.zeros(x.shape[-1])))
                self.stats[i] = (min(lo, rest.min().item()), max(hi, rest.max().item()),
                                 torch.maximum(top, rest.abs().amax((0, 1))))
                return None
            lo, hi, _ = self.stats[i]
            mid = (lo + hi) / 2
            lo, hi = mid - (mid - lo) * self.headroom, mid + (hi - mid) * self.headroom
            scale = (hi - lo) / 65535
            zero = round(-lo / scale)
            q = torch.round(rest / scale) + zero
            self.clipped += int(((q < 0) | (q > 65535)).sum())
            self.n += q.numel()
            rounded = (torch.clamp(q, 0, 65535) - zero) * scale
            return (torch.cat([x[:, :1], rounded], 1),)
        return hook


def channel_max(model, calib: list[list[int]]) -> list[torch.Tensor]:
    """max |down_proj input| per channel per layer over the calibration positions (position 0 left out)."""
    grid = DownInGrid(model)
    with torch.no_grad():
        for ids in calib:
            model(torch.tensor([ids]))
    return [grid.stats[i][2] for i in range(len(model.model.layers))]


@torch.no_grad()
def smooth(model, tops: list[torch.Tensor], alpha: float) -> None:
    for layer, top in zip(model.model.layers, tops):
        w = layer.mlp.down_proj.weight  # [hidden, inter]
        s = top.clamp(min=1e-5) ** alpha / w.abs().amax(0).clamp(min=1e-5) ** (1 - alpha)
        s = s / s.median()
        layer.mlp.up_proj.weight.div_(s[:, None])
        w.mul_(s[None])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--wide", nargs="*", default=list(CHOSEN))
    parser.add_argument("--alphas", nargs="*", type=float, default=[0.5, 0.75, 1.0])
    parser.add_argument("--headroom", nargs="*", type=float, default=[1.5, 2.0, 4.0, 16.0],
                        help="the calibrated range widened about its middle by these factors")
    parser.add_argument("--per-layer", action="store_true", help="each layer's input on the grid alone")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    fp32, _, prompts, seqs, calib = heldout_answers(args.prompts, args.tokens, args.threads)
    ref = answer_logits(fp32, fp32, prompts, seqs, "model")
    base = copy.deepcopy(fp32)
    base.lm_head.weight = torch.nn.Parameter(base.model.embed_tokens.weight.detach().clone())  # untied
    tops = channel_max(copy.deepcopy(base), calib)
    for i, top in enumerate(tops):
        print(json.dumps({"layer": i, "max": round(float(top.max()), 2), "median_channel_max": round(
            float(top.median()), 3), "top3": [round(float(v), 1) for v in top.topk(3).values]}), flush=True)

    def run(label: str, alpha: float | None, layers: set[int] | None, grid: bool = True, headroom: float = 1.0) -> None:
        model = copy.deepcopy(base)
        if alpha is not None:
            smooth(model, tops, alpha)
        quantize_weights(model, WIDE + tuple(args.wide))
        g = None
        if grid:
            g = DownInGrid(model, layers, headroom)
            with torch.no_grad():
                for ids in calib:
                    model(torch.tensor([ids]))
            g.calibrating = False
        top1, kl = scores(answer_logits(model, fp32, prompts, seqs, "model"), ref)
        print(json.dumps({"variant": label, "top1": round(top1, 4), "kl": round(kl, 5),
                          "clipped": g.clipped if g else 0, "of": g.n if g else 0}), flush=True)

    run("weights only", None, None, grid=False)
    run("down_in on its grid (min / max)", None, None)
    for h in args.headroom:
        run(f"down_in on its grid, range widened x{h}", None, None, headroom=h)
    for a in args.alphas:
        run(f"smoothed a={a}, weights only", a, None, grid=False)
        run(f"smoothed a={a}, down_in on its grid", a, None)
    if args.per_layer:
        for i in range(len(base.model.layers)):
            run(f"layer {i}'s down_in alone on its grid", None, {i})


if __name__ == "__main__":
    main()
