"""The manifest's optional `datastore` key: a static datastore shipped inside the bundle (the target's own earlier
answers as token ids, indexed for drafting: edge_spec.decoding.datastore, runtimes/native/src/datastore.cpp).

    "datastore": {"file": "datastore.bin", "version": 1, "tokens": 133711, "documents": 1082,
                  "source": "data/regenerated/smollm2-135m"}

`file` is relative to the bundle root and listed (size + sha256) under `files` like every other file; `version` is
the file format's (its header repeats it); `tokens` / `documents` / `source` say what it was built from. A bundle
without the key has no datastore and drafts as before. The file's own contents are checked where it is read.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from edge_spec.errors import BundleError

DATASTORE_KEY = "datastore"
DATASTORE_FILE = "datastore.bin"
DATASTORE_VERSION = 1  # the file format (edge_spec.decoding.datastore's header)
_REEXPORT = "re-run `edge-spec export` into a fresh --out folder (manifest.json was edited or damaged)"


def datastore_entry(file: str, tokens: int, documents: int, source: str) -> dict:
    """The manifest value for a datastore written to `file` (relative to the bundle root)."""
    return {"file": file, "version": DATASTORE_VERSION, "tokens": tokens, "documents": documents, "source": source}


def check_datastore(entry, files: dict, path: Path) -> None:
    """The `datastore` value (None: no datastore) by type, and its file listed in `files` (BundleError if not)."""
    if entry is None:
        return
    if not isinstance(entry, dict):
        raise BundleError(f"{path}: datastore is {type(entry).__name__}, not an object", _REEXPORT)
    rel = entry.get("file")
    if not isinstance(rel, str) or not rel or PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
        raise BundleError(f"{path}: datastore.file is {rel!r}, not a file inside the bundle", _REEXPORT)
    if rel not in files:
        raise BundleError(f"{path}: datastore.file {rel} is used but has no checksum entry", _REEXPORT)
    version = entry.get("version")
    if isinstance(version, bool) or version != DATASTORE_VERSION:
        raise BundleError(f"{path}: datastore version {version!r}, this edge-spec reads version {DATASTORE_VERSION}",
                          "update edge-spec, or re-export the bundle with this version (or --no-datastore)")
    for name in ("tokens", "documents"):
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BundleError(f"{path}: datastore.{name} is {value!r}, not an integer >= 0", _REEXPORT)
