"""Which 8da4w form keeps SmolLM2's top-1? Eager torchao variants of the quantized model vs eager fp32, teacher-forced
over the 9 bench prompts + an fp32 bundle's 128-token greedy continuation of each (the sequences of
scripts/quant_agreement.py): top-1 agreement on the continuation positions and on all positions, max |logit diff|.
docs/architecture.md "ExecuTorch path" (Precisions) has the table; the exported .pte of a form agrees with its eager
form to within 0.005 (scripts/quant_agreement.py on the bundles).

    .venv/bin/python scripts/et_quant_variants.py bundles/smollm2-fp32 [--variants exact+head8 torchao]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_spec.loading import checkpoints
from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import DEFAULT_PROMPTS
from edge_spec.exporters.exact_int4 import swap_linears
from edge_spec.train.evaluate import read_prompts


def configs():
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig as DA, IntxWeightOnlyConfig as WO
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxChooseQParamsAlgorithm
    from torchao.quantization.quant_primitives import MappingType

    g = PerGroup(32)
    return {
        "w4": lambda: DA(weight_dtype=torch.int4, weight_granularity=g),
        "w4_hqq": lambda: DA(weight_dtype=torch.int4, weight_granularity=g,
                             intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm.HQQ_SCALE_ONLY),
        "w4_noclip": lambda: DA(weight_dtype=torch.int4, weight_granularity=g,
                                weight_mapping_type=MappingType.SYMMETRIC_NO_CLIPPING_ERR),
        "wo4": lambda: WO(weight_dtype=torch.int4, granularity=g),
        "wo4_asym": lambda: WO(weight_dtype=torch.int4, granularity=g, mapping_type=MappingType.ASYMMETRIC),
        "w8": lambda: DA(weight_dtype=torch.int8, weight_granularity=PerAxis(0)),
    }


def linear(m, fqn):
    return isinstance(m, nn.Linear)


# variant -> [(config, filter)] for torchao's quantize_, or "exact" steps through edge_spec.exporters.exact_int4
VARIANTS = {
    "torchao": [("w4", linear)],  # the form before 2026-12-02
    "torchao_hqq": [("w4_hqq", linear)],
    "torchao_noclip": [("w4_noclip", linear)],
    "weight_only_sym": [("wo4", linear)],
    "weight_only_asym": [("wo4_asym", linear)],
    "torchao+head8": [("w4", lambda m, f: linear(m, f) and f != "lm_head"), ("w8", lambda m, f: f == "lm_head")],
    "exact": [("exact", lambda f, m: m.in_features % 32 == 0)],
    "exact+head8": [("w8", lambda m, f: f == "lm_head"),  # what exporters/executorch.quantize_8da4w does
                    ("exact", lambda f, m: m.in_features % 32 == 0 and f != "lm_head")],
    "8da8w": [("w8", linear)],
    # XNNPACK's symmetric int4, bf16 scales fitted to the bench prompts' activations (exporters/executorch_quant.
    # swap_symmetric), the head 8da8w; native_bias: + the rounding's mean shift as a bias (--quant 8da4w since
    # 2026-12-06); native_rtn: round-to-nearest scales
    "native+head8": [("w8", lambda m, f: f == "lm_head"),
                     ("native", lambda f, m: m.in_features % 32 == 0 and f != "lm_head")],
    "native_bias+head8": [("w8", lambda m, f: f == "lm_head"),
                          ("native_bias", lambda f, m: m.in_features % 32 == 0 and f != "lm_head")],
    # the ONNX int4 grid (exporters/onnx_passes.quantize_blocks, zero points fitted to the same statistics), weights
    # only (dequantized in place: fp32 activations); _bias: + the ET grid's bias correction
    "onnx_int4": [("onnx_int4", linear)],
    "onnx_int4_bias": [("onnx_int4_bias", linear)],
    "native_rtn+head8": [("w8", lambda m, f: f == "lm_head"),
                         ("native_rtn", lambda f, m: m.in_features % 32 == 0 and f != "lm_head")],
}


def quantized(model, steps, stats=None):
    from torchao.quantization import quantize_

    from edge_spec.exporters.executorch_quant import swap_symmetric

    q = copy.deepcopy(model)
    if q.cfg.tie_word_embeddings:  # quantize the head without touching the embedding
        q.lm_head.weight = nn.Parameter(q.lm_head.weight.detach().clone())
    made = configs()
    for name, keep in steps:
        if name == "exact":
            swap_linears(q, keep)
        elif name in ("onnx_int4", "onnx_int4_bias"):
            zero_point_in_place(q, keep, stats, name.endswith("_bias"))
        elif name in ("native", "native_bias", "native_rtn"):
            swap_symmetric(q, keep, stats if name != "native_rtn" else None, bias_correction=name == "native_bias")
        else:
            quantize_(q, made[name](), filter_fn=keep)
    return q


def zero_point_in_place(model, keep, stats, bias: bool) -> None:
    """Every Linear `keep` accepts -> its weight on the ONNX int4 grid (dequantized), fitted to `stats`; with `bias`,
    plus (W - Q) @ mean as a bias."""
    from edge_spec.exporters.calibration import linear_key
    from edge_spec.exporters.onnx_passes import ZERO_POINT, quantize_blocks

    for fqn, m in list(model.named_modules()):
        if not (isinstance(m, nn.Linear) and keep(m, fqn)):
            continue
        w = m.weight.detach().float().numpy()  # [N, K]
        st = stats.get(linear_key(w))
        b = quantize_blocks(w.T.copy(), 4, grid=ZERO_POINT, stats=st)
        n, k = w.shape
        kb = k // 32
        codes = np.stack([b.codes & 15, b.codes >> 4], -1).reshape(n, kb, 32).astype(np.float32)
        z = b.zero_points.reshape(n, -1)
        zero = np.stack([z & 15, z >> 4], -1).reshape(n, -1)[:, :kb].astype(np.float32)
        deq = ((codes - zero[..., None]) * b.scales.reshape(n, kb)[..., None]).reshape(n, k)
        shift = (w - deq).astype(np.float64) @ np.asarray(st[0], np.float64) if bias and st is not None else None
        m.weight = nn.Parameter(torch.from_numpy(deq.astype(np.float32)), requires_grad=False)
        if shift is not None:
            m.bias = nn.Parameter(torch.from_numpy(shift.astype(np.float32)) + (m.bias if m.bias is not None else 0),
                                  requires_grad=False)


def logits_of(model, ids: list[int]) -> np.ndarray:  # [T, V], one causal pass, no cache
    cfg, t = model.cfg, len(ids)
    mask = torch.triu(torch.full((t, t), float("-inf")), 1)[None, None]
    empty = [torch.zeros(1, cfg.kv_heads[i], 0, cfg.head_dims[i]) for i in range(len(cfg.layer_kinds))]
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.arange(t)[None], {k: mask for k in set(cfg.layer_kinds)}, empty, empty)
    return out.logits[0].float().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fp32_bundle", nargs="?", help="an fp32 bundle of the same model: its greedy continuations are the "
                    "sequences (default: eager fp32's own, one full pass per token)")
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS, help="JSONL prompts (default: the bench prompts, which the "
                    "native grid is calibrated on; edge_spec/assets/prompts/heldout_everyday.jsonl is held out)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sequences", help="a JSON file of the teacher-forced sequences: read if it exists, else written")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = checkpoints.load("smollm2-135m")
    model = loaded.model
    seqs = []
    if args.sequences and Path(args.sequences).is_file():
        seqs = [tuple(x) for x in json.loads(Path(args.sequences).read_text())]
    elif args.fp32_bundle:
        engine = load_bundle(args.fp32_bundle, threads=args.threads, host_check=False)
        for p in read_prompts(args.prompts):
            ids = engine.encode(p["prompt"], chat=p["chat"])
            out = engine.generate(ids, max_new_tokens=args.max_new_tokens, speculative=False)
            seqs.append((len(ids), ids + out.tokens[:-1]))
        del engine
    else:
        for p in read_prompts(args.prompts):
            ids = loaded.tokenizer.encode_prompt(p["prompt"], chat=p["chat"])
            seq = list(ids)
            for _ in range(args.max_new_tokens - 1):
                seq.append(int(logits_of(model, seq)[-1].argmax()))
            seqs.append((len(ids), seq))
    if args.sequences and not Path(args.sequences).is_file():
        Path(args.sequences).write_text(json.dumps(seqs))
    stats = None
    if any(step in ("native", "native_bias", "onnx_int4", "onnx_int4_bias") for v in args.variants for step, _ in VARIANTS[v]):
        from edge_spec.exporters.calibration import linear_input_stats
        stats = linear_input_stats(loaded)
    ref = [logits_of(model, s) for _, s in seqs]
    for name in args.variants:
        q = quantized(model, VARIANTS[name], stats)
        cont, every, worst = [], [], 0.0
        for (n, s), r in zip(seqs, ref):
            lq = logits_of(q, s)
            same = lq.argmax(-1) == r.argmax(-1)
            cont += list(same[n - 1:])
            every += list(same)
            worst = max(worst, float(np.abs(lq - r).max()))
        print(json.dumps({"variant": name, "top1_continuation": round(float(np.mean(cont)), 4),
                          "top1_all": round(float(np.mean(every)), 4), "max_abs_logit_diff": round(worst, 2)}),
              flush=True)


if __name__ == "__main__":
    main()
