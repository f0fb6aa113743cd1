"""exporters/coreml_passes.py: coremltools' pass pipelines validated once each, not after every pass - the same
program, and a broken program still refused."""

import pytest
import torch

ct = pytest.importorskip("coremltools")

from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY, register_pass  # noqa: E402

from edge_spec.exporters import coreml_passes  # noqa: E402

BROKEN = "edge_spec_test::drop_the_first_op"
if BROKEN not in PASS_REGISTRY:
    @register_pass(namespace="edge_spec_test")
    class drop_the_first_op(AbstractGraphPass):  # noqa: N801 (coremltools names passes by their class)
        """Leaves the program invalid: the op reading the dropped op's output sees a variable no op makes."""

        def apply(self, prog):
            block = prog.functions["main"]
            block.operations.remove(list(block.operations)[0])


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.RMSNorm(8)

    def forward(self, x):  # x [1, 4, 8] -> [1, 4, 8]
        return torch.softmax(self.norm(self.proj(x)) * 2.0 + x, dim=-1)


def _converted_text() -> str:
    torch.manual_seed(0)
    program = torch.export.export(Small().eval(), (torch.randn(1, 4, 8),)).run_decompositions()
    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                       skip_model_load=True)
    return str(model.get_spec())


def test_a_conversion_gives_coremltools_own_program_and_the_pipeline_is_put_back():
    original = PassPipelineManager.__dict__["apply_pipeline"]
    own = _converted_text()
    with coreml_passes.pipeline_checks():
        assert PassPipelineManager.apply_pipeline is coreml_passes.apply_pipeline
        ours = _converted_text()
    assert PassPipelineManager.__dict__["apply_pipeline"] is original
    assert ours == own


def test_a_pass_that_breaks_the_program_still_fails_the_pipeline():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def prog(x):
        y = mb.relu(x=x)
        return mb.add(x=y, y=y)

    with pytest.raises(ValueError, match="not visible"):  # caught by the validation after the last pass
        coreml_passes.apply_pipeline(prog, PassPipeline([BROKEN, "common::noop_elimination"], "test"))


def test_each_pass_validation_comes_back_with_the_environment(monkeypatch):
    monkeypatch.setenv(coreml_passes.EACH_PASS, "1")
    original = PassPipelineManager.__dict__["apply_pipeline"]
    with coreml_passes.pipeline_checks():
        assert PassPipelineManager.__dict__["apply_pipeline"] is original
