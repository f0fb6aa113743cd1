"""Host check of the exactness guarantee: does *this* machine's runtime give verify rows bit-identical to decode steps?

Greedy speculative output equals plain greedy output only if every position's logits come out with the same bits
whether the target computed them in a one-token decode step or as a row of a (k + 1)-token verify pass. Our graphs
are built for that (batch-invariant attention, edge_spec.model.attention.attend_slots), but the kernels under them are chosen
per CPU: on an AMD EPYC (AVX2) onnxruntime's 4-bit MatMulNBits takes a one-row kernel whose sums run in another
order than its multi-row kernel, while every multi-row call agrees row for row (docs/architecture.md, "Exactness
on every CPU"). So exactness is a property of (artifact, runtime, CPU), and this module measures it:

  * `probe` runs verify passes and decode steps over the same random tokens, across cache edges (the onnxruntime
    backend's bucket boundaries, sliding rings wrapping inside a pass), in two row modes:
      - "one-row": decode steps are passes of one token, as is;
      - "two-row": a pass of one token carries a second, masked dummy row (`Session.min_rows = 2`), so every pass
        of the target runs the multi-row kernels; the dummy row is never committed and causal masks hide it from
        the real row.
    and compares every row bit for bit.
  * the verdict picks the row mode the session runs with: one-row if that is exact, else two-row if that is
    exact, else none: speculative decoding is turned off (plain decoding, with a one-line notice), never silently
    different.
  * results are cached per (artifact, runtime identity, CPU identity, probe version) under
    `$EDGE_SPEC_CACHE/hostcheck/`, so the probe runs once per bundle and machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edge_spec.contract.backend import Session
from edge_spec.contract.kv import SCORE_EDGE, SLIDING, pass_cap

PROBE_VERSION = 1
# x86 / arm features that select different kernels in onnxruntime (MLAS), XNNPACK and torch
_KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                 "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "asimd", "asimddp", "i8mm", "sve", "sme")


def cpu_identity() -> str:
    """CPU model + the instruction-set features kernels dispatch on, e.g. 'AMD EPYC [x86_64: avx avx2 fma f16c]'."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip().lower(), value.strip())  # the first CPU's entry
    except OSError:  # macOS, Windows: no /proc
        pass
    model = info.get("model name") or info.get("hardware") or platform.processor() or "unknown CPU"
    flags = set((info.get("flags") or info.get("features") or "").split())
    present = " ".join(f for f in _KERNEL_FLAGS if f in flags)
    return f"{model} [{platform.machine()}{': ' + present if present else ''}]"


@dataclass(frozen=True)
class HostCheck:
    """What `probe` found for one (artifact, runtime, CPU)."""

    artifact: str  # what was checked (a bundle's target graph digest, or an eager model's content id)
    runtime: str  # backend identity: library, version, provider, threads
    cpu: str
    windows: tuple[tuple[int, int], ...]  # (start position, T) of every verify pass compared
    one_row_max_diff: float  # max |verify row - one-token step| over all windows (0.0 = bit-identical)
    two_row_max_diff: float  # same with two-row passes
    one_row_step_ms: float  # median cost of a one-token decode step in each mode
    two_row_step_ms: float
    probe_version: int = PROBE_VERSION

    @property
    def min_rows(self) -> int | None:
        """Rows every target pass must carry for exact greedy speculative decoding; None: no mode is exact."""
        if self.one_row_max_diff == 0.0:
            return 1
        if self.two_row_max_diff == 0.0:
            return 2
        return None

    @property
    def exact(self) -> bool:
        return self.min_rows is not None

    def summary(self) -> str:
        """One line for `generate` / `bench`."""
        if self.min_rows == 1:
            return "exactness: host-checked, verify rows == decode steps bit for bit"
        if self.min_rows == 2:
            return ("exactness: host-checked, exact with two-row passes (this CPU's one-row kernels sum in another "
                    f"order; a decode step costs {self.two_row_step_ms:.1f} ms instead of {self.one_row_step_ms:.1f})")
        return ("exactness: NOT batch-invariant on this host (verify rows differ from decode steps by up to "
                f"{min(self.one_row_max_diff, self.two_row_max_diff):.2g}): speculative decoding is off, plain decoding "
                "runs instead (edge-spec check, with the same --bundle or --model / --drafter, for details)")

    def report(self) -> str:
        """The multi-line report of `edge-spec check`."""
        spans = ", ".join(f"{s}..{s + t - 1}" for s, t in self.windows)

        def line(diff: float) -> str:
            return "bit-identical" if diff == 0.0 else f"DIFFER (max |diff| {diff:.3g})"

        verdict = {1: "exact: one-token decode steps as they are",
                   2: "exact with two-row passes (decode steps carry a masked dummy row)",
                   None: "NOT exact: speculative decoding is turned off on this host (plain decoding only)"}[self.min_rows]
        return "\n".join([
            f"cpu:      {self.cpu}",
            f"runtime:  {self.runtime}",
            f"probed:   {len(self.windows)} verify passes (positions {spans}) vs the same tokens one pass at a time",
            f"one-row:  {line(self.one_row_max_diff)}; decode step {self.one_row_step_ms:.2f} ms",
            f"two-row:  {line(self.two_row_max_diff)}; decode step {self.two_row_step_ms:.2f} ms",
            f"verdict:  {verdict}"])

    def to_json(self) -> dict:
        d = asdict(self)
        d["windows"] = [list(w) for w in self.windows]
        d["min_rows"] = self.min_rows
        return d

    @staticmethod
    def from_json(d: dict) -> "HostCheck":
        fields = {k: d[k] for k in HostCheck.__dataclass_fields__}
        fields["windows"] = tuple(tuple(w) for w in fields["windows"])
        return HostCheck(**fields)


def probe_windows(layout, max_t: int, edge: int | None = None) -> tuple[tuple[int, int], ...]:
    """(start, T) verify passes that cross the places where kernels or bindings change shape - the backend's cache
    bucket edges (`edge`, 2 * edge), each sliding ring's first and second wrap - then small passes near the start
    where they do not overlap those (a layout with a pass cap, kv.pass_cap: one across half its edge too; `_run_mode`
    cuts a window to the cap). T runs over 2, 3, 5 and max_t (row counts take different kernel tiles). Every
    window leaves room for a dummy row after it (two-row mode), and windows never overlap (they are probed in one
    pass over the tokens)."""
    max_t = max(2, max_t)
    edges = []
    if edge:
        edges += [edge, 2 * edge]
    for c in layout.caches:
        if c.kind == SLIDING:
            edges += [c.slots, 2 * c.slots]
    kept: list[tuple[int, int]] = []

    def keep(start: int, t: int) -> None:
        fits = start >= 1 and start + t + 1 <= layout.max_context  # + 1: room for two-row mode's dummy row
        if fits and not any(start < s + n and s < start + t for s, n in kept):
            kept.append((start, t))

    for e, t in zip(sorted(set(edges)), [max_t, 3, max_t, 2] * len(edges)):  # passes straddling each edge first
        t = min(t, max_t)
        keep(e - t // 2, t)
    if pass_cap(layout, 0) is not None:  # long heads scored by a fused kernel: were its edge not where kv.py says,
        keep(SCORE_EDGE // 2 - max_t // 2, max_t)  # a pass across another power of two would differ
    for start, t in ((2, 2), (5, 3), (9, min(5, max_t)), (15, max_t)):
        keep(start, t)
    return tuple(sorted(kept))


def _run_mode(session: Session, tokens: list[int], windows, min_rows: int) -> tuple[float, float]:
    """Max |verify row - decode step| over `windows` and the median decode step time, with `min_rows`. A window is
    cut to the longest verify pass decoding takes there (`Session.pass_cap`)."""
    session.reset()
    session.min_rows = min_rows
    worst, times = 0.0, []
    try:
        for n, (start, t) in enumerate(windows):
            if session.length < start:
                session.prefill(tokens[session.length:start])
            t = min(t, session.pass_cap() or t)
            verify = session.forward(tokens[start:start + t]).logits  # one pass, not committed
            steps = []
            for token in tokens[start:start + t]:  # plain decoding: one token per pass, committed
                begin = time.perf_counter()
                steps.append(session.forward([token]).logits[0])
                if n:  # the first window pays first-run costs (allocation, binding)
                    times.append(time.perf_counter() - begin)
                session.commit(1)
            steps = np.stack(steps)
            if not np.array_equal(steps, verify):
                diff = np.abs(steps.astype(np.float64) - verify)
                worst = max(worst, float(np.nanmax(diff)) if np.isfinite(diff).any() else float("inf"), 1e-45)
    finally:
        session.reset()
    return worst, float(np.median(times)) * 1e3 if times else float("nan")


def probe(session: Session, vocab_size: int, *, artifact: str, runtime: str, max_t: int = 9,
          seed: int = 0) -> HostCheck:
    """Run the check on `session` (reset before and after). Cost: two prefills to the last window plus 2 x ~20
    forwards (SmolLM2 int4 on 2 cores: about a second)."""
    layout = session.state.layout
    if layout.max_pass is not None:
        max_t = min(max_t, layout.max_pass)
    windows = probe_windows(layout, max_t, getattr(session.backend, "bucket_size", None))
    rng = np.random.default_rng(seed)
    tokens = [int(i) for i in rng.integers(0, vocab_size, windows[-1][0] + windows[-1][1])]
    if (first := getattr(session.backend, "first_token", None)) is not None:  # a backend whose position 0 holds
        tokens[0] = int(first)  # only some first tokens (a QNN table): probe as a prompt would start
    keep = session.min_rows
    try:
        one = _run_mode(session, tokens, windows, 1)
        two = _run_mode(session, tokens, windows, 2)
    finally:
        session.min_rows = keep
    return HostCheck(artifact, runtime, cpu_identity(), windows, one[0], two[0], one[1], two[1])


def cache_key(artifact: str, runtime: str, cpu: str) -> str:
    return hashlib.sha256(json.dumps([artifact, runtime, cpu, PROBE_VERSION]).encode()).hexdigest()[:32]


def cache_file(artifact: str, runtime: str, cache_dir: Path) -> Path:
    return cache_dir / "hostcheck" / f"{cache_key(artifact, runtime, cpu_identity())}.json"


def checked(session: Session, vocab_size: int, *, artifact: str, runtime: str, cache_dir: Path | None,
            max_t: int = 9, fresh: bool = False) -> tuple[HostCheck, bool]:
    """The host check for (artifact, runtime, this CPU): from the cache unless `fresh`, else probed and stored.
    Returns (check, came_from_cache). Sets `session.min_rows` to the check's row mode (1 when none is exact: the
    caller then runs plain decoding only)."""
    path = cache_file(artifact, runtime, cache_dir) if cache_dir is not None else None
    result, cached = None, False
    if path is not None and path.is_file() and not fresh:
        try:
            result, cached = HostCheck.from_json(json.loads(path.read_text())), True
        except (ValueError, KeyError, TypeError):  # a damaged or older cache entry: probe again
            result = None
    if result is None:
        result = probe(session, vocab_size, artifact=artifact, runtime=runtime, max_t=max_t)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(result.to_json(), indent=1))
            os.replace(tmp, path)  # atomic: concurrent loads never read half a file
    session.min_rows = result.min_rows or 1
    return result, cached
