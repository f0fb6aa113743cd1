"""Publishing a trained drafter folder atomically (the MTP and EAGLE-3 trainers both end here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable


def publish_folder(out: Path, write: Callable[[Path], None], report: dict) -> None:
    """`write(folder)` writes the drafter's files into a temp folder beside `out`; its training_report.json joins
    them; then the folder is renamed to `out` (replacing an earlier chunk's): no reader, and no crash, ever sees a
    drafter folder without its report or half of one."""
    partial = out.parent / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # left by a run killed while writing
    try:
        write(partial)
        (partial / "training_report.json").write_text(json.dumps(report, indent=2, default=float))
        if out.exists():
            old = out.parent / f".{out.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            out.replace(old)
            partial.replace(out)
            shutil.rmtree(old)
        else:
            partial.replace(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
