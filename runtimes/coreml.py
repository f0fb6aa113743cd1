"""Core ML runtime: the Backend and DrafterBackend over one multifunction .mlpackage (exporters/coreml.py).
`io` binding: this runtime holds the caches ([1, H_kv, S_kind, D] float32 per cached layer, S_kind the functions'
fixed slots), passes them to every call and writes the committed rows itself (edge_spec.runtimes.fixed, shared with QNN).
`state` binding: one state (MLState: `make_state()` of the first function) is passed to every function's prediction,
the target's and the (MTP) drafter's; the functions write their rows themselves and `commit` only accepts. An eagle3
drafter's functions take no state: its own cache stays function IO (runtimes/fixed_eagle3.py holds it).

An eagle3 drafter (exporters/coreml.py): its step and fc functions at each length, run by
runtimes/fixed_eagle3.py beside the backend, which hands it every pass's aux states.

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
from pathlib import Path

from edge_spec.contract import kv
from edge_spec.errors import BundleError, ConfigError
from edge_spec.contract.manifest import EAGLE3, EAGLE3_FC_GRAPH
from edge_spec.runtimes.fixed import FixedBackend, FixedDrafter, Predictor, fixed_shapes
from edge_spec.runtimes.fixed_eagle3 import FixedEagle3Drafter
from edge_spec.contract.kv import KVLayout
from edge_spec.runtimes.coreml_tools import import_coremltools

EXECUTOR_ENV = "EDGE_SPEC_COREML_EXECUTOR"  # "mil": run the package through the MIL reference executor
COMPUTE_UNITS = {"all": "ALL", "cpu_and_ne": "CPU_AND_NE", "cpu_and_gpu": "CPU_AND_GPU", "cpu": "CPU_ONLY"}
DEFAULT_COMPUTE_UNITS = "all"
_FIX = "re-export the bundle: edge-spec export --format coreml --out DIR"

def _mac_predictors(package: Path, names: list[str], compute_units: str, stateful: set[str]) -> dict[str, Predictor]:
    """Predictors of the functions `names`; those in `stateful` share one MLState (the `state` binding's target
    functions and MTP drafter; an eagle3 drafter's functions declare none)."""
    if platform.system() != "Darwin":
        raise ConfigError(
            "Core ML prediction needs macOS 15+ (or iOS 18+): this machine runs " + platform.system(),
            f"run the bundle on a Mac, or export --format onnx / executorch here; to check the package on this machine "
            f"set {EXECUTOR_ENV}=mil (the MIL reference executor: slow, for verification)")
    ct = import_coremltools()
    units = ct.ComputeUnit[COMPUTE_UNITS[compute_units]]
    out, shared = {}, None
    for name in names:
        try:
            model = ct.models.MLModel(str(package), compute_units=units, function_name=name)
        except Exception as err:
            raise BundleError(f"{package}: Core ML cannot load function {name!r} ({str(err).strip()[:200]})", _FIX) from err
        if name in stateful:  # one MLState for them all (identical state names and shapes: the exporter checks it)
            shared = shared if shared is not None else model.make_state()
            out[name] = lambda feeds, model=model: model.predict(feeds, state=shared)
        else:
            out[name] = model.predict
    return out


def _executor_predictors(package: Path, names: list[str], stateful: set[str]) -> dict[str, Predictor]:
    from edge_spec.runtimes.coreml_mil import load_functions, make_state

    functions = load_functions(package)
    missing = [n for n in names if n not in functions]
    if missing:
        raise BundleError(f"{package} has no function {missing[0]!r} (it has {', '.join(sorted(functions))})", _FIX)
    if not stateful:
        return {n: functions[n] for n in names}
    shared = make_state(functions[n] for n in names if n in stateful)
    return {n: (lambda feeds, fn=functions[n]: fn(feeds, state=shared)) if n in stateful else functions[n]
            for n in names}


def open_bundle(folder: Path, manifest, layout: KVLayout, *, threads: int | None = None, spin: bool = True,
                compute_units: str | None = None) -> tuple[FixedBackend, FixedDrafter | None]:
    """The runtime half of the coreml format (edge_spec.contract.formats). `threads`, `spin`: not Core ML's."""
    units = compute_units or DEFAULT_COMPUTE_UNITS
    if units not in COMPUTE_UNITS:
        raise ConfigError(f"unknown compute units {units!r}", f"choose one of {', '.join(COMPUTE_UNITS)}")
    entry = manifest.graphs["target"]
    if not entry.fixed or "lengths" not in entry.fixed:
        raise BundleError(f"{folder}: the coreml target entry lists no fixed pass lengths", _FIX)
    lengths, slots = fixed_shapes(entry, layout, "Core ML package")
    eagle3 = manifest.drafter is not None and manifest.drafter.kind == EAGLE3
    drafters = [EAGLE3_FC_GRAPH, "drafter"] if eagle3 else []  # their functions at each length
    lengths_of = {g: {int(t): f for t, f in (manifest.graphs[g].fixed or {}).get("lengths", {}).items()}
                  for g in drafters}
    if eagle3 and not all(lengths_of.values()):
        raise BundleError(f"{folder}: the eagle3 drafter's entries list no fixed lengths", _FIX)
    names = list(lengths.values()) + [f for g in drafters for f in lengths_of[g].values()]
    names += [manifest.graphs["drafter"].method] if manifest.drafter and not eagle3 else []
    package = folder / entry.file
    state = layout.binding == kv.BINDING_STATE
    eagle3_names = {f for g in drafters for f in lengths_of[g].values()}  # their cache is IO under either binding
    stateful = {n for n in names if n not in eagle3_names} if state else set()
    executor = os.environ.get(EXECUTOR_ENV, "")
    if executor not in ("", "mil"):
        raise ConfigError(f"{EXECUTOR_ENV}={executor!r} is not a Core ML executor", f"unset it, or set {EXECUTOR_ENV}=mil")
    if executor == "mil":
        predictors, identity = _executor_predictors(package, names, stateful), "coreml MIL reference executor (numpy)"
    else:
        predictors = _mac_predictors(package, names, units, stateful)
        ct = import_coremltools()
        identity = f"coreml {ct.__version__}, {platform.mac_ver()[0]}, compute units {units}"
    identity += f", {layout.binding} binding"
    functions = {t: predictors[name] for t, name in lengths.items()}
    backend = FixedBackend(functions, layout, slots, identity, name="coreml", feature=kv.feature_name,
                           fix="re-export with --max-pass", aux_width=kv.aux_size(entry.io))
    if manifest.drafter is None:
        return backend, None
    if eagle3:  # runtimes/fixed_eagle3.py: its step and fc functions over its own cache (held here)
        steps, fcs = ({t: predictors[f] for t, f in lengths_of[g].items()} for g in ("drafter", EAGLE3_FC_GRAPH))
        return backend, FixedEagle3Drafter(steps, fcs, backend, manifest.drafter.draft_layout)
    sources = {kind: int(layer) for kind, layer in manifest.drafter.kv_sharing.items()}
    return backend, FixedDrafter(predictors[manifest.graphs["drafter"].method], backend, sources)
