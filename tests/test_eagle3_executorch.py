"""EAGLE-3 drafters in ExecuTorch programs (issue 48): the target method returns the aux states (kv.AUX_HIDDEN), the
drafter is a step method and an fc method whose cache is the program's own buffers (exporters/executorch.py
`Program.eagle3_step`, draft layout `state`), run by runtimes/executorch.py ExecutorchEagle3Drafter.

A tiny random llama target and tiny random EAGLE-3 drafters (tests/test_eagle3_speculative.py `drafter_for`): fp32
with the target's table (the step gathers the program's embedding) and 8da4w with a table of its own. fp32: greedy
speculative == plain and the same drafts accepted as the eager runtime, including an accept-all verifier (every burst
rebuilds the committed rows from the target's states) and prompts longer than max_pass (the first step's rows run in
chunks); 8da4w: speculative == plain."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.contract.bundle import export_bundle
from edge_spec.contract.layout import kv_layout
from edge_spec.contract.manifest import EAGLE3, read_manifest
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import accept_all, generate_speculative
from edge_spec.runtimes.torch_eagle3 import eagle3_pair
from tests.test_eagle3_onnx import spec_equals_plain, target, with_target_table  # noqa: F401 (target: a fixture)
from tests.eagle3_checks import assert_accept_all_as_eager, assert_host_check_passes_and_speculates
from tests.test_eagle3_speculative import drafter_for
from tests.test_native import native  # noqa: F401 (the build fixture)
from tests.test_native_eagle3 import ids_flag, serve
from tests.tiers import long_variant

pytest.importorskip("executorch")

MAX_PASS = 6  # k <= 4; a 12-token prompt's first draft step runs its rows in two chunks
FORMS = {"fp32+target-table": "fp32", "8da4w+own-table": "8da4w"}


@pytest.fixture(autouse=True)
def host_check_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "eagle3-pte-cache"))


# fp32 in the fast tier; the 8da4w program is a variant (tests/tiers.py)
@pytest.fixture(scope="module", params=[f if f.startswith("fp32") else long_variant(f) for f in FORMS])
def exported(request, target, tmp_path_factory):
    """(bundle folder, the eager drafter it was exported from, precision)."""
    precision = FORMS[request.param]
    drafter = drafter_for(target, seed=3, norm_before_residual=True)
    if "target-table" in request.param:
        drafter = with_target_table(drafter, target)
    folder = export_bundle(target, tmp_path_factory.mktemp("eagle3-pte") / "bundle", format="executorch",
                           drafter=drafter, precision=precision, max_context=128, max_draft_len=4,
                           max_pass=MAX_PASS)
    return folder, drafter, precision


def test_manifest_records_the_eagle3_drafter_and_its_buffers(exported, target):
    folder, drafter, _ = exported
    m = read_manifest(folder)
    d = m.drafter
    assert d.kind == EAGLE3 and d.aux_layers == [0, 1, 3] and not d.kv_sharing
    draft = d.draft_layout
    assert draft.binding == kv.BINDING_STATE and draft.max_pass == MAX_PASS and draft.max_context == 129
    assert kv.aux_size(m.graphs["target"].io) == 3 * target.config.hidden_size
    assert (m.graphs["drafter"].method, m.graphs["drafter_fc"].method) == ("drafter", "drafter_fc")
    names = {t.name for t in m.graphs["drafter"].io.inputs}
    assert names == {kv.INPUT_IDS, kv.HIDDEN, kv.POSITION_IDS, kv.DRAFT_MASK}  # no cache in, no rows out


def _prompt(seed: int, n: int = 12) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(4, 320, n)]


def test_greedy_speculative_equals_plain_and_drafts_as_eager(exported, target):
    folder, drafter, precision = exported
    engine = load_bundle(folder, host_check=False)
    eager_backend, eager_drafter = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    for k in (1, 2, 4):
        for seed in range(2):  # a second prompt: the drafter's rows of the first are dropped
            prompt = _prompt(seed + 10 * k)
            plain, stats = spec_equals_plain(engine, prompt, k)
            if precision != "fp32":
                continue
            ref = generate_speculative(Session(eager_backend), eager_drafter, prompt, max_new_tokens=30,
                                       params=SamplingParams(), rng=np.random.default_rng(0),
                                       stop_ids=engine.stop_ids, k=k, vocab_size=target.config.vocab_size,
                                       lookup=False, adaptive=False)
            assert ref.tokens == plain.tokens
            assert list(stats.accepted) == list(ref.extra["spec"].accepted)  # the same drafts were accepted


def test_accepted_drafts_are_recomputed_as_eager(exported, target):
    """Every draft accepted (a wrong verifier on purpose): the program and the eager runtime give the same tokens only
    if every burst rebuilds the committed rows from the target's states alike, in the program's buffers."""
    folder, drafter, precision = exported
    if precision != "fp32":
        pytest.skip("compares drafts with the eager fp32 drafter")
    engine = load_bundle(folder, host_check=False)
    eager = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    for k in (2, 4):
        assert_accept_all_as_eager(engine, eager, _prompt(7, 9 + k), k, 30, target.config.vocab_size)


def test_the_host_check_passes_and_generate_speculates(exported):
    folder, _, _ = exported
    assert_host_check_passes_and_speculates(folder, _prompt(5), 20)


def test_the_native_runner_equals_the_python_runtime(native, exported):  # noqa: F811
    """The C++ runner (runtimes/native/src/executorch_backend.cpp ExecutorchEagle3Drafter over eagle3.h) on the same
    program, one process for every request: greedy speculative at k = 1, 2, 4 == plain == the Python runtime's tokens
    with the same drafts accepted, and an accept-all verifier (its rows rebuilt from the target's states, a prompt
    edited at token 4 dropping the rows after it)."""
    folder, _, _ = exported
    fixed = ["--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", "24"]
    base = _prompt(7, 9)
    cases = [(_prompt(k), k, False) for k in (1, 2, 4)]
    cases += [(base, 4, True), (base[:4] + [base[4] + 1] + base[5:], 2, True)]
    requests = [[*ids_flag(ids), "--spec-k", k, *(["--test-accept-all"] if every else []), *fixed]
                for ids, k, every in cases]
    _, results = serve(native, folder, requests)
    engine = load_bundle(folder, host_check=False)
    for (ids, k, every), ours in zip(cases, results):
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=24, params=SamplingParams(),
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup=False,
                                      **({"verifier": accept_all} if every else {}))
        assert ours["tokens"] == theirs.tokens, f"k={k} accept-all={every}: {ours.get('notice')}"
        stats = theirs.extra["spec"]
        assert ours["accepted"] == [int(a) for a in stats.accepted] and sum(ours["accepted"]) >= (10 if every else 0)
        assert ours["drafted"] == [int(d) for d in stats.drafted] and sum(ours["drafted"]) > 0
        if not every:
            plain = generate_plain(engine.session, ids, max_new_tokens=24, params=SamplingParams(),
                                   rng=np.random.default_rng(0), stop_ids=frozenset())
            assert ours["tokens"] == plain.tokens
