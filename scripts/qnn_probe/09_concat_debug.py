"""Exp 9: debug the Concat accuracy gap (two graph inputs with different ranges -> different QDQ scales)."""
import onnx
from onnx import numpy_helper as nh
from qnn_common import *
for act in ("uint16", "uint8"):
    q = os.path.join(MODELS, f"op_concat_axis1.qdq.{act}.uint8.onnx")
    m = onnx.load(q)
    init = {i.name: nh.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            print(act, n.op_type, n.input[0], "scale", init.get(n.input[1]), "zp", init.get(n.input[2]) if len(n.input) > 2 else None)
    rng = np.random.default_rng(5)
    feed = {"a": rng.standard_normal((1, 8, 32)).astype(np.float32), "b": 3 * rng.standard_normal((1, 4, 32)).astype(np.float32)}
    r = cpu_session(q).run(None, feed)[0]; o = qnn_session(q).run(None, feed)[0]
    d = np.abs(o - r)
    print(act, "maxdiff rows(a part)", d[:, :8].max(), "rows(b part)", d[:, 8:].max(), "| input b max", np.abs(feed['b']).max())
    print(act, "sample a-part ref", r[0, 0, :4], "qnn", o[0, 0, :4]); print(act, "sample b-part ref", r[0, 8, :4], "qnn", o[0, 8, :4])
