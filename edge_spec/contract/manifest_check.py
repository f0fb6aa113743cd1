"""Every manifest field by type and range, and the memory a bundle's KV cache will take, before anything allocates.

A hand-edited or damaged manifest.json is not covered by the checksums (they cover the files it lists), so each
field the runtimes use is checked here: integers are integers in range, token ids lie inside the vocabulary, each
shared table's shape matches its file's size, and the KV cache that `max_context` implies fits the memory this
machine has free (`check_memory`). The native runner checks the same (runtimes/native/src/manifest.cpp).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from edge_spec.errors import BundleError
from edge_spec.contract.kv import KVLayout

INT32_MAX = 2**31 - 1  # the largest count the native runner and the graphs' int indices take
_REEXPORT = "re-run `edge-spec export` into a fresh --out folder (manifest.json was edited or damaged)"
_TABLE_DTYPES = ("float32", "float16", "int8", "uint8")


def _int(value, what: str, path: Path, lo: int = 0, hi: int = INT32_MAX, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BundleError(f"{path}: {what} is {value!r}, not an integer in [{lo}, {hi}]", _REEXPORT)


def check_fields(raw: dict, path: Path) -> None:
    """The raw JSON's fields the runtimes use, by type and range (BundleError naming the field)."""
    vocab = raw.get("vocab_size")
    _int(vocab, "vocab_size", path, 1)
    _int(raw.get("hidden_size"), "hidden_size", path, 1)
    _int(raw.get("max_context"), "max_context", path, 2)
    _int(raw.get("max_draft_len"), "max_draft_len", path, 0, 1024)
    scale = raw.get("embed_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise BundleError(f"{path}: embed_scale is {scale!r}, not a finite number > 0", _REEXPORT)
    tok = raw.get("tokenizer")
    if not isinstance(tok, dict):
        raise BundleError(f"{path}: tokenizer is {type(tok).__name__}, not an object", _REEXPORT)
    eos = tok.get("eos_token_ids")
    if not isinstance(eos, list):
        raise BundleError(f"{path}: tokenizer.eos_token_ids is {eos!r}, not a list of token ids", _REEXPORT)
    for i, t in enumerate(eos):
        _int(t, f"tokenizer.eos_token_ids[{i}]", path, 0, vocab - 1)
    for name in ("bos_token_id", "pad_token_id"):
        _int(tok.get(name), f"tokenizer.{name}", path, 0, vocab - 1, none_ok=True)
    if not isinstance(tok.get("files"), list) or not all(isinstance(f, str) for f in tok["files"]):
        raise BundleError(f"{path}: tokenizer.files is {tok.get('files')!r}, not a list of file names", _REEXPORT)
    layout = raw.get("kv", {}).get("layout") if isinstance(raw.get("kv"), dict) else None
    if not isinstance(layout, dict) or not isinstance(layout.get("caches"), list):
        raise BundleError(f"{path}: kv.layout.caches is missing or not a list", _REEXPORT)
    if layout.get("max_context") != raw.get("max_context"):
        raise BundleError(f"{path}: kv.layout.max_context {layout.get('max_context')!r} differs from max_context "
                          f"{raw.get('max_context')!r}", _REEXPORT)
    _int(layout.get("max_pass"), "kv.layout.max_pass", path, 1, none_ok=True)
    for i, c in enumerate(layout["caches"]):
        if not isinstance(c, dict):
            raise BundleError(f"{path}: kv.layout.caches[{i}] is not an object", _REEXPORT)
        for key in ("layer", "num_kv_heads", "head_dim", "slots"):
            _int(c.get(key), f"kv.layout.caches[{i}].{key}", path, 0 if key == "layer" else 1)
        _int(c.get("window"), f"kv.layout.caches[{i}].window", path, 1, none_ok=True)
        if c["slots"] > layout["max_context"]:
            raise BundleError(f"{path}: kv.layout.caches[{i}] has {c['slots']} slots, more than max_context "
                              f"{layout['max_context']}", _REEXPORT)
    tables = raw.get("tables")
    if not isinstance(tables, dict):
        raise BundleError(f"{path}: tables is {tables!r}, not an object", _REEXPORT)
    for name, t in tables.items():
        if not isinstance(t, dict) or t.get("dtype") not in _TABLE_DTYPES or not isinstance(t.get("shape"), list):
            raise BundleError(f"{path}: tables.{name} needs a dtype ({', '.join(_TABLE_DTYPES)}) and a shape list",
                              _REEXPORT)
        for j, d in enumerate(t["shape"]):
            _int(d, f"tables.{name}.shape[{j}]", path, 1)


def check_tables(m, path: Path) -> None:
    """Each shared table's shape x dtype against its file's size in the manifest (which `_verify_files` checked
    against the disk): a wrong shape would map the wrong rows, or past the file's end."""
    for name, t in m.tables.items():
        want = math.prod(t.shape) * np.dtype(t.dtype).itemsize
        got = m.files.get(t.file, {}).get("bytes")
        if got != want:
            raise BundleError(f"{path}: tables.{name} is {t.dtype}{list(t.shape)} ({want} bytes), but {t.file} holds "
                              f"{got} bytes", _REEXPORT)


def kv_cache_bytes(layout: KVLayout) -> int:
    """Bytes of the target's KV cache (keys and values, fp32) for `layout`."""
    return sum(2 * c.num_kv_heads * c.slots * c.head_dim * 4 for c in layout.caches)


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping: MemAvailable on Linux, physical memory elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(layout: KVLayout, folder: Path, available: int | None = None,
                 drafter: KVLayout | None = None) -> int:
    """Refuse a layout whose KV cache (with `drafter`'s own, an EAGLE-3 drafter's) would not fit the memory this
    machine has free; returns its bytes."""
    need = kv_cache_bytes(layout) + (kv_cache_bytes(drafter) if drafter is not None else 0)
    have = available_memory() if available is None else available
    if have is not None and need > have:
        whose = " (the drafter's own included)" if drafter is not None else ""
        raise BundleError(f"{folder}: a KV cache of {layout.max_context} tokens{whose} takes {need / 2**30:.1f} GiB, more "
                          f"than this machine's {have / 2**30:.1f} GiB free",
                          "pass a smaller --max-context, or re-export the bundle with a smaller --max-context")
    return need
