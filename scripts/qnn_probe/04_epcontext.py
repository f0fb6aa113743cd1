"""Exp 4: compile EPContext models (embed 0 and 1) from the QDQ MLP on QNN-HTP, then load & run them."""
import glob
from qnn_common import *
q = os.path.join(MODELS, "mlp.qdq.auint16.wuint8.onnx")
rng = np.random.default_rng(1)
test = {"x": rng.standard_normal((1, 32)).astype(np.float32)}
ref = cpu_session(q).run(None, test)[0]
for embed in ("0", "1"):
    ctx = os.path.join(MODELS, f"mlp_ctx_embed{embed}.onnx")
    for f in glob.glob(ctx.replace(".onnx", "*")): os.remove(f)
    t = time.perf_counter()
    s = qnn_session(q, extra_sess_cfg={"ep.context_enable": "1", "ep.context_file_path": ctx, "ep.context_embed_mode": embed})
    print(f"[embed={embed}] compile session created in {time.perf_counter()-t:.2f}s; files:",
          sorted((os.path.basename(f), os.path.getsize(f)) for f in glob.glob(os.path.join(MODELS, f"mlp_ctx_embed{embed}*"))))
    del s
    import onnx
    m = onnx.load(ctx, load_external_data=False)
    print(f"[embed={embed}] ctx model nodes:", [(n.op_type, n.domain, {a.name: (onnx.helper.get_attribute_value(a) if a.name != 'ep_cache_context' or embed=='0' else f'<{len(a.s)} bytes>') for a in n.attribute}) for n in m.graph.node])
    t = time.perf_counter()
    s2 = qnn_session(ctx)
    print(f"[embed={embed}] ctx model loaded in {time.perf_counter()-t:.3f}s providers={s2.get_providers()}")
    ms, out = timeit(s2, test)
    print(f"[embed={embed}] ctx run max|diff| vs CPU QDQ = {np.abs(out[0]-ref).max():.3e}, {ms:.3f} ms/run")
