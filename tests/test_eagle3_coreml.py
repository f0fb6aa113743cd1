"""EAGLE-3 drafters in Core ML packages (issue 48): every `target_{T}` function also returns aux_hidden, the drafter is
`drafter_{T}` step and `drafter_fc_{T}` functions at the target's lengths over its own `io` cache
(exporters/coreml.py, exporters/static.py Eagle3StepFunction), run by runtimes/fixed_eagle3.py. On Linux the package
runs through the MIL reference executor (runtimes/coreml_mil.py), as tests/test_coreml.py runs MTP packages.

A tiny random llama target and tiny random EAGLE-3 drafters (tests/test_eagle3_speculative.py `drafter_for`): fp32
(norm_before_residual) and fp16 (fc_norm + norm_output). fp32: greedy speculative == plain and the same drafts
accepted as the eager runtime at k = 1, 2, 4, also with an accept-all verifier (every burst rebuilds the committed
rows from the target's states) and prompts longer than the longest function (a first step in chunks); fp16:
speculative == plain and the host check passes."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.contract.bundle import export_bundle
from edge_spec.contract.layout import kv_layout
from edge_spec.contract.manifest import EAGLE3, read_manifest
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.runtimes.coreml import EXECUTOR_ENV
from edge_spec.runtimes.fixed_eagle3 import front_pad_mask
from edge_spec.runtimes.torch_eagle3 import eagle3_pair
from tests.test_eagle3_onnx import spec_equals_plain, target  # noqa: F401 (target: a fixture)
from tests.eagle3_checks import assert_accept_all_as_eager, assert_host_check_passes_and_speculates
from tests.test_eagle3_speculative import drafter_for
from tests.tiers import long_variant

pytest.importorskip("coremltools")

MAX_PASS = 6  # lengths 1, 2, 3, 5, 6: a 10-token prompt's first draft step runs 6 rows, then 4 padded to 5
# name -> (precision, drafter options, KV binding); "state": the target's caches as MLState (fp16 states), the
# drafter's own cache still function IO
FORMS = {"fp32": ("fp32", {"norm_before_residual": True}, "io"),
         "fp16": ("fp16", {"fc_norm": True, "norm_output": True}, "io"),
         "fp32-state": ("fp32", {"norm_before_residual": True}, "state")}


@pytest.fixture(autouse=True)
def mil_executor(monkeypatch, tmp_path_factory):
    monkeypatch.setenv(EXECUTOR_ENV, "mil")
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "eagle3-coreml-cache"))


# fp32 `io` in the fast tier; the fp16 and `state` packages are variants (tests/tiers.py)
@pytest.fixture(scope="module", params=[f if f == "fp32" else long_variant(f) for f in FORMS])
def exported(request, target, tmp_path_factory):
    """(bundle folder, the eager drafter it was exported from, precision; "<precision>-state" for the state binding:
    its drafts are not eager's, the fp16 states round the target's caches)."""
    precision, options, binding = FORMS[request.param]
    drafter = drafter_for(target, seed=5, **options)
    folder = export_bundle(target, tmp_path_factory.mktemp("eagle3-coreml") / "bundle", format="coreml",
                           drafter=drafter, precision=precision, max_context=64, max_draft_len=4, max_pass=MAX_PASS,
                           binding=binding)
    return folder, drafter, precision if binding == "io" else f"{precision}-{binding}"


def _prompt(seed: int, n: int = 10) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(4, 320, n)]


def test_front_pad_mask_hides_pad_rows_from_real_rows():
    m = front_pad_mask(s=2, t=2, n=4, slots=5)[0, 0] == 0  # [4, 9] visible
    assert m[:, :2].all() and not m[:, 2:5].any()  # written slots only
    assert m[0, 5:].tolist() == [True, False, False, False] and m[1, 5:].tolist() == [False, True, False, False]
    assert m[2, 5:].tolist() == [False, False, True, False] and m[3, 5:].tolist() == [False, False, True, True]


def test_manifest_records_the_functions_at_every_length(exported, target):
    folder, _, _ = exported
    m = read_manifest(folder)
    assert m.drafter.kind == EAGLE3 and m.drafter.draft_layout.binding == kv.BINDING_IO
    lengths = m.graphs["target"].fixed["lengths"]
    assert m.graphs["drafter"].fixed["lengths"] == {t: f"drafter_{t}" for t in lengths}
    assert m.graphs["drafter_fc"].fixed["lengths"] == {t: f"drafter_fc_{t}" for t in lengths}
    assert kv.aux_size(m.graphs["target"].io) == 3 * target.config.hidden_size


def test_greedy_speculative_equals_plain_and_drafts_as_eager(exported, target):
    folder, drafter, precision = exported
    engine = load_bundle(folder, host_check=False)
    eager_backend, eager_drafter = eagle3_pair(target.model, drafter, kv_layout(target.config, 64))
    for k in (1, 2, 4):
        prompt = _prompt(k)
        plain, stats = spec_equals_plain(engine, prompt, k)
        if precision != "fp32":
            continue
        ref = generate_speculative(Session(eager_backend), eager_drafter, prompt, max_new_tokens=30,
                                   params=SamplingParams(), rng=np.random.default_rng(0), stop_ids=engine.stop_ids,
                                   k=k, vocab_size=target.config.vocab_size, lookup=False, adaptive=False)
        assert ref.tokens == plain.tokens
        assert list(stats.accepted) == list(ref.extra["spec"].accepted)  # the same drafts were accepted


def test_accepted_drafts_are_recomputed_as_eager(exported, target):
    """Every draft accepted (a wrong verifier on purpose): the package and the eager runtime give the same tokens only
    if every burst rebuilds the committed rows from the target's states alike."""
    folder, drafter, precision = exported
    if precision != "fp32":
        pytest.skip("compares drafts with the eager fp32 drafter")
    engine = load_bundle(folder, host_check=False)
    eager = eagle3_pair(target.model, drafter, kv_layout(target.config, 64))
    assert_accept_all_as_eager(engine, eager, _prompt(7), 4, 24, target.config.vocab_size)


def test_the_host_check_passes_and_generate_speculates(exported):
    folder, _, _ = exported
    assert_host_check_passes_and_speculates(folder, _prompt(5), 16)


def test_beside_the_state_binding_the_drafters_cache_stays_function_io(exported):
    """`--kv state`: the target functions declare the caches' states and return aux_hidden; the drafter's functions
    declare none (its own cache is IO, held by the runtime), and the manifest's draft layout says `io` (Core ML's
    Format.eagle3_state is False; ExecuTorch programs keep both)."""
    from edge_spec.runtimes.coreml_mil import load_functions

    folder, _, precision = exported
    if not precision.endswith("-state"):
        pytest.skip("the state binding's package")
    m = read_manifest(folder)
    assert m.layout.binding == kv.BINDING_STATE and m.drafter.draft_layout.binding == kv.BINDING_IO
    functions = load_functions(folder / m.graphs["target"].file)
    states = {name: sorted(fn.states) for name, fn in functions.items()}
    lengths = m.graphs["target"].fixed["lengths"]
    assert all(states[f"target_{t}"] == sorted(m.graphs["target"].fixed["states"]) for t in lengths)
    assert all(states[f"drafter_{t}"] == [] and states[f"drafter_fc_{t}"] == [] for t in lengths)


@pytest.mark.parametrize("fp32_compute", [True, pytest.param(False, marks=pytest.mark.xfail(
    strict=True, reason="the negative control: in fp16 compute aux * 4 overflows fp16 (65,504)"))])
def test_fc_multiplies_the_scaled_stream_back_in_fp32(target, tmp_path, fp32_compute):
    """An fp16 package carries the target's stream divided by a power of two (edge_spec.model.headroom); the fc
    function multiplies aux back before the norms and fc, in fp32 compute: aux values beyond fp16's range (gemma-3's
    stream reaches 104,061) come out as eager's fuse of the unscaled stream."""
    import torch

    from edge_spec.exporters import coreml, static
    from edge_spec.runtimes.coreml_mil import load_functions

    drafter = drafter_for(target, seed=2, norm_before_fc=True)
    width = drafter.cfg.num_aux * drafter.cfg.hidden_size
    aux = torch.randn(1, 3, width, generator=torch.Generator().manual_seed(0)) * 40_000  # > 65,504 in places
    ml = coreml.convert(static.Eagle3FcFunction(drafter, 4).eval(), (torch.zeros(1, 3, width),), ["aux_hidden"],
                        ["fused_hidden"], "fp16", "fc", fp32_compute=fp32_compute)
    ml.save(str(tmp_path / "fc.mlpackage"))
    got = next(iter(load_functions(tmp_path / "fc.mlpackage").values()))({"aux_hidden": (aux / 4).numpy()})
    want = drafter.fuse(aux).detach().numpy()
    assert np.abs(got["fused_hidden"] - want).max() <= 1e-3 * np.abs(want).max()
