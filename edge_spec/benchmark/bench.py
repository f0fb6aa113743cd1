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

import json
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge_spec.errors import ConfigError
from edge_spec.peers.times import SETTLE_S, disk_bytes

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "bench.jsonl"


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
    datastore_passes: int = 0  # passes whose drafts came from the static datastore
    lookup_calls: int = 0  # retrieval proposals asked for, and the time they took (Python runtime only)
    lookup_s: float = 0.0
    datastore_calls: int = 0
    datastore_s: float = 0.0
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
        tally.datastore_passes += stats.datastore_passes
        tally.lookup_calls += stats.lookup_calls
        tally.lookup_s += stats.lookup_s
        tally.datastore_calls += stats.datastore_calls
        tally.datastore_s += stats.datastore_s
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
            about = {"runtime": engine.runtime, "precision": engine.manifest.precision if engine.manifest else "fp32",
                     "min_rows": engine.session.min_rows,
                     "host_check": engine.exactness.to_json() if engine.exactness is not None else None}
            for (k, ad), tally in spec.items():
                rows.append(config_row(about, plain, tally, k=k, adaptive=ad, temperature=temperature))
    finally:
        marks.close()
    return rows


def config_row(about: dict, plain: Tally, spec: Tally, *, k: int, adaptive: bool, temperature: float,
               rss_mb: float | None = None) -> dict:
    """One configuration's row. `about`: runtime, precision, min_rows (the row mode the host check chose: 1, passes as
    they are; 2, one-token passes carry a dummy row) and host_check (its JSON, or None); `rss_mb`: the peak RSS of the
    process that decoded (default this one's)."""
    acceptance = [float(a / d) if d else None for a, d in zip(spec.accepted, spec.drafted)]
    row = {
        "runtime": about["runtime"], "precision": about["precision"],
        "k": "adaptive" if adaptive else k, "k_max": k, "temperature": temperature,
        "plain_tok_s": plain.tok_s, "spec_tok_s": spec.tok_s,
        "speedup": spec.tok_s / plain.tok_s if plain.tok_s else None,
        "tau": spec.emitted / spec.passes if spec.passes else None, "acceptance_by_position": acceptance,
        "lookup_share": spec.lookup_passes / spec.passes if spec.passes else None,  # passes drafted by retrieval
        "datastore_share": spec.datastore_passes / spec.passes if spec.passes else None,  # by the static datastore
        # the cost of asking each retrieval source for a draft (a proposal that finds nothing included)
        "lookup_ms_per_call": 1000 * spec.lookup_s / spec.lookup_calls if spec.lookup_calls else None,
        "datastore_ms_per_call": 1000 * spec.datastore_s / spec.datastore_calls if spec.datastore_calls else None,
        "mean_k": float(np.mean(spec.mean_k)) if spec.mean_k else None,
        "time_split": {"plain": plain.split(), "spec": spec.split()},
        "python_overhead_plain": plain.split()["overhead"], "python_overhead_spec": spec.split()["overhead"],
        "first_token_ms": {"plain": 1000 * float(np.mean(plain.first_token_s)),
                           "spec": 1000 * float(np.mean(spec.first_token_s))},
        "tokens": {"plain": plain.tokens, "spec": spec.tokens}, "prompts": len(plain.outputs),
        # one plain decode token = one T=1 target call; the drafter-step budget is a fraction of it
        "target_step_ms": 1000 * plain.target_kernel_s / plain.tokens if plain.tokens else None,
        "drafter_step_ms": 1000 * spec.drafter_kernel_s / spec.drafter_calls if spec.drafter_calls else None,
        "peak_rss_mb": peak_rss_mb() if rss_mb is None else rss_mb,
        "min_rows": about["min_rows"], "host_check": about["host_check"],
    }
    if row["target_step_ms"] and row["drafter_step_ms"]:
        row["drafter_step_share"] = row["drafter_step_ms"] / row["target_step_ms"]
    if temperature == 0:
        row["greedy_exact"] = all(a == b for a, b in zip(plain.outputs, spec.outputs))
        row["greedy_exact_prompts"] = sum(a == b for a, b in zip(plain.outputs, spec.outputs))
    return row


def summary(rows: list[dict], peers: list[dict]) -> str:
    """The run in one line: our best speculative configuration against our plain decode and each peer's plain decode
    (all from this run). Greedy rows only: sampled rows are not compared with greedy peers."""
    greedy = [r for r in rows if r["temperature"] == 0 and r["spec_tok_s"]]
    if not greedy:
        return "no greedy speculative configuration was measured"
    best = max(greedy, key=lambda r: r["spec_tok_s"])
    plain = float(np.mean([r["plain_tok_s"] for r in greedy]))
    line = (f"best speculative: {best['spec_tok_s']:.1f} tok/s (k = {best['k']}, tau {_fmt(best['tau'], '.2f')}) = "
            f"{best['spec_tok_s'] / plain:.2f}x our plain {plain:.1f} tok/s")
    for p in peers:
        if p.get("tok_s"):
            line += (f"; {p['peer']} {p['precision']} plain {p['tok_s']:.1f} tok/s "
                     f"(ours {best['spec_tok_s'] / p['tok_s']:.2f}x it)")
    return line


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _steps(r: dict) -> str:
    if not r.get("drafter_step_share"):
        return "-"
    return f"{r['drafter_step_ms']:.1f} / {r['target_step_ms']:.1f} ms ({r['drafter_step_share']:.0%})"


def _retrieval(r: dict) -> str:
    """Milliseconds per proposal: prompt lookup / static datastore ('-' where the source was off or not timed)."""
    return f"{_fmt(r.get('lookup_ms_per_call'), '.3f')} / {_fmt(r.get('datastore_ms_per_call'), '.3f')}"


def short_outputs(rows: list[dict], max_new_tokens: int) -> str | None:
    """A warning when our plain decode stopped early on most prompts (a stop token within half the budget, on
    average): speeds over a few tokens per prompt say little, and an instruct model given its prompts without the
    chat template often answers with a stop token at once. None when the outputs are long enough."""
    measured = [r for r in rows if r.get("prompts") and "tokens" in r]
    if not measured:
        return None
    r = next((r for r in measured if r.get("temperature") == 0.0), measured[0])
    per_prompt = (r["tokens"]["plain"] + r["prompts"]) / r["prompts"]  # tokens counts the new ones after the first
    if per_prompt >= max_new_tokens / 2:
        return None
    return (f"warning: our plain decode made {per_prompt:.1f} new tokens per prompt of the {max_new_tokens} asked: "
            f"most prompts stopped at a stop token, so these speeds cover few tokens. An instruct model wants its "
            f"chat template (\"chat\": true in the --prompts file)")


def markdown(rows: list[dict], peers: list[dict], meta: dict) -> str:
    short = short_outputs(rows, meta["max_new_tokens"])
    lines = [f"Measured {meta['date']} on {meta['machine']} ({meta['threads']} threads), "
             f"{meta['prompts']} prompts x {meta['max_new_tokens']} new tokens, one run (ratios are within-run).", "",
             *([short, ""] if short else []),
             *([meta["exactness"], ""] if meta.get("exactness") else []),
             "| runtime | precision | T | k | plain tok/s | spec tok/s | speedup | tau | acceptance by position | "
             "time split spec (drafter/target/python) | python share plain | drafter step / target step | "
             "lookup / datastore ms per proposal | first token ms | greedy exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " ".join(_fmt(a, ".2f") for a in r["acceptance_by_position"])
        sp = r["time_split"]["spec"]
        exact = "-" if "greedy_exact" not in r else f"{r['greedy_exact_prompts']}/{r['prompts']}"
        k = r["k"] if r["k"] != "adaptive" else f"adaptive<={r['k_max']} (mean {_fmt(r['mean_k'], '.1f')})"
        lines.append(f"| {r['runtime']} | {r['precision']} | {r['temperature']:g} | {k} | {_fmt(r['plain_tok_s'])} | "
                     f"{_fmt(r['spec_tok_s'])} | {_fmt(r['speedup'], '.2f')}x | {_fmt(r['tau'], '.2f')} | {acc} | "
                     f"{sp['drafter']:.0%} / {sp['target']:.0%} / {sp['overhead']:.0%} | "
                     f"{r['python_overhead_plain']:.0%} | {_steps(r)} | {_retrieval(r)} | "
                     f"{r['first_token_ms']['spec']:.0f} | {exact} |")
    if meta.get("bundle_bytes") and rows and rows[0].get("peak_rss_mb"):
        where = ("a decode of every prompt in a process of its own, as each peer's" if "bench_process_rss_mb" in rows[0]
                 else "our runtime's process (each peer runs in a process of its own)")
        lines += ["", f"Bundle on disk: {meta['bundle_bytes'] / 1e6:.1f} MB; peak resident memory "
                      f"{max(r['peak_rss_mb'] for r in rows):.0f} MB ({where})."]
    if peers:
        lines += ["", "| peer | model | precision | plain tok/s | first token ms | model MB on disk | peak RSS MB |",
                  "|---|---|---|---|---|---|---|"]
        for p in peers:
            size = f"{p['model_bytes'] / 1e6:.1f}" if p.get("model_bytes") else "-"
            rss = f"{p['peak_rss_mb']:.0f}" if p.get("peak_rss_mb") else "-"
            lines.append(f"| {p['peer']} | {p['model']} | {p['precision']} | {p['tok_s']:.1f} | "
                         f"{p['first_token_ms']:.0f} | {size} | {rss} |")
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
    from edge_spec.decoding.hostcheck import cpu_identity

    return f"{cpu_identity()}, {os.cpu_count()} cores, {platform.system()}"


def main(args, prompts: list[dict]) -> int:
    """`edge-spec bench` on the Python runtimes (edge_spec.benchmark.command: the shared option checks done, `prompts`
    read)."""
    from edge_spec.api import load
    from edge_spec.benchmark.own_process import decode_peak_mb
    from edge_spec.cli_options import given_options
    from edge_spec.contract.formats import RUN
    from edge_spec.peers import from_args as peers_from_args

    if args.native_bin is not None:
        raise ConfigError("--native-bin applies to --runtime native", "add --runtime native, or drop --native-bin")
    if args.bundle is not None and args.drafter is not None:
        raise ConfigError("--bundle cannot be combined with --drafter (a bundle brings its own)", "drop --drafter")
    load_kwargs = dict(model=args.model or "smollm2-135m", drafter=args.drafter if args.bundle is None else None,
                       runtime=args.runtime, threads=args.threads, bundle=args.bundle, spin=not args.no_spin,
                       **given_options(args, RUN))
    engine = load(**load_kwargs)
    datastore = getattr(args, "datastore", True)
    if not datastore:  # --no-datastore
        engine.datastore = None
    runners = peers_from_args(args, engine)
    rows = measure(engine, prompts, ks=args.spec_k, temperatures=args.temperature, adaptive=args.adaptive,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats, peers=runners, lookup=args.lookup)
    # the peak memory of a decode in a process of its own, as the peers' is (edge_spec/benchmark/own_process.py)
    if getattr(args, "memory_probe", True):
        own = decode_peak_mb(load_kwargs, prompts, k=max(args.spec_k), adaptive=args.adaptive,
                             temperature=args.temperature[0], max_new_tokens=args.max_new_tokens, lookup=args.lookup,
                             datastore=datastore)
        for r in rows:
            r["bench_process_rss_mb"], r["peak_rss_mb"] = r["peak_rss_mb"], own
    exactness = engine.exactness
    return report(args, rows, [r.result() for r in runners], len(prompts),
                  exactness.summary() if exactness is not None else None,
                  host_exact=exactness.exact if exactness is not None else None)


def report(args, rows: list[dict], peers: list[dict], n_prompts: int, exactness: str | None, *,
           host_exact: bool | None) -> int:
    """Print the table, write --json / --markdown / --plot, warn, print the summary line; the exit code.
    `exactness`: the host check's one line; `host_exact`: its verdict (None: not run)."""
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "spin": not args.no_spin,
            "threads": args.threads or os.cpu_count(), "prompts": n_prompts * args.repeats,
            "max_new_tokens": args.max_new_tokens, "command": "edge-spec " + " ".join(sys.argv[1:]),
            "exactness": exactness, "bundle_bytes": disk_bytes(args.bundle) if args.bundle else None}
    for r in rows:
        r["bundle_bytes"] = meta["bundle_bytes"]
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
    if host_exact is False:
        print(f"warning: {exactness}", file=sys.stderr)
    short = short_outputs(rows, args.max_new_tokens)
    if short:
        print(short, file=sys.stderr)
    print(summary(rows, peers))
    if args.require_exact and (inexact or host_exact is False):
        print("error: greedy exactness did not hold on this host (--require-exact)", file=sys.stderr)
        return 1
    return 0
