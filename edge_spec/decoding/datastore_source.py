"""Where a target's datastore text comes from: its own regenerated answers, committed under
data/regenerated/<folder>/ (`<source>.jsonl.gz`: one {"key": sha256(prompt)[:20], "new": [ids]} row per prompt;
`target.json`: {"name", "content_sha256"} of the target that generated them; see data/README.md). Only the answers
("new") go in; the prompts are not stored there. A checkout has the folder; an installed wheel does not (then a
bundle exported from a checkout still carries its datastore.bin).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from edge_spec.contract.datastore_check import DATASTORE_FILE, datastore_entry
from edge_spec.decoding.datastore import Datastore

REGENERATED = Path(__file__).resolve().parents[2] / "data" / "regenerated"


def regenerated_folder(name: str, content_sha256: str | None = None, root: Path = REGENERATED) -> Path | None:
    """The folder whose target.json names this target (and, when given, its content hash); None when there is none."""
    if not root.is_dir():
        return None
    for stamp in sorted(root.glob("*/target.json")):
        try:
            recorded = json.loads(stamp.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if recorded.get("name") == name and content_sha256 in (None, recorded.get("content_sha256")):
            return stamp.parent
    return None


def read_answers(folder: Path) -> list[list[int]]:
    """Every answer's token ids, sources in name order, rows in file order."""
    docs = []
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            docs += [row["new"] for row in map(json.loads, f) if row.get("new")]
    return docs


def target_datastore(name: str, vocab_size: int, content_sha256: str | None = None,
                     root: Path = REGENERATED) -> Datastore | None:
    """The datastore built from this target's regenerated answers, or None when none are committed for it."""
    folder = regenerated_folder(name, content_sha256, root)
    return Datastore.build(read_answers(folder), vocab_size=vocab_size) if folder else None


def bundle_datastore(name: str, vocab_size: int, root: Path = REGENERATED):
    """The export hook (edge_spec.contract.bundle.DatastoreWriter): writes datastore.bin built from the regenerated
    answers of this target (matched by name and content hash) into the bundle's temp folder and returns the manifest
    entry; None when none are committed for it (the bundle then has no datastore)."""

    def write(tmp: Path, content_sha256: str) -> dict | None:
        folder = regenerated_folder(name, content_sha256, root)
        if folder is None:
            return None
        docs = read_answers(folder)
        store = Datastore.build(docs, vocab_size=vocab_size)
        store.save(tmp / DATASTORE_FILE)
        where = folder.relative_to(root.parent.parent) if folder.is_relative_to(root.parent.parent) else folder
        return datastore_entry(DATASTORE_FILE, len(store.tokens) - len(docs), len(docs), where.as_posix())

    return write


def load_bundle_datastore(folder: Path, entry: dict | None, vocab_size: int) -> Datastore | None:
    """A bundle's datastore (its manifest's `datastore` entry, already checked by read_manifest), or None."""
    return Datastore.load(Path(folder) / entry["file"], vocab_size=vocab_size) if entry else None
