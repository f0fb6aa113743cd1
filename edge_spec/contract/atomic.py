"""Writing a bundle atomically, and only over a folder that is a bundle.

`write_bundle(out, build)`: `build(tmp)` writes the artifacts into a temp sibling folder and returns the manifest;
sizes and sha256 of every file are recorded, manifest.json is written last, then the folder is renamed into place.
An interrupted export leaves `out` as it was (the previous bundle, or absent), never half-written.

`out` may be replaced only when it is absent, empty, or an edge-spec bundle whose folder holds nothing but the files
its manifest lists (plus manifest.json): a folder with any other file is refused, so an export never deletes a
file it did not write. `check_out(out)` runs the same checks (and that `out`'s parent can be written) before any
model loads, so a bad --out fails in a second rather than after the export's minutes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from edge_spec.errors import ExportError
from edge_spec.contract.manifest import MANIFEST, Manifest, sha256_file

_ANOTHER = "choose another --out folder"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bundle_files(manifest: Path) -> set[str] | None:
    """The files an edge-spec manifest lists (relative paths), or None when `manifest` is not an edge-spec one."""
    try:
        raw = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("schema_version"), int) or "format" not in raw:
        return None
    files = raw.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        return None
    return set(files)


def check_replaceable(out: Path) -> None:
    """Raise ExportError unless writing a bundle to `out` can lose nothing but a previous bundle's own files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ExportError(f"--out {out} exists and is a file", _ANOTHER)
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir()}  # files, links, fifos
    if not present:
        return
    listed = _bundle_files(out / MANIFEST) if (out / MANIFEST).is_file() else None
    if listed is None:
        what = f"holds a {MANIFEST} that is not an edge-spec bundle's" if (out / MANIFEST).exists() else \
            f"is not empty and holds no {MANIFEST}"
        raise ExportError(f"--out {out} {what}: refusing to replace it", f"{_ANOTHER}, or empty that folder first")
    others = sorted(present - listed - {MANIFEST})
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ExportError(f"--out {out} is a bundle but also holds files it does not list ({shown}): replacing it "
                          "would delete them", f"move those files elsewhere, or {_ANOTHER}")


def check_out(out: str | Path) -> Path:
    """The resolved --out folder, once it is known to be replaceable and its parent writable (ExportError if not)."""
    out = Path(out).expanduser().resolve()
    check_replaceable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ExportError(f"cannot create --out's parent folder {out.parent}: {err.strerror or err}",
                          f"{_ANOTHER} (one you can write)") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write into {out.parent} (permission denied)", f"{_ANOTHER} (one you can write)")
    return out


def _clear_stale(parent: Path, prefix: str) -> None:
    for stale in parent.glob(prefix + "*"):  # left by a killed export
        suffix = stale.name[len(prefix):]
        if suffix.isdigit() and not _pid_alive(int(suffix)):
            shutil.rmtree(stale, ignore_errors=True)


def _swap(new: Path, out: Path, old: Path) -> None:
    """Move `new` to `out`; a previous `out` goes to `old` first and comes back if the second move fails."""
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(new, out)
    except OSError:
        if old.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_bundle(out: str | Path, build: Callable[[Path], Manifest]) -> Path:
    """Build a bundle into a temp sibling folder, record sizes + sha256 of every file, write manifest.json
    last, then move it into place. `build(tmp)` writes the artifacts and returns the manifest (files empty).

    If anything fails (or the process dies) `out` is either the previous bundle or absent, never half-written.
    """
    out = check_out(out)
    prefix = f".{out.name}.tmp-"
    _clear_stale(out.parent, prefix)
    tmp = out.parent / f"{prefix}{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        manifest = build(tmp)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        data = manifest.to_json()
        data["files"] = files
        with open(tmp / MANIFEST, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        check_replaceable(out)  # again: the build took minutes, and the folder may have gained files since
        _swap(tmp, out, old)
    except OSError as err:
        raise ExportError(f"writing the bundle to {out} failed: {err.strerror or err}"
                          f"{f' ({err.filename})' if err.filename else ''}; {out} is unchanged",
                          "free disk space or fix the folder's permissions, then export again") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
