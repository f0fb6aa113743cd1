"""Exp 3: placement signals. Verbose log of a QNN session on the QDQ MLP + profiling."""
import sys, json, glob
from qnn_common import *
q = sys.argv[1] if len(sys.argv) > 1 else os.path.join(MODELS, "mlp.qdq.auint16.wuint8.onnx")
ort.set_default_logger_severity(0)
s = qnn_session(q, log_level=0, profile_prefix=os.path.join(HERE, "prof_mlp"))
feed = {i.name: np.zeros([d for d in i.shape], dtype=np.float32) for i in s.get_inputs()}
s.run(None, feed)
pf = s.end_profiling()
ev = json.load(open(pf))
prov = {}
for e in ev:
    a = e.get("args", {})
    if e.get("cat") == "Node" and "provider" in a:
        prov.setdefault(a["provider"], set()).add(a.get("op_name"))
print("PROFILE node events by provider:", {k: sorted(v) for k, v in prov.items()}, "file:", pf)
