"""Size of one multifunction Core ML package vs the separate per-function packages it merges (weights deduplicated).

    .venv/bin/python scripts/coreml_package_size.py MODEL_FOLDER [--quant fp16] [--max-context 256] [--max-pass 9]

Exports MODEL_FOLDER (+ a random tiny drafter when --drafter random) with `edge-spec export --format coreml`'s exporter
and measures the temporary per-function packages right before they are merged and deleted.
"""

import argparse
import tempfile
from pathlib import Path

from edge_spec.loading import checkpoints
from edge_spec.exporters import coreml


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--quant", default="fp16")
    p.add_argument("--max-context", type=int, default=256)
    p.add_argument("--max-pass", type=int, default=9)
    args = p.parse_args()
    target = checkpoints.load(args.model)
    separate = {}
    rmtree = coreml.shutil.rmtree

    def measure_then_remove(path, *a, **k):  # the exporter removes its per-function packages after merging
        for package in Path(path).glob("*.mlpackage"):
            separate[package.stem] = folder_bytes(package)
        rmtree(path, *a, **k)

    coreml.shutil.rmtree = measure_then_remove
    with tempfile.TemporaryDirectory() as tmp:
        out = coreml.export_bundle(target, Path(tmp) / "b", precision=args.quant, max_context=args.max_context,
                                   max_pass=args.max_pass, max_draft_len=args.max_pass - 1)
        merged = folder_bytes(out / coreml.PACKAGE)
    total = sum(separate.values())
    print(f"{args.model} {args.quant}: {len(separate)} functions, separate packages {total / 1e6:.1f} MB "
          f"({', '.join(f'{k} {v / 1e6:.1f}' for k, v in sorted(separate.items()))}), one multifunction package "
          f"{merged / 1e6:.1f} MB ({total / merged:.1f}x smaller)")


if __name__ == "__main__":
    main()
