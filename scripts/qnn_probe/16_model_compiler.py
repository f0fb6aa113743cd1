"""Exp 16: AOT compile via the ORT compile API (onnxruntime.ModelCompiler) instead of a session with ep.context_enable."""
import glob
from qnn_common import *
q = os.path.join(MODELS, "mini.qdq.uint16.uint8.onnx")
devs = register_qnn()
for embed in (False, True):
    out = os.path.join(MODELS, f"mini_compiled_embed{int(embed)}.onnx")
    for f in glob.glob(out.replace(".onnx", "*")): os.remove(f)
    so = ort.SessionOptions(); so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devs, {"backend_type": "htp", "soc_model": "57"})
    flags = ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
    t = time.perf_counter()
    ort.ModelCompiler(so, q, embed_compiled_data_into_model=embed, flags=flags).compile_to_file(out)
    files = sorted((os.path.basename(f), os.path.getsize(f)) for f in glob.glob(out.replace(".onnx", "*")))
    s = qnn_session(out, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
    T = 8; feed = {"ids": np.arange(T, dtype=np.int64)[None], "mask": np.triu(np.full((T, T), -1e4, np.float32), 1)[None, None]}
    r = s.run(None, feed); ref = cpu_session(q).run(None, feed)
    print(f"embed={embed}: compiled in {time.perf_counter()-t:.2f}s files={files} assignment={[(ep, [o for o,_ in ns]) for ep, ns in assignment(s)]} "
          f"max|diff| vs CPU-QDQ {np.abs(r[0]-ref[0]).max():.3e}")
print("flags available:", [f for f in dir(ort.OrtCompileApiFlags) if f.isupper()])
