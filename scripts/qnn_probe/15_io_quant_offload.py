"""Exp 15: with CPU fallback ENABLED, the default offload_graph_io_quantization=1 puts graph-input Q / graph-output DQ on CPU EP;
offload_graph_io_quantization=0 keeps them on QNN."""
from qnn_common import *
q = os.path.join(MODELS, "mlp.qdq.auint16.wuint8.onnx")
for fb, opts in [(False, {}), (False, {"offload_graph_io_quantization": "0"}), (True, {})]:
    s = qnn_session(q, extra_ep_opts=opts, disable_fallback=fb, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
    print(f"disable_fallback={fb} opts={opts}:", [(ep, [n for _, n in ns] if ep != 'QNNExecutionProvider' else len(ns)) for ep, ns in assignment(s)])
