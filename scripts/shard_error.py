"""Relative error of 4-bit shard codes (edge_spec/train/shard_quant.py) with and without the Hadamard rotation, on
SmolLM2's final hidden states and its layer-29 K / V over held-out text (docs/drafter.md, "4-bit Hadamard shard
storage"), and the shard sizes for that many tokens.

    .venv/bin/python scripts/shard_error.py --sequences 128 --tokens 256      # the table's size (~4 min, 2 cores)
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from edge_spec.loading import checkpoints
from edge_spec.train import shard_quant
from edge_spec.train.data import iter_documents, stdlib_root
from edge_spec.train.teacher import extract


def rel_error(x: np.ndarray, rotate: bool) -> float:
    codes, scales = shard_quant.encode(x, rotate=rotate)
    y = shard_quant.decode(codes, scales, rotate=rotate)
    return float(np.linalg.norm(y - x) / np.linalg.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--layer", type=int, default=29)
    args = ap.parse_args()
    loaded = checkpoints.load("smollm2-135m")
    ids = []
    for doc in iter_documents([stdlib_root()], held_out=True):
        ids += loaded.tokenizer.encode(doc.text)
        if len(ids) >= args.sequences * args.tokens:
            break
    seqs = np.array(ids[:args.sequences * args.tokens]).reshape(args.sequences, args.tokens)
    acts = extract(loaded.model, seqs, [args.layer], dtype=torch.float32, store=np.float32)
    print(f"{args.sequences} x {args.tokens} held-out stdlib tokens")
    print("| tensor | 4-bit, no rotation | 4-bit + Hadamard | fp16 MB | 4-bit MB |\n|---|---|---|---|---|")
    for name in ("hidden", f"k_{args.layer}", f"v_{args.layer}"):
        x = acts[name]
        codes, scales = shard_quant.encode(x)
        print(f"| {name} | {rel_error(x, False):.3f} | {rel_error(x, True):.3f} | {x.size * 2 / 1e6:.1f} | "
              f"{(codes.nbytes + scales.nbytes) / 1e6:.1f} |")


if __name__ == "__main__":
    main()
