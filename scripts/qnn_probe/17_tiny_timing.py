"""Exp 17: steady-state ms/run of the tiny QDQ MLP on emulated HTP (direct and EPContext), 200 runs each."""
from qnn_common import *
test = {"x": np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)}
for name in ("mlp.qdq.auint16.wuint8.onnx", "mlp.qdq.auint8.wuint8.onnx", "mlp_ctx_embed1.onnx"):
    s = qnn_session(os.path.join(MODELS, name))
    ms, _ = timeit(s, test, n=200, warm=5)
    cms = timeit(cpu_session(os.path.join(MODELS, name)), test, n=200)[0] if "ctx" not in name else float("nan")
    print(f"{name:32s} HTP-emul {ms:.3f} ms/run   CPU-EP {cms:.3f} ms/run")
