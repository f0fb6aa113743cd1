"""Recall of the clustered head with untrained centroids (docs/benchmarks.md, "Recall of the clustered head"):
balanced spherical k-means of SmolLM2's tied embedding, centroids = mean member embedding, target final hidden
states over the first --tokens tokens of argparse.py (the Python standard library): the share of positions whose
dense argmax lies inside the top-k clusters.

    .venv/bin/python scripts/cluster_recall.py --tokens 1500 --iters 6
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from edge_spec.loading import checkpoints
from edge_spec.model.clustering import balanced_kmeans, recall
from edge_spec.train.data import stdlib_root
from edge_spec.train.teacher import extract


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--clusters", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--top-k", type=int, nargs="+", default=[8, 16, 32, 64])
    args = ap.parse_args()
    loaded = checkpoints.load("smollm2-135m")
    ids = loaded.tokenizer.encode((stdlib_root() / "argparse.py").read_text())[:args.tokens]
    hidden = extract(loaded.model, np.array([ids]), [], dtype=torch.float32, store=np.float32)["hidden"][0]
    table = loaded.model.lm_head.weight.detach().numpy()
    print(f"{len(ids)} tokens of argparse.py, {args.iters} k-means iterations")
    print("| clusters \\ top-k | " + " | ".join(map(str, args.top_k)) + " |\n" + "|---" * (1 + len(args.top_k)) + "|")
    for c in args.clusters:
        clustering = balanced_kmeans(table, c, iters=args.iters)
        print(f"| {c} | " + " | ".join(f"{recall(hidden, table, clustering, k):.2f}" for k in args.top_k) + " |")


if __name__ == "__main__":
    main()
