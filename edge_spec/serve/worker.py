"""One decode at a time per loaded bundle (the Engine is not thread-safe), behind a bounded queue.

Requests are `Job`s run in FIFO order on a single decode thread. A job is cancelled (client gone, time limit, server
shutting down) by setting its reason: the Engine's `stream` callback raises `Cancelled` at the next token, the decode
loop propagates it, and the thread moves on to the next job; a job cancelled while still queued ends as soon as it is
reached, without decoding. `stop` strings are cut as OpenAI does: the text ends right before the first occurrence,
and the decode stops there; text that may be the start of a stop string is held back from the stream until it is not.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from edge_spec.errors import EdgeSpecError
from edge_spec.serve.schema import ApiError, Request

CLIENT_GONE, TIMEOUT, SHUTDOWN = "client disconnected", "time limit", "server shutting down"


class Cancelled(Exception):
    """Raised inside the decode (from the stream callback) to end it early; `reason` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _StopHit(Exception):
    """A stop string was produced: the decode ends there (not an error)."""


@dataclass
class Outcome:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    stats: dict  # the response's `edge_spec` extension field
    notice: str | None


class Job:
    """One request's decode. `on_text` (called on the decode thread) receives the text deltas to stream."""

    def __init__(self, request: Request, on_text: Callable[[str], None] | None, timeout_s: float):
        self.request = request
        self.on_text = on_text
        self.deadline = time.monotonic() + timeout_s
        self.cancel_reason: str | None = None
        self.started = threading.Event()
        self.started_at: float | None = None

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason

    def _check(self) -> None:
        if self.cancel_reason is None and time.monotonic() > self.deadline:
            self.cancel_reason = TIMEOUT
        if self.cancel_reason is not None:
            raise Cancelled(self.cancel_reason)

    def run(self, engine) -> Outcome:
        """On the decode thread: the whole decode, or Cancelled."""
        self.started_at = time.perf_counter()
        self.started.set()
        self._check()
        req = self.request
        stops = req.stop
        longest = max((len(s) for s in stops), default=0)
        text, sent = [""], [0]  # all text so far; how much of it went to on_text

        def emit(upto: int) -> None:
            if upto > sent[0]:
                if self.on_text is not None:
                    self.on_text(text[0][sent[0]:upto])
                sent[0] = upto

        cut: list[int | None] = [None]

        def stream(delta: str) -> None:
            self._check()
            start = max(0, len(text[0]) - longest + 1)
            text[0] += delta
            if stops:
                hits = [i for i in (text[0].find(s, start) for s in stops) if i >= 0]
                if hits:
                    cut[0] = min(hits)
                    emit(cut[0])
                    raise _StopHit()
                emit(len(text[0]) - _held(text[0], stops))
            else:
                emit(len(text[0]))

        # seeded sampling drafts a fixed k per pass: the adaptive k follows measured timings, and a different k
        # changes which random draws the rejection sampler makes (the same distribution, another sample)
        adaptive = req.seed is None or req.temperature == 0.0
        began = time.perf_counter()
        try:
            result = engine.generate(req.prompt_ids, max_new_tokens=req.max_tokens, temperature=req.temperature,
                                     top_p=req.top_p, top_k=req.top_k, seed=req.seed, stream=stream,
                                     adaptive=adaptive)
        except _StopHit:
            elapsed = time.perf_counter() - began
            final = text[0][:cut[0]]
            # the decode ended inside the stream callback: its tokens are counted by encoding the text produced
            # up to the end of the stop string (the ids themselves stay inside the decode loop)
            matched = min((s for s in stops if text[0].startswith(s, cut[0])), key=len)
            produced = len(engine.tokenizer.encode(text[0][:cut[0] + len(matched)], add_bos=False))
            stats = {"speculative": _speculative(engine), "tau": None,  # the loop's statistics end with it
                     "tokens_per_s": round(produced / elapsed, 2) if elapsed > 0 else None}
            return Outcome(final, len(req.prompt_ids), produced, "stop", stats, None)
        emit(len(text[0]))  # the held-back tail (it never completed a stop string)
        notice = result.extra.get("notice")
        spec = result.extra.get("spec")
        stats = {"speculative": spec is not None, "tau": round(spec.tau, 4) if spec is not None else 1.0,
                 "tokens_per_s": round(result.decode_tok_s, 2), "prefill_ms": round(result.prefill_s * 1000, 2),
                 "target_passes": spec.target_calls if spec is not None else max(result.new_tokens - 1, 0)}
        if notice:
            stats["notice"] = notice
        finish = "stop" if result.stop_reason == "eos" else "length"
        return Outcome(result.text, result.prompt_tokens, result.new_tokens, finish, stats, notice)


def _speculative(engine) -> bool:
    """Whether a decode of `engine` runs speculatively (it has a drafter and the host check did not refuse it)."""
    return (engine.drafter is not None and (engine.exactness is None or engine.exactness.exact))


def _held(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` may still begin a stop string (held back from the stream)."""
    for n in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0


class QueueFull(ApiError):
    def __init__(self, queued: int, retry_after: int):
        super().__init__(429, f"the server is busy: {queued} requests are already waiting (its --queue limit); "
                              f"retry in about {retry_after} s", type="rate_limit_error", code="queue_full",
                         headers={"Retry-After": str(retry_after)})


class Worker:
    """The decode thread and its bounded queue. Call `submit` from the event loop."""

    def __init__(self, engine, *, queue_size: int, metrics=None):
        self.engine = engine
        self.queue_size = queue_size
        self.metrics = metrics
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="edge-spec-decode")
        self.jobs: list[Job] = []  # admitted, not finished (the first may be decoding)
        self.draining = False
        self._mean_s = 1.0  # running mean of a decode's seconds (Retry-After's estimate)

    @property
    def busy(self) -> bool:
        return any(job.started.is_set() for job in self.jobs)

    @property
    def queued(self) -> int:
        """Admitted requests not decoding yet."""
        return sum(1 for job in self.jobs if not job.started.is_set())

    def submit(self, job: Job) -> asyncio.Future:
        if self.draining:
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if len(self.jobs) > self.queue_size:  # one decoding + queue_size waiting
            raise QueueFull(self.queued, max(1, math.ceil(self._mean_s * len(self.jobs))))  # ~ when one frees
        self.jobs.append(job)
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, job)

        def done(fut):
            self.jobs.remove(job)
            err = None if fut.cancelled() else fut.exception()  # retrieved here: a client may have left
            if isinstance(err, Cancelled) and self.metrics is not None:
                self.metrics.cancel(err.reason)
            if job.started_at is not None:
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - job.started_at)
            if self.metrics is not None:
                self.metrics.set_queue(self.queued, self.busy)

        future.add_done_callback(done)
        if self.metrics is not None:
            self.metrics.set_queue(self.queued, self.busy)
        return future

    def _run(self, job: Job) -> Outcome:
        if self.metrics is not None:
            self.metrics.set_queue(self.queued, True)
        try:
            return job.run(self.engine)
        except Cancelled:
            raise
        except EdgeSpecError as err:  # a request the engine refuses (after the schema's own checks)
            raise ApiError(400, err.what + (f" ({err.fix})" if err.fix else ""), code="invalid_request") from None

    def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new requests, cancel queued ones, give the running decode `grace_s` to finish."""
        self.draining = True
        for job in self.jobs:
            if not job.started.is_set():
                job.cancel(SHUTDOWN)
        running = [job for job in self.jobs if job.started.is_set()]
        if running:
            asyncio.get_running_loop().call_later(grace_s, lambda: [job.cancel(SHUTDOWN) for job in running])

    def close(self) -> None:
        for job in self.jobs:
            job.cancel(SHUTDOWN)
        self._executor.shutdown(wait=True)
