"""`edge-spec serve`: its arguments (registered into edge_spec.cli) and its run. Starlette and uvicorn are imported
only when the command runs (the `serve` extra)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from edge_spec.errors import ConfigError

SHUTDOWN_GRACE_S = 30.0  # SIGTERM: how long the running decode may go on before it is cancelled
LOCALHOST = ("127.0.0.1", "localhost", "::1")
RUNTIMES = ("python", "native")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a bundle over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)")
    p.add_argument("--bundle", required=True, help="an exported bundle folder (edge-spec export)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--model-id", default=None,
                   help="the model name clients send and /v1/models lists (default: the bundle folder's name)")
    p.add_argument("--queue", type=int, default=64,
                   help="requests that may wait while one decodes; beyond that 429 with Retry-After (default 64)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="per-request time limit in seconds, waiting included (default 300); past it: 504")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every request (default: none)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the runtime (default: its own)")
    p.add_argument("--no-spin", action="store_true",
                   help="let the runtime's idle threads sleep (for machines whose cores other processes share)")
    p.add_argument("--no-spec", action="store_true", help="decode plainly even though the bundle has a drafter")
    p.add_argument("--runtime", choices=RUNTIMES, default="python",
                   help="python (default): the bundle's format runtime in this process; native: the C++ runner "
                        "(make native) through its C API, for executorch and onnx bundles")
    p.add_argument("--native-lib", default=None,
                   help="with --runtime native: the runner's library (default build/native/libedge_spec.so, "
                        "or $EDGE_SPEC_NATIVE_LIB)")


def check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be 0 to 65535, got {args.port}", "pass --port 8080, say")
    if args.queue < 0:
        raise ConfigError(f"--queue must be >= 0, got {args.queue}", "pass --queue 64, say (0: no waiting)")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}", "pass --timeout 300, say")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key is empty", "pass a non-empty key, or leave --api-key out")
    if args.runtime == "native" and args.no_spin:
        raise ConfigError("--no-spin is an option of the Python runtimes, not of --runtime native",
                          "leave --no-spin out (the native runner sets its own thread pool up)")
    if args.runtime != "native" and args.native_lib:
        raise ConfigError("--native-lib is taken only with --runtime native", "add --runtime native, or drop --native-lib")


def load_engine(args: argparse.Namespace):
    """The engine the server drives: the Python runtime's Engine, or the native runner's (edge_spec.serve.native)."""
    if args.runtime == "native":
        from edge_spec.contract.manifest import read_manifest
        from edge_spec.benchmark.native import check_format
        from edge_spec.serve.native import NativeEngine

        check_format(read_manifest(args.bundle, verify_checksums=False).format)
        return NativeEngine(args.bundle, threads=args.threads, library=args.native_lib)
    from edge_spec.api import load_bundle

    return load_bundle(args.bundle, threads=args.threads, spin=not args.no_spin)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the bundle loads, so that a busy port fails at once as a user error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ConfigError(f"--host {host!r} is not an address here: {err.strerror}",
                          "pass --host 127.0.0.1 (this machine) or 0.0.0.0 (every interface)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror}",
                          "pick another --port (0: any free one), or stop what is using it") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(engine, sock: socket.socket, *, model_id: str, queue: int = 64, timeout: float = 300.0,
                api_key: str | None = None, log_level: str = "info", spec: bool = True):
    """(uvicorn server, app state) serving `engine` on the bound `sock` (tests run it in a thread)."""
    import uvicorn

    from edge_spec.serve.app import Server

    state = Server(engine, model_id=model_id, queue_size=queue, timeout_s=timeout, api_key=api_key)

    class _Uvicorn(uvicorn.Server):
        """uvicorn's server; on SIGTERM / SIGINT it first drains the worker: queued requests are answered 503,
        the running decode gets SHUTDOWN_GRACE_S to finish, then it is cancelled (its client gets an error)."""

        loop = None

        async def startup(self, sockets=None):
            import asyncio

            self.loop = asyncio.get_running_loop()
            await super().startup(sockets=sockets)

        def handle_exit(self, sig, frame):
            if not self.should_exit and self.loop is not None:
                self.loop.call_soon_threadsafe(state.worker.drain, SHUTDOWN_GRACE_S)
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None):
            await super().shutdown(sockets=sockets)
            state.worker.close()

    config = uvicorn.Config(state.app(), log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S) + 5)
    return _Uvicorn(config), state


def main(args: argparse.Namespace) -> int:
    check_args(args)
    import importlib.util

    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"edge-spec serve needs starlette and uvicorn ({', '.join(missing)} not installed)",
                          "pip install -e '.[serve]'")
    if args.host not in LOCALHOST:
        print(f"warning: --host {args.host} accepts connections from other machines"
              f"{'' if args.api_key else ' and no --api-key is set: anyone who can reach it can use it'}",
              file=sys.stderr)
    sock = bind(args.host, args.port)
    engine = load_engine(args)
    if args.no_spec:
        engine.drafter = None
    model_id = args.model_id or Path(args.bundle).resolve().name
    server, _ = make_server(engine, sock, model_id=model_id, queue=args.queue, timeout=args.timeout,
                            api_key=args.api_key)
    host, port = sock.getsockname()[:2]
    if engine.drafter is None:
        mode = "plain decoding (no drafter)" if not args.no_spec else "plain decoding (--no-spec)"
    elif engine.exactness is not None and not engine.exactness.exact:
        mode = f"plain decoding: {engine.exactness.summary()}"
    else:
        mode = "speculative decoding"
    print(f"edge-spec serve: {model_id} ({engine.manifest.format} {engine.manifest.precision}, {args.runtime} "
          f"runtime, {mode}) on "
          f"http://{host}:{port}/v1", file=sys.stderr)
    server.run(sockets=[sock])
    return 0
