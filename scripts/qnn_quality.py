"""Where does the QNN bundle's 16a8w quantization lose SmolLM2? A truncated SmolLM2 (its first --layers layers, the
real widths and weights) exported to a QNN bundle per variant, its QDQ graphs run on the CPU provider and compared
with eager fp32 over the shipped bench prompts: max / mean logit error relative to the logits' scale and top-1
agreement.

    .venv/bin/python scripts/qnn_quality.py --layers 30 --variants before sink_only default --no-compile

Variants (the exporter's recipe with steps turned off by patching it; the bundle code is not changed): default (what
`edge-spec export --format qnn` does: position 0 on the host, linears as 1x1 Conv with per-channel weights),
sink_only (linears stay MatMuls, per-tensor weights), before (neither: the recipe before 2026-12-02), no_sink (Conv,
position 0 quantized), w16 (16-bit weights). --no-compile skips the
context binaries (the CPU provider does not read them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from qnn_bundle_quality import passes  # logits of every position, in committed passes of max_pass
from truncated import truncated_smollm2

# variant -> get_qnn_qdq_config overrides, export_bundle keywords, recipe steps turned off ("conv": linears stay
# MatMuls with per-tensor weights)
VARIANTS = {
    "default": ({}, {}, ()),  # what `edge-spec export --format qnn` does
    "sink_only": ({}, {}, ("conv",)),
    "before": ({}, {"host_sink": False}, ("conv",)),  # the recipe before 2026-12-02
    "no_sink": ({}, {"host_sink": False}, ()),
    "w16": ({"weight_type": "uint16"}, {}, ()),
}


def export_variant(folder: Path, out: Path, variant: tuple, compile_htp: bool, max_pass: int) -> float:
    import onnxruntime.quantization.execution_providers.qnn as qnn_tools

    from edge_spec.loading import checkpoints
    from edge_spec.exporters import qnn

    overrides, keywords, off = variant
    saved = qnn_tools.get_qnn_qdq_config, qnn.compile_context, qnn.linears_as_conv
    original = saved[0]

    def wrapped(*args, **kwargs):
        extra = dict(overrides)
        if "weight_type" in extra:
            from onnxruntime.quantization import QuantType

            extra["weight_type"] = QuantType.QUInt16
        return original(*args, **{**kwargs, **extra})

    qnn_tools.get_qnn_qdq_config = wrapped
    if not compile_htp:  # the CPU provider reads only the QDQ graphs
        qnn.compile_context = lambda *args: None
    if "conv" in off:
        qnn.linears_as_conv = lambda path: 0
    try:
        start = time.perf_counter()
        qnn.export_bundle(checkpoints.load(str(folder)), out, max_context=128, max_draft_len=2, max_pass=max_pass,
                          **keywords)
        return time.perf_counter() - start
    finally:
        qnn_tools.get_qnn_qdq_config, qnn.compile_context, qnn.linears_as_conv = saved


def compare(folder: Path, bundle: Path, n_prompts: int, max_pass: int) -> dict:
    from edge_spec.loading import checkpoints
    from edge_spec.api import load_bundle
    from edge_spec.contract.backend import Session
    from edge_spec.benchmark.bench import DEFAULT_PROMPTS
    from edge_spec.runtimes.torch import TorchBackend
    from edge_spec.train.evaluate import read_prompts

    target = checkpoints.load(str(folder))
    engine = load_bundle(bundle, provider="cpu", host_check=False)
    worst, means, agree, n = 0.0, [], 0, 0

    for p in read_prompts(DEFAULT_PROMPTS)[:n_prompts]:
        ids = engine.encode(p["prompt"], chat=p["chat"])[:48]
        engine.session.reset()
        a = passes(engine.session, ids, max_pass)
        b = passes(Session(TorchBackend(target.model, engine.session.state.layout)), ids, max_pass)
        scale = np.abs(b).max()
        worst = max(worst, float(np.abs(a - b).max() / scale))
        means.append(float(np.abs(a - b).mean() / scale))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += len(a)
    return {"max_rel": worst, "mean_rel": float(np.mean(means)), "top1": agree / n, "positions": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=["default"], choices=list(VARIANTS))
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-pass", type=int, default=3, help="longest pass exported (prefill chunk; 9 pads "
                        "passes: lengths 1, 2, 3, 9) and the pass length compared in")
    parser.add_argument("--no-compile", action="store_true", help="skip the context binaries (not used here)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qnn-quality-"))
    folder = truncated_smollm2(args.layers, work / "smollm2")
    for name in args.variants:
        seconds = export_variant(folder, work / name, VARIANTS[name], not args.no_compile, args.max_pass)
        print(json.dumps({"layers": args.layers, "variant": name, "max_pass": args.max_pass, "export_s": round(seconds),
                          **compare(folder, work / name, args.prompts, args.max_pass)}), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
