"""The two KV bindings through ExecuTorch, measured on SmolLM2's real layers (docs/architecture.md "ExecuTorch path",
why the `state` binding is the default): the same truncated SmolLM2 (its first --layers layers) lowered to XNNPACK
twice, fp32:
  * state - what `edge-spec export --format executorch` ships: the caches are the program's mutable buffers, written
    in place by `llama::update_cache_with_indices`, attended over the first b slots (exporters/executorch.Program);
  * io - the ONNX contract's form (exporters/onnx.TargetGraph): the caches [1, H_kv, b, D] are method inputs, the
    new rows [1, H_kv, T, D] are outputs, and the runtime copies the accepted rows into its cache arrays (contiguous
    per bucket of 64 slots, as runtimes/ort.py keeps them), counted in each pass's time.
Both run the same token sequence through KVState's masks; the script prints export time, .pte size, the logits'
max |diff| between the two, and the median time of one pass over T rows after a --context-token context.

    .venv/bin/python scripts/et_binding_cost.py --layers 10 --threads 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from truncated import truncated_smollm2

from edge_spec.loading import checkpoints
from edge_spec.contract import kv
from edge_spec.contract.kv_state import KVState
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.io_caches import IoCaches, NewRows
from edge_spec.exporters import executorch as et_export
from edge_spec.exporters.onnx import TargetGraph
from edge_spec.model.forms import Slots
from edge_spec.model.ops import SPELLED_GELU
from edge_spec.runtimes import executorch as et_runtime

BUCKET = et_runtime.BUCKET  # both forms attend over multiples of 64 slots
MAX_PASS = 9


def lower_state(model, layout):
    program = et_export.Program(model, layout).eval()
    with et_export._exporting(program):
        methods = {"target": et_export.export_target_method(program)}
    return et_export.lower(methods, {})


def lower_io(model, layout):
    """TargetGraph (caches in, new rows out) through torch.export with dynamic T and bound slots b."""
    kinds = layout.kinds()
    t, b = 3, 8
    ids, pos = torch.zeros(1, t, dtype=torch.long), torch.arange(b - t, b)[None]
    masks = tuple(torch.zeros(1, 1, t, b + t) for _ in kinds)
    caches = tuple(torch.zeros(1, c.num_kv_heads, b, c.head_dim) for c in layout.caches for _ in "kv")
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=MAX_PASS)
    s_dim = torch.export.Dim(kv.slots_dim(kv.FULL), min=1, max=layout.max_context)
    dynamic = ({1: t_dim}, {1: t_dim}, tuple({2: t_dim, 3: torch.export.Dim.AUTO} for _ in kinds),
               tuple({2: s_dim} for _ in layout.caches for _ in "kv"))
    with torch.no_grad():
        ep = torch.export.export(TargetGraph(model, kinds, Slots(), SPELLED_GELU).eval(), (ids, pos, masks, caches),
                                 dynamic_shapes=dynamic, strict=False, prefer_deferred_runtime_asserts_over_guards=True)
    return et_export.lower({"target": ep}, {})


class IoRunner:
    """The runtime half of the io form, on edge_spec.runtimes.io_caches (the ONNX runtime's cache bookkeeping): bucketed
    cache views as the method's inputs, all T new rows committed after each pass (the probe accepts every row)."""

    def __init__(self, method, layout):
        self.method, self.layout = method, layout
        self.caches, self.new = IoCaches(layout, BUCKET), NewRows(layout, MAX_PASS)

    def forward(self, ids, pos, masks, used):
        t, s = ids.shape[1], self.layout.max_context
        self.caches.prepare(used, t)
        b = self.caches.bucket[kv.FULL]
        mask = masks[kv.FULL]
        views = [torch.from_numpy(v) for i in range(len(self.layout.caches)) for v in self.caches.views(i)]
        logits, _hidden, *rows = self.method.execute([torch.from_numpy(ids), torch.from_numpy(pos),
                                                      torch.from_numpy(np.concatenate([mask[..., :b], mask[..., s:]],
                                                                                      -1)), *views])
        for i in range(len(self.layout.caches)):
            for dst, src in zip(self.new.views(i, t), rows[2 * i:2 * i + 2]):
                dst[...] = src.numpy()
        plan = {kind: kv.commit_slots(used, t, self.layout.slots(kind), False) for kind in self.layout.kinds()}
        self.caches.commit(plan, self.new, t)
        return logits


class StateRunner:
    def __init__(self, method, layout):
        self.method, self.layout = method, layout

    def forward(self, ids, pos, masks, used):
        t, s = ids.shape[1], self.layout.max_context
        b = kv.bucket_slots(used + t, s, BUCKET)
        mask = masks[kv.FULL]
        logits, _hidden = self.method.execute([torch.from_numpy(ids), torch.from_numpy(pos),
                                               torch.from_numpy(np.concatenate([mask[..., :b], mask[..., s:]], -1))])
        return logits


def run(runner, layout, seq: list[int], ts: list[int], context: int, repeats: int) -> tuple[np.ndarray, dict]:
    """Prefill `seq[:context]` in passes of MAX_PASS, then time passes over T rows (rewound after each)."""
    state = KVState(layout)

    def step(tokens):
        ids = np.array([tokens], np.int64)
        masks, pos = state.masks(len(tokens)), state.position_ids(len(tokens))
        used = state.length
        out = runner.forward(ids, pos, masks, used)
        if layout.binding == kv.BINDING_STATE:
            state.written(len(tokens))
        state.advance(len(tokens), state.plan_commit(len(tokens)))
        return out

    for start in range(0, context, MAX_PASS):
        step(seq[start:min(context, start + MAX_PASS)])
    last = step(seq[context:context + 1]).numpy().copy()
    state.rewind(context)
    times = {}
    for t in ts:
        samples = []
        for r in range(repeats + 2):
            begin = time.perf_counter()
            step(seq[context:context + t])
            if r >= 2:
                samples.append(time.perf_counter() - begin)
            state.rewind(context)
        times[t] = float(np.median(samples)) * 1e3
    return last, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-context", type=int, default=512)
    args = ap.parse_args()
    et_export._custom_ops()
    work = Path(tempfile.mkdtemp(prefix="et-binding-"))
    model = checkpoints.load(str(truncated_smollm2(args.layers, work / "smollm2"))).model
    seq = [int(i) for i in np.random.default_rng(0).integers(100, 40000, args.context + MAX_PASS)]
    ts = [1, 2, 3, 5, 9]
    results = {}
    for binding, lower, runner in [("state", lower_state, StateRunner), ("io", lower_io, IoRunner)]:
        layout = kv_layout(model.cfg, args.max_context, MAX_PASS, binding)
        begin = time.perf_counter()
        data = lower(model, layout)
        export_s = time.perf_counter() - begin
        path = work / f"{binding}.pte"
        path.write_bytes(data)
        program = et_runtime.load_program(path)
        et_runtime.set_threads(args.threads)
        last, times = run(runner(program.load_method("target"), layout), layout, seq, ts, args.context, args.repeats)
        results[binding] = {"export_s": round(export_s), "pte_mb": round(len(data) / 2**20, 1), "last": last,
                            "pass_ms": times}
        del program
    diff = float(np.abs(results["state"]["last"] - results["io"]["last"]).max())
    for binding, r in results.items():
        del r["last"]
        r["pass_ms"] = {t: round(ms, 2) for t, ms in r["pass_ms"].items()}
        print(json.dumps({"binding": binding, "layers": args.layers, "context": args.context, **r}))
    ratio = {t: round(results["io"]["pass_ms"][t] / results["state"]["pass_ms"][t], 2) for t in ts}
    print(json.dumps({"io_over_state": ratio, "max_abs_logit_diff": diff}))


if __name__ == "__main__":
    main()
