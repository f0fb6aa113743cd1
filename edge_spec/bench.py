"""`edge-spec bench`: plain vs speculative decoding speed of one engine, measured in one run, plus peers.

Every prompt runs plain first and then once per configuration (k values x temperatures), interleaved,
so slow drift of a shared machine hits all configurations alike. Reported per configuration:
decode tok/s (tokens after the first / time after the first), tau, acceptance by position, the time split
(drafter kernel / target kernel / everything else = Python loop overhead), first-token latency, peak RSS,
and, at temperature 0, whether the speculative tokens equal the plain ones (they must).

Output: a Markdown table on stdout, optionally JSON (a list: one object per configuration and per peer),
a Markdown file and a PNG plot (tok/s vs k; acceptance by position).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ConfigError

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "assets" / "prompts" / "bench.jsonl"


@dataclass
class Tally:
    """Sums over prompts for one configuration (decode = everything after the first new token)."""

    tokens: int = 0  # new tokens after the first
    decode_s: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    target_kernel_s: float = 0.0  # during decode
    drafter_kernel_s: float = 0.0
    emitted: int = 0  # speculative only
    passes: int = 0
    drafter_calls: int = 0
    lookup_passes: int = 0  # passes whose drafts came from retrieval
    drafted: np.ndarray | None = None
    accepted: np.ndarray | None = None
    outputs: list[list[int]] = field(default_factory=list)
    mean_k: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    def split(self) -> dict:
        """Shares of decode time: drafter kernel, target kernel, the rest (our Python loop)."""
        d = max(self.decode_s, 1e-12)
        overhead = max(self.decode_s - self.target_kernel_s - self.drafter_kernel_s, 0.0)
        return {"drafter": self.drafter_kernel_s / d, "target": self.target_kernel_s / d, "overhead": overhead / d}


class _KernelMarks:
    """Reads the backends' kernel clocks right after each prefill, so decode time can be split exactly."""

    def __init__(self, engine):
        self.backend, self.drafter = engine.session.backend, engine.drafter
        self.session = engine.session
        self._prefill = self.session.prefill
        self.at_prefill = (0.0, 0.0)
        self.session.prefill = self._marked_prefill

    def clocks(self) -> tuple[float, float]:
        return self.backend.kernel_s, self.drafter.kernel_s if self.drafter is not None else 0.0

    def _marked_prefill(self, tokens):
        out = self._prefill(tokens)
        self.at_prefill = self.clocks()
        return out

    def close(self) -> None:
        self.session.prefill = self._prefill


def run_one(engine, marks: _KernelMarks, row: dict, tally: Tally, *, k: int | None, adaptive: bool,
            temperature: float, max_new_tokens: int, seed: int, lookup: bool = True) -> None:
    result = engine.generate(row["prompt"], chat=row["chat"], max_new_tokens=max_new_tokens, temperature=temperature,
                             seed=seed, speculative=k is not None, spec_k=k or 1, adaptive=adaptive, lookup=lookup,
                             allow_inexact=True)  # measured even where the host check failed: greedy_exact reports it
    target_end, drafter_end = marks.clocks()
    tally.tokens += max(result.new_tokens - 1, 0)
    tally.decode_s += result.total_s - result.prefill_s
    tally.first_token_s.append(result.prefill_s)
    tally.target_kernel_s += target_end - marks.at_prefill[0]
    tally.drafter_kernel_s += drafter_end - marks.at_prefill[1]
    tally.outputs.append(result.tokens)
    stats = result.extra.get("spec")
    if stats is not None:
        tally.emitted += stats.emitted_by_passes
        tally.passes += stats.target_calls
        tally.drafter_calls += stats.drafter_calls
        tally.lookup_passes += stats.lookup_passes
        if tally.drafted is None:
            tally.drafted, tally.accepted = np.zeros_like(stats.drafted), np.zeros_like(stats.accepted)
        tally.drafted += stats.drafted
        tally.accepted += stats.accepted
        if stats.k_chosen:
            tally.mean_k.append(float(np.mean(stats.k_chosen)))


def peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return kb / 2 ** 20 if sys.platform == "darwin" else kb / 1024


def measure(engine, prompts: list[dict], *, ks: list[int], temperatures: list[float], adaptive: bool,
            max_new_tokens: int, seed: int = 0, repeats: int = 1, progress: bool = True,
            peers: list | None = None, lookup: bool = True) -> list[dict]:
    """One plain + one speculative configuration per k (and adaptive), per temperature. Returns rows.

    `peers` (e.g. LlamaCppPeer) decode each prompt right after our plain run of it, in the first pass
    (greedy peers: once per prompt and repeat)."""
    peers = peers or []
    from tqdm.auto import tqdm

    if engine.drafter is None:
        raise ConfigError("benchmarking speculative decoding needs a drafter",
                          "export the bundle with --drafter builtin (or PATH), or pass --drafter for --model")
    configs = [(k, False) for k in ks] + ([(max(ks), True)] if adaptive else [])
    marks = _KernelMarks(engine)
    rows = []
    try:
        engine.generate(prompts[0]["prompt"], chat=prompts[0]["chat"], max_new_tokens=8)  # warm-up: first-run costs
        engine.generate(prompts[0]["prompt"], chat=prompts[0]["chat"], max_new_tokens=8, spec_k=max(ks),
                        allow_inexact=True)
        token_prompts = [engine.encode(p["prompt"], chat=p["chat"]) for p in prompts] if peers else []
        for peer in peers:
            peer.warm_up(token_prompts[0])
        for n_temp, temperature in enumerate(temperatures):
            plain = Tally()
            spec = {c: Tally() for c in configs}
            total = len(prompts) * repeats * (1 + len(configs) + (len(peers) if n_temp == 0 else 0))
            bar = tqdm(total=total, desc=f"bench T={temperature}", unit="run", disable=not progress, file=sys.stderr)
            for rep in range(repeats):
                for i, row in enumerate(prompts):
                    s = seed + 1000 * rep + i
                    run_one(engine, marks, row, plain, k=None, adaptive=False, temperature=temperature,
                            max_new_tokens=max_new_tokens, seed=s)
                    bar.update(1)
                    for peer in peers if n_temp == 0 else []:
                        time.sleep(SETTLE_S)  # let the other engine's threads stop spinning first
                        peer.run(token_prompts[i], max_new_tokens)
                        time.sleep(SETTLE_S)
                        bar.update(1)
                    for (k, ad), tally in spec.items():
                        run_one(engine, marks, row, tally, k=k, adaptive=ad, temperature=temperature,
                                max_new_tokens=max_new_tokens, seed=s, lookup=lookup)
                        bar.update(1)
            bar.close()
            for (k, ad), tally in spec.items():
                rows.append(_row(engine, plain, tally, k=k, adaptive=ad, temperature=temperature))
    finally:
        marks.close()
    return rows


def _row(engine, plain: Tally, spec: Tally, *, k: int, adaptive: bool, temperature: float) -> dict:
    acceptance = [float(a / d) if d else None for a, d in zip(spec.accepted, spec.drafted)]
    row = {
        "runtime": engine.runtime, "precision": engine.manifest.precision if engine.manifest else "fp32",
        "k": "adaptive" if adaptive else k, "k_max": k, "temperature": temperature,
        "plain_tok_s": plain.tok_s, "spec_tok_s": spec.tok_s,
        "speedup": spec.tok_s / plain.tok_s if plain.tok_s else None,
        "tau": spec.emitted / spec.passes if spec.passes else None, "acceptance_by_position": acceptance,
        "lookup_share": spec.lookup_passes / spec.passes if spec.passes else None,  # passes drafted by retrieval
        "mean_k": float(np.mean(spec.mean_k)) if spec.mean_k else None,
        "time_split": {"plain": plain.split(), "spec": spec.split()},
        "python_overhead_plain": plain.split()["overhead"], "python_overhead_spec": spec.split()["overhead"],
        "first_token_ms": {"plain": 1000 * float(np.mean(plain.first_token_s)),
                           "spec": 1000 * float(np.mean(spec.first_token_s))},
        "tokens": {"plain": plain.tokens, "spec": spec.tokens}, "prompts": len(plain.outputs),
        # one plain decode token = one T=1 target call; the drafter-step budget is a fraction of it
        "target_step_ms": 1000 * plain.target_kernel_s / plain.tokens if plain.tokens else None,
        "drafter_step_ms": 1000 * spec.drafter_kernel_s / spec.drafter_calls if spec.drafter_calls else None,
        "peak_rss_mb": peak_rss_mb(),
        # the row mode the host check chose (1: passes as they are, 2: one-token passes carry a dummy row)
        "min_rows": engine.session.min_rows,
        "host_check": engine.exactness.to_json() if engine.exactness is not None else None,
    }
    if row["target_step_ms"] and row["drafter_step_ms"]:
        row["drafter_step_share"] = row["drafter_step_ms"] / row["target_step_ms"]
    if temperature == 0:
        row["greedy_exact"] = all(a == b for a, b in zip(plain.outputs, spec.outputs))
        row["greedy_exact_prompts"] = sum(a == b for a, b in zip(plain.outputs, spec.outputs))
    return row


# ---- peers ---------------------------------------------------------------------------------------------
def _require_llama_cpp() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        raise ConfigError("--peer llama.cpp needs llama-cpp-python",
                          "pip install llama-cpp-python (builds llama.cpp from source, ~15 min on 2 cores)") from err


SETTLE_S = 0.2  # pause when switching between our engine and a peer: both spin-wait idle threads for a while


class _PeerTimes:
    """Decode-time bookkeeping shared by the peers: first-token latency and decode tok/s after the first token."""

    def __init__(self, threads: int | None):
        self.threads = threads or os.cpu_count()
        self.tokens, self.decode_s, self.first = 0, 0.0, []

    def record(self, n: int, start: float, t_first: float, end: float) -> None:
        self.first.append(t_first - start)
        self.tokens += n - 1
        self.decode_s += end - t_first

    def timing(self) -> dict:
        return {"tok_s": self.tokens / self.decode_s if self.decode_s else 0.0,
                "first_token_ms": 1000 * float(np.mean(self.first)) if self.first else None,
                "threads": self.threads, "tokens": self.tokens, "interleaved": True}


class LlamaCppPeer(_PeerTimes):
    """Plain greedy decode of a GGUF through llama-cpp-python, on the same prompt token ids and token budget.

    `measure` runs it right after our plain run of each prompt, so both see the same machine state (this
    machine's speed drifts by 20-40% over minutes). `extra_bufts`: llama.cpp's extra CPU buffer types
    (AMX tiles, repacked quant layouts). Off by default: with them, llama-cpp-python 0.3.36 built here
    segfaults on quantized models on this AMX CPU (f32 runs)."""

    def __init__(self, gguf: Path, *, threads: int | None, label: str | None = None, extra_bufts: bool = False):
        _require_llama_cpp()
        from llama_cpp import Llama
        import llama_cpp.llama_cpp as lowlevel

        if not Path(gguf).is_file():
            raise ConfigError(f"GGUF file {gguf} does not exist", "pass --peer-gguf PATH")
        super().__init__(threads)
        self.gguf, self.label, self.extra_bufts = Path(gguf), label, extra_bufts
        defaults = lowlevel.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = extra_bufts
            return p

        lowlevel.llama_model_default_params = params  # Llama() takes its model params from here
        try:
            self.llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=self.threads, n_threads_batch=self.threads,
                             verbose=False)
        finally:
            lowlevel.llama_model_default_params = defaults

    def warm_up(self, ids: list[int]) -> None:
        self.llm.generate(ids[:8], temp=0.0).__next__()

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        stop = self.llm.token_eos()
        self.llm.reset()
        start = time.perf_counter()
        n, t_first = 0, None
        for tok in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
            if tok == stop or n >= max_new_tokens:
                break
        self.record(n, start, t_first, time.perf_counter())

    def result(self) -> dict:
        return {"peer": "llama.cpp", "model": self.gguf.name, "precision": self.label or _gguf_type(self.gguf),
                **self.timing(), "extra_bufts": self.extra_bufts,
                "llama_cpp_python": __import__("llama_cpp").__version__}


PEER_FTYPES = {"f32": "LLAMA_FTYPE_ALL_F32", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
               "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1"}


def peer_gguf(source: Path, kind: str, cache: Path) -> Path:
    """`source` re-encoded as `kind` by llama.cpp's own quantizer (cached). SmolLM2's only GGUF is Q4_1, so
    f32 / q8_0 / q4_0 peers hold exactly the weights our bundles are exported from (Q4_1 dequantized)."""
    import ctypes
    import llama_cpp

    if _gguf_type(source) == kind:
        return source
    if kind not in PEER_FTYPES:
        raise ConfigError(f"unknown peer quantization {kind!r}", f"choose from {', '.join(PEER_FTYPES)}")
    out = cache / f"{source.stem}.as-{kind.upper()}.gguf"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, PEER_FTYPES[kind])
    params.allow_requantize = True  # the source is already quantized: llama.cpp dequantizes, then encodes
    params.pure = True  # one type for every tensor (no k-quant mixtures)
    params.nthread = os.cpu_count() or 1
    tmp = out.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"llama.cpp could not re-encode {source.name} as {kind}", "pass --peer-gguf PATH instead")
    tmp.replace(out)
    return out


GENAI_PRECISIONS = ("fp32", "int8", "int4")  # onnxruntime-genai model builder precisions on the CPU provider


def _require_genai():
    try:
        import onnxruntime_genai
    except ImportError as err:
        raise ConfigError("--peer onnxruntime-genai needs onnxruntime-genai",
                          "pip install onnxruntime-genai (use --no-deps to keep this onnxruntime)") from err
    return onnxruntime_genai


def genai_model(source: Path, precision: str, cache: Path) -> Path:
    """onnxruntime-genai's own ONNX model of the checkpoint folder `source` (config.json + safetensors), built
    by its model builder for the CPU provider and cached (written to a temp folder, then renamed)."""
    og = _require_genai()
    if precision not in GENAI_PRECISIONS:
        raise ConfigError(f"unknown onnxruntime-genai precision {precision!r}",
                          f"choose from {', '.join(GENAI_PRECISIONS)}")
    if not (Path(source) / "config.json").is_file():
        raise ConfigError(f"{source} is not a checkpoint folder (no config.json)",
                          "the genai peer is built from the target's Hugging Face folder: pass --model FOLDER")
    out = cache / f"genai-{og.__version__}-{Path(source).name}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(tmp / "model"),
           "-p", precision, "-e", "cpu", "-c", str(tmp / "hf-cache")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (tmp / "model" / "genai_config.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"onnxruntime-genai's model builder failed on {source} ({precision}): "
                          f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no output'}",
                          "check that the folder is a supported Llama/Gemma checkpoint")
    (tmp / "model").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


class OrtGenaiPeer(_PeerTimes):
    """Plain greedy decode through onnxruntime-genai with the model its own builder made of the same checkpoint
    (fused GroupQueryAttention / RotaryEmbedding / SkipSimplifiedLayerNorm graph; its int4 is symmetric with a
    4-bit head, so its tokens can differ from ours). Same prompt ids, budget and interleaving as LlamaCppPeer."""

    def __init__(self, model_dir: Path, *, threads: int | None, precision: str):
        og = _require_genai()
        super().__init__(threads)
        self.model_dir, self.precision = Path(model_dir), precision
        config = og.Config(str(model_dir))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": self.threads, "inter_op_num_threads": 1}}}}))
        self.og, self.model = og, og.Model(config)
        self.outputs = []

    def _generate(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], float, float, float]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
        gen = self.og.Generator(self.model, params)
        start = time.perf_counter()
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        out, t_first = [], None
        while not gen.is_done() and len(out) < max_new_tokens:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
            if t_first is None:
                t_first = time.perf_counter()
        return out, start, t_first, time.perf_counter()

    def warm_up(self, ids: list[int]) -> None:
        self._generate(ids[:8], 2)

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        out, start, t_first, end = self._generate(ids, max_new_tokens)
        self.outputs.append(out)
        self.record(len(out), start, t_first, end)

    def result(self) -> dict:
        return {"peer": "onnxruntime-genai", "model": self.model_dir.name, "precision": self.precision,
                **self.timing(), "onnxruntime_genai": self.og.__version__}


def _gguf_type(path: Path) -> str:
    name = Path(path).stem.lower()
    if ".as-" in name:
        return name.rsplit(".as-", 1)[1]
    for tag in ("q4_0", "q4_1", "q4_k_m", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32"):
        if tag in name:
            return tag
    return "gguf"


# ---- reporting -----------------------------------------------------------------------------------------
def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _steps(r: dict) -> str:
    if not r.get("drafter_step_share"):
        return "-"
    return f"{r['drafter_step_ms']:.1f} / {r['target_step_ms']:.1f} ms ({r['drafter_step_share']:.0%})"


def markdown(rows: list[dict], peers: list[dict], meta: dict) -> str:
    lines = [f"Measured {meta['date']} on {meta['machine']} ({meta['threads']} threads), "
             f"{meta['prompts']} prompts x {meta['max_new_tokens']} new tokens, one run (ratios are within-run).", "",
             *([meta["exactness"], ""] if meta.get("exactness") else []),
             "| runtime | precision | T | k | plain tok/s | spec tok/s | speedup | tau | acceptance by position | "
             "time split spec (drafter/target/python) | python share plain | drafter step / target step | "
             "first token ms | greedy exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " ".join(_fmt(a, ".2f") for a in r["acceptance_by_position"])
        sp = r["time_split"]["spec"]
        exact = "-" if "greedy_exact" not in r else f"{r['greedy_exact_prompts']}/{r['prompts']}"
        k = r["k"] if r["k"] != "adaptive" else f"adaptive<={r['k_max']} (mean {_fmt(r['mean_k'], '.1f')})"
        lines.append(f"| {r['runtime']} | {r['precision']} | {r['temperature']:g} | {k} | {_fmt(r['plain_tok_s'])} | "
                     f"{_fmt(r['spec_tok_s'])} | {_fmt(r['speedup'], '.2f')}x | {_fmt(r['tau'], '.2f')} | {acc} | "
                     f"{sp['drafter']:.0%} / {sp['target']:.0%} / {sp['overhead']:.0%} | "
                     f"{r['python_overhead_plain']:.0%} | {_steps(r)} | {r['first_token_ms']['spec']:.0f} | {exact} |")
    if peers:
        lines += ["", "| peer | model | precision | plain tok/s | first token ms |", "|---|---|---|---|---|"]
        for p in peers:
            lines.append(f"| {p['peer']} | {p['model']} | {p['precision']} | {p['tok_s']:.1f} | "
                         f"{p['first_token_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], peers: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for temperature in sorted({r["temperature"] for r in rows}):
        fixed = [r for r in rows if r["temperature"] == temperature and r["k"] != "adaptive"]
        if not fixed:
            continue
        line, = ax1.plot([r["k"] for r in fixed], [r["spec_tok_s"] for r in fixed], "o-",
                         label=f"speculative T={temperature:g}")
        ax1.axhline(float(np.mean([r["plain_tok_s"] for r in fixed])), ls="--", color=line.get_color(),
                    label=f"plain T={temperature:g}")
    for p in peers:
        ax1.axhline(p["tok_s"], ls=":", color="gray")
        ax1.annotate(f"{p['peer']} {p['precision']}", (ax1.get_xlim()[0], p["tok_s"]), fontsize=8, va="bottom")
    ax1.set_xticks(sorted({r["k"] for r in rows if r["k"] != "adaptive"}))
    ax1.set_xlabel("k (draft tokens per target pass)")
    ax1.set_ylabel("decode tok/s")
    ax1.set_title(f"{rows[0]['runtime']} {rows[0]['precision']}")
    ax1.legend(fontsize=8)
    greedy = [r for r in rows if r["temperature"] == min(x["temperature"] for x in rows) and r["k"] != "adaptive"]
    for r in greedy:
        acc = [a if a is not None else np.nan for a in r["acceptance_by_position"]]
        ax2.plot(range(1, len(acc) + 1), acc, "o-", label=f"k={r['k']}")
    ax2.set_xticks(range(1, max((len(r["acceptance_by_position"]) for r in greedy), default=1) + 1))
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance rate")
    ax2.set_ylim(0, 1)
    ax2.set_title(f"acceptance by position (T={greedy[0]['temperature']:g})" if greedy else "acceptance")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    from .hostcheck import cpu_identity

    return f"{cpu_identity()}, {os.cpu_count()} cores, {platform.system()}"


def _target_folder(engine) -> Path:
    """The target's checkpoint folder: the bundle's recorded source, or the loaded checkpoint's folder."""
    folder = engine.manifest.target.source if engine.manifest else getattr(engine.loaded, "folder", None)
    if not folder or not Path(folder).is_dir():
        raise ConfigError(f"the target's checkpoint folder {folder!r} is not on this machine",
                          "--peer onnxruntime-genai builds its model from it: run on the machine that exported "
                          "the bundle, or use --model FOLDER")
    return Path(folder)


def _genai_default(engine) -> str:
    precision = engine.manifest.precision if engine.manifest else "fp32"
    return precision if precision in GENAI_PRECISIONS else "fp32"


def main(args) -> int:
    from .api import load
    from .gguf_import import cache_root, find_smollm2_gguf
    from .train.evaluate import read_prompts

    if not args.spec_k or any(k < 1 for k in args.spec_k):
        raise ConfigError(f"--spec-k values must be >= 1, got {args.spec_k}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    prompts = read_prompts(Path(args.prompts) if args.prompts else DEFAULT_PROMPTS)[:args.num_prompts]
    if args.bundle is not None and args.drafter is not None:
        raise ConfigError("--bundle cannot be combined with --drafter (a bundle brings its own)", "drop --drafter")
    engine = load(args.model or "smollm2-135m", drafter=args.drafter if args.bundle is None else None,
                  runtime=args.runtime, threads=args.threads, bundle=args.bundle, provider=args.provider,
                  spin=not args.no_spin, compute_units=args.compute_units)
    gguf = None
    if "llama.cpp" in (args.peer or []):  # fail before the long measurement, not after it
        _require_llama_cpp()
        gguf = [Path(p) for p in args.peer_gguf or []]
        for p in gguf:
            if not p.is_file():
                raise ConfigError(f"GGUF file {p} does not exist", "pass existing files to --peer-gguf")
        if args.peer_quant or not gguf:
            source = find_smollm2_gguf()
            gguf += [peer_gguf(source, kind, cache_root() / "peers") for kind in args.peer_quant or ["q4_1"]]
    runners = [LlamaCppPeer(path, threads=args.threads) for path in gguf or []]
    if "onnxruntime-genai" in (args.peer or []):
        source = _target_folder(engine)
        precisions = args.genai_precision or [_genai_default(engine)]
        runners += [OrtGenaiPeer(genai_model(source, p, cache_root() / "peers"), threads=args.threads, precision=p)
                    for p in precisions]
    if "executorch" in (args.peer or []):
        from .peer_executorch import ET_PRECISIONS, ExecutorchRunnerPeer, et_runner_model

        source = _target_folder(engine)
        decode = functools.partial(engine.tokenizer.decode, skip_special=False)
        runners += [ExecutorchRunnerPeer(et_runner_model(source, p, cache_root() / "peers"), source / "tokenizer.json",
                                         decode, threads=args.threads, precision=p)
                    for p in args.et_precision or ET_PRECISIONS[:1]]
    rows = measure(engine, prompts, ks=args.spec_k, temperatures=args.temperature, adaptive=args.adaptive,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats, peers=runners, lookup=args.lookup)
    peers = [r.result() for r in runners]
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "spin": not args.no_spin,
            "threads": args.threads or os.cpu_count(), "prompts": len(prompts) * args.repeats,
            "max_new_tokens": args.max_new_tokens, "command": "edge-spec " + " ".join(sys.argv[1:]),
            "exactness": engine.exactness.summary() if engine.exactness is not None else None}
    table = markdown(rows, peers, meta)
    print(table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        objects = [{**r, "date": meta["date"], "machine": meta["machine"], "threads": meta["threads"],
                    "max_new_tokens": meta["max_new_tokens"]} for r in rows + peers]
        Path(args.json).write_text(json.dumps(objects, indent=2, default=float))
    if args.markdown:
        Path(args.markdown).write_text(f"`{meta['command']}`\n\n{table}")
    if args.plot:
        plot(rows, peers, Path(args.plot))
    inexact = [r for r in rows if r.get("greedy_exact") is False]
    for r in inexact:
        print(f"warning: greedy speculative output differed from plain at k={r['k']} "
              f"({r['greedy_exact_prompts']}/{r['prompts']} prompts identical)", file=sys.stderr)
    if engine.exactness is not None and not engine.exactness.exact:
        print(f"warning: {engine.exactness.summary()}", file=sys.stderr)
    if args.require_exact and (inexact or (engine.exactness is not None and not engine.exactness.exact)):
        print("error: greedy exactness did not hold on this host (--require-exact)", file=sys.stderr)
        return 1
    return 0
