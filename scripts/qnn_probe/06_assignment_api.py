"""Exp 6: programmatic placement check via session.record_ep_graph_assignment_info + get_provider_graph_assignment_info()."""
from qnn_common import *
cfg = {"session.record_ep_graph_assignment_info": "1"}
for name, fb in [("mlp.qdq.auint16.wuint8.onnx", True), ("fallback.qdq.onnx", False)]:
    s = qnn_session(os.path.join(MODELS, name), extra_sess_cfg=cfg, disable_fallback=fb)
    a = assignment(s)
    n_cpu = sum(len(nodes) for ep, nodes in a if ep != "QNNExecutionProvider")
    print(f"{name} (disable_fallback={fb}):")
    for ep, nodes in a: print("   ", ep, nodes)
    print("    FULLY ON QNN" if n_cpu == 0 else f"    {n_cpu} node(s) NOT on QNN")
