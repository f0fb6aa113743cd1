"""What the int4 bundle's exact-Q4_1 offset term costs, as graph variants of one int4 bundle (docs/benchmarks.md,
"The int4 offset term"); each variant is a bundle, then measured with scripts/profile_step.py (kernel time per plain
step) and scripts/quant_agreement.py (top-1 agreement with fp32):

    .venv/bin/python scripts/int4_offset_variants.py B-int4 --work /tmp/offset-variants

  * `reducesum`: the block sums as Reshape + ReduceSum instead of a MatMul with a 0/1 indicator (same weights);
  * `zeropoints`: every MatMulNBits with uint8 zero points and no offset term, the weights re-quantized by
    round-to-nearest over [min(lo, 0), max(hi, 0)] per block (onnxruntime's / onnxruntime-genai's int4 form):
    NOT the GGUF Q4_1 weights any more;
  * `symhead`: only the 8-bit output head made symmetric (SmolLM2's token_embd is Q8_0: the same weights), its
    offset term dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_variants import build  # noqa: E402


def _prune(g) -> None:
    """Drop nodes whose outputs nothing reads (repeatedly) and initializers no node reads."""
    outs = {o.name for o in g.output}
    while True:
        used = {i for n in g.node for i in n.input} | outs
        alive = [n for n in g.node if any(o in used for o in n.output)]
        if len(alive) == len(g.node):
            break
        del g.node[:]
        g.node.extend(alive)
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


def reducesum(proto):
    """The indicator MatMul of each block sum -> Reshape [.., K/32, 32] + ReduceSum."""
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    nodes = []
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1].endswith(".indicator"):
            k, kb = numpy_helper.to_array(inits[n.input[1]]).shape
            shp = n.name + ".shape"
            g.initializer.append(numpy_helper.from_array(np.array([0, 0, kb, k // kb], np.int64), shp))
            ax = n.name + ".axes"
            g.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), ax))
            nodes.append(helper.make_node("Reshape", [n.input[0], shp], [n.output[0] + ".blocks"]))
            nodes.append(helper.make_node("ReduceSum", [n.output[0] + ".blocks", ax], [n.output[0]], keepdims=0))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    _prune(g)


def rtn(w, bits):
    """genai's form: round to nearest over [min(lo, 0), max(hi, 0)] per block -> (codes, scales, zero points)."""
    levels = 2 ** bits - 1
    lo = np.minimum(w.min(-1), 0); hi = np.maximum(w.max(-1), 0)
    sc = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
    zp = np.clip(np.rint(-lo / sc), 0, levels)
    return np.clip(np.rint(w / sc[..., None]) + zp[..., None], 0, levels), sc, zp


def _q4_1(w, bits):
    """A Q4_1-shaped block w = lo + d * q back as (lo, d, q) (exact for the bundle's own int4 weights)."""
    levels = 2 ** bits - 1
    lo, hi = w.min(-1), w.max(-1)
    d = np.where(hi > lo, (hi - lo) / levels, 1.0)
    return lo, d, np.clip(np.rint((w - lo[..., None]) / d[..., None]), 0, levels)


def shift(w, bits):
    """Keep the codes and the scale, round the block's offset to an integer zero point: every weight of a block moves
    by the same amount (<= d / 2)."""
    levels = 2 ** bits - 1
    lo, d, q = _q4_1(w, bits)
    zp = np.clip(np.rint(-lo / d), 0, levels)
    return q, d.astype(np.float32), zp


def align(w, bits):
    """Keep the block minimum exact: zero point z = round(-lo / d), scale d' = -lo / z, codes re-rounded on that grid
    (most codes map to themselves; the block max moves by <= d' / 2). Blocks with lo >= 0: rtn."""
    levels = 2 ** bits - 1
    lo, d, _ = _q4_1(w, bits)
    neg = lo < 0
    zp = np.clip(np.rint(-lo / d), 1, levels)
    d2 = np.where(neg, -lo / zp, 1.0)
    codes = np.clip(np.rint((w - lo[..., None]) / d2[..., None]), 0, levels)
    fallback = rtn(w, bits)
    return (np.where(neg[..., None], codes, fallback[0]), np.where(neg, d2, fallback[1]).astype(np.float32),
            np.where(neg, zp, fallback[2]))


def best(w, bits):
    """Per block, whichever of rtn / shift / align has the smallest squared error."""
    outs = [f(w, bits) for f in (rtn, shift, align)]
    errs = np.stack([(((c - z[..., None]) * s[..., None] - w) ** 2).sum(-1) for c, s, z in outs])  # [3, N, kb]
    pick = errs.argmin(0)
    codes = np.choose(pick[..., None], [c for c, _, _ in outs])
    return codes, np.choose(pick, [s for _, s, _ in outs]).astype(np.float32), np.choose(pick, [z for _, _, z in outs])


def zeropoints(proto, requant=rtn, head=None, vocab=49152):
    """MatMulNBits + offsets -> MatMulNBits with uint8 zero points, the weights re-quantized by `requant` (4-bit
    projections; the 8-bit head too unless `head` says otherwise: `head="sym"` gives it symhead's exact form,
    `head=4` re-quantizes it to 4 bits, as genai's int4 head)."""
    if head == "sym":
        symhead(proto)
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    cons = {}
    for n in g.node:
        for i in n.input: cons.setdefault(i, []).append(n)
    drop = set(); rename = {}
    for n in list(g.node):
        if n.op_type != "MatMulNBits" or not n.output[0].endswith(".main"):
            continue
        a = {x.name: x for x in n.attribute}
        bits, K, N, B = a["bits"].i, a["K"].i, a["N"].i, a["block_size"].i
        adds = [c for c in cons[n.output[0]] if c.op_type == "Add"]
        if not adds:
            continue  # already without an offset term (symhead)
        packed = numpy_helper.to_array(inits[n.input[1]]); scales = numpy_helper.to_array(inits[n.input[2]]).reshape(N, -1)
        kb = scales.shape[1]
        if bits == 4:
            q = np.stack([packed & 15, packed >> 4], -1).reshape(N, kb, B).astype(np.float32)
        else:
            q = packed.reshape(N, kb, B).astype(np.float32)
        zero = 2 ** (bits - 1)
        if head == 4 and N == vocab:
            bits = a["bits"].i = 4
        add = adds[0]
        off_mm = prod[[i for i in add.input if i != n.output[0]][0]]
        offsets = numpy_helper.to_array(inits[off_mm.input[1]])  # [kb, N]
        w = ((q - zero) * scales[..., None] + offsets.T[..., None]).astype(np.float64)  # [N, kb, B]
        qq, sc, zp = requant(w, bits)
        qq = qq.astype(np.uint8); zp = zp.astype(np.uint8); sc = sc.astype(np.float32)
        if bits == 4:
            qq = qq[..., 0::2] | (qq[..., 1::2] << 4)
            if kb % 2: zp = np.concatenate([zp, np.zeros((N, 1), np.uint8)], 1)
            zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(qq), n.input[1]))
        inits[n.input[2]].CopyFrom(numpy_helper.from_array(sc.reshape(-1), n.input[2]))
        zname = n.input[1] + ".zp"
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(zp), zname))
        n.input.append(zname)
        drop.update([add.name or add.output[0], off_mm.name or off_mm.output[0]])
        rename[add.output[0]] = n.output[0]
    # rewire: consumers of the Add output read the MatMulNBits output directly
    nodes = [n for n in g.node if (n.name or n.output[0]) not in drop]
    inv = {v: k for k, v in rename.items()}
    for n in nodes:
        if n.op_type == "MatMulNBits" and n.output[0] in inv:
            n.output[0] = inv[n.output[0]]
    del g.node[:]; g.node.extend(nodes)
    _prune(g)


def symhead(proto, vocab=49152):
    """The output head's 8-bit asymmetric code + offsets -> symmetric 8-bit (Q8_0 source: the same weights)."""
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    cons = {}
    for n in g.node:
        for i in n.input: cons.setdefault(i, []).append(n)
    drop = set()
    for n in list(g.node):
        if n.op_type != "MatMulNBits" or not n.output[0].endswith(".main"): continue
        a = {x.name: x for x in n.attribute}
        if a["N"].i != vocab: continue
        N, B = a["N"].i, a["block_size"].i
        packed = numpy_helper.to_array(inits[n.input[1]]); scales = numpy_helper.to_array(inits[n.input[2]]).reshape(N, -1)
        kb = scales.shape[1]
        add = next(c for c in cons[n.output[0]] if c.op_type == "Add")
        off_mm = prod[[i for i in add.input if i != n.output[0]][0]]
        offsets = numpy_helper.to_array(inits[off_mm.input[1]])
        w = (packed.reshape(N, kb, B).astype(np.float32) - 128) * scales[..., None] + offsets.T[..., None]
        amax = np.abs(w).max(-1); sc = np.where(amax > 0, amax / 127, 1.0).astype(np.float32)
        q = (np.clip(np.rint(w / sc[..., None]), -127, 127) + 128).astype(np.uint8)
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(q), n.input[1]))
        inits[n.input[2]].CopyFrom(numpy_helper.from_array(sc.reshape(-1), n.input[2]))
        drop.update([add.output[0], off_mm.output[0]])
        n.output[0] = add.output[0]
    nodes = [n for n in g.node if not (n.op_type in ("Add", "MatMul") and n.output[0] in drop and n.op_type != "MatMulNBits")]
    del g.node[:]; g.node.extend(nodes)
    _prune(g)


VARIANTS = {"reducesum": reducesum, "zeropoints": zeropoints, "symhead": symhead,
            "zp-shift": lambda p: zeropoints(p, shift, head="sym"), "zp-align": lambda p: zeropoints(p, align, head="sym"),
            "zp-best": lambda p: zeropoints(p, best, head="sym"), "zp-best-head4": lambda p: zeropoints(p, best, head=4),
            "zp-rtn-head4": lambda p: zeropoints(p, rtn, head=4), "zp-rtn-symhead": lambda p: zeropoints(p, rtn, head="sym")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--work", required=True, help="folder for the variant bundles (~250 MB each for SmolLM2)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    for name in args.variants:
        print(build(Path(args.bundle), Path(args.work) / name, VARIANTS[name]))


if __name__ == "__main__":
    main()
