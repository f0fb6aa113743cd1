"""One MatMulNBits node (int4, blocks of 32, a SmolLM2 MLP shape K=576 -> N=1536) timed at T = 1, 2, 3, 5, 9 rows,
accuracy levels 0 and 4, 2 threads: how a verify pass's rows scale on this CPU (issue #47 item 3).

    .venv/bin/python scripts/matmulnbits_rows.py
"""
import time, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
K, N = 576, 1536
rng = np.random.default_rng(0)
codes = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
scales = rng.random(N * K // 32, dtype=np.float32) * 0.01
zp = rng.integers(0, 256, (N * ((K // 32 + 1) // 2),), dtype=np.uint8)
for acc in (0, 4):
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=32, accuracy_level=acc)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "T", K])], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "T", N])],
                          [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "S"), numpy_helper.from_array(zp, "Z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = {}
    for t in (1, 2, 3, 5, 9):
        a = rng.standard_normal((1, t, K), dtype=np.float32)
        for _ in range(50): s.run(None, {"A": a})
        st = time.perf_counter(); n = 2000
        for _ in range(n): s.run(None, {"A": a})
        res[t] = (time.perf_counter() - st) / n * 1e6
    print(f"accuracy_level {acc}: " + ", ".join(f"T={t} {us:.1f} us ({us / res[1]:.2f}x)" for t, us in res.items()))
