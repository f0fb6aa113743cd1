"""Shared helpers for the QNN experiments (run with /tmp/qnn/venv/bin/python)."""
import os, time
import numpy as np
import onnx
from onnx import helper, TensorProto, numpy_helper
import onnxruntime as ort
import onnxruntime_qnn as oq

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "models")
os.makedirs(MODELS, exist_ok=True)
_REGISTERED = False


def register_qnn():
    """QNN 2.x is a plugin EP: register its library once per process."""
    global _REGISTERED
    if not _REGISTERED:
        ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
        _REGISTERED = True
    return [d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name()]


def qnn_session(model_path, extra_ep_opts=None, extra_sess_cfg=None, disable_fallback=True,
                log_level=3, profile_prefix=None):
    devs = register_qnn()
    so = ort.SessionOptions()
    so.log_severity_level = log_level          # 0=verbose ... 3=error
    if disable_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (extra_sess_cfg or {}).items():
        so.add_session_config_entry(k, v)
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    ep_opts = {"backend_path": oq.get_qnn_htp_path(), "soc_model": "57", "htp_arch": "75"}
    ep_opts.update(extra_ep_opts or {})
    so.add_provider_for_devices(devs, ep_opts)
    return ort.InferenceSession(model_path, sess_options=so)


def cpu_session(model_path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])


def save(model, name):
    p = os.path.join(MODELS, name)
    onnx.checker.check_model(model)
    onnx.save(model, p)
    return p


class DR:
    """Tiny CalibrationDataReader over a list of feed dicts."""
    def __init__(self, feeds):
        self.feeds = list(feeds); self.i = 0
    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]
    def rewind(self):
        self.i = 0


def qdq(fp32_path, out_path, feeds, act="uint16", wt="uint8", **kw):
    from onnxruntime.quantization import quantize, QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model
    pre = fp32_path.replace(".onnx", ".pre.onnx")
    changed = qnn_preprocess_model(fp32_path, pre)
    src = pre if changed else fp32_path
    qt = {"uint16": QuantType.QUInt16, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16, "int8": QuantType.QInt8}
    cfg = get_qnn_qdq_config(src, DR(feeds), activation_type=qt[act], weight_type=qt[wt], **kw)
    quantize(src, out_path, cfg)
    return out_path, changed


def timeit(sess, feed, n=20, warm=2):
    for _ in range(warm):
        sess.run(None, feed)
    t = time.perf_counter()
    for _ in range(n):
        out = sess.run(None, feed)
    return (time.perf_counter() - t) / n * 1e3, out


def assignment(sess):
    """Programmatic placement: needs session config session.record_ep_graph_assignment_info=1."""
    res = []
    for sg in sess.get_provider_graph_assignment_info():
        res.append((sg.ep_name, [(n.op_type, n.name) for n in sg.get_nodes()]))
    return res
