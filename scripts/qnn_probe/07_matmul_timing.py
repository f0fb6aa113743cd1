"""Exp 7: timing of one QDQ MatMul [1,576]x[576,1536] (+ optional stack of N such layers) on emulated HTP vs CPU EP.
usage: python 07_matmul_timing.py [n_layers=1] [act=uint16] [wt=uint8] [M=1]"""
import sys, resource
from onnx import helper, TensorProto, numpy_helper
from qnn_common import *
L = int(sys.argv[1]) if len(sys.argv) > 1 else 1
act = sys.argv[2] if len(sys.argv) > 2 else "uint16"
wt = sys.argv[3] if len(sys.argv) > 3 else "uint8"
M = int(sys.argv[4]) if len(sys.argv) > 4 else 1
K, N = 576, 1536
rng = np.random.default_rng(0)
nodes, inits, cur = [], [], "x"
for i in range(L):
    # alternate 576->1536 and 1536->576 so layers chain
    k, n = (K, N) if i % 2 == 0 else (N, K)
    inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"W{i}"))
    nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"h{i}"], name=f"mm{i}")); cur = f"h{i}"
outdim = N if L % 2 == 1 else K
g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                      [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [M, outdim])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 10
tag = f"mm_L{L}_M{M}_{act}_{wt}"
fp = save(m, f"{tag}.onnx"); q = os.path.join(MODELS, f"{tag}.qdq.onnx")
feeds = [{"x": rng.standard_normal((M, K)).astype(np.float32)} for _ in range(4)]
qdq(fp, q, feeds, act, wt)
test = feeds[0]
params = sum(np.prod(i.dims) for i in inits)
cms, cout = timeit(cpu_session(q), test, n=20)
t0 = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF)
s = qnn_session(q, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
t1 = time.perf_counter()
full = all(ep == "QNNExecutionProvider" for ep, _ in assignment(s))
ms, out = timeit(s, test, n=10, warm=1)
r1 = resource.getrusage(resource.RUSAGE_SELF); t2 = time.perf_counter()
cpu_s = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print(f"{tag}: params={params/1e6:.2f}M fully_on_QNN={full} session_create={t1-t0:.2f}s  "
      f"HTP-emul {ms:.2f} ms/run  CPU-EP(QDQ) {cms:.3f} ms/run  max|diff|={np.abs(out[0]-cout[0]).max():.3e} "
      f"(|ref|max={np.abs(cout[0]).max():.2f})  process CPU-time/wall during QNN part = {cpu_s/(t2-t0):.2f} cores")
