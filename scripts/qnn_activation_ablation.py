"""Which 16-bit activations cost a QNN bundle its agreement with fp32? Each variant takes the bundle's QDQ target
graphs and turns the activation Quantize -> Dequantize pairs of one class of tensors into Identity (those tensors
float, every other one and every weight as the bundle has them), then teacher-forces the CPU provider over eager fp32's
own greedy answers to held-out everyday chat prompts and scores top-1 on the answer tokens. A class whose float
variant gains much is where the activations lose; "all" (every activation float: the weights' share of the loss) and
"none" (the bundle as it is) bound the table.

    .venv/bin/python scripts/qnn_activation_ablation.py B --export [--without rope calibration]  # QDQ graphs only
    .venv/bin/python scripts/qnn_activation_ablation.py B --export --eight-bit-rest  # without qnn_sensitivity's choice
    .venv/bin/python scripts/qnn_activation_ablation.py B [--classes none all norm ...] [--prompts 8] [--tokens 32]
        [--sink fp32]

--export writes a QNN bundle of the target alone without context binaries (the CPU provider reads only the QDQ
graphs): ~10 min for SmolLM2 on 2 cores. One JSON line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

HELDOUT = Path(__file__).resolve().parents[1] / "edge_spec/assets/prompts/heldout_everyday.jsonl"
ANSWER_TOKENS = 32

# class -> a predicate on the name of the activation tensor a Q/DQ pair quantizes (torch.onnx's names, e.g.
# "/model/layers.3/input_layernorm/Pow_output_0", "/model/layers.3/Add_1_output_0")
CLASSES = {
    "none": lambda name: False,
    "all": lambda name: True,
    "norm": lambda name: "layernorm" in name or "/norm/" in name,
    "norm_square": lambda name: ("layernorm" in name or "/norm/" in name) and re.search(r"/(Pow|Mul|ReduceMean)", name),
    "residual": lambda name: re.fullmatch(r"/model/layers\.\d+/Add(_\d+)?_output_0.*", name) is not None,
    "attn_softmax": lambda name: "self_attn" in name and "Softmax" in name,
    "attn": lambda name: "self_attn" in name,
    "mlp": lambda name: "/mlp/" in name,
    "mlp_act": lambda name: "/mlp/" in name and re.search(r"/(Sigmoid|Mul)[^/]*$", name) is not None,
    "mlp_down_in": lambda name: re.search(r"/mlp/(Mul_1_output_0|down_proj/MatMul\.conv\.x)", name) is not None,
    "linear_in": lambda name: re.search(r"MatMul\.conv\.x$|/mlp/Mul_1_output_0$", name) is not None,
    "linear_out": lambda name: re.search(r"(MatMul\.conv\.y|/MatMul_output_0)$", name) is not None,
    "mlp_sigmoid": lambda name: "/mlp/Sigmoid" in name,
    "logits": lambda name: name.startswith(("logits", "hidden")) or "lm_head" in name,
    "cache": lambda name: name.startswith(("k_cache", "v_cache", "k_new", "v_new")),
    "other": lambda name: not any(CLASSES[c](name) for c in ("norm", "residual", "attn", "mlp", "logits", "cache")),
}


def floated(qdq: Path, out: Path, keep_float) -> int:
    """`qdq` with the activation Q -> DQ pairs whose tensor name satisfies `keep_float` as Identity; returns how many."""
    proto = onnx.load(str(qdq), load_external_data=False)
    graph = proto.graph
    weights = {i.name for i in graph.initializer}
    quantized = {n.output[0]: n.input[0] for n in graph.node
                 if n.op_type == "QuantizeLinear" and n.input[0] not in weights and keep_float(n.input[0])}
    nodes = [onnx.helper.make_node("Identity", [quantized[n.input[0]]], list(n.output), name=n.name)
             if n.op_type == "DequantizeLinear" and n.input[0] in quantized else n
             for n in graph.node if not (n.op_type == "QuantizeLinear" and n.output[0] in quantized)]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(proto, str(out))
    return len(quantized)


def widened(qdq: Path, out: Path, match, factor: float) -> int:
    """`qdq` with the 16-bit range of each activation whose tensor name satisfies `match` widened `factor` times about
    its middle (scale x factor, the zero point moved to keep the middle): fewer values clip, the grid is coarser."""
    from onnx import numpy_helper

    proto = onnx.load(str(qdq), load_external_data=False)
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    params = {(n.input[1], n.input[2]) for n in graph.node
              if n.op_type == "QuantizeLinear" and n.input[0] not in inits and match(n.input[0])}
    for scale_name, zero_name in params:
        scale, zero = numpy_helper.to_array(inits[scale_name]), numpy_helper.to_array(inits[zero_name])
        top = np.iinfo(zero.dtype).max
        middle = (top / 2 - zero.astype(np.float64)) * scale  # the range's middle in real units
        new_scale = (scale * factor).astype(scale.dtype)
        new_zero = np.clip(np.round(top / 2 - middle / new_scale), 0, top).astype(zero.dtype)
        inits[scale_name].CopyFrom(numpy_helper.from_array(new_scale, scale_name))
        inits[zero_name].CopyFrom(numpy_helper.from_array(new_zero, zero_name))
    onnx.save(proto, str(out))
    return len(params)


def variant_bundle(bundle: Path, work: Path, transform) -> tuple[Path, int]:
    """A copy of `bundle` (links) whose target QDQ graphs are rewritten by `transform(qdq, out) -> n` (`floated`,
    `widened`), the manifest's hashes to match; returns it and the last graph's n."""
    from edge_spec.contract.manifest import MANIFEST, sha256_file
    from edge_spec.runtimes import qnn_htp

    out = work / "variant"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out, copy_function=os.link)
    n = 0
    manifest = json.loads((out / MANIFEST).read_text())
    for qdq in sorted((out / qnn_htp.QNN_DIR).glob("target_*.qdq.onnx")):
        tmp = qdq.with_suffix(".tmp")
        n = transform(qdq, tmp)
        qdq.unlink()
        tmp.rename(qdq)
        manifest["files"][str(qdq.relative_to(out))] = {"sha256": sha256_file(qdq), "bytes": qdq.stat().st_size}
    (out / MANIFEST).unlink()  # a link to the bundle's own manifest
    (out / MANIFEST).write_text(json.dumps(manifest))
    return out, n


def answers(target, prompts: list[str], layout, tokens: int = ANSWER_TOKENS) -> list[tuple[list[int], list[int],
                                                                                         np.ndarray]]:
    """Eager fp32's greedy answer (`tokens` tokens) to each chat prompt and its logits over the answer positions,
    teacher-forced in the bundle's pass length: [(prompt ids, answer ids, logits [tokens, V])]."""
    from qnn_bundle_quality import greedy, passes

    from edge_spec.contract.backend import Session
    from edge_spec.runtimes.torch import TorchBackend

    out = []
    for p in prompts:
        ids = target.tokenizer.encode_prompt(p, chat=True)
        answer = greedy(Session(TorchBackend(target.model, layout)), ids, tokens, layout.max_pass)
        logits = passes(Session(TorchBackend(target.model, layout)), ids + answer, layout.max_pass)[len(ids) - 1:-1]
        out.append((ids, answer, logits))
    return out


def fp32_sink(engine, target) -> None:
    """Position 0's rows from eager fp32 (`target`) instead of the bundle's host sink (the QDQ graph's float twin:
    float activations over the 8-bit weights): what a phone bundle's `position0.bin` could hold."""
    import torch

    backend = engine.session.backend
    layout = engine.session.state.layout
    d = engine.manifest.drafter
    aux_layers = tuple(d.aux_layers) if d is not None and d.aux_layers else ()
    empty = [torch.zeros(1, c.num_kv_heads, 0, c.head_dim) for c in layout.caches]
    real_run, sink = backend.run, object()

    def run(function, input_ids, position_ids, masks):
        if function is not sink:
            return real_run(function, input_ids, position_ids, masks)
        with torch.no_grad():
            out = target.model(torch.as_tensor(input_ids, dtype=torch.long), torch.as_tensor(position_ids,
                               dtype=torch.long), {k: torch.zeros(1, 1, 1, 1) for k in layout.kinds()}, empty, empty,
                               aux_layers=aux_layers)
        if backend.aux_width:
            backend._aux = out.aux[0].numpy()
        return out.logits[0].numpy(), out.hidden[0].numpy(), [t.numpy() for p in zip(out.new_k, out.new_v) for t in p]

    backend.run, backend.sink = run, sink


def score(bundle: Path, data, target=None) -> dict:
    """Top-1 of the bundle's CPU QDQ graphs, teacher-forced, on the answer tokens, and the mean KL(eager fp32 ||
    bundle) over the same positions (`target`: position 0 from eager fp32, `fp32_sink`)."""
    from qnn_bundle_quality import passes

    from edge_spec.api import load_bundle
    from edge_spec.exporters.qnn_sensitivity import mean_kl

    engine = load_bundle(bundle, provider="cpu", host_check=False)
    if target is not None:
        fp32_sink(engine, target)
    t = engine.session.state.layout.max_pass
    agree, n, kl, first = 0, 0, 0.0, []
    for ids, answer, ref in data:
        engine.session.reset()
        a = passes(engine.session, ids + answer, t)[len(ids) - 1:-1]
        hit = a.argmax(-1) == np.array(answer)
        agree, n = agree + int(hit.sum()), n + len(answer)
        kl += mean_kl(torch.from_numpy(ref), torch.from_numpy(a)) * len(answer)
        first.append(int(np.argmin(hit)) if not hit.all() else None)
    return {"top1": round(agree / n, 4), "kl": round(kl / n, 5), "positions": n, "first_miss": first}


def export(out: Path, without: list[str], eight_bit_rest: bool = False, tokens: int | None = None) -> None:
    """SmolLM2's QNN bundle, target alone, QDQ graphs only (one graph of 3 rows). `without`: recipe steps of
    2026-12-06 turned off by patching the exporter ("rope": the angle computed in the graph; "calibration": the
    first 2 bench prompts, 48 tokens). `tokens`: calibration tokens per prompt (qnn_calibration.CALIBRATION_TOKENS)."""
    from edge_spec.exporters import qnn, qnn_calibration
    from edge_spec.loading import checkpoints
    from edge_spec.model.ops import SPELLED_GELU

    saved = qnn.compile_context, qnn.TableRopeOps, qnn_calibration.CALIBRATION_PROMPTS, \
        qnn_calibration.CALIBRATION_TOKENS, qnn.GAIN
    if eight_bit_rest:
        qnn.GAIN = float("inf")  # no linear cuts that much: none chosen
    qnn.compile_context = lambda *args: None  # the CPU provider reads only the QDQ graphs
    if "rope" in without:
        qnn.TableRopeOps = lambda rows: SPELLED_GELU
    if "calibration" in without:
        qnn_calibration.CALIBRATION_PROMPTS, qnn_calibration.CALIBRATION_TOKENS = 2, 48
        qnn_calibration.calibration_tokens.__defaults__ = (2,)
    if tokens:
        qnn_calibration.CALIBRATION_TOKENS = tokens
    try:
        start = time.perf_counter()
        qnn.export_bundle(checkpoints.load("smollm2-135m"), out, max_context=256, max_draft_len=2, max_pass=3)
        print(json.dumps({"exported": str(out), "without": without, "s": round(time.perf_counter() - start)}),
              flush=True)
    finally:
        (qnn.compile_context, qnn.TableRopeOps, qnn_calibration.CALIBRATION_PROMPTS, qnn_calibration.CALIBRATION_TOKENS,
         qnn.GAIN) = saved
        qnn_calibration.calibration_tokens.__defaults__ = (saved[2],)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--export", action="store_true", help="write the bundle first")
    parser.add_argument("--without", nargs="*", default=[], choices=("rope", "calibration"),
                        help="with --export: recipe steps turned off (`export`)")
    parser.add_argument("--sink", choices=("bundle", "fp32"), default="bundle",
                        help="position 0 through the bundle's host sink or from eager fp32 (`fp32_sink`)")
    parser.add_argument("--classes", nargs="+", choices=list(CLASSES), help="(default: every class)")
    parser.add_argument("--match", nargs="+", default=[], metavar="NAME=REGEX", help="classes of one's own: the "
                        "tensors whose name the regular expression finds (scored instead of the default classes)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out everyday prompts (of 12)")
    parser.add_argument("--tokens", type=int, default=ANSWER_TOKENS, help="answer tokens per prompt")
    parser.add_argument("--widen", type=float, help="instead of floating each class, widen its 16-bit ranges this "
                        "many times about their middle (`widened`)")
    parser.add_argument("--calibration-tokens", type=int, help="with --export: calibration tokens per prompt "
                        "(default qnn_calibration.CALIBRATION_TOKENS)")
    parser.add_argument("--eight-bit-rest", action="store_true", help="with --export: every weight but q / k / v at 8 "
                        "bits (the recipe before exporters/qnn_sensitivity.py)")
    args = parser.parse_args()
    for item in args.match:
        name, _, pattern = item.partition("=")
        CLASSES[name] = lambda tensor, p=re.compile(pattern): p.search(tensor) is not None
    args.classes = args.classes or ([m.partition("=")[0] for m in args.match] if args.match else list(CLASSES))
    if args.export:
        export(args.bundle, args.without, args.eight_bit_rest, args.calibration_tokens)
    from edge_spec.api import load_bundle
    from edge_spec.loading import checkpoints
    from edge_spec.train.evaluate import read_prompts

    layout = load_bundle(args.bundle, provider="cpu", host_check=False).session.state.layout
    target = checkpoints.load("smollm2-135m")
    data = answers(target, [p["prompt"] for p in read_prompts(HELDOUT)[:args.prompts]], layout, args.tokens)
    with tempfile.TemporaryDirectory(prefix="qnn-ablation-", dir=args.bundle.parent) as work:
        for name in args.classes:
            match = CLASSES[name]
            folder, n = variant_bundle(args.bundle, Path(work), (lambda q, o: floated(q, o, match)) if args.widen is None
                                       else (lambda q, o: widened(q, o, match, args.widen)))
            print(json.dumps({"float" if args.widen is None else f"widen x{args.widen}": name, "pairs_per_graph": n,
                              "sink": args.sink,
                              **score(folder, data, target if args.sink == "fp32" else None)}), flush=True)


if __name__ == "__main__":
    main()
