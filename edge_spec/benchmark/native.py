"""`edge-spec bench --runtime native`: the C++ runner (runtimes/native, `make native`) measured as bench measures the
Python runtimes, with the same rows, tables, JSON, plot and summary line (edge_spec.benchmark.bench).

The runner is started once (`edge-spec-run --bundle B --requests -`: it opens and host-checks the bundle once, prints
the verdict, then decodes one request per stdin line and answers each with a --json line: tokens, its own prefill and
decode clocks, the speculative statistics and the kernel clocks after the first token). The prompts are encoded once
by the Python tokenizer and sent as --prompt-ids, so both runtimes see the same ids. As bench does: a warm-up (plain
and speculative) on the first prompt, then every prompt plain first and then once per configuration, interleaved;
greedy exactness per prompt compares each configuration's tokens with the runner's own plain tokens. Time split:
drafter and target kernel seconds inside decode, the rest is the C++ loop ("python" in the table's header).

Where the runner's host check finds this host inexact it decodes plain for the speculative configurations (its
notice lands in the rows); the Python runtimes' bench measures them anyway (allow_inexact).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from edge_spec.benchmark.bench import Tally, config_row, report
from edge_spec.contract.formats import native_formats
from edge_spec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN = ROOT / "build" / "native" / "edge-spec-run"
ENV_BIN = "EDGE_SPEC_NATIVE"
BUILD_FIX = "make native (or pass --native-bin PATH / set EDGE_SPEC_NATIVE to a built edge-spec-run)"


def runner_path(explicit: str | None = None) -> Path:
    """--native-bin, else $EDGE_SPEC_NATIVE, else build/native/edge-spec-run; refused when it is not there."""
    path = Path(explicit or os.environ.get(ENV_BIN) or DEFAULT_BIN).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"the native runner is not built: no executable {path}", BUILD_FIX)
    return path


def check_format(bundle_format: str, runner: Path | None = None) -> None:
    """Refuse a bundle the runner cannot run: a format it has no backend for, or (given the runner) onnx on an
    build without that backend (its formats.txt, written by CMake beside it, says which)."""
    names = native_formats()
    if bundle_format not in names:
        listed = " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"
        raise ConfigError(f"the native runner runs {listed} bundles, not {bundle_format!r} ones",
                          f"export the bundle with --format {' or --format '.join(names)}, or bench it with its own "
                          "runtime (drop --runtime native)")
    if runner is None:
        return
    built = runner.parent / "formats.txt"
    if built.is_file() and bundle_format not in built.read_text().split():
        raise ConfigError(f"{runner} was built without the {bundle_format} backend ({built}: "
                          f"{built.read_text().strip()})",
                          "apt-get install npm (CMake fetches onnxruntime's headers with it), then make native")


class NativeRunner:
    """One `edge-spec-run --requests -` process: `header` is its first line (runtime, min_rows, host_check and its
    summary), `generate` one request."""

    def __init__(self, runner: Path, bundle: Path, threads: int | None, provider: str | None = None):
        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (the runner's stderr, open as long as it runs)
        command = [str(runner), "--bundle", str(bundle), "--requests", "-"]
        if threads:
            command += ["--threads", str(threads)]
        if provider:  # the format row's run option (the runner refuses what its backend lacks, naming the fix)
            command += ["--provider", provider]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, bufsize=1)
        self.header = self._read("open")

    def _read(self, what: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._err.seek(0)
            err = self._err.read().strip()
            raise ConfigError(f"the native runner stopped during {what} (exit {self.proc.returncode}): "
                              f"{err.splitlines()[-1] if err else 'no message'}",
                              "run build/native/edge-spec-run --bundle B --check to see why; rebuild with make native")
        out = json.loads(line)
        if "error" in out:
            raise ConfigError(f"the native runner refused a request: {out['error']}")
        return out

    def generate(self, ids: list[int], *, max_new_tokens: int, k: int | None, adaptive: bool, temperature: float,
                 seed: int, lookup: bool = True, datastore: bool = True) -> dict:
        flags = ["--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(max_new_tokens),
                 "--temperature", repr(float(temperature)), "--seed", str(seed)]
        if k is None:
            flags.append("--no-spec")
        else:
            flags += ["--spec-k", str(k), "--adaptive" if adaptive else "--fixed-k"]
        if not lookup:
            flags.append("--no-lookup")
        if not datastore:
            flags.append("--no-datastore")
        self.proc.stdin.write(" ".join(flags) + "\n")
        self.proc.stdin.flush()
        return self._read("a generation")

    def peak_rss_mb(self) -> float | None:
        """The runner's peak resident memory (Linux /proc; None elsewhere)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        kb = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
        return int(kb[0]) / 1024 if kb else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def add(tally: Tally, out: dict) -> None:
    """One --json answer into a configuration's sums (as bench.run_one adds a Python GenerationResult)."""
    import numpy as np

    tally.tokens += max(len(out["tokens"]) - 1, 0)
    tally.decode_s += out["total_s"] - out["prefill_s"]
    tally.first_token_s.append(out["prefill_s"])
    tally.target_kernel_s += out["target_kernel_s"]
    tally.drafter_kernel_s += out["drafter_kernel_s"]
    tally.outputs.append(out["tokens"])
    if out["speculative"]:
        tally.emitted += out["emitted"]
        tally.passes += out["target_passes"]
        tally.drafter_calls += out["drafter_calls"]
        tally.lookup_passes += out["lookup_passes"]
        tally.datastore_passes += out.get("datastore_passes", 0)
        drafted, accepted = np.array(out["drafted"], dtype=np.int64), np.array(out["accepted"], dtype=np.int64)
        if tally.drafted is None:
            tally.drafted, tally.accepted = np.zeros_like(drafted), np.zeros_like(accepted)
        tally.drafted += drafted
        tally.accepted += accepted
        if out["k_chosen_mean"] is not None:
            tally.mean_k.append(float(out["k_chosen_mean"]))


def measure(runner: NativeRunner, about: dict, prompt_ids: list[list[int]], *, ks: list[int],
            temperatures: list[float], adaptive: bool, max_new_tokens: int, seed: int = 0, repeats: int = 1,
            lookup: bool = True, progress: bool = True, peers: list | None = None,
            datastore: bool = True) -> list[dict]:
    """bench.measure's loop over the runner: rows in the same order and schema. `peers` decode each prompt right
    after the runner's plain run of it (greedy, first temperature only), as in bench.measure; the runner's
    threads are idle then (it answers one request at a time)."""
    import time

    from tqdm.auto import tqdm

    from edge_spec.peers.times import SETTLE_S

    peers = peers or []
    for peer in peers:
        peer.warm_up(prompt_ids[0])

    configs = [(k, False) for k in ks] + ([(max(ks), True)] if adaptive else [])
    runner.generate(prompt_ids[0], max_new_tokens=8, k=None, adaptive=False, temperature=0.0, seed=0)  # warm-up
    runner.generate(prompt_ids[0], max_new_tokens=8, k=max(ks), adaptive=False, temperature=0.0, seed=0)
    done: list[tuple] = []
    notices: set[str] = set()
    for temperature in temperatures:
        plain, spec = Tally(), {c: Tally() for c in configs}
        with_peers = peers if temperature == temperatures[0] else []
        bar = tqdm(total=len(prompt_ids) * repeats * (1 + len(configs) + len(with_peers)),
                   desc=f"bench native T={temperature}", unit="run", disable=not progress, file=sys.stderr)
        for rep in range(repeats):
            for i, ids in enumerate(prompt_ids):
                s = seed + 1000 * rep + i
                add(plain, runner.generate(ids, max_new_tokens=max_new_tokens, k=None, adaptive=False,
                                           temperature=temperature, seed=s))
                bar.update(1)
                for peer in with_peers:
                    time.sleep(SETTLE_S)
                    peer.run(ids, max_new_tokens)
                    time.sleep(SETTLE_S)
                    bar.update(1)
                for (k, ad), tally in spec.items():
                    out = runner.generate(ids, max_new_tokens=max_new_tokens, k=k, adaptive=ad,
                                          temperature=temperature, seed=s, lookup=lookup, datastore=datastore)
                    add(tally, out)
                    if out["notice"]:
                        notices.add(out["notice"])
                    bar.update(1)
        bar.close()
        done += [(plain, tally, k, ad, temperature) for (k, ad), tally in spec.items()]
    rss = runner.peak_rss_mb()
    rows = [config_row(about, plain, tally, k=k, adaptive=ad, temperature=t, rss_mb=rss)
            for plain, tally, k, ad, t in done]
    for r in rows:
        r["notice"] = "; ".join(sorted(notices)) or None
    return rows


def main(args, prompts: list[dict]) -> int:
    """`edge-spec bench --runtime native` (edge_spec.benchmark.command: the shared option checks done, `prompts` read)."""
    from edge_spec.cli_options import given_options
    from edge_spec.contract.formats import RUN
    from edge_spec.contract.manifest import MANIFEST, read_manifest
    from edge_spec.loading.tokenizer import Tokenizer

    if args.bundle is None:
        raise ConfigError("--runtime native runs an exported bundle, not --model (the eager checkpoint)",
                          f"export one (edge-spec export --format {'|'.join(native_formats())} --out B) and pass --bundle B")
    refused = [flag for flag, given in (("--drafter", args.drafter is not None),
                                        ("--no-spin", args.no_spin), ("--max-context", args.max_context is not None),
                                        *((f"--{d.replace('_', '-')}", True) for d in given_options(args, RUN)
                                          if d != "provider"))  # the runner's own --provider
               if given]
    if refused:
        raise ConfigError(f"--runtime native does not take {', '.join(refused)}",
                          f"drop {', '.join(refused)} (the runner has no such option; the Python runtimes' options "
                          "run without --runtime native)")
    bundle = Path(args.bundle).expanduser()
    try:  # the format first: another format's manifest need not pass this checkout's checks
        check_format(str(json.loads((bundle / MANIFEST).read_text()).get("format")))
    except (OSError, ValueError, AttributeError):
        pass  # no or malformed manifest: read_manifest below says what is wrong
    runner_bin = runner_path(args.native_bin)
    manifest = read_manifest(bundle, verify_checksums=False)  # the runner verifies the checksums when it opens
    check_format(manifest.format, runner_bin)
    if manifest.drafter is None:
        raise ConfigError("benchmarking speculative decoding needs a drafter",
                          "export the bundle with --drafter builtin (or PATH)")
    tokenizer = Tokenizer(bundle)
    prompt_ids = [tokenizer.encode_prompt(p["prompt"], chat=p["chat"]) for p in prompts]
    from edge_spec.peers import from_args as peers_from_args

    peers = peers_from_args(args, SimpleNamespace(manifest=manifest, loaded=None))  # built before the run starts
    runner = NativeRunner(runner_bin, bundle, args.threads, given_options(args, RUN).get("provider"))
    try:
        head = runner.header
        about = {"runtime": head["runtime"], "precision": manifest.precision, "min_rows": head["min_rows"],
                 "host_check": head["host_check"]}
        rows = measure(runner, about, prompt_ids, ks=args.spec_k, temperatures=args.temperature,
                       adaptive=args.adaptive, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                       lookup=args.lookup, peers=peers, datastore=getattr(args, "datastore", True))
    finally:
        runner.close()
    if rows and rows[0]["peak_rss_mb"] is None:
        rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # macOS: bytes
        for r in rows:
            r["peak_rss_mb"] = rss_kb / 2 ** 20 if sys.platform == "darwin" else rss_kb / 1024
    verdict = head["host_check"]
    return report(args, rows, [p.result() for p in peers], len(prompts), head["host_check_summary"],
                  host_exact=None if verdict is None else verdict["min_rows"] != 0)
