"""Top-1 agreement of quantized bundles with an fp32 bundle (README, docs/architecture.md "Quantization"): over the
bench prompts and the fp32 bundle's greedy continuation of each, teacher-forced (every bundle reads the same token
sequence), the share of positions whose argmax equals fp32's (the continuation's positions; `--all-positions`: the
prompt's too), and the max |logit diff|. `--genai DIR` scores an onnxruntime-genai model folder the same way (its
model.onnx run by onnxruntime, the whole sequence in one pass over an empty cache); `--prompts FILE` reads other
prompts (JSONL, as `edge-spec bench --prompts`).

    .venv/bin/python scripts/quant_agreement.py bundles/smollm2-fp32 bundles/smollm2-int8 bundles/smollm2-int4 \
        --genai GENAI_INT4_FOLDER --prompts edge_spec/assets/prompts/heldout_everyday.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import DEFAULT_PROMPTS
from edge_spec.train.evaluate import read_prompts


class GenaiLogits:
    """An onnxruntime-genai model folder's logits for a whole sequence: one pass over an empty KV cache."""

    def __init__(self, folder: str, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(Path(folder) / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        decoder = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
        # a past_present_share_buffer model (gemma-3's sliding window) reads a cache of at least the window's
        # capacity, the attention mask saying how much of it is filled (none before this one pass)
        config = json.loads((Path(folder) / "genai_config.json").read_text())
        shared = config.get("search", {}).get("past_present_share_buffer", False)
        capacity = decoder.get("sliding_window", {}).get("window_size", 0) if shared else 0
        self.kv_shape = (1, decoder["num_key_value_heads"], capacity, decoder["head_size"])

    def __call__(self, seq: list[int]) -> np.ndarray:  # -> [T, V]
        feeds = {}
        for i in self.session.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = np.array([seq], dtype=np.int64)
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((1, len(seq)), dtype=np.int64)
            elif i.name == "position_ids":
                feeds[i.name] = np.arange(len(seq), dtype=np.int64)[None]
            elif i.name.startswith("past_key_values."):  # [batch, kv heads, capacity, head dim], empty
                shape = self.kv_shape[:2] + (max(self.kv_shape[2], len(seq) if self.kv_shape[2] else 0),)
                feeds[i.name] = np.zeros(shape + self.kv_shape[3:], dtype=np.float32)
            else:
                raise SystemExit(f"{i.name}: an onnxruntime-genai input this script does not know")
        return self.session.run(["logits"], feeds)[0][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference")
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--all-positions", action="store_true", help="also score the prompt's positions")
    ap.add_argument("--genai", action="append", default=[], help="an onnxruntime-genai model folder to score too")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="prompts JSONL (default: the bench prompts)")
    args = ap.parse_args()
    ref = load_bundle(args.reference, threads=args.threads, host_check=False)
    others = {b: load_bundle(b, threads=args.threads, host_check=False) for b in args.bundles}
    others.update({g: GenaiLogits(g, args.threads) for g in args.genai})
    agree = {b: [] for b in others}
    worst = {b: 0.0 for b in others}
    prompts = read_prompts(args.prompts)
    for p in prompts:
        ids = ref.encode(p["prompt"], chat=p["chat"])
        out = ref.generate(ids, max_new_tokens=args.max_new_tokens, speculative=False)
        seq = ids + out.tokens[:-1]
        chunk = ref.session.state.layout.max_pass or len(seq)
        logits = {}
        for name, engine in [("ref", ref), *others.items()]:
            if isinstance(engine, GenaiLogits):
                logits[name] = engine(seq)[0 if args.all_positions else len(ids) - 1:]
                continue
            s = engine.session
            s.reset()
            rows = []
            for start in range(0, len(seq), chunk):
                rows.append(s.forward(seq[start:start + chunk]).logits)
                s.commit(len(seq[start:start + chunk]))
            logits[name] = np.concatenate(rows)[0 if args.all_positions else len(ids) - 1:]
            s.reset()
        for b in others:
            agree[b] += list(logits[b].argmax(-1) == logits["ref"].argmax(-1))
            worst[b] = max(worst[b], float(np.abs(logits[b] - logits["ref"]).max()))
    print(f"{len(prompts)} prompts x {args.max_new_tokens} greedy tokens of {args.reference}, teacher-forced"
          f"{', prompt positions included' if args.all_positions else ''}")
    print("| bundle | top-1 agreement | max abs logit diff |\n|---|---|---|")
    for b in others:
        print(f"| {b} | {np.mean(agree[b]):.4f} | {worst[b]:.2f} |")


if __name__ == "__main__":
    main()
