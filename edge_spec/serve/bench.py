"""`edge-spec bench-serve`: what the server costs. The same bundle decoded directly (the engine in this process, as
`edge-spec generate` runs it) and through `edge-spec serve` (a separate process on 127.0.0.1, driven over HTTP).

Per runtime (python, native): a server process is started on a free port; after one warm-up request each way,
every prompt is decoded directly and then through the server with one client (interleaved, greedy, the prompt as
the same token ids: POST /v1/completions), so drift hits both alike; then `--clients` C > 1 clients send every
prompt at once (each starting at another prompt). Figures: tokens per second (completion tokens / summed request
wall time, one client; / the phase's wall time, several), per-request latency p50 / p99 (client side, the prefill
included), the server's overhead against direct decoding, and whether every served text equals the direct one.
Each runtime is measured in a fresh process of its own (multiprocessing's spawn): the native runner's library and
ExecuTorch's Python LLM ops cannot share one (edge_spec.runtimes.native_capi), and neither runtime's memory or
threads then weigh on the other's figures.
Output: a table on stdout, --json, --markdown, --plot (as `edge-spec bench`).
"""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from edge_spec.errors import ConfigError

MODEL_ID = "bench"
RUNTIMES = ("python", "native")


def add_parser(sub) -> None:
    p = sub.add_parser("bench-serve", help="benchmark edge-spec serve against direct decoding (tok/s, latency)")
    p.add_argument("--bundle", required=True, help="an exported bundle folder")
    p.add_argument("--runtime", nargs="+", choices=RUNTIMES, default=["python"],
                   help="runtimes to measure (default python; native needs make native)")
    p.add_argument("--prompts", default=None, help="JSONL prompts (default: edge-spec bench's)")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8],
                   help="concurrent clients per phase (default 1 8; 1 is always measured)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the runtime (both sides)")
    p.add_argument("--native-lib", default=None, help="the native runner's library (default build/native)")
    p.add_argument("--json", default=None, help="write the rows as JSON")
    p.add_argument("--markdown", default=None, help="write the Markdown table (with the command line)")
    p.add_argument("--plot", default=None, help="write a PNG: tok/s and latency per runtime and client count")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: a latency some request actually had."""
    ordered = sorted(values)
    return ordered[max(0, int(np.ceil(q / 100 * len(ordered))) - 1)]


class ServerProcess:
    """`edge-spec serve` on a free port of 127.0.0.1; `url` once it listens."""

    def __init__(self, bundle: str, runtime: str, threads: int | None, native_lib: str | None):
        command = [sys.executable, "-m", "edge_spec.cli", "serve", "--bundle", bundle, "--port", "0", "--model-id",
                   MODEL_ID, "--runtime", runtime, "--queue", "256", "--timeout", "3600"]
        command += ["--threads", str(threads)] if threads else []
        command += ["--native-lib", native_lib] if native_lib and runtime == "native" else []
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = []
        while True:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise ConfigError(f"edge-spec serve --runtime {runtime} did not start:\n{''.join(seen[-20:])}",
                                  "run that serve command by hand to see why")
            seen.append(line)
            if match := re.search(r" on (http://127\.0\.0\.1:\d+)/v1", line):
                self.url, self.banner = match.group(1), line.strip()
                break
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # drain its log

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _serve_one(client, url: str, ids: list[int], max_new_tokens: int) -> tuple[float, dict]:
    began = time.perf_counter()
    response = client.post(f"{url}/v1/completions", json={"model": MODEL_ID, "prompt": ids, "temperature": 0,
                                                          "max_tokens": max_new_tokens})
    elapsed = time.perf_counter() - began
    if response.status_code != 200:
        raise ConfigError(f"the server answered {response.status_code}: {response.text[:300]}", "see its log")
    return elapsed, response.json()


def measure_runtime(args, runtime: str, prompt_ids: list[list[int]]) -> list[dict]:
    import httpx

    from edge_spec.serve.command import load_engine

    engine_args = type("A", (), {"runtime": runtime, "bundle": args.bundle, "threads": args.threads,
                                 "native_lib": args.native_lib, "no_spin": False})()
    engine = load_engine(engine_args)
    server = ServerProcess(args.bundle, runtime, args.threads, args.native_lib)
    n = args.max_new_tokens
    rows = []
    try:
        with httpx.Client(timeout=3600) as client:
            engine.generate(prompt_ids[0], max_new_tokens=n)  # warm-up, both ways
            _serve_one(client, server.url, prompt_ids[0], n)
            direct_s, served_s, direct_tokens, served_tokens, same, taus = [], [], 0, 0, 0, []
            for ids in prompt_ids:
                began = time.perf_counter()
                want = engine.generate(ids, max_new_tokens=n)
                direct_s.append(time.perf_counter() - began)
                direct_tokens += want.new_tokens
                elapsed, body = _serve_one(client, server.url, ids, n)
                served_s.append(elapsed)
                served_tokens += body["usage"]["completion_tokens"]
                same += body["choices"][0]["text"] == want.text
                taus.append(body["edge_spec"]["tau"])
            direct_tok_s = direct_tokens / sum(direct_s)
            common = {"runtime": runtime, "requests": len(prompt_ids), "max_new_tokens": n}
            rows.append({**common, "mode": "direct", "clients": 1, "tokens": direct_tokens,
                         "tok_s": round(direct_tok_s, 2), "p50_ms": round(1000 * percentile(direct_s, 50), 1),
                         "p99_ms": round(1000 * percentile(direct_s, 99), 1)})
            served_tok_s = served_tokens / sum(served_s)
            rows.append({**common, "mode": "server", "clients": 1, "tokens": served_tokens,
                         "tok_s": round(served_tok_s, 2), "p50_ms": round(1000 * percentile(served_s, 50), 1),
                         "p99_ms": round(1000 * percentile(served_s, 99), 1),
                         "overhead_pct": round(100 * (1 - served_tok_s / direct_tok_s), 2),
                         "same_text": f"{same}/{len(prompt_ids)}", "tau": round(float(np.mean(taus)), 3)})
            for clients in sorted(set(args.clients) - {1}):
                rows.append({**common, **_concurrent(server.url, prompt_ids, n, clients)})
    finally:
        server.close()
        if hasattr(engine, "close"):
            engine.close()
    for row in rows:
        print(_line(row), flush=True)
    return rows


def _concurrent(url: str, prompt_ids: list[list[int]], n: int, clients: int) -> dict:
    """`clients` threads, each sending every prompt once (client c starts at prompt c); the server decodes them one
    at a time behind its queue, so latency grows with the queue and throughput stays the server's."""
    import httpx

    latencies, tokens, errors = [], [0], []
    lock = threading.Lock()

    def loop(c: int) -> None:
        try:
            with httpx.Client(timeout=3600) as client:
                for i in range(len(prompt_ids)):
                    elapsed, body = _serve_one(client, url, prompt_ids[(c + i) % len(prompt_ids)], n)
                    with lock:
                        latencies.append(elapsed)
                        tokens[0] += body["usage"]["completion_tokens"]
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=loop, args=(c,)) for c in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    return {"mode": "server", "clients": clients, "requests": len(latencies), "tokens": tokens[0],
            "tok_s": round(tokens[0] / wall, 2), "p50_ms": round(1000 * percentile(latencies, 50), 1),
            "p99_ms": round(1000 * percentile(latencies, 99), 1)}


def _line(row: dict) -> str:
    extra = f" | overhead {row['overhead_pct']:+.1f}% | same text {row['same_text']} | tau {row['tau']}" \
        if "overhead_pct" in row else ""
    return (f"{row['runtime']:>6} {row['mode']:>6} x{row['clients']:<2} {row['requests']:>3} req {row['tokens']:>5} tok"
            f" | {row['tok_s']:7.1f} tok/s | p50 {row['p50_ms']:8.1f} ms | p99 {row['p99_ms']:8.1f} ms{extra}")


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"`{meta['command']}`", "", f"{meta['machine']}; bundle {meta['bundle']}; {meta['prompts']} prompts x "
             f"{meta['max_new_tokens']} new tokens, greedy", "",
             "| runtime | mode | clients | requests | tokens | tok/s | p50 ms | p99 ms | overhead vs direct | same text | tau |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        over = f"{r['overhead_pct']:+.1f}%" if "overhead_pct" in r else ""
        lines.append(f"| {r['runtime']} | {r['mode']} | {r['clients']} | {r['requests']} | {r['tokens']} | "
                     f"{r['tok_s']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {over} | {r.get('same_text', '')} | "
                     f"{r.get('tau', '')} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['runtime']}\n{r['mode']} x{r['clients']}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.bar(labels, [r["tok_s"] for r in rows], color=["#888" if r["mode"] == "direct" else "#37a" for r in rows])
    ax1.set_ylabel("tokens / s")
    ax1.set_title("throughput: direct vs through the server")
    x = np.arange(len(rows))
    ax2.bar(x - 0.2, [r["p50_ms"] for r in rows], 0.4, label="p50")
    ax2.bar(x + 0.2, [r["p99_ms"] for r in rows], 0.4, label="p99")
    ax2.set_xticks(x, labels)
    ax2.set_ylabel("request latency (ms)")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args) -> int:
    from edge_spec.benchmark.bench import DEFAULT_PROMPTS, machine
    from edge_spec.loading.tokenizer import Tokenizer
    from edge_spec.train.evaluate import read_prompts

    if args.max_new_tokens < 1 or any(c < 1 for c in args.clients):
        raise ConfigError("--max-new-tokens and --clients must be >= 1", "pass --max-new-tokens 64 --clients 1 8")
    if not (Path(args.bundle) / "manifest.json").is_file():
        raise ConfigError(f"{args.bundle} is not a bundle (no manifest.json)", "export one with edge-spec export")
    prompts = read_prompts(Path(args.prompts) if args.prompts else DEFAULT_PROMPTS)[:args.num_prompts]
    tokenizer = Tokenizer(Path(args.bundle))
    prompt_ids = [tokenizer.encode_prompt(p["prompt"], chat=p["chat"]) for p in prompts]
    rows = []
    for runtime in args.runtime:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rows += pool.apply(measure_runtime, (args, runtime, prompt_ids))
    meta = {"command": "edge-spec " + " ".join(sys.argv[1:]), "machine": machine(), "bundle": args.bundle,
            "prompts": len(prompts), "max_new_tokens": args.max_new_tokens}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, meta))
    if args.plot:
        plot(rows, Path(args.plot))
    return 0
