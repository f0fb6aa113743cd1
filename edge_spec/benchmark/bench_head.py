"""Benchmark: clustered vs dense drafter head (MACs and measured time per draft step, eager torch).

Run with `edge-spec bench-head`; prints a Markdown table (and JSON with --json). Not a test: timings
depend on the machine and its load. Ratios are meaningful only within one run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.model.drafter import check_pair, new_drafter


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def run(model: str = "smollm2-135m", *, hidden_size: int = 256, num_layers: int = 2, num_heads: int | None = None,
        intermediate_size: int = 1024, top_k: int = 32, clusters: tuple[int, ...] = (512, 1024, 2048),
        context: int = 256, repeats: int = 50) -> list[dict]:
    from edge_spec.loading.checkpoints import load
    from edge_spec.runtimes.torch import TorchBackend, TorchDrafter

    loaded = load(model)
    cfg = loaded.config
    backend = TorchBackend(loaded.model, kv_layout(cfg, context + 16))
    session = Session(backend)
    ids = [int(i) for i in np.random.default_rng(0).integers(100, cfg.vocab_size, context)]
    out = session.prefill(ids)
    target_step = _median_s(lambda: session.forward([ids[0]], last_only=True), repeats)
    rows = []
    variants = [("dense", None)] + [("clustered", c) for c in clusters]
    for name, c in variants:
        drafter = new_drafter(cfg, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                              intermediate_size=intermediate_size, clustered=c is not None, num_centroids=c or 1024,
                              top_k_clusters=top_k)
        runner = TorchDrafter(drafter, backend, check_pair(cfg, drafter.cfg))
        runner.begin(session.length, session.state.drafter_masks(), session.length)
        step_s = _median_s(lambda: runner.step(ids[-1], out.hidden[-1]), repeats)
        h = torch.randn(hidden_size)
        table = drafter.lm_head.weight
        with torch.no_grad():
            head = (lambda: drafter.masked_embedding(h, table)) if c else (lambda: table @ h)
            head_s = _median_s(head, repeats * 4)
        macs = hidden_size * (c + top_k * cfg.vocab_size // c) if c else hidden_size * cfg.vocab_size
        rows.append({"head": name, "clusters": c, "top_k": top_k if c else None,
                     "candidates": drafter.cfg.candidates_per_step, "vocab": cfg.vocab_size,
                     "skipped": 1 - drafter.cfg.candidates_per_step / cfg.vocab_size, "head_macs": macs, "head_ms": head_s * 1e3,
                     "drafter_step_ms": step_s * 1e3, "target_step_ms": target_step * 1e3,
                     "drafter_vs_target": step_s / target_step})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| head | clusters | top-k | candidates | vocabulary skipped | head MMACs | head ms | drafter step ms | "
             "target step ms | step / target |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['head']} | {r['clusters'] or '-'} | {r['top_k'] or '-'} | {r['candidates']} | "
                     f"{100 * r['skipped']:.1f}% | "
                     f"{r['head_macs'] / 1e6:.2f} | {r['head_ms']:.3f} | {r['drafter_step_ms']:.2f} | "
                     f"{r['target_step_ms']:.2f} | {100 * r['drafter_vs_target']:.1f}% |")
    return "\n".join(lines)


def main(args) -> int:
    rows = run(args.model, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads,
               intermediate_size=args.intermediate_size, top_k=args.top_k, clusters=tuple(args.clusters),
               repeats=args.repeats)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0
