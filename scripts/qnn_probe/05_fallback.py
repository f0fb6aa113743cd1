"""Exp 5: what disable_cpu_ep_fallback does when a node is NOT supported by QNN-HTP (Det op), and the
placement log lines with fallback enabled."""
from onnx import helper, TensorProto, numpy_helper
from qnn_common import *
rng = np.random.default_rng(0)
W = rng.standard_normal((4, 4)).astype(np.float32)
g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
                       helper.make_node("Det", ["r"], ["y"], name="det")], "fb",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [numpy_helper.from_array(W, "W")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 10
fp = save(m, "fallback.onnx")
q = os.path.join(MODELS, "fallback.qdq.onnx")
qdq(fp, q, [{"x": rng.standard_normal((4, 4)).astype(np.float32)} for _ in range(4)])
feed = {"x": rng.standard_normal((4, 4)).astype(np.float32)}
print("=== fallback DISABLED ===")
try:
    s = qnn_session(q, disable_fallback=True); s.run(None, feed); print("unexpectedly ran")
except Exception as e:
    print(f"{type(e).__name__}: {e}")
print("=== fallback ENABLED (log level 1=warning / 0=verbose; placement lines below) ===", flush=True)
ort.set_default_logger_severity(0)
s = qnn_session(q, disable_fallback=False, log_level=0)
print("ran:", s.run(None, feed)[0], flush=True)
