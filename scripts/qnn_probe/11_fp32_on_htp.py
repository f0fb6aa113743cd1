"""Exp 11: does the (non-quantized) fp32 MLP run on HTP? default options vs enable_htp_fp16_precision=1."""
from qnn_common import *
fp = os.path.join(MODELS, "mlp.onnx")
test = {"x": np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)}
ref = cpu_session(fp).run(None, test)[0]
for opts in ({}, {"enable_htp_fp16_precision": "1"}, {"enable_htp_fp16_precision": "0"}):
    try:
        s = qnn_session(fp, extra_ep_opts=opts, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
        out = s.run(None, test)[0]
        print(opts, "OK", [ep for ep, _ in assignment(s)], f"max|diff| vs fp32 CPU {np.abs(out-ref).max():.2e}")
    except Exception as e:
        print(opts, "FAIL", type(e).__name__, str(e)[:300])
