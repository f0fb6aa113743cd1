"""What the GGUF importers share (llama: edge_spec.loading.gguf_import, gemma3: edge_spec.loading.gguf_gemma3): the
error type, reading metadata, the cache root, and the output folder: its four files (`HF_FILES`), written into a
sibling temporary folder that is renamed into place only once complete (`convert`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from edge_spec.errors import CheckpointError

if TYPE_CHECKING:  # gguf (and the yaml, sentencepiece it imports: ~7 MB resident) is read when a GGUF is, not before:
    from gguf import GGUFReader  # `edge_spec.api` imports this module for `cache_root` alone

CACHE_ENV_VAR = "EDGE_SPEC_CACHE"
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")  # a per-layer GGUF tensor: blk.<layer>.<name>.weight
REQUIRED = object()  # read_field's default: the key must be there

# write(reader, gguf_path, folder, progress): puts the four HF_FILES into `folder`
Writer = Callable[["GGUFReader", Path, Path, bool], None]


class GGUFImportError(CheckpointError):
    """A GGUF file cannot be found, read or converted to a Hugging Face folder."""


def cache_root() -> Path:
    """`$EDGE_SPEC_CACHE`, else `~/.cache/edge-spec`."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edge-spec"


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in HF_FILES)


def convert(gguf_path: Path, out_dir: Path, write: Writer, *, progress: bool = True) -> Path:
    """`out_dir` right away if it already holds all of `HF_FILES`; else `write` builds it in `<out_dir>.tmp-<pid>`,
    which is renamed into place. On any failure the temporary folder is removed and no `out_dir` is left behind.
    An `out_dir` that exists but is incomplete is refused (GGUFImportError)."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if is_complete(out_dir):
        return out_dir
    if out_dir.exists():
        missing = [name for name in HF_FILES if not (out_dir / name).is_file()]
        raise GGUFImportError(f"{out_dir} exists but lacks {missing}; delete it and convert again")

    reader = open_reader(gguf_path)
    tmp_dir = out_dir.parent / f"{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        tmp_dir.mkdir(parents=True)
        write(reader, gguf_path, tmp_dir, progress)
        try:
            os.replace(tmp_dir, out_dir)
        except OSError:
            if not is_complete(out_dir):  # not just another process finishing first
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def open_reader(path: Path) -> GGUFReader:
    from gguf import GGUFReader

    if not path.is_file():
        raise GGUFImportError(f"GGUF file not found: {path}")
    try:
        return GGUFReader(path)
    except Exception as exc:  # the reader raises many kinds on bad input
        raise GGUFImportError(f"{path.name}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def read_field(reader: GGUFReader, key: str, path: Path, default: Any = REQUIRED) -> Any:
    """Value of metadata `key` (lists for arrays); `default` if absent, else GGUFImportError."""
    field = reader.fields.get(key)
    if field is None:
        if default is REQUIRED:
            raise GGUFImportError(f"{path.name}: metadata key {key!r} is missing")
        return default
    return field.contents()


def short_float(value: float) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
