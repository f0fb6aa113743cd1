"""The int4 exactness candidates of docs/architecture.md ("Exactness on every CPU"), built from one int4 bundle and
measured interleaved in one process (scripts/verify_cost.py's measurement):

    .venv/bin/python scripts/int4_variants.py bundles/smollm2-int4 --work /tmp/int4-variants --threads 2

  * `int4` in one-row mode (as shipped before 2026-12-01) and in two-row mode (the fix the host check picks on AVX2);
  * `block16`: the same 4-bit codes and scales in MatMulNBits blocks of 16 (each block-32 scale repeated; the same
    weights): onnxruntime has no one-row special kernel for blocks of 16 on AVX2;
  * `codes8`: the same Q4_1 weights as 8-bit codes (q8 = q4 + 120, same scales and offsets): the 8-bit kernel;
  * `graph-pad`: every MatMulNBits input padded to >= 2 rows inside the graph (Pad + Slice per projection).
Every variant holds exactly the same weights; each also gets a host check (is it exact in one-row mode?).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import DEFAULT_PROMPTS, machine
from edge_spec.train.evaluate import read_prompts

import verify_cost  # noqa: E402  (scripts/ is on sys.path when run as a script)


def _nbits(proto):
    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a for a in node.attribute}
            if attrs["bits"].i == 4:
                yield node, attrs, inits


def block16(proto):
    for node, attrs, inits in _nbits(proto):
        codes, scales = inits[node.input[1]], inits[node.input[2]]
        q = numpy_helper.to_array(codes)  # [N, K/32, 16] -> [N, K/16, 8]: the same bytes
        codes.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(q.reshape(q.shape[0], -1, 8)), codes.name))
        scales.CopyFrom(numpy_helper.from_array(np.repeat(numpy_helper.to_array(scales), 2), scales.name))
        attrs["block_size"].i = 16


def codes8(proto):
    for node, attrs, inits in _nbits(proto):
        codes = inits[node.input[1]]
        q = numpy_helper.to_array(codes)
        q4 = np.stack([q & 15, q >> 4], -1).reshape(q.shape[0], q.shape[1], 32)
        codes.CopyFrom(numpy_helper.from_array((q4.astype(np.int16) + 120).astype(np.uint8), codes.name))
        attrs["bits"].i = 8


def graph_pad(proto):
    """Pad every MatMulNBits activation [1, T, K] to max(T, 2) rows and slice each projection's result back."""
    g = proto.graph
    consumers = {}
    for n in g.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    outs = set()
    for n in g.node:
        if n.op_type == "MatMulNBits":
            o = n.output[0]
            outs.add(next(c for c in consumers[o] if c.op_type == "Add").output[0] if o.endswith(".main") else o)
    padded_inputs = {n.input[0] for n in g.node if n.op_type == "MatMulNBits"}
    g.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
                          (("pad.two", [2]), ("pad.head", [0, 0, 0, 0]), ("pad.zero", [0]), ("pad.axis", [1]))])
    nodes = [helper.make_node("Shape", ["input_ids"], ["pad.T"], start=1, end=2),
             helper.make_node("Sub", ["pad.two", "pad.T"], ["pad.d"]), helper.make_node("Relu", ["pad.d"], ["pad.p"]),
             helper.make_node("Concat", ["pad.head", "pad.p", "pad.zero"], ["pad.pads"], axis=0)]
    done = set()
    for n in g.node:
        a = n.input[0] if n.input else None
        quantized = n.op_type == "MatMulNBits" or (n.op_type == "MatMul" and n.input[1].endswith(".indicator"))
        if quantized and a in padded_inputs:
            if a not in done:
                nodes.append(helper.make_node("Pad", [a, "pad.pads"], [a + ".pad"]))
                done.add(a)
            n.input[0] = a + ".pad"
        renamed = [o for o in n.output if o in outs]
        n.output[:] = [o + ".padded" if o in outs else o for o in n.output]
        nodes.append(n)
        nodes += [helper.make_node("Slice", [o + ".padded", "pad.zero", "pad.T", "pad.axis"], [o]) for o in renamed]
    del g.node[:]
    g.node.extend(nodes)


def build(src: Path, dst: Path, transform) -> Path:
    """A copy of bundle `src` whose target graph went through `transform`, checksums re-recorded."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    graph = dst / "onnx" / "target.onnx"
    proto = onnx.load(graph)
    transform(proto)
    (dst / "onnx" / "target.onnx.data").unlink()
    onnx.save_model(proto, graph, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="target.onnx.data", size_threshold=1024)
    manifest = json.loads((dst / "manifest.json").read_text())
    for rel in manifest["files"]:
        data = (dst / rel).read_bytes()
        manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--work", required=True, help="folder for the variant bundles (~300 MB each for SmolLM2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--spec-k", type=int, default=2)
    args = ap.parse_args()
    work = Path(args.work)
    variants = {name: build(Path(args.bundle), work / name, fn)
                for name, fn in (("block16", block16), ("codes8", codes8), ("graph-pad", graph_pad))}
    engines = {"int4": load_bundle(args.bundle, threads=args.threads, host_check=False)}
    engines.update({name: load_bundle(path, threads=args.threads, host_check=False) for name, path in variants.items()})
    for name, engine in engines.items():
        check = engine.check_host(cache=False)
        print(f"{name}: one-row {'exact' if check.one_row_max_diff == 0 else 'differs'}, "
              f"two-row {'exact' if check.two_row_max_diff == 0 else 'differs'}")
    configs = [("int4", engines["int4"], 1), ("int4", engines["int4"], 2)]
    configs += [(name, engines[name], 1) for name in variants]
    ts = [1, 2, 3, 5, 9]
    rows = verify_cost.measure(configs, read_prompts(DEFAULT_PROMPTS)[:args.prompts], spec_k=args.spec_k,
                               rounds=args.rounds, max_new_tokens=64, ts=ts)
    print(f"{machine()}, {args.threads} threads, {args.rounds} rounds x {args.prompts} prompts x 64 tokens, "
          f"spec k={args.spec_k}")
    print(verify_cost.table(rows, ts))


if __name__ == "__main__":
    main()
