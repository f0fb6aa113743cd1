"""Exp 10: how QNN EP handles int64 graph I/O (Gather ids int64 in, TopK int64 out): grep verbose log for tensor dtypes."""
import sys
from qnn_common import *
ort.set_default_logger_severity(0)
for name in ("op_gather_int64_input.qdq.uint16.uint8.onnx", "op_topk_k4_last_axis.qdq.uint16.uint8.onnx"):
    print("#### MODEL", name, flush=True)
    s = qnn_session(os.path.join(MODELS, name), log_level=0)
    print("#### inputs", [(i.name, i.type) for i in s.get_inputs()], "outputs", [(o.name, o.type) for o in s.get_outputs()], flush=True)
