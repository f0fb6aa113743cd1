"""Does onnxruntime's MatMulNBits (4 bits, accuracy level 4, 2 threads) give a row the same bits whatever the number
of rows M in the call, and what does the 262,144-row head (gemma-3-270m's tied table, K = 640) cost at M = 1, 2, 5?
For block sizes 16 / 32 / 64 / 128, with and without zero points. Random codes (the kernels do not look at them).

The host check (edge_spec/decoding/hostcheck.py) needs a decode step's row to equal the same row of a verify pass;
where the M = 1 kernel sums in another order, decode steps run two rows (`min_rows = 2`).

    .venv/bin/python scripts/matmulnbits_row_invariance.py
"""
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
K, N = 640, 262_144


def session(block: int, zero_points: bool) -> ort.InferenceSession:
    """One MatMulNBits [M, K] -> [M, N]."""
    kb = K // block
    inits = [numpy_helper.from_array(rng.integers(0, 256, (N, kb, block // 2), dtype=np.uint8), "B"),
             numpy_helper.from_array((rng.random(N * kb) * 0.01).astype(np.float32), "S")]
    inputs = ["x", "B", "S"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (N * ((kb + 1) // 2),), dtype=np.uint8), "Z"))
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=block,
                            accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


x = rng.standard_normal((5, K)).astype(np.float32)
for block in (16, 32, 64, 128):
    for zero_points in (False, True):
        s = session(block, zero_points)
        out = {m: s.run(None, {"x": x[:m]})[0] for m in (1, 2, 5)}
        one_row = max(float(np.abs(out[m][0] - out[1][0]).max()) for m in (2, 5))  # row 0: M = 1 vs M = 2, 5
        multi_row = float(np.abs(out[5][1] - out[2][1]).max())  # row 1: M = 2 vs M = 5
        times = {m: [] for m in out}
        for _ in range(10):
            for m in times:
                start = time.perf_counter()
                s.run(None, {"x": x[:m]})
                times[m].append((time.perf_counter() - start) * 1e3)
        ms = ", ".join(f"M={m} {statistics.median(t):.1f} ms" for m, t in times.items())
        print(f"block {block:3d} {'zero points' if zero_points else 'symmetric  '}: M=1 row vs M>=2 row max |diff| "
              f"{one_row:.2g}, M=2 vs M=5 {multi_row:.2g}; {ms}", flush=True)
        del s
