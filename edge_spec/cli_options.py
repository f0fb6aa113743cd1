"""The command line's format-dependent parts, generated from the registry (edge_spec.contract.formats): the
help of --format / --quant / --runtime / --kv, every format's own options, and which of them the user gave."""

from __future__ import annotations

import argparse

from edge_spec.contract import formats
from edge_spec.contract.kv import BINDING_IO, BINDING_SHARED, BINDING_STATE


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def format_help() -> str:
    rows = [f"{f.name} ({f.about})" if f.about else f.name for f in formats.FORMATS.values()]
    listed = rows[0] if len(rows) == 1 else ", ".join(rows[:-1]) + " or " + rows[-1]
    return _escape(f"artifact format: {listed}; default {formats.DEFAULT_FORMAT}")


def quant_help() -> str:
    rows = [f"{f.name}: {f.precision_help or ', '.join(f.precisions)}" for f in formats.FORMATS.values()]
    defaults: dict[str, list[str]] = {}
    for f in formats.FORMATS.values():
        defaults.setdefault(f.precisions[0], []).append(f.name)
    first = ", ".join(f"{p} ({', '.join(names)})" for p, names in defaults.items())
    return _escape("; ".join(rows) + f"; default: {first}")


def runtime_help() -> str:
    own = ", ".join(f"{f.runtime} for {f.name}" for f in formats.FORMATS.values())
    return f"execution runtime (default: the bundle format's - {own} - and {formats.EAGER_RUNTIME} for --model)"


def kv_help() -> str:
    own = ", ".join(f"{f.name} {f.binding}" for f in formats.FORMATS.values())
    also = "; ".join(f"{f.name} also writes {', '.join(f.other_bindings)}" for f in formats.FORMATS.values()
                     if f.other_bindings)
    return (f"how the graphs hold the KV cache: {BINDING_IO} (inputs, new rows out), {BINDING_STATE} (buffers the "
            f"program writes in place) or {BINDING_SHARED} (inputs and outputs bound to the same buffers, written "
            f"in place by fused attention: onnx; llama, qwen3 and gemma3 targets); default the format's own ({own}; "
            f"onnx exports llama, qwen3 and gemma3 targets {BINDING_SHARED})"
            + (f"; {also}" if also else ""))


def add_format_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Every registered format's options for `command` (formats.EXPORT / RUN / CHECK). Formats sharing an option
    (same dest) share one flag: its choices are theirs together, its help says what it means for each."""
    merged: dict[str, list[tuple[formats.Format, formats.Option]]] = {}
    for fmt in formats.FORMATS.values():
        for opt in fmt.options:
            if opt.command == command:
                merged.setdefault(opt.dest, []).append((fmt, opt))
    noun = "{}" if command == formats.EXPORT else "{} bundles"
    for dest, rows in merged.items():
        opt = rows[0][1]
        text = "; ".join(f"{noun.format(fmt.name)}: {o.help}" for fmt, o in rows)
        if len(opt.flags) > 1:
            text += f"; {', '.join(opt.flags[1:])} {'is' if len(opt.flags) == 2 else 'are'} the same option"
        if opt.switch:
            parser.add_argument(*opt.flags, dest=dest, action="store_true", help=_escape(text))
            continue
        choices = list(dict.fromkeys(c for _, o in rows for c in (o.choices or ()))) or None
        parser.add_argument(*opt.flags, dest=dest, default=None, choices=choices, help=_escape(text))


def given_options(args: argparse.Namespace, command: str) -> dict:
    """dest -> value of the format options of `command` the user gave."""
    dests = dict.fromkeys(o.dest for o in formats.all_options(command))
    return formats.given({dest: getattr(args, dest, None) for dest in dests})
