"""A peer in a process of its own (multiprocessing's spawn), so that its peak resident memory is its own.

`edge-spec bench` used to build and run every peer inside its own process: the one peak-RSS figure then covered our
runtime and every peer together. `IsolatedPeer(factory, *args, **kwargs)` builds `factory(*args, **kwargs)` (a peer
class: LlamaCppPeer, OrtGenaiPeer, ...) in a child process and forwards `warm_up`, `run` and `result` to it over a
pipe, one call at a time (bench calls them between its own runs, so the timing and interleaving are unchanged: the
peer times itself inside the child). `result()` gains `peak_rss_mb`, the child's peak resident memory. An edge-spec
error in the child is raised again here; any other (a peer library's own) and a child that dies are errors naming
the peer.
"""

from __future__ import annotations

import multiprocessing
import resource
import sys

from edge_spec.errors import ConfigError, EdgeSpecError


def peak_rss_mb() -> float:
    """This process's own peak resident memory. Linux: VmHWM, the peak of the memory it runs in now; not ru_maxrss,
    which a spawned child inherits from the copy of its parent it was forked as before exec (a peer spawned by a
    bench holding 850 MB read 850 MB: tests/test_bench.py)."""
    try:
        with open("/proc/self/status") as status:
            kb = next((line.split()[1] for line in status if line.startswith("VmHWM:")), None)
        if kb is not None:
            return int(kb) / 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024


def _serve(conn, factory, args, kwargs) -> None:
    """The child: build the peer, then answer (method, args) messages until None."""
    try:
        peer = factory(*args, **kwargs)
        conn.send((True, None))
    except BaseException as err:  # noqa: BLE001 (sent to the parent, raised there)
        conn.send((False, err))
        return
    while (message := conn.recv()) is not None:
        name, call_args = message
        try:
            value = getattr(peer, name)(*call_args)
            if name == "result":
                value = {**value, "peak_rss_mb": round(peak_rss_mb(), 1)}
            conn.send((True, value))
        except BaseException as err:  # noqa: BLE001
            conn.send((False, err))


class IsolatedPeer:
    def __init__(self, factory, *args, **kwargs):
        self.name = getattr(factory, "__name__", str(factory))
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_serve, args=(child, factory, args, kwargs), daemon=True)
        self._proc.start()
        child.close()
        self._receive()

    def _receive(self):
        try:
            ok, value = self._conn.recv()
        except EOFError:
            raise ConfigError(f"the {self.name} peer's process ended (exit code {self._proc.exitcode})",
                              "run the peer alone to see why (edge-spec bench --peer ...)") from None
        if not ok:
            if isinstance(value, EdgeSpecError):
                raise value
            # a peer library's own failure (llama.cpp's "llama_decode returned -1", ...): an error naming the peer,
            # not a traceback through the pipe
            raise ConfigError(f"the {self.name} peer failed: {type(value).__name__}: {value}",
                              "run that peer alone (edge-spec bench --peer NAME) and check its model "
                              "(--peer-gguf, --genai-precision)") from value
        return value

    def _call(self, name: str, *args):
        self._conn.send((name, args))
        return self._receive()

    def warm_up(self, ids: list[int]) -> None:
        self._call("warm_up", ids)

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        self._call("run", ids, max_new_tokens)

    def result(self) -> dict:
        return self._call("result")

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass
