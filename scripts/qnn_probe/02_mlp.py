"""Exp 2: tiny static MLP (MatMul+Add+Relu+MatMul+Add+Softmax), QDQ via QNN tools, run on QNN HTP vs CPU."""
import sys, numpy as np
from onnx import helper, TensorProto, numpy_helper
from qnn_common import *

rng = np.random.default_rng(0)
B, D, H, O = 1, 32, 64, 16
W1 = rng.standard_normal((D, H)).astype(np.float32) * 0.2
b1 = rng.standard_normal(H).astype(np.float32) * 0.1
W2 = rng.standard_normal((H, O)).astype(np.float32) * 0.2
b2 = rng.standard_normal(O).astype(np.float32) * 0.1
nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
         helper.make_node("Add", ["h3", "b2"], ["h4"]), helper.make_node("Softmax", ["h4"], ["y"], axis=-1)]
g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, D])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, O])],
                      [numpy_helper.from_array(a, n) for a, n in [(W1, "W1"), (b1, "b1"), (W2, "W2"), (b2, "b2")]])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 10
fp32 = save(m, "mlp.onnx")
feeds = [{"x": rng.standard_normal((B, D)).astype(np.float32)} for _ in range(8)]
test = {"x": rng.standard_normal((B, D)).astype(np.float32)}
ref_fp32 = cpu_session(fp32).run(None, test)[0]

for act, wt in [("uint16", "uint8"), ("uint8", "uint8")]:
    q = os.path.join(MODELS, f"mlp.qdq.a{act}.w{wt}.onnx")
    qdq(fp32, q, feeds, act, wt)
    cpu = cpu_session(q).run(None, test)[0]
    try:
        s = qnn_session(q)
        print(f"[{act}/{wt}] session providers:", s.get_providers())
        ms, out = timeit(s, test, n=20)
        print(f"[{act}/{wt}] QNN-HTP vs CPU(QDQ) max|diff| = {np.abs(out[0]-cpu).max():.3e}; "
              f"CPU(QDQ) vs fp32 = {np.abs(cpu-ref_fp32).max():.3e}; QNN vs fp32 = {np.abs(out[0]-ref_fp32).max():.3e}; {ms:.3f} ms/run")
    except Exception as e:
        print(f"[{act}/{wt}] QNN FAILED: {type(e).__name__}: {e}")
