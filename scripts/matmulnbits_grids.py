"""MatMulNBits (int4, blocks of 32, accuracy level 4, 2 threads) with and without zero points, at one and two rows:
onnxruntime-genai 0.18.0 builds its int4 models symmetric (MatMulNBits with 3 inputs, no zero points), edge-spec's
`int4` keeps integer zero points (exporters/onnx_passes.py ZERO_POINT). gemma-3-270m's shapes: q/k/v 640 -> 1536, an
MLP half 640 -> 2048 (18 of each, timed as one graph), the tied head 640 -> 262,144. Random codes (the kernels do not
look at their values). Prints the median microseconds per matmul over alternating runs of the two forms.

    .venv/bin/python scripts/matmulnbits_grids.py
"""
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)


def session(k: int, n: int, zero_points: bool, layers: int) -> ort.InferenceSession:
    """`layers` MatMulNBits nodes [M, k] -> [M, n] over one input, summed."""
    kb, nodes, inits = k // 32, [], []
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.integers(0, 256, (n, kb, 16), dtype=np.uint8), f"B{i}"),
                  numpy_helper.from_array((rng.random(n * kb) * 0.01).astype(np.float32), f"S{i}")]
        inputs = ["x", f"B{i}", f"S{i}"]
        if zero_points:
            inits.append(numpy_helper.from_array(rng.integers(0, 256, (n * ((kb + 1) // 2),), dtype=np.uint8), f"Z{i}"))
            inputs.append(f"Z{i}")
        nodes.append(helper.make_node("MatMulNBits", inputs, [f"y{i}"], domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=32, accuracy_level=4))
    nodes.append(helper.make_node("Sum", [f"y{i}" for i in range(layers)], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


for k, n, layers in [(640, 1536, 18), (640, 2048, 18), (640, 262144, 1)]:
    forms = {"symmetric": session(k, n, False, layers), "zero points": session(k, n, True, layers)}
    for m in (1, 2):
        x = rng.standard_normal((m, k)).astype(np.float32)
        times = {name: [] for name in forms}
        for _ in range(25):
            for name, s in forms.items():
                start = time.perf_counter()
                s.run(None, {"x": x})
                times[name].append((time.perf_counter() - start) * 1e6 / layers)
        print(f"K={k} N={n} M={m}: " + ", ".join(f"{name} {statistics.median(t):.1f} us" for name, t in times.items()),
              flush=True)
