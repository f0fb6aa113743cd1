"""Exp 18: after register_execution_provider_library, does the legacy providers=[("QNNExecutionProvider", opts)] form work?"""
from qnn_common import *
q = os.path.join(MODELS, "mlp.qdq.auint16.wuint8.onnx")
try:
    s = ort.InferenceSession(q, providers=[("QNNExecutionProvider", {"backend_type": "htp"})])
    print("BEFORE register: providers=", s.get_providers())
except Exception as e:
    print("BEFORE register: FAIL", type(e).__name__, str(e)[:300])
register_qnn()
so = ort.SessionOptions(); so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
try:
    s = ort.InferenceSession(q, sess_options=so, providers=[("QNNExecutionProvider", {"backend_type": "htp", "soc_model": "57"})])
    print("AFTER register: providers=", s.get_providers(), assignment(s)[0][0])
except Exception as e:
    print("AFTER register: FAIL", type(e).__name__, str(e)[:300])
so = ort.SessionOptions(); so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
s = ort.InferenceSession(q, sess_options=so, providers=[("QNNExecutionProvider", {"backend_type": "htp", "soc_model": "57"})])
print("AFTER register, fallback allowed: get_providers()=", s.get_providers(), "assignment EPs=", sorted({ep for ep, _ in assignment(s)}))
