"""Exp 14: backend selection variants and SoC/arch variants on the QDQ MLP (fallback disabled)."""
from qnn_common import *
q = os.path.join(MODELS, "mlp.qdq.auint16.wuint8.onnx")
test = {"x": np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)}
ref = cpu_session(q).run(None, test)[0]
devs = register_qnn()
def try_opts(label, opts):
    so = ort.SessionOptions(); so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devs, opts)
    try:
        s = ort.InferenceSession(q, sess_options=so); out = s.run(None, test)[0]
        print(f"{label:45s} OK  max|diff| vs CPU-QDQ {np.abs(out-ref).max():.2e}")
    except Exception as e:
        print(f"{label:45s} FAIL {type(e).__name__}: {str(e)[:250]}")
try_opts("backend_type=htp (no soc/arch)", {"backend_type": "htp"})
try_opts("backend_path=<abs libQnnHtp.so> (no soc/arch)", {"backend_path": oq.get_qnn_htp_path()})
try_opts("backend_path=libQnnHtp.so (bare name)", {"backend_path": "libQnnHtp.so"})
try_opts("backend_type=cpu", {"backend_type": "cpu"})
try_opts("backend_type=gpu", {"backend_type": "gpu"})
for soc, arch in [("57", "75"), ("57", None), ("43", "73"), ("60", "79"), ("69", "81"), ("30", "68"), (None, "75"), (None, "73"), (None, "68")]:
    o = {"backend_type": "htp"}
    if soc: o["soc_model"] = soc
    if arch: o["htp_arch"] = arch
    try_opts(f"htp soc_model={soc} htp_arch={arch}", o)
try_opts("htp soc57 + profiling_level=basic", {"backend_type": "htp", "soc_model": "57", "profiling_level": "basic",
                                                "profiling_file_path": os.path.join(HERE, "qnn_profile_mlp.csv")})
