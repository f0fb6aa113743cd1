"""What one more node costs onnxruntime's CPU provider (2 threads, graph optimizations off so nothing is folded):
chains of 10 and 610 Reshapes / Adds over a [1, 640] tensor (gemma-3-270m's hidden size), median of 300 runs; the
difference over 600 nodes is the cost per node. Puts a bound on what a graph's node count can cost a decode step.

    .venv/bin/python scripts/ort_node_overhead.py
"""
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def chain(n: int, op: str) -> ort.InferenceSession:
    inits = [numpy_helper.from_array(np.ones((1, 640), np.float32), "c")] if op == "Add" else \
        [numpy_helper.from_array(np.array([1, 640], np.int64), "s")]
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node(op, [prev, "c" if op == "Add" else "s"], [f"y{i}"]))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 640])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 640])], inits)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def median_us(s: ort.InferenceSession) -> float:
    x, times = np.zeros((1, 640), np.float32), []
    for _ in range(300):
        start = time.perf_counter()
        s.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


for op in ("Reshape", "Add"):
    short, long = median_us(chain(10, op)), median_us(chain(610, op))
    print(f"{op}: 10 nodes {short:.1f} us, 610 nodes {long:.1f} us -> {(long - short) / 600:.2f} us per node", flush=True)
