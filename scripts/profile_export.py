"""Where a tiny bundle's export spends its time: cProfile of `export_bundle` on a tests/tiny.py model and drafter, the
contract suite's shapes (tests/contract.py: passes of 1, 2, 3, 5 and 9 tokens for the fixed-shape formats).

    .venv/bin/python scripts/profile_export.py --format qnn --family gemma [--top 30]

Prints the export's wall time and the functions with the most cumulative time (issue #50: onnxruntime's calibrator
and quantizer took 139 of a tiny Gemma-4 QNN export's 190 s, docs/android-qnn.md).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_spec.contract.bundle import export_bundle  # noqa: E402
from edge_spec.loading import checkpoints  # noqa: E402
from tests.contract import DRAFTERS, ROWS, tiny_drafter  # noqa: E402
from tests.tiny import gemma4_config, llama_config, qwen3_config, save_reference  # noqa: E402

CONFIGS = {"llama": llama_config, "gemma": gemma4_config, "qwen3": qwen3_config}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="qnn")
    ap.add_argument("--family", default="gemma", choices=sorted(CONFIGS))
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    row = next((r for r in ROWS if (r.format, r.family) == (args.format, args.family)), None)
    if row is None:
        sys.exit(f"no contract row for {args.format} / {args.family} (tests/contract.py ROWS)")
    work = Path(tempfile.mkdtemp(prefix="profile-export-"))
    save_reference(CONFIGS[args.family](), work / "checkpoint")
    target = checkpoints.load(str(work / "checkpoint"))
    drafter = tiny_drafter(target.config, **DRAFTERS[args.family]) if row.drafter else None
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    export_bundle(target, work / "bundle", format=args.format, drafter=drafter, **row.export)
    profile.disable()
    print(f"{args.format} {args.family}: exported in {time.perf_counter() - start:.1f} s ({work / 'bundle'})")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
