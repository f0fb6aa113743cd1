"""Which of SmolLM2's layers lose most under QNN's 8-bit weights? Eager transformers, the bundle's weight recipe
(`qnn_rotation.quantize_weights`: 8-bit symmetric per output channel, q / k / v 16-bit, the input table 16-bit per
tensor), teacher-forced over fp32's own greedy answers to the held-out everyday chat prompts, position 0 through the
quantized model (as the bundle's host sink runs it); the research behind exporters/qnn_sensitivity.py, which makes
the choice per linear at export on the calibration sequences. One row per variant: the recipe, then the recipe with every
linear of one layer at 16 bits (one row per layer), then `--greedy N`: layers added one at a time in order of the
per-layer rows' gain (KL first), each row cumulative. Top-1 counts tokens (one token of 1,075 is 0.001); the mean
KL(fp32 || quantized) over the same positions ranks what top-1 is too coarse to see. Extra bytes: the second byte of
every weight moved to 16 bits.

    .venv/bin/python scripts/qnn_layer_sensitivity.py [--prompts 12] [--tokens 96] [--greedy 8] [--threads 1]
        [--rows layers.11.mlp.down_proj layers.11.,layers.29. ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qnn_rotation import WIDE, answer_logits, heldout_answers, quantize_weights  # noqa: E402

from edge_spec.exporters.qnn_sensitivity import mean_kl  # noqa: E402


def scores(out: list[torch.Tensor], ref: list[torch.Tensor]) -> tuple[float, float]:
    """(top-1 agreement, mean KL(ref || out)) over every position of every prompt."""
    hits = n = 0
    kl = 0.0
    for a, b in zip(out, ref):  # [positions, vocab] each
        hits += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += a.shape[0]
        kl += mean_kl(b, a) * a.shape[0]
    return hits / n, kl / n


def layer_linears(model, layer: int) -> tuple[str, ...]:
    """Name suffixes of every linear of decoder layer `layer` (matched by `quantize_weights`' endswith)."""
    prefix = f"layers.{layer}."
    return tuple(name[name.index(prefix):] for name, mod in model.named_modules()
                 if isinstance(mod, torch.nn.Linear) and f".{prefix}" in name)


def extra_bytes(model, wide: tuple[str, ...]) -> int:
    return sum(mod.weight.numel() for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and name.endswith(wide) and not name.endswith(WIDE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--greedy", type=int, default=8, help="layers added in order of gain, cumulatively")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", nargs="*", help="instead of the sweep: these variants, each a comma-separated list "
                        "of linear name suffixes at 16 bits (e.g. layers.11.mlp.down_proj,lm_head)")
    args = parser.parse_args()
    fp32, _, prompts, seqs, _ = heldout_answers(args.prompts, args.tokens, args.threads)
    ref = answer_logits(fp32, fp32, prompts, seqs, "model")
    base = copy.deepcopy(fp32)
    base.lm_head.weight = torch.nn.Parameter(base.model.embed_tokens.weight.detach().clone())  # untied

    def run(wide: tuple[str, ...], label: str) -> dict:
        model = copy.deepcopy(base)
        quantize_weights(model, WIDE + wide)
        top1, kl = scores(answer_logits(model, fp32, prompts, seqs, "model"), ref)
        row = {"variant": label, "top1": round(top1, 4), "kl": round(kl, 5), "extra_mb": extra_bytes(base, wide) / 1e6,
               "positions": sum(r.shape[0] for r in ref)}
        print(json.dumps(row), flush=True)
        return row

    recipe = run((), "recipe")
    if args.rows:
        for row in args.rows:  # "layers.11." stands for every linear of layer 11
            names = row.split(",")
            run(tuple(n for name in names for n in (layer_linears(base, int(name.split(".")[1]))
                                                     if name.endswith(".") else (name,))), row)
        return
    per_layer = [(i, run(layer_linears(base, i), f"layer {i} at 16 bits")) for i in range(len(base.model.layers))]
    run(("lm_head",), "head at 16 bits")
    order = sorted(per_layer, key=lambda r: (r[1]["kl"], -r[1]["top1"]))
    chosen: tuple[str, ...] = ()
    for count, (i, _) in enumerate(order[:args.greedy], 1):
        chosen += layer_linears(base, i)
        run(chosen, f"best {count} layers at 16 bits: {sorted(j for j, _ in order[:count])}")
    print(json.dumps({"recipe": recipe, "order": [i for i, _ in order]}))


if __name__ == "__main__":
    main()
