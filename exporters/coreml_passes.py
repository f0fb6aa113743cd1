"""coremltools' MIL pass pipelines, validated where it matters rather than after every pass.

coremltools 9.0's `PassPipelineManager.apply_pipeline` re-validates the whole program after each of the ~110 passes
of a conversion (`Program.validate` walks every op's inputs, 8.3M calls in a tiny Gemma-4 package): 73 of a tiny
Core ML export's 209 s (`scripts/profile_export.py --format coreml --family gemma`). `pipeline_checks()` swaps in the
same loop with the same checks at the points that can fail: the program before the pipeline, the essential-scope check
after each dead-code elimination (as coremltools does: the one pass after which it asks for it), and the whole
program after the last pass. An invalid program still fails the export; what is lost is only the name of the pass
that broke it, which `EDGE_SPEC_COREML_VALIDATE_EACH_PASS=1` restores (coremltools' own loop).
"""

from __future__ import annotations

import contextlib
import os

DCE = "common::dead_code_elimination"
EACH_PASS = "EDGE_SPEC_COREML_VALIDATE_EACH_PASS"


def apply_pipeline(prog, pipeline) -> None:
    """coremltools' pass loop with validation before, after each dead-code elimination, and after the last pass."""
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    pipeline.validate()
    prog.validate()
    for name in pipeline.passes:
        graph_pass = PASS_REGISTRY[name]
        graph_pass.set_options(pipeline.get_options(name))
        graph_pass(prog)
        if name == DCE:
            prog.validate(check_essential_scope=True)
    if not pipeline.passes or pipeline.passes[-1] != DCE:
        prog.validate()


@contextlib.contextmanager
def pipeline_checks():
    """Within: every coremltools pass pipeline runs through `apply_pipeline` (unless EACH_PASS is set)."""
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    if os.environ.get(EACH_PASS) == "1":
        yield
        return
    original = PassPipelineManager.__dict__["apply_pipeline"]
    PassPipelineManager.apply_pipeline = staticmethod(apply_pipeline)
    try:
        yield
    finally:
        PassPipelineManager.apply_pipeline = original
