"""`edge-spec bench`: the option checks every runtime shares and the prompts, then the Python runtimes
(edge_spec.benchmark.bench) or, with `--runtime native`, the C++ runner (edge_spec.benchmark.native). Both measure and
report with bench's rows and tables, so native imports bench, and the choice between them lives here, above both.
"""

from __future__ import annotations

from pathlib import Path

from edge_spec.benchmark import bench, native
from edge_spec.errors import ConfigError

NATIVE = "native"  # --runtime native: the C++ runner (edge_spec/benchmark/native.py)


def main(args) -> int:
    prompts = check_args(args)
    if args.runtime == NATIVE:
        return native.main(args, prompts)
    return bench.main(args, prompts)


def check_args(args) -> list[dict]:
    """The checks every runtime shares; the prompts."""
    from edge_spec.train.evaluate import read_prompts

    if not args.spec_k or any(k < 1 for k in args.spec_k):
        raise ConfigError(f"--spec-k values must be >= 1, got {args.spec_k}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    return read_prompts(Path(args.prompts) if args.prompts else bench.DEFAULT_PROMPTS)[:args.num_prompts]
