"""The native runner's C API (runtimes/native/include/edge_spec.h) from Python, through ctypes.

What `edge-spec serve --runtime native` drives: the C++ runner (`make native` builds build/native/libedge_spec.so)
opened on a bundle, one es_generate_ids per request, each emitted token delivered to a Python callback. The structs
below mirror edge_spec.h field for field (ES_API_VERSION 2); `Library` refuses a library of another API version.
ctypes releases the GIL during every foreign call, so an asyncio server keeps serving while the runner decodes.

An exception raised by `on_token` (a cancelled request, a stop string) cannot cross C: the callback stores it, asks
the runner to stop (a nonzero return), and `Runner.generate` raises it again once es_generate_ids has returned.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edge_spec.errors import BundleError, ConfigError, ContextOverflowError, EdgeSpecError

API_VERSION = 2  # edge_spec.h's ES_API_VERSION this binding mirrors
ROOT = Path(__file__).resolve().parents[1]  # the checkout (runtimes/ maps to edge_spec.runtimes)
DEFAULT_LIB = ROOT / "build" / "native" / "libedge_spec.so"
ENV_LIB = "EDGE_SPEC_NATIVE_LIB"
BUILD_FIX = "make native (or pass --native-lib PATH / set EDGE_SPEC_NATIVE_LIB to a built libedge_spec.so)"

OK, ARGUMENT, BUNDLE, BACKEND, CONTEXT, ENCODING, CANCELLED, INTERNAL, VERSION = range(9)  # es_status
# ExecuTorch's Python LLM ops register the same llama::update_cache_* kernels the library carries (for .pte bundles):
# ExecuTorch aborts the process on the second registration, whichever of the two comes first
ET_CUSTOM_OPS = "executorch.extension.llm.custom_ops.custom_ops"
ONE_PER_PROCESS_FIX = ("run the native runner and the Python executorch runtime in separate processes (edge-spec serve "
                       "--runtime native and edge-spec bench-serve do)")
loaded: list[Path] = []  # the library, once loaded into this process (runtimes/executorch.py checks it)


class _OpenOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("threads", ctypes.c_int32), ("verify_checksums", ctypes.c_int32),
                ("host_check", ctypes.c_int32), ("compute_units", ctypes.c_char_p)]


class _GenerateOptions(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int32), ("chat", ctypes.c_int32), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("spec", ctypes.c_int32), ("spec_k", ctypes.c_int32), ("adaptive", ctypes.c_int32),
                ("lookup", ctypes.c_int32)]


class _Stats(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int32), ("new_tokens", ctypes.c_int32), ("target_passes", ctypes.c_int32),
                ("tau", ctypes.c_double), ("prefill_s", ctypes.c_double), ("decode_s", ctypes.c_double),
                ("tok_per_s", ctypes.c_double), ("spec_used", ctypes.c_int32), ("host_check", ctypes.c_char * 32),
                ("notice", ctypes.c_char * 256)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p)


def library_path(explicit: str | None = None) -> Path:
    """--native-lib, else $EDGE_SPEC_NATIVE_LIB, else build/native/libedge_spec.so; refused when it is not there."""
    path = Path(explicit or os.environ.get(ENV_LIB) or DEFAULT_LIB).expanduser()
    if not path.is_file():
        raise ConfigError(f"the native runner's library is not built: no {path}", BUILD_FIX)
    return path


class Library:
    """libedge_spec.so loaded, its functions typed."""

    def __init__(self, path: Path):
        if ET_CUSTOM_OPS in sys.modules:
            raise ConfigError(f"cannot load {path} into this process: it already runs ExecuTorch's Python LLM ops, "
                              "and both register llama::update_cache_* (ExecuTorch would abort the process)",
                              ONE_PER_PROCESS_FIX)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise ConfigError(f"cannot load {path}: {err}", BUILD_FIX) from None
        lib.es_api_version.restype = ctypes.c_int32
        version = lib.es_api_version()
        if version != API_VERSION:
            raise ConfigError(f"{path} has C API version {version}; this edge-spec speaks version {API_VERSION}",
                              "rebuild it from this checkout: make native")
        lib.es_open_options_defaults.argtypes = [ctypes.POINTER(_OpenOptions), ctypes.c_size_t]
        lib.es_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(_OpenOptions), ctypes.POINTER(ctypes.c_void_p)]
        lib.es_open_error.restype = ctypes.c_char_p
        lib.es_default_generate_options.argtypes = [ctypes.POINTER(_GenerateOptions)]
        lib.es_generate_ids.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                        ctypes.POINTER(_GenerateOptions), _CALLBACK, ctypes.c_void_p,
                                        ctypes.POINTER(_Stats)]
        lib.es_cancel.argtypes = [ctypes.c_void_p]
        lib.es_last_error.argtypes = [ctypes.c_void_p]
        lib.es_last_error.restype = ctypes.c_char_p
        lib.es_bundle_info_json.argtypes = [ctypes.c_void_p]
        lib.es_bundle_info_json.restype = ctypes.c_char_p
        lib.es_close.argtypes = [ctypes.c_void_p]
        self.lib, self.path = lib, path
        loaded.append(path)


def _error(status: int, message: str) -> EdgeSpecError | RuntimeError:
    """The Python error for an es_status (the runner's message carries its own fix)."""
    if status == CONTEXT:
        return ContextOverflowError(message)
    if status in (ARGUMENT, ENCODING):
        return ConfigError(message)
    if status == BUNDLE:
        return BundleError(message)
    if status == VERSION:
        return ConfigError(message, "rebuild the library from this checkout: make native")
    return RuntimeError(f"the native runner failed (status {status}): {message}")


@dataclass
class Stats:
    """es_stats: the run's counts and clocks."""

    prompt_tokens: int
    new_tokens: int
    target_passes: int
    tau: float
    prefill_s: float
    decode_s: float
    tok_per_s: float
    spec_used: bool
    host_check: str
    notice: str


class Runner:
    """One es_runner handle on a bundle. Used by one thread at a time; `cancel` from any thread."""

    def __init__(self, library: Library, bundle: Path, *, threads: int | None = None, verify_checksums: bool = True,
                 host_check: bool = True):
        self._lib = library.lib
        options = _OpenOptions()
        status = self._lib.es_open_options_defaults(ctypes.byref(options), ctypes.sizeof(options))
        if status != OK:
            raise ConfigError(f"{library.path} refused es_open_options (status {status})", "rebuild it: make native")
        options.threads = threads or 0
        options.verify_checksums = int(verify_checksums)
        options.host_check = int(host_check)
        handle = ctypes.c_void_p()
        status = self._lib.es_open(str(bundle).encode(), ctypes.byref(options), ctypes.byref(handle))
        if status != OK:
            raise _error(status, (self._lib.es_open_error() or b"").decode(errors="replace"))
        self._handle = handle
        self.info: dict = json.loads(self._lib.es_bundle_info_json(handle).decode())

    def generate(self, ids: list[int], *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, spec: bool = True, spec_k: int = 4, adaptive: bool = True,
                 lookup: bool = True, on_token: Callable[[int, str], None] | None = None) -> Stats:
        """es_generate_ids. `on_token(id, text)` per emitted token (id -1: the stream's held-back tail); an exception
        it raises stops the run and is raised here."""
        if self._handle is None:
            raise ConfigError("this native runner is closed", "open the bundle again")
        options = _GenerateOptions()
        self._lib.es_default_generate_options(ctypes.byref(options))
        options.max_new_tokens, options.temperature, options.top_k, options.top_p = (
            max_new_tokens, temperature, top_k, top_p)
        options.seed, options.spec, options.spec_k = seed, int(spec), spec_k
        options.adaptive, options.lookup = int(adaptive), int(lookup)
        raised: list[BaseException] = []

        def callback(_user, token, text):
            try:
                if on_token is not None:
                    on_token(int(token), (text or b"").decode("utf-8", errors="replace"))
                return 0
            except BaseException as err:  # noqa: BLE001 (raised again below, after C has returned)
                raised.append(err)
                return 1

        prompt = (ctypes.c_int32 * len(ids))(*ids)  # [n_prompt] int32
        stats = _Stats()
        status = self._lib.es_generate_ids(self._handle, prompt, len(ids), ctypes.byref(options), _CALLBACK(callback),
                                           None, ctypes.byref(stats))
        if raised:
            raise raised[0]
        if status != OK:
            raise _error(status, (self._lib.es_last_error(self._handle) or b"").decode(errors="replace"))
        return Stats(stats.prompt_tokens, stats.new_tokens, stats.target_passes, stats.tau, stats.prefill_s,
                     stats.decode_s, stats.tok_per_s, bool(stats.spec_used), stats.host_check.decode(),
                     stats.notice.decode(errors="replace"))

    def cancel(self) -> None:
        if self._handle is not None:
            self._lib.es_cancel(self._handle)

    def close(self) -> None:
        if self._handle is not None:
            self._lib.es_close(self._handle)
            self._handle = None

    def __del__(self):
        self.close()
