"""The registry of artifact formats and runtimes: the one table the CLI, the API and the manifest check read.

A format is one exporter module (`writer(**export options) -> bundle.Writer` and `export_steps(with_drafter)`) plus
one runtime module (`open_bundle(folder, manifest, layout, *, threads, spin, **run options) -> (Backend,
DrafterBackend | None)`, and `diagnose(folder, manifest, *, threads, **check options) -> str` when it declares
check options), and one `Format` row here, which declares its precisions, KV bindings and its own command-line
options. Adding a format means adding its two modules and one row (`register` adds one at run time, e.g. a test's);
nothing else in the core names a format.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass

from edge_spec.errors import ConfigError
from edge_spec.model.config import ATTENTION_FORMS
from edge_spec.contract.kv import BINDING_IO, BINDING_SHARED, BINDING_STATE

EXPORT, RUN, CHECK = "export", "run", "check"  # where an option goes: the exporter, open_bundle, diagnose


@dataclass(frozen=True)
class Option:
    """A format's own command-line option. `dest` is the keyword its exporter's `writer` (EXPORT), its runtime's
    `open_bundle` (RUN: generate, check, bench) or its runtime's `diagnose` (CHECK: check only) receives; the value
    is passed only when the user gave it (None / False: the module's own default)."""

    flags: tuple[str, ...]  # ("--provider", "--ep"): the first names the option in messages
    dest: str
    help: str  # what it means for this format (the CLI prefixes the format's name)
    command: str = EXPORT
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a flag without a value (store_true)

    @property
    def flag(self) -> str:
        return self.flags[0]


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
    about: str = ""  # what its artifacts are (--format's help)
    precision_help: str = ""  # what its precisions mean (--quant's help)
    options: tuple[Option, ...] = ()
    # the attention form its target graphs are traced with (edge_spec.model.forms.NAMES): slots (batch-invariant
    # slot attention), placed (data movement + 4-D ops, no scatter), state (the program owns the caches)
    attention: str = "slots"
    native: bool = False  # runtimes/native (the C++ runner, `make native`) has a backend for its bundles
    # beside a `state` target, an eagle3 drafter's own cache is the program's state too (ExecuTorch: its buffers);
    # False: it stays `io`, held by the runtime (Core ML: the drafter's functions declare no states)
    eagle3_state: bool = False

    @property
    def bindings(self) -> tuple[str, ...]:
        return (self.binding,) + self.other_bindings

    def option(self, dest: str, command: str) -> Option | None:
        return next((o for o in self.options if o.dest == dest and o.command == command), None)


_EP_RUN = ("--provider", "--ep")
FORMATS = {
    "onnx": Format(
        "onnx", ("fp32", "fp16", "int8", "int4", "int4-gguf"), BINDING_IO, "ort", "edge_spec.exporters.onnx",
        "edge_spec.runtimes.ort", "pip install onnx onnxruntime onnxscript", about="onnxruntime", native=True,
        other_bindings=(BINDING_SHARED,),
        precision_help="fp32, fp16 (fp16 compute for accelerator providers; ~10% slower than fp32 on an x86 CPU), int8 "
                       "int8 (MatMulNBits, blocks of 32), int4 (onnxruntime's native 4-bit grid with zero points, "
                       "4-bit tied head and table, as onnxruntime-genai's int4) or int4-gguf (a GGUF's Q4_1 blocks "
                       "bit for bit + a per-block offset term, 8-bit head; slower)",
        options=(Option(("--exporter",), "exporter", "the torch.onnx exporter: dynamo (default, faster graphs) or "
                        "torchscript (exports ~10x faster)", choices=("dynamo", "torchscript")),
                 Option(_EP_RUN, "provider", "onnxruntime's execution provider (cpu, the default | xnnpack | coreml)",
                        RUN, ("cpu", "xnnpack", "coreml", "qnn")),
                 Option(("--nodes",), "nodes", "also compare every node's output between a one-token step and row 0 "
                        "of a verify pass and list where they first differ (a diagnostic; ~2x the graph's memory)",
                        CHECK, switch=True))),
    "executorch": Format(
        "executorch", ("fp32", "8da4w", "8da4w-gguf"), BINDING_STATE, "executorch", "edge_spec.exporters.executorch",
        "edge_spec.runtimes.executorch", "pip install executorch==1.5.1", about="one .pte, XNNPACK", attention="state",
        native=True, eagle3_state=True,
        precision_help="fp32, 8da4w (int8 dynamic activations x XNNPACK's symmetric int4 in groups of 32, scales fitted to "
                       "calibration prompts; 8-bit head and table) or 8da4w-gguf (a GGUF's Q4_1 codes bit for bit + a "
                       "per-block offset term; larger and slower)"),
    "coreml": Format(
        "coreml", ("fp16", "fp32", "int8", "int4", "int4-channel"), BINDING_IO, "coreml", "edge_spec.exporters.coreml",
        "edge_spec.runtimes.coreml", "pip install coremltools==9.0", constant_tables=True, fixed_shapes=True,
        other_bindings=(BINDING_STATE,), about="one multifunction .mlpackage",
        precision_help="fp16 (compute), fp32, int8 (per channel), int4 (per block of 32, GPU) or int4-channel (ANE)",
        options=(Option(("--compute-units",), "compute_units", "the devices Core ML may use (macOS; default all)",
                        RUN, ("all", "cpu_and_ne", "cpu_and_gpu", "cpu")),)),
    "qnn": Format(
        "qnn", ("16a8w", "8a8w"), BINDING_IO, "qnn", "edge_spec.exporters.qnn", "edge_spec.runtimes.qnn",
        "pip install onnxruntime-qnn==2.7.0", constant_tables=True, fixed_shapes=True,
        about="static QDQ graphs + context binaries for a Snapdragon HTP", attention="placed", native=True,
        precision_help="16a8w (16-bit activations, 8-bit weights, QDQ) or 8a8w",
        options=(Option(("--soc",), "soc", "the Snapdragon SoC the context binaries are compiled for (default sm8650, "
                        "Snapdragon 8 Gen 3 / Galaxy S24)", choices=("sm8350", "sm8450", "sm8550", "sm8650", "sm8750")),
                 Option(("--qnn-graphs",), "graphs", "target graphs: two (default: decode + verify at max draft "
                        "length + 1 rows, and the prefill chunk; each context binary holds a copy of the weights: 2 "
                        "copies) or every (decode, verify at k + 1 for k = 1, 2, 4, prefill: ~6 copies)",
                        choices=("two", "every")),
                 Option(("--qnn-position0",), "position0", "how a pass from position 0 gets its first row: graph "
                        "(default: the host's float graph, any first token; the QDQ graphs and their weights come "
                        "too, for --provider cpu) or table (for a phone: rows precomputed for the chat template's "
                        "first token and BOS; no host graph, QDQ graphs or second copy of the weights)",
                        choices=("graph", "table")),
                 Option(_EP_RUN, "provider", "qnn (the HTP, the default; simulated on x86-64) | cpu (the QDQ graphs "
                        "on the CPU)", RUN, ("qnn", "cpu")))),
}
DEFAULT_FORMAT = "onnx"
EAGER_RUNTIME = "torch"  # reruns a bundle's source checkpoints in PyTorch (any format)


# ---- registering formats ------------------------------------------------------------------------------------------
def register(fmt: Format) -> Format:
    """Add a format row (a plugin's, a test's). Its name and runtime must be new, and an option it shares with
    another row (same dest) must have the same flags."""
    if fmt.name in FORMATS:
        raise ConfigError(f"a format named {fmt.name!r} is already registered", "register it under another name")
    if fmt.attention not in ATTENTION_FORMS:
        raise ConfigError(f"format {fmt.name!r} declares an unknown attention form {fmt.attention!r}",
                          f"choose one of {', '.join(ATTENTION_FORMS)} (edge_spec.model.forms)")
    if fmt.runtime == EAGER_RUNTIME or any(f.runtime == fmt.runtime for f in FORMATS.values()):
        raise ConfigError(f"the runtime name {fmt.runtime!r} is taken", "give the format's runtime its own name")
    for opt in fmt.options:
        for other in all_options():
            if other.dest == opt.dest and other.flags != opt.flags:
                raise ConfigError(f"option {opt.dest!r} of format {fmt.name!r} is spelled {'/'.join(opt.flags)}, "
                                  f"another format spells it {'/'.join(other.flags)}", "use the same flags")
    FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    FORMATS.pop(name, None)


@contextlib.contextmanager
def registered(fmt: Format):
    """`with registered(Format(...)):` the format exists inside the block only."""
    register(fmt)
    try:
        yield fmt
    finally:
        unregister(fmt.name)


# ---- reading the table --------------------------------------------------------------------------------------------
def runtimes() -> tuple[str, ...]:
    return (EAGER_RUNTIME,) + tuple(dict.fromkeys(f.runtime for f in FORMATS.values()))


def native_formats() -> tuple[str, ...]:
    """The formats whose bundles the C++ runner (runtimes/native) runs."""
    return tuple(sorted(f.name for f in FORMATS.values() if f.native))


def precisions() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for f in FORMATS.values() for p in f.precisions))


def all_options(command: str | None = None) -> list[Option]:
    return [o for f in FORMATS.values() for o in f.options if command is None or o.command == command]


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise ConfigError(f"unknown format {name!r}", f"choose one of {', '.join(FORMATS)}")
    return FORMATS[name]


def format_of_runtime(runtime: str) -> Format | None:
    """The format whose bundles `runtime` runs (None: the eager runtime, or an unknown name)."""
    return next((f for f in FORMATS.values() if f.runtime == runtime), None)


def check_runtime(runtime: str) -> None:
    if runtime not in runtimes():
        raise ConfigError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(runtimes())}")


def check_precision(fmt: Format, precision: str) -> None:
    if precision not in fmt.precisions:
        raise ConfigError(f"the {fmt.name} format has no precision {precision!r}",
                          f"choose one of {', '.join(fmt.precisions)} for --format {fmt.name}")


def check_binding(fmt: Format, binding: str) -> None:
    if binding not in fmt.bindings:
        raise ConfigError(f"the {fmt.name} format has no KV binding {binding!r}",
                          f"choose one of {', '.join(fmt.bindings)} for --format {fmt.name}")


def given(options: dict) -> dict:
    """The options the user gave (None / False: not given, the module's default applies)."""
    return {k: v for k, v in options.items() if v is not None and v is not False}


def check_options(fmt: Format | None, options: dict, command: str, runtime: str | None = None) -> dict:
    """The given `options` (dest -> value), each declared by `fmt` for `command`; else a ConfigError naming the
    formats that declare it. `fmt` None: the eager runtime, which declares none. Returns the given ones."""
    options = given(options)
    for dest in options:
        if fmt is not None and fmt.option(dest, command) is not None:
            continue
        owners = [f for f in FORMATS.values() if f.option(dest, command) is not None]
        if not owners:
            raise ConfigError(f"no format has an option {dest!r}",
                              f"drop it; the formats' options: {', '.join(o.dest for o in all_options(command))}")
        flag, names = owners[0].option(dest, command).flag, [f.name for f in owners]
        if command == EXPORT:
            raise ConfigError(f"{flag} applies to --format {' | '.join(names)}, not {fmt.name}",
                              f"drop {flag}, or use --format {names[0]}")
        own = [o.flag for o in (fmt.options if fmt else ()) if o.command == command]
        raise ConfigError(f"{flag} applies to {' and '.join(names)} bundles, not the {runtime or fmt.runtime} runtime",
                          f"drop {flag}" + (f" (the {runtime or fmt.runtime} runtime's options: {', '.join(own)})"
                                            if own else ""))
    return options


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
