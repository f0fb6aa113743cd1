"""Exp 12: a 1-layer mini decoder (Gather int64 ids -> RMSNorm -> QKV -> heads reshape/transpose -> QK^T*scale
+ additive causal mask (graph input) -> Softmax -> @V -> out proj -> residual -> RMSNorm -> SiLU MLP -> residual
-> RMSNorm -> logits -> TopK(k=1)), static shapes, QDQ via QNN tools, full placement check, EPContext compile+run.
usage: python 12_mini_transformer.py [act=uint16] [wt=uint8]"""
import sys, glob
from onnx import helper as h, TensorProto as TP, numpy_helper as nh
from qnn_common import *
act = sys.argv[1] if len(sys.argv) > 1 else "uint16"; wt = sys.argv[2] if len(sys.argv) > 2 else "uint8"
rng = np.random.default_rng(0)
T, D, H, V, FF = 8, 64, 2, 128, 128
hd = D // H
W = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
inits = {"E": rng.standard_normal((V, D)).astype(np.float32), "Wq": W(D, D), "Wk": W(D, D), "Wv": W(D, D), "Wo": W(D, D),
         "W1": W(D, FF), "W2": W(FF, D), "Wout": W(D, V), "two": np.float32(2), "eps": np.float32(1e-6),
         "ax": np.array([-1], np.int64), "sc": np.float32(1 / np.sqrt(hd)), "one": np.array([1], np.int64),
         "shp_h": np.array([1, T, H, hd], np.int64), "shp_m": np.array([1, T, D], np.int64)}
for i in range(3): inits[f"g{i}"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
N = []
def n(op, i, o, **kw): N.append(h.make_node(op, i, o, name=o[0] + "_" + op, **kw)); return o[0]
def rms(x, i):
    sq = n("Pow", [x, "two"], [f"sq{i}"]); ms = n("ReduceMean", [sq, "ax"], [f"ms{i}"], keepdims=1)
    a = n("Add", [ms, "eps"], [f"mse{i}"]); r = n("Sqrt", [a], [f"rms{i}"]); d = n("Div", [x, r], [f"nrm{i}"])
    return n("Mul", [d, f"g{i}"], [f"rmsout{i}"])
e = n("Gather", ["E", "ids"], ["emb"], axis=0)
x1 = rms(e, 0)
def heads(t, nm):
    r = n("Reshape", [t, "shp_h"], [nm + "_r"]); return n("Transpose", [r], [nm + "_t"], perm=[0, 2, 1, 3])
q = heads(n("MatMul", [x1, "Wq"], ["q"]), "q"); k = heads(n("MatMul", [x1, "Wk"], ["k"]), "k"); v = heads(n("MatMul", [x1, "Wv"], ["v"]), "v")
kt = n("Transpose", [k], ["kT"], perm=[0, 1, 3, 2])
s = n("Mul", [n("MatMul", [q, kt], ["qk"]), "sc"], ["qks"])
p = n("Softmax", [n("Add", [s, "mask"], ["qkm"])], ["p"], axis=-1)
o = n("MatMul", [p, v], ["pv"]); o = n("Transpose", [o], ["pvt"], perm=[0, 2, 1, 3]); o = n("Reshape", [o, "shp_m"], ["pvr"])
r1 = n("Add", [e, n("MatMul", [o, "Wo"], ["attn"])], ["res1"])
x2 = rms(r1, 1)
f = n("MatMul", [x2, "W1"], ["f1"]); f = n("Mul", [f, n("Sigmoid", [f], ["f1s"])], ["f1a"])
r2 = n("Add", [r1, n("MatMul", [f, "W2"], ["f2"])], ["res2"])
logits = n("MatMul", [rms(r2, 2), "Wout"], ["logits"])
N.append(h.make_node("TopK", [logits, "one"], ["top_v", "top_i"], axis=-1, name="topk"))
g = h.make_graph(N, "mini", [h.make_tensor_value_info("ids", TP.INT64, [1, T]), h.make_tensor_value_info("mask", TP.FLOAT, [1, 1, T, T])],
                 [h.make_tensor_value_info("logits", TP.FLOAT, [1, T, V]), h.make_tensor_value_info("top_i", TP.INT64, [1, T, 1])],
                 [nh.from_array(np.asarray(a), k) for k, a in inits.items()])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)]); m.ir_version = 10
fp = save(m, "mini.onnx"); qp = os.path.join(MODELS, f"mini.qdq.{act}.{wt}.onnx")
mask = np.triu(np.full((T, T), -1e4, np.float32), 1)[None, None]
feed = lambda: {"ids": rng.integers(0, V, (1, T)).astype(np.int64), "mask": mask}
qdq(fp, qp, [feed() for _ in range(16)], act, wt)
test = feed()
ref32 = cpu_session(fp).run(None, test); refq = cpu_session(qp).run(None, test)
print(f"== mini decoder act={act} wt={wt}: {len(N)} fp32 nodes, params={sum(a.size for a in inits.values())/1e3:.1f}K")
sess = qnn_session(qp, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
a = assignment(sess)
print("assignment:", [(ep, len(ns)) for ep, ns in a], "FULLY ON QNN" if all(ep == "QNNExecutionProvider" for ep, _ in a) else "NOT fully on QNN")
ms, out = timeit(sess, test, n=10)
print(f"QNN vs CPU-QDQ logits max|diff|={np.abs(out[0]-refq[0]).max():.3e}; QNN vs fp32 {np.abs(out[0]-ref32[0]).max():.3e}; "
      f"CPU-QDQ vs fp32 {np.abs(refq[0]-ref32[0]).max():.3e} (|logits|max {np.abs(ref32[0]).max():.2f}); "
      f"argmax agree QNN/CPU-QDQ {int((out[1]==refq[1]).sum())}/{T}, QNN/fp32 {int((out[1]==ref32[1]).sum())}/{T}; {ms:.2f} ms/run")
ctx = os.path.join(MODELS, f"mini_ctx.{act}.{wt}.onnx")
for fl in glob.glob(ctx.replace(".onnx", "*")): os.remove(fl)
del sess
c = qnn_session(qp, extra_sess_cfg={"ep.context_enable": "1", "ep.context_file_path": ctx, "ep.context_embed_mode": "0"}); del c
cs = qnn_session(ctx); co = cs.run(None, test)
print(f"EPContext: files {[os.path.basename(x) for x in glob.glob(ctx.replace('.onnx', '*'))]}; ctx run vs direct QNN max|diff|={np.abs(co[0]-out[0]).max():.3e}; top_i equal={np.array_equal(co[1], out[1])}")
