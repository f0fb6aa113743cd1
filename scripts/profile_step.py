"""Where a decode step's time goes, op type by op type: onnxruntime's profiler on a bundle's target graph during plain
greedy decoding (and, with --peer, on onnxruntime-genai's model of the same checkpoint, fed through its own runtime).

    .venv/bin/python scripts/profile_step.py /tmp/b-int4 [/tmp/b-int8 ...] --tokens 64 --threads 2 \
        [--genai ~/.cache/edge-spec/peers/genai-0.18.0-smollm2-135m-instruct-int4] [--verify 2 5] \
        [--prompts edge_spec/assets/prompts/long_documents.jsonl]   # the steps after that file's first prompt

Prints, per graph: nodes per step, kernel microseconds per step by op type (sorted), and the step's total kernel
time. The profiler's own overhead inflates every node's time a little; compare graphs within one run.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import tempfile
from pathlib import Path

import onnxruntime as ort

PROMPT = "Explain speculative decoding in two sentences."


def _profiled(prefix: str):
    """Every SessionOptions made from now on profiles to `prefix`* (edge_spec's runtime builds its own)."""
    base = ort.SessionOptions

    class Profiled(base):
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = prefix

    ort.SessionOptions = Profiled
    return base


def summarize(trace: Path, graph_hint: str, last: int | None = None) -> tuple[int, dict[str, float], int]:
    """(steps, op type -> total us, nodes per step) of the session whose profile is `trace`; with `last`, over its
    last `last` runs only (the decode steps, not the prefill chunks before them)."""
    events = json.loads(trace.read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if last is not None:
        runs = runs[-last:]
    start = runs[0]["ts"] if runs and last is not None else float("-inf")
    per_op: dict[str, float] = collections.defaultdict(float)
    nodes = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            per_op[e["args"]["op_name"]] += e["dur"]
            nodes[e["name"]] += 1
    steps = max(len(runs), 1)
    return steps, dict(per_op), len(nodes)


def report(name: str, steps: int, per_op: dict[str, float], nodes: int) -> None:
    total = sum(per_op.values()) / steps
    print(f"\n{name}: {steps} decode runs, {nodes} nodes per run, {total:.0f} us kernel time per run")
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:36s} {us / steps:8.1f} us  {100 * us / steps / total:5.1f}%")


def profile_bundle(folder: str, tokens: int, threads: int, verify: int | None = None) -> None:
    """Plain decoding of `tokens` tokens, or (`verify` T) `tokens` passes of T tokens at one position after the
    prompt (a verify pass's cost, nothing committed)."""
    from edge_spec.api import load_bundle

    tmp = Path(tempfile.mkdtemp(prefix="profile-"))
    base = _profiled(str(tmp / "p"))
    try:
        engine = load_bundle(folder, threads=threads, host_check=False)
        if verify:
            ids = engine.tokenizer.encode_prompt(PROMPT, chat=True)
            engine.session.reset()
            engine.session.prefill(ids)
            for _ in range(tokens):
                engine.session.forward(ids[:verify])
        else:
            engine.generate(PROMPT, chat=True, max_new_tokens=tokens, speculative=False)
        backend = getattr(engine.session, "backend", None)
        target = getattr(backend, "session", None)  # the target graph's InferenceSession (OrtBackend)
    finally:
        ort.SessionOptions = base
    files = [Path(target.end_profiling())] if target is not None else sorted(tmp.glob("p*.json"))
    steps, per_op, nodes = summarize(files[0], "target", last=tokens if verify else tokens - 1)
    report(f"{folder} target" + (f", passes of {verify} tokens" if verify else ""), steps, per_op, nodes)


def profile_genai(model_dir: str, tokens: int, threads: int) -> None:
    import onnxruntime_genai as og

    tmp = Path(tempfile.mkdtemp(prefix="profile-genai-"))
    config = json.loads((Path(model_dir) / "genai_config.json").read_text())
    opts = config["model"]["decoder"].setdefault("session_options", {})
    opts.update({"enable_profiling": str(tmp / "g"), "intra_op_num_threads": threads})
    work = Path(tempfile.mkdtemp(prefix="genai-model-"))
    for f in Path(model_dir).iterdir():
        (work / f.name).symlink_to(f.resolve())
    (work / "genai_config.json").unlink()
    (work / "genai_config.json").write_text(json.dumps(config))
    model = og.Model(str(work))
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    window = config["model"]["decoder"].get("sliding_window", {}).get("window_size", 0)  # gemma-3: a cache >= window
    ids = tok.encode(PROMPT)
    params.set_search_options(max_length=max(256, window, len(ids) + tokens + 8), do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    for _ in range(tokens):
        gen.generate_next_token()
    del gen, params, tok, model  # the profile is written when the last reference to the session goes
    gc.collect()
    files = sorted(tmp.glob("g*.json")) or sorted(Path(".").glob(f"{tmp.name}*.json"))
    steps, per_op, nodes = summarize(files[0], "genai", last=tokens - 1)
    report(f"{model_dir} (onnxruntime-genai)", steps, per_op, nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="*")
    ap.add_argument("--genai", nargs="*", default=[])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verify", type=int, nargs="*", default=[],
                    help="also profile passes of these token counts (verify passes; --tokens passes each)")
    ap.add_argument("--prompts", default=None,
                    help="a prompts .jsonl: decode after its first prompt (e.g. a long document) instead of a short one")
    args = ap.parse_args()
    if args.prompts:
        global PROMPT
        with open(args.prompts, encoding="utf-8") as f:
            PROMPT = json.loads(f.readline())["prompt"]
    for b in args.bundles:
        profile_bundle(b, args.tokens, args.threads)
        for t in args.verify:
            profile_bundle(b, args.tokens, args.threads, t)
    for g in args.genai:
        profile_genai(g, args.tokens, args.threads)


if __name__ == "__main__":
    main()
