"""Exp 8: per-op placement on QNN-HTP (emulated, soc 57) for transformer-relevant ops.
Each case: fp32 graph -> qnn_preprocess_model + get_qnn_qdq_config + quantize (act/wt from argv) ->
QNN session with session.disable_cpu_ep_fallback=1 -> run -> compare with the same QDQ model on CPU EP.
usage: python 08_ops.py [act=uint16] [wt=uint8] [case-substring]"""
import sys, traceback
from onnx import helper as h, TensorProto as TP, numpy_helper as nh
from qnn_common import *
act = sys.argv[1] if len(sys.argv) > 1 else "uint16"
wt = sys.argv[2] if len(sys.argv) > 2 else "uint8"
only = sys.argv[3] if len(sys.argv) > 3 else ""
rng = np.random.default_rng(0)
T, D, V = 8, 32, 64
F = lambda: rng.standard_normal((1, T, D)).astype(np.float32)
vi = h.make_tensor_value_info
C = lambda a, n: nh.from_array(np.asarray(a), n)

def model(nodes, inputs, outputs, inits, opset=17):
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, inits), opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 10
    return m

cases = {}
def case(f): cases[f.__name__] = f; return f

@case
def gather_int64_input():
    emb = rng.standard_normal((V, D)).astype(np.float32)
    m = model([h.make_node("Gather", ["E", "ids"], ["y"], axis=0)], [vi("ids", TP.INT64, [1, T])], [vi("y", TP.FLOAT, [1, T, D])], [C(emb, "E")])
    return m, lambda: {"ids": rng.integers(0, V, (1, T)).astype(np.int64)}

@case
def gather_int32_input():
    emb = rng.standard_normal((V, D)).astype(np.float32)
    m = model([h.make_node("Gather", ["E", "ids"], ["y"], axis=0)], [vi("ids", TP.INT32, [1, T])], [vi("y", TP.FLOAT, [1, T, D])], [C(emb, "E")])
    return m, lambda: {"ids": rng.integers(0, V, (1, T)).astype(np.int32)}

@case
def gather_then_matmul_int64():
    emb = rng.standard_normal((V, D)).astype(np.float32); W = rng.standard_normal((D, D)).astype(np.float32) * 0.2
    m = model([h.make_node("Gather", ["E", "ids"], ["e"], axis=0), h.make_node("MatMul", ["e", "W"], ["y"])],
              [vi("ids", TP.INT64, [1, T])], [vi("y", TP.FLOAT, [1, T, D])], [C(emb, "E"), C(W, "W")])
    return m, lambda: {"ids": rng.integers(0, V, (1, T)).astype(np.int64)}

def _rms(div):
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    nodes = [h.make_node("Pow", ["x", "two"], ["sq"]), h.make_node("ReduceMean", ["sq", "ax"], ["ms"], keepdims=1),
             h.make_node("Add", ["ms", "eps"], ["mse"]), h.make_node("Sqrt", ["mse"], ["rms"])]
    if div:
        nodes += [h.make_node("Div", ["x", "rms"], ["n"])]
    else:
        nodes += [h.make_node("Reciprocal", ["rms"], ["inv"]), h.make_node("Mul", ["x", "inv"], ["n"])]
    nodes += [h.make_node("Mul", ["n", "g"], ["y"])]
    inits = [C(np.float32(2.0), "two"), C(np.array([-1], np.int64), "ax"), C(np.float32(1e-6), "eps"), C(g, "g")]
    return model(nodes, [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])], inits, opset=18), lambda: {"x": F()}

@case
def rmsnorm_pow_mean_sqrt_div(): return _rms(True)
@case
def rmsnorm_pow_mean_sqrt_recip_mul(): return _rms(False)

@case
def rmsnorm_onnx23_RMSNormalization():
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    m = model([h.make_node("RMSNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-6)],
              [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])], [C(g, "g")], opset=23)
    return m, lambda: {"x": F()}

@case
def softmax_last_axis():
    m = model([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [vi("x", TP.FLOAT, [1, 2, T, T])], [vi("y", TP.FLOAT, [1, 2, T, T])], [])
    return m, lambda: {"x": rng.standard_normal((1, 2, T, T)).astype(np.float32)}

@case
def additive_mask_add_input_then_softmax():
    m = model([h.make_node("Add", ["s", "mask"], ["a"]), h.make_node("Softmax", ["a"], ["y"], axis=-1)],
              [vi("s", TP.FLOAT, [1, 2, T, T]), vi("mask", TP.FLOAT, [1, 1, T, T])], [vi("y", TP.FLOAT, [1, 2, T, T])], [])
    mask = np.triu(np.full((T, T), -1e4, np.float32), 1)[None, None]
    return m, lambda: {"s": rng.standard_normal((1, 2, T, T)).astype(np.float32), "mask": mask}

@case
def causal_mask_const_add_then_softmax():
    mask = np.triu(np.full((T, T), -1e4, np.float32), 1)[None, None]
    m = model([h.make_node("Add", ["s", "mask"], ["a"]), h.make_node("Softmax", ["a"], ["y"], axis=-1)],
              [vi("s", TP.FLOAT, [1, 2, T, T])], [vi("y", TP.FLOAT, [1, 2, T, T])], [C(mask, "mask")])
    return m, lambda: {"s": rng.standard_normal((1, 2, T, T)).astype(np.float32)}

@case
def where_bool_input_mask_then_softmax():
    m = model([h.make_node("Where", ["cond", "s", "neg"], ["a"]), h.make_node("Softmax", ["a"], ["y"], axis=-1)],
              [vi("cond", TP.BOOL, [1, 1, T, T]), vi("s", TP.FLOAT, [1, 2, T, T])], [vi("y", TP.FLOAT, [1, 2, T, T])],
              [C(np.float32(-1e4), "neg")])
    cond = np.tril(np.ones((T, T), bool))[None, None]
    return m, lambda: {"cond": cond, "s": rng.standard_normal((1, 2, T, T)).astype(np.float32)}

@case
def where_const_mask_then_softmax():
    cond = np.tril(np.ones((T, T), bool))[None, None]
    m = model([h.make_node("Where", ["cond", "s", "neg"], ["a"]), h.make_node("Softmax", ["a"], ["y"], axis=-1)],
              [vi("s", TP.FLOAT, [1, 2, T, T])], [vi("y", TP.FLOAT, [1, 2, T, T])], [C(cond, "cond"), C(np.float32(-1e4), "neg")])
    return m, lambda: {"s": rng.standard_normal((1, 2, T, T)).astype(np.float32)}

@case
def concat_axis1():
    m = model([h.make_node("Concat", ["a", "b"], ["y"], axis=1)], [vi("a", TP.FLOAT, [1, T, D]), vi("b", TP.FLOAT, [1, 4, D])],
              [vi("y", TP.FLOAT, [1, T + 4, D])], [])
    return m, lambda: {"a": F(), "b": rng.standard_normal((1, 4, D)).astype(np.float32)}

@case
def concat_kvcache_like_with_matmul():
    W = rng.standard_normal((D, D)).astype(np.float32) * 0.2
    m = model([h.make_node("MatMul", ["x", "W"], ["k"]), h.make_node("Concat", ["past", "k"], ["y"], axis=1)],
              [vi("x", TP.FLOAT, [1, 1, D]), vi("past", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T + 1, D])], [C(W, "W")])
    return m, lambda: {"x": rng.standard_normal((1, 1, D)).astype(np.float32), "past": F()}

@case
def reshape_transpose_heads():
    m = model([h.make_node("Reshape", ["x", "shp"], ["r"]), h.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])],
              [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, 2, T, D // 2])], [C(np.array([1, T, 2, D // 2], np.int64), "shp")])
    return m, lambda: {"x": F()}

@case
def matmul_act_act_qkT():
    m = model([h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["s"]),
               h.make_node("Mul", ["s", "sc"], ["y"])],
              [vi("q", TP.FLOAT, [1, 2, T, 16]), vi("k", TP.FLOAT, [1, 2, T, 16])], [vi("y", TP.FLOAT, [1, 2, T, T])], [C(np.float32(0.25), "sc")])
    return m, lambda: {"q": rng.standard_normal((1, 2, T, 16)).astype(np.float32), "k": rng.standard_normal((1, 2, T, 16)).astype(np.float32)}

@case
def topk_k4_last_axis():
    m = model([h.make_node("TopK", ["x", "k"], ["vals", "idx"], axis=-1)], [vi("x", TP.FLOAT, [1, V])],
              [vi("vals", TP.FLOAT, [1, 4]), vi("idx", TP.INT64, [1, 4])], [C(np.array([4], np.int64), "k")])
    return m, lambda: {"x": rng.standard_normal((1, V)).astype(np.float32)}

@case
def topk_k1_after_matmul_logits():
    W = rng.standard_normal((D, V)).astype(np.float32) * 0.2
    m = model([h.make_node("MatMul", ["x", "W"], ["l"]), h.make_node("TopK", ["l", "k"], ["vals", "idx"], axis=-1)],
              [vi("x", TP.FLOAT, [1, D])], [vi("vals", TP.FLOAT, [1, 1]), vi("idx", TP.INT64, [1, 1])], [C(W, "W"), C(np.array([1], np.int64), "k")])
    return m, lambda: {"x": rng.standard_normal((1, D)).astype(np.float32)}

@case
def argmax_logits():
    W = rng.standard_normal((D, V)).astype(np.float32) * 0.2
    m = model([h.make_node("MatMul", ["x", "W"], ["l"]), h.make_node("ArgMax", ["l"], ["idx"], axis=-1, keepdims=1)],
              [vi("x", TP.FLOAT, [1, D])], [vi("idx", TP.INT64, [1, 1])], [C(W, "W")])
    return m, lambda: {"x": rng.standard_normal((1, D)).astype(np.float32)}

@case
def silu_sigmoid_mul():
    m = model([h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", ["x", "s"], ["y"])], [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])], [])
    return m, lambda: {"x": F()}

@case
def gelu_erf():
    nodes = [h.make_node("Div", ["x", "s2"], ["a"]), h.make_node("Erf", ["a"], ["b"]), h.make_node("Add", ["b", "one"], ["c"]),
             h.make_node("Mul", ["x", "c"], ["d"]), h.make_node("Mul", ["d", "half"], ["y"])]
    m = model(nodes, [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])],
              [C(np.float32(np.sqrt(2)), "s2"), C(np.float32(1), "one"), C(np.float32(0.5), "half")])
    return m, lambda: {"x": F()}

@case
def layernorm_op():
    m = model([h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], [vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])],
              [C((1 + 0.1 * rng.standard_normal(D)).astype(np.float32), "g"), C(np.zeros(D, np.float32), "b")])
    return m, lambda: {"x": F()}

@case
def cast_int64_to_float():
    m = model([h.make_node("Cast", ["i"], ["f"], to=TP.FLOAT), h.make_node("Mul", ["f", "x"], ["y"])],
              [vi("i", TP.INT64, [1, T, 1]), vi("x", TP.FLOAT, [1, T, D])], [vi("y", TP.FLOAT, [1, T, D])], [])
    return m, lambda: {"i": rng.integers(0, 3, (1, T, 1)).astype(np.int64), "x": F()}

print(f"== act={act} wt={wt} (QNN HTP soc 57, disable_cpu_ep_fallback=1) ==")
for name, fn in cases.items():
    if only and only not in name: continue
    m, feedfn = fn()
    fp = save(m, f"op_{name}.onnx"); q = os.path.join(MODELS, f"op_{name}.qdq.{act}.{wt}.onnx")
    try:
        qdq(fp, q, [feedfn() for _ in range(4)], act, wt)
    except Exception as e:
        print(f"{name:40s} QUANTIZE-FAIL {type(e).__name__}: {str(e)[:300]}"); continue
    test = feedfn()
    ref = cpu_session(q).run(None, test)
    try:
        s = qnn_session(q, extra_sess_cfg={"session.record_ep_graph_assignment_info": "1"})
        a = assignment(s)
        out = s.run(None, test)
        diffs = []
        for o, r in zip(out, ref):
            if o.dtype.kind in "iub":
                diffs.append(f"{o.dtype}:{'equal' if np.array_equal(o, r) else 'MISMATCH ' + str(o.ravel()[:6]) + ' vs ' + str(r.ravel()[:6])}")
            else:
                diffs.append(f"{o.dtype}:maxdiff={np.abs(o - r).max():.2e}(ref max {np.abs(r).max():.2f})")
        ops = sorted({op for _, ns in a for op, _ in ns})
        print(f"{name:40s} OK on QNN ({len(a)} subgraph(s), ops={ops}) outputs: {'; '.join(diffs)}", flush=True)
    except Exception as e:
        msg = str(e).replace("\n", " ")
        print(f"{name:40s} FAIL {type(e).__name__}: {msg[:400]}", flush=True)
