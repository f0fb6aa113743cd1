"""The registry of artifact formats and runtimes: the one table the CLI, the API and the manifest check read.

A format is one exporter module (`edge_spec.exporters.<name>`: `export_bundle(...)`) plus one runtime module
(`edge_spec.runtimes.<runtime>`: `open_bundle(folder, manifest, layout, ...) -> (Backend, DrafterBackend | None)`).
Adding a format means adding its two modules and one `Format` row here; nothing else names formats.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from edge_spec.errors import ConfigError
from edge_spec.contract.kv import BINDING_IO, BINDING_STATE


@dataclass(frozen=True)
class Format:
    name: str
    precisions: tuple[str, ...]  # the --quant values its exporter writes (first = default)
    binding: str  # the KV binding its artifacts use (kv.BINDING_IO / BINDING_STATE)
    runtime: str  # the runtime that executes its bundles
    exporter: str  # module path of the exporter
    runtime_module: str  # module path of the runtime
    install: str  # what to install when the exporter or runtime is missing
    constant_tables: bool = False  # the drafter graph holds the embedding / output tables itself (no table inputs)
    fixed_shapes: bool = False  # graphs at fixed pass lengths and cache sizes (GraphEntry.fixed), not symbolic ones
    other_bindings: tuple[str, ...] = ()  # bindings its exporter also writes on request (`--kv`)

    @property
    def bindings(self) -> tuple[str, ...]:
        return (self.binding,) + self.other_bindings


FORMATS = {
    "onnx": Format("onnx", ("fp32", "fp16", "int8", "int4"), BINDING_IO, "ort", "edge_spec.exporters.onnx",
                   "edge_spec.runtimes.ort", "pip install onnx onnxruntime onnxscript"),
    "executorch": Format("executorch", ("fp32", "8da4w"), BINDING_STATE, "executorch", "edge_spec.exporters.executorch",
                         "edge_spec.runtimes.executorch", "pip install executorch==1.5.1"),
    "coreml": Format("coreml", ("fp16", "fp32", "int8", "int4", "int4-channel"), BINDING_IO, "coreml",
                     "edge_spec.exporters.coreml", "edge_spec.runtimes.coreml", "pip install coremltools==9.0",
                     constant_tables=True, fixed_shapes=True, other_bindings=(BINDING_STATE,)),
    "qnn": Format("qnn", ("16a8w", "8a8w"), BINDING_IO, "qnn", "edge_spec.exporters.qnn", "edge_spec.runtimes.qnn",
                  "pip install onnxruntime-qnn==2.7.0", constant_tables=True, fixed_shapes=True),
}
EAGER_RUNTIME = "torch"  # reruns a bundle's source checkpoints in PyTorch (any format)
RUNTIMES = (EAGER_RUNTIME,) + tuple(dict.fromkeys(f.runtime for f in FORMATS.values()))
PRECISIONS = tuple(dict.fromkeys(p for f in FORMATS.values() for p in f.precisions))


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise ConfigError(f"unknown format {name!r}", f"choose one of {', '.join(FORMATS)}")
    return FORMATS[name]


def check_precision(fmt: Format, precision: str) -> None:
    if precision not in fmt.precisions:
        raise ConfigError(f"the {fmt.name} format has no precision {precision!r}",
                          f"choose one of {', '.join(fmt.precisions)} for --format {fmt.name}")


def check_binding(fmt: Format, binding: str) -> None:
    if binding not in fmt.bindings:
        raise ConfigError(f"the {fmt.name} format has no KV binding {binding!r}",
                          f"choose one of {', '.join(fmt.bindings)} for --format {fmt.name}")


def _import(path: str, fmt: Format, role: str):
    try:
        return importlib.import_module(path)
    except ImportError as err:
        raise ConfigError(f"the {fmt.name} {role} needs a package that is not installed ({err.name or err})",
                          fmt.install) from err


def exporter(name: str):
    fmt = get_format(name)
    return _import(fmt.exporter, fmt, "exporter")


def runtime_for(name: str):
    fmt = get_format(name)
    return _import(fmt.runtime_module, fmt, "runtime")
