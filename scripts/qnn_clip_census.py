"""Which 16-bit activations of a QNN bundle clip on held-out text? The bundle's target QDQ graphs with every quantized
activation (the input of each activation QuantizeLinear) added as a graph output, teacher-forced on the CPU provider
over eager fp32's own greedy answers to held-out everyday chat prompts (as scripts/qnn_activation_ablation.py scores
them); for each tensor, how many values fall outside its encoding's range and by how much (in units of the range).
One JSON line per tensor that clips, most values first, then one line per name pattern (the layer number taken out).

    .venv/bin/python scripts/qnn_clip_census.py B [--prompts 12] [--tokens 96] [--top 40]

B: a QNN bundle with QDQ graphs (`scripts/qnn_activation_ablation.py B --export` writes a target-only one). The
values are what the QDQ graph computes (upstream tensors already on their grids), every row of every pass (a short
last pass's padding rows included).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qnn_activation_ablation import HELDOUT, answers, variant_bundle  # noqa: E402
from qnn_bundle_quality import passes  # noqa: E402


def encodings(qdq: Path) -> dict[str, tuple[float, float]]:
    """activation tensor -> (lo, hi): the real range its QuantizeLinear represents."""
    proto = onnx.load(str(qdq), load_external_data=False)
    inits = {i.name: i for i in proto.graph.initializer}
    out = {}
    for n in proto.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits:
            scale = float(numpy_helper.to_array(inits[n.input[1]]))
            zero = numpy_helper.to_array(inits[n.input[2]])
            top = np.iinfo(zero.dtype).max
            out[n.input[0]] = ((0 - float(zero)) * scale, (top - float(zero)) * scale)
    return out


def exposed(qdq: Path, out: Path, names) -> int:
    """`qdq` with each tensor of `names` also a graph output (float, shape left open)."""
    proto = onnx.load(str(qdq), load_external_data=False)
    have = {o.name for o in proto.graph.output}
    for name in sorted(set(names) - have):
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    onnx.save(proto, str(out))
    return len(names)


class Census:
    """Wraps runtimes/qnn's predictors: counts each tracked output's values outside its range."""

    def __init__(self, ranges: dict[str, tuple[float, float]]):
        self.ranges = ranges
        self.clipped, self.total, self.over = defaultdict(int), defaultdict(int), defaultdict(float)

    def wrap(self, make):
        def predictor(session):
            run = make(session)

            def counted(feeds):
                out = run(feeds)
                for name, (lo, hi) in self.ranges.items():
                    if name in out:
                        x = out.pop(name)
                        width = hi - lo
                        half = width / 65535 / 2  # within half a step: the grid's own rounding, not a clip
                        self.clipped[name] += int(((x < lo - half) | (x > hi + half)).sum())
                        self.total[name] += x.size
                        self.over[name] = max(self.over[name], float(max(x.max() - hi, lo - x.min(), 0)) / width)
                return out
            return counted
        return predictor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--prompts", type=int, default=12, help="held-out everyday prompts (of 12)")
    parser.add_argument("--tokens", type=int, default=96, help="answer tokens per prompt")
    parser.add_argument("--top", type=int, default=40, help="tensors listed")
    args = parser.parse_args()
    from edge_spec.api import load_bundle
    from edge_spec.loading import checkpoints
    from edge_spec.runtimes import qnn, qnn_htp
    from edge_spec.train.evaluate import read_prompts

    layout = load_bundle(args.bundle, provider="cpu", host_check=False).session.state.layout
    target = checkpoints.load("smollm2-135m")
    data = answers(target, [p["prompt"] for p in read_prompts(HELDOUT)[:args.prompts]], layout, args.tokens)
    graphs = sorted((args.bundle / qnn_htp.QNN_DIR).glob("target_*.qdq.onnx"))
    ranges = {}
    for g in graphs:
        ranges.update(encodings(g))  # one pass length in the ablation bundle; names repeat across lengths
    with tempfile.TemporaryDirectory(prefix="qnn-census-", dir=args.bundle.parent) as work:
        folder, _ = variant_bundle(args.bundle, Path(work), lambda qdq, out: exposed(qdq, out, ranges))
        census = Census(ranges)
        saved, qnn._predictor = qnn._predictor, census.wrap(qnn._predictor)
        try:
            engine = load_bundle(folder, provider="cpu", host_check=False)
        finally:
            qnn._predictor = saved
        t = engine.session.state.layout.max_pass
        for ids, answer, _ in data:
            engine.session.reset()
            passes(engine.session, ids + answer, t)
    rows = sorted(((census.clipped[n], n) for n in ranges if census.clipped[n]), reverse=True)
    for count, name in rows[:args.top]:
        lo, hi = ranges[name]
        print(json.dumps({"tensor": name, "clipped": count, "of": census.total[name],
                          "overrun": round(census.over[name], 3), "range": [round(lo, 3), round(hi, 3)]}), flush=True)
    groups = defaultdict(lambda: [0, 0, 0, 0.0])
    for name in ranges:
        g = groups[re.sub(r"layers\.\d+", "layers.N", name)]
        g[0] += census.clipped[name]
        g[1] += census.total[name]
        g[2] += bool(census.clipped[name])
        g[3] = max(g[3], census.over[name])
    for pattern, (count, total, tensors, over) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if count:
            print(json.dumps({"pattern": pattern, "clipped": count, "of": total, "tensors_clipping": tensors,
                              "max_overrun": round(over, 3)}), flush=True)
    print(json.dumps({"tensors": len(ranges), "clipping": len(rows), "values_clipped": sum(census.clipped.values()),
                      "of": sum(census.total.values())}), flush=True)


if __name__ == "__main__":
    main()
