"""Where does the simulated HTP compute a QNN bundle's shortest target graph (a decode step: target_5 with the
default two graphs, target_1 with --qnn-graphs every) differently from the CPU provider? The same QDQ graph,
the same feeds (the CPU bundle's decode step at position POS of the chat prompt "What is the capital of France?"),
every activation of layers 0 and 1, each layer's residual stream and the final norm exposed as outputs; per tensor:
max and mean |HTP - CPU| relative to max |CPU|.

    .venv/bin/python scripts/qnn_htp_tensors.py BUNDLE 10 | sort -rn | head -20

(The augmented graph is written next to a temporary folder and prepared for the HTP on the fly: ~1 min for SmolLM2.)
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from edge_spec.runtimes import qnn_htp
from edge_spec.api import load_bundle
from edge_spec.runtimes.qnn import open_session

WATCH = re.compile(r"/model/layers\.(0|1)/|/model/layers\.\d+/Add(_1)?_output_0_DequantizeLinear_Output$|/model/norm/")


def main() -> None:
    bundle, pos = Path(sys.argv[1]), int(sys.argv[2])
    cpu = load_bundle(bundle, provider="cpu", host_check=False)
    backend, seen = cpu.session.backend, []
    first = min(backend.functions)  # the graph a decode step runs (padded when it has more rows)
    decode = backend.functions[first]
    backend.functions[first] = lambda feeds: (seen.append({k: v.copy() for k, v in feeds.items()}), decode(feeds))[1]
    for token in cpu.encode("What is the capital of France?", chat=True)[:pos + 1]:
        cpu.session.forward([token])
        cpu.session.commit(1)
    feeds = seen[-1]  # position `pos`'s decode step (position 0 ran on the host sink, not through this graph)
    graph = cpu.manifest.graphs["target"].fixed["lengths"][str(first)]
    model = onnx.load(str(bundle / qnn_htp.qdq_file(graph)))
    weights = {i.name for i in model.graph.initializer}
    names = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in weights
             and WATCH.search(n.output[0]) and "Constant" not in n.output[0]]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"{graph}.watch.qdq.onnx"
        onnx.save(model, str(path))
        soc = qnn_htp.get_soc(cpu.manifest.graphs["target"].fixed["qnn"]["soc"])
        sessions = [open_session(path, provider, soc) for provider in ("cpu", "qnn")]
        outputs = [o.name for o in sessions[0].get_outputs()]
        ref, htp = (dict(zip(outputs, s.run(None, feeds))) for s in sessions)
    for name in ["logits", "hidden", *names]:
        scale = float(np.abs(ref[name]).max()) or 1.0
        diff = np.abs(ref[name] - htp[name]) / scale
        label = name.replace("_DequantizeLinear_Output", "")
        print(f"{diff.max():8.4f} {diff.mean():8.5f}  max|cpu| {scale:10.3f}  {label}")


if __name__ == "__main__":
    main()
