"""Core ML runtime: the Backend and DrafterBackend over one multifunction .mlpackage (exporters/coreml.py), `io`
binding: this runtime holds the caches ([1, H_kv, S_kind, D] float32 per cached layer, S_kind the functions' fixed
slots), passes them to every call and writes the committed rows itself.

A pass of t tokens runs the function of the smallest exported length T >= t: rows t..T-1 are pad rows (the last
token again at the next positions, each seeing only itself; never committed or returned). Cache columns past the
runtime's layout (the full layers' headroom for pad rows) are masked.

Predictors (what executes a function):
  * macOS 15+ / iOS 18+: coremltools.models.MLModel(package, function_name=..., compute_units=...), one per function;
  * anywhere, for verification only: the MIL reference executor (runtimes/coreml_mil.py), selected with
    EDGE_SPEC_COREML_EXECUTOR=mil (slow; the tests run packages through it on Linux).
On Linux without the executor, opening a bundle fails with what is needed.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edge_spec import kv
from edge_spec.backend import DraftStep, StepOutput
from edge_spec.errors import BundleError, ConfigError
from edge_spec.kv import KVLayout
from edge_spec.logs import import_coremltools

EXECUTOR_ENV = "EDGE_SPEC_COREML_EXECUTOR"  # "mil": run the package through the MIL reference executor
COMPUTE_UNITS = {"all": "ALL", "cpu_and_ne": "CPU_AND_NE", "cpu_and_gpu": "CPU_AND_GPU", "cpu": "CPU_ONLY"}
DEFAULT_COMPUTE_UNITS = "all"
_FIX = "re-export the bundle: edge-spec export --format coreml --out DIR"

Predictor = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _mac_predictors(package: Path, names: list[str], compute_units: str) -> dict[str, Predictor]:
    if platform.system() != "Darwin":
        raise ConfigError(
            "Core ML prediction needs macOS 15+ (or iOS 18+): this machine runs " + platform.system(),
            f"run the bundle on a Mac, or export --format onnx / executorch here; to check the package on this machine "
            f"set {EXECUTOR_ENV}=mil (the MIL reference executor: slow, for verification)")
    ct = import_coremltools()
    units = ct.ComputeUnit[COMPUTE_UNITS[compute_units]]
    out = {}
    for name in names:
        try:
            model = ct.models.MLModel(str(package), compute_units=units, function_name=name)
        except Exception as err:
            raise BundleError(f"{package}: Core ML cannot load function {name!r} ({str(err).strip()[:200]})", _FIX) from err
        out[name] = model.predict
    return out


def _executor_predictors(package: Path, names: list[str]) -> dict[str, Predictor]:
    from edge_spec.runtimes.coreml_mil import load_functions

    functions = load_functions(package)
    missing = [n for n in names if n not in functions]
    if missing:
        raise BundleError(f"{package} has no function {missing[0]!r} (it has {', '.join(sorted(functions))})", _FIX)
    return {n: functions[n] for n in names}


def open_bundle(folder: Path, manifest, layout: KVLayout, *, threads: int | None = None, provider: str = "cpu",
                spin: bool = True, compute_units: str | None = None) -> tuple["CoreMLBackend", "CoreMLDrafter | None"]:
    """The runtime half of the coreml format (edge_spec.formats). `threads`, `provider`, `spin`: not Core ML's."""
    if provider != "cpu":
        raise ConfigError(f"the coreml runtime picks its devices with --compute-units, not provider {provider!r}",
                          "drop --provider; use --compute-units all|cpu_and_ne|cpu_and_gpu|cpu")
    units = compute_units or DEFAULT_COMPUTE_UNITS
    if units not in COMPUTE_UNITS:
        raise ConfigError(f"unknown compute units {units!r}", f"choose one of {', '.join(COMPUTE_UNITS)}")
    entry = manifest.graphs["target"]
    if not entry.fixed or "lengths" not in entry.fixed:
        raise BundleError(f"{folder}: the coreml target entry lists no fixed pass lengths", _FIX)
    lengths = {int(t): name for t, name in entry.fixed["lengths"].items()}
    slots = {kind: int(s) for kind, s in entry.fixed["slots"].items()}
    for c in layout.caches:
        if c.window and c.slots != slots[c.kind]:
            raise ConfigError(f"this Core ML package's rings hold {slots[c.kind]} slots; a layout of {c.slots} cannot "
                              "run on its fixed shapes", "load it with its exported --max-context")
    names = list(lengths.values()) + ([manifest.graphs["drafter"].method] if manifest.drafter else [])
    package = folder / entry.file
    executor = os.environ.get(EXECUTOR_ENV, "")
    if executor not in ("", "mil"):
        raise ConfigError(f"{EXECUTOR_ENV}={executor!r} is not a Core ML executor", f"unset it, or set {EXECUTOR_ENV}=mil")
    if executor == "mil":
        predictors, identity = _executor_predictors(package, names), "coreml MIL reference executor (numpy)"
    else:
        predictors = _mac_predictors(package, names, units)
        ct = import_coremltools()
        identity = f"coreml {ct.__version__}, {platform.mac_ver()[0]}, compute units {units}"
    functions = {t: predictors[name] for t, name in lengths.items()}
    backend = CoreMLBackend(functions, layout, slots, identity)
    if manifest.drafter is None:
        return backend, None
    sources = {kind: int(layer) for kind, layer in manifest.drafter.kv_sharing.items()}
    return backend, CoreMLDrafter(predictors[manifest.graphs["drafter"].method], backend, sources)


def pad_mask(mask: np.ndarray, t: int, n: int, s: int, s_f: int) -> np.ndarray:
    """The contract's mask [1, 1, t, s + t] as a function's [1, 1, n, s_f + n]: real rows keep their columns (cache
    slots [0, s), new rows [s_f, s_f + t)), slots [s, s_f) stay masked, pad row r sees only itself."""
    out = np.full((1, 1, n, s_f + n), kv.NEG_INF, dtype=np.float32)
    out[:, :, :t, :s] = mask[..., :s]
    out[:, :, :t, s_f:s_f + t] = mask[..., s:]
    for r in range(t, n):
        out[0, 0, r, s_f + r] = 0.0
    return out


class CoreMLBackend:
    """edge_spec.backend.Backend over the package's fixed-length target functions (this runtime owns the caches)."""

    name = "coreml"

    def __init__(self, functions: dict[int, Predictor], layout: KVLayout, slots: dict[str, int], identity: str):
        self.functions, self.layout, self.slots = functions, layout, slots
        self.lengths = sorted(functions)
        self.identity = identity  # part of the host check's cache key
        self.k = [np.zeros((1, c.num_kv_heads, slots[c.kind], c.head_dim), np.float32) for c in layout.caches]
        self.v = [np.zeros_like(k) for k in self.k]
        self._pending: list[np.ndarray] | None = None
        self.kernel_s = 0.0

    def length_for(self, t: int) -> int:
        fit = [n for n in self.lengths if n >= t]
        if not fit:
            raise ConfigError(f"one forward over {t} tokens exceeds this package's longest function "
                              f"({self.lengths[-1]} tokens)", "use a smaller --spec-k, or re-export with --max-pass")
        return fit[0]

    def cache_feeds(self, indices) -> dict[str, np.ndarray]:
        feeds = {}
        for i in indices:
            layer = self.layout.caches[i].layer
            feeds[kv.feature_name(kv.k_cache_name(layer))] = self.k[i]
            feeds[kv.feature_name(kv.v_cache_name(layer))] = self.v[i]
        return feeds

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        t = input_ids.shape[1]
        n = self.length_for(t)
        pad = n - t
        ids = np.concatenate([input_ids[0], np.repeat(input_ids[0, -1:], pad)])[None].astype(np.int32)
        pos = np.concatenate([position_ids[0], position_ids[0, -1] + 1 + np.arange(pad)])[None].astype(np.int32)
        feeds = {kv.INPUT_IDS: ids, kv.POSITION_IDS: pos}
        for kind in self.layout.kinds():
            feeds[kv.feature_name(kv.mask_name(kind))] = pad_mask(masks[kind], t, n, self.layout.slots(kind),
                                                                  self.slots[kind])
        feeds.update(self.cache_feeds(range(len(self.layout.caches))))
        start = time.perf_counter()
        out = self.functions[n](feeds)
        self.kernel_s += time.perf_counter() - start
        self._pending = [np.asarray(out[kv.feature_name(name(c.layer))])[:, :, :t]
                         for c in self.layout.caches for name in (kv.k_new_name, kv.v_new_name)]
        rows = slice(t - 1, t) if last_only else slice(0, t)
        logits = np.asarray(out[kv.LOGITS], dtype=np.float32)[0, rows]
        hidden = np.asarray(out[kv.HIDDEN], dtype=np.float32)[0, rows]
        return StepOutput(logits.copy(), hidden.copy())

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        assert self._pending is not None, "commit without a forward"
        for i, c in enumerate(self.layout.caches):
            rows, slots = plan[c.kind]
            self.k[i][:, :, slots] = self._pending[2 * i][:, :, rows]
            self.v[i][:, :, slots] = self._pending[2 * i + 1][:, :, rows]
        self._pending = None

    def reset(self) -> None:
        self._pending = None


class CoreMLDrafter:
    """edge_spec.backend.DrafterBackend over the package's `drafter` function, fed the target backend's caches."""

    def __init__(self, predictor: Predictor, target: CoreMLBackend, sources: dict[str, int]):
        self.predictor, self.target = predictor, target
        self.sources = kv.source_caches(target.layout, sources)
        self.kernel_s = 0.0
        self._feeds = None

    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        feeds = {kv.POSITION_IDS: np.array([[position]], dtype=np.int32)}
        for kind in self.sources:  # [1, 1, 1, S] -> [1, 1, 1, S_f], the headroom masked
            s, s_f = self.target.layout.slots(kind), self.target.slots[kind]
            mask = np.full((1, 1, 1, s_f), kv.NEG_INF, dtype=np.float32)
            mask[..., :s] = masks[kind][..., :s]
            feeds[kv.feature_name(kv.mask_name(kind))] = mask
        self._feeds = feeds

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        feeds = dict(self._feeds)
        feeds[kv.INPUT_IDS] = np.array([[token]], dtype=np.int32)
        feeds[kv.HIDDEN] = hidden.reshape(1, 1, -1).astype(np.float32)
        feeds.update(self.target.cache_feeds(self.sources.values()))  # the committed caches, read in place
        start = time.perf_counter()
        out = self.predictor(feeds)
        self.kernel_s += time.perf_counter() - start
        return DraftStep(np.asarray(out[kv.DRAFT_TOKEN_IDS]).astype(np.int64), np.asarray(out[kv.DRAFT_LOGITS],
                         dtype=np.float32), np.asarray(out[kv.DRAFT_HIDDEN], dtype=np.float32)[0, 0].copy())
