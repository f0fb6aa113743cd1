"""onnxruntime's CPU kernels for one SmolLM2-shaped projection (K 576 -> N 1536): is an M-row call row-for-row
bit-identical to M one-row calls, and what does each configuration cost per call?

    .venv/bin/python scripts/matmul_kernels.py [--threads 2] [--rounds 15]

Configurations: MatMulNBits 4-bit / 8-bit, symmetric or asymmetric (min/max) codes, accuracy level 0 / 1 / 4, blocks
of 16 / 32 / 64 / 128; fp32 MatMul; MatMulInteger (uint8 activations, one zero point, x int8 weights). Prints for each
"M=1 vs rows of M=9" (max |diff|; 0 = bit-identical), "M=2 vs rows of M=9" (do multi-row calls agree among
themselves?) and the median microseconds per call at M = 1, 2, 3, 5, 9. The findings behind docs/architecture.md
"Exactness on every CPU" came from this script (AMD EPYC, AVX2).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edge_spec.benchmark.bench import machine
from edge_spec.exporters.onnx_passes import quantize_blocks

K, N = 576, 1536
MS = (1, 2, 3, 5, 9)


def _model(node, inits, a_type=TensorProto.FLOAT, y_type=TensorProto.FLOAT):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", a_type, ["M", K])],
                              [helper.make_tensor_value_info("y", y_type, ["M", N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])


def nbits(w, bits, symmetric, level, block):
    packed, scales, _ = quantize_blocks(w, bits, block=block, symmetric=symmetric)
    node = helper.make_node("MatMulNBits", ["a", "w", "s"], ["y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=block, accuracy_level=level)
    return _model(node, [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")]), np.float32


def fp32(w):
    return _model(helper.make_node("MatMul", ["a", "w"], ["y"]), [numpy_helper.from_array(w, "w")]), np.float32


def integer(w):
    q = np.clip(np.rint(w / (np.abs(w).max(0) / 127)), -127, 127).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w", "za"], ["y"])
    inits = [numpy_helper.from_array(q, "w"), numpy_helper.from_array(np.array(128, np.uint8), "za")]
    return _model(node, inits, TensorProto.UINT8, TensorProto.INT32), np.uint8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    configs = {"fp32 MatMul": fp32(w), "MatMulInteger u8 x s8": integer(w)}
    for bits in (4, 8):
        for symmetric in (False, True):
            for level in (0, 1, 4):
                configs[f"MatMulNBits {bits}-bit {'sym' if symmetric else 'asym'} acc{level} b32"] = \
                    nbits(w, bits, symmetric, level, 32)
        for block in (16, 64, 128):
            configs[f"MatMulNBits {bits}-bit sym acc4 b{block}"] = nbits(w, bits, True, 4, block)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.log_severity_level = 3
    print(f"{machine()}, onnxruntime {ort.__version__}, {args.threads} threads")
    print("| kernel | M=1 vs M=9 rows | M=2 vs M=9 rows | " + " | ".join(f"us M={m}" for m in MS) + " |")
    print("|---" * (3 + len(MS)) + "|")
    for name, (model, dtype) in configs.items():
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        a = rng.standard_normal((9, K)).astype(np.float32)
        if dtype == np.uint8:
            a = rng.integers(0, 256, (9, K)).astype(np.uint8)
        run = lambda x: sess.run(None, {"a": x})[0]
        full = run(a)
        single = np.concatenate([run(a[i:i + 1]) for i in range(9)])
        pairs = np.concatenate([run(a[i:i + 2])[:1] for i in range(8)])
        d1 = float(np.abs(single.astype(np.float64) - full).max())
        d2 = float(np.abs(pairs.astype(np.float64) - full[:8]).max())
        times = {m: [] for m in MS}
        for _ in range(args.rounds):
            for m in MS:
                run(a[:m])
                begin = time.perf_counter()
                for _ in range(5):
                    run(a[:m])
                times[m].append((time.perf_counter() - begin) / 5 * 1e6)
        print(f"| {name} | {d1:.2g} | {d2:.2g} | " + " | ".join(f"{np.median(times[m]):.0f}" for m in MS) + " |")


if __name__ == "__main__":
    main()
