"""EAGLE-3 drafters in the native runner (issue 48): onnx bundles whose drafter kind is eagle3 run in the C++ runner
(runtimes/native/src/ort_backend.cpp OrtEagle3Drafter over eagle3.h's bookkeeping), against the Python runtime
runtimes/ort_eagle3.py on the same bundle.

Tiny random Speculators EAGLE-3 drafters for the tiny llama (tests/test_eagle3_speculative.py `drafter_for`), two of
Speculators' norm options and both exporters (tests/test_eagle3_onnx.py OPTIONS), exported as test_eagle3_onnx.py
exports them, the first again over a target with the `shared` KV binding, and an int4 bundle whose drafter gathers
the target's quantized table (the step graph's table inputs: the bundle's one copy, bound by the runner). One runner process per bundle serves every request (`--requests -`), so the drafter's own cache is
carried from one generation to the next as in the Python engine, which runs the same requests in the same order:

  * greedy speculative at k = 1, 2, 4 == plain greedy (native) == the Python runtime's tokens, with the same drafts
    accepted at every position (the drafter proposes what the Python one proposes), the host check applying;
  * a verifier that accepts every draft (wrong on purpose: the test build's --test-accept-all, Python's accept_all):
    the tokens are the drafts themselves, so they agree only if every burst rebuilds the committed rows from the
    target's states as the Python runtime does;
  * seeded rejection sampling: the drafter's logits decide every acceptance, so the tokens agree only if they do;
  * the C API (libedge_spec.so, no signature change: the bundle carries the drafter) generates the Python tokens.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.contract.bundle import export_bundle
from edge_spec.contract.manifest import EAGLE3, read_manifest
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import accept_all, generate_speculative
from edge_spec.loading import checkpoints
from edge_spec.runtimes.ort_eagle3 import OrtEagle3Drafter
from tests.test_eagle3_onnx import OPTIONS, with_target_table
from tests.test_eagle3_speculative import drafter_for
from tests.test_native import native, run  # noqa: F401 (the build fixture, the CLI helper)
from tests.test_native_ort import ort_native  # noqa: F401 (the build, with the onnx backend)

pytest.importorskip("onnxruntime")

GREEDY = SamplingParams()
TOKENS = 30


@pytest.fixture(autouse=True)
def host_check_cache(monkeypatch, tmp_path_factory):
    """The host check's cache (the Python runtime's and the runner's) in a folder of this test session."""
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "native-eagle3-cache"))


@pytest.fixture(scope="module")
def target(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


# test_eagle3_onnx.py's bundles (`io` KV binding), and the first one's drafter over a target with the `shared`
# binding (GroupQueryAttention writing the runner's caches in place; the drafter's own cache stays `io`)
# binding, and an int4 bundle whose drafter gathers the target's quantized table (the bundle's one copy)
BUNDLES = {name: (options, exporter, "io", "fp32") for name, (options, exporter) in OPTIONS.items()}
BUNDLES["norm_before_residual+shared"] = (*OPTIONS["norm_before_residual"], "shared", "fp32")
BUNDLES["norm_before_residual+target-table-int4"] = (*OPTIONS["norm_before_residual"], "io", "int4")


@pytest.fixture(scope="module", params=list(BUNDLES))
def eagle3_onnx(request, ort_native, target, tmp_path_factory):  # noqa: F811
    """An eagle3 onnx bundle (max_context 128), as tests/test_eagle3_onnx.py exports it for the same options."""
    options, exporter, binding, precision = BUNDLES[request.param]
    name = request.param.split("+")[0]
    drafter = drafter_for(target, seed=len(name), **options)
    if "target-table" in request.param:
        drafter = with_target_table(drafter, target)
    return export_bundle(target, tmp_path_factory.mktemp("native-eagle3") / "bundle", format="onnx", drafter=drafter,
                         max_context=128, exporter=exporter, binding=binding, precision=precision)


def prompt(seed: int, n: int = 12) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(4, 320, n)]


def serve(native, folder, requests: list[list[str]]) -> tuple[dict, list[dict]]:  # noqa: F811
    """One runner process (the test build: its hooks are allowed on request lines) over `requests` (each a list of
    generation flags) -> (its first line: runtime, min_rows, host check; one JSON result per request)."""
    lines = "".join(" ".join(map(str, r)) + "\n" for r in requests)
    command = [str(native / "edge-spec-run-test"), "--bundle", str(folder), "--threads", "2", "--requests", "-"]
    done = subprocess.run(command, input=lines, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr}"
    head, *results = [json.loads(line) for line in done.stdout.splitlines()]
    errors = [r for r in results if "error" in r]
    assert not errors, errors
    assert len(results) == len(requests)
    return head, results


def ids_flag(ids: list[int]) -> list[str]:
    return ["--prompt-ids", ",".join(map(str, ids))]


def test_the_bundle_carries_an_eagle3_drafter(eagle3_onnx):
    m = read_manifest(eagle3_onnx)
    assert m.drafter.kind == EAGLE3 and {"drafter", "drafter_fc"} <= set(m.graphs)


def test_greedy_speculative_equals_plain_and_the_python_runtime(ort_native, eagle3_onnx):  # noqa: F811
    """k = 1, 2, 4, two prompts each (the second drops the drafter rows of the first): the runner's greedy tokens ==
    its plain tokens == the Python runtime's, with the same drafts made and accepted at every position (acceptance
    counts, drafter calls and verify passes equal), and the host check's row mode the Python runtime's; edge-spec-run
    (the release binary, a fresh process) agrees."""
    fixed = ["--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", str(TOKENS)]
    runs = [(k, seed) for k in (1, 2, 4) for seed in range(2)]
    requests = [[*ids_flag(prompt(seed + 10 * k)), "--no-spec", *fixed] for k, seed in runs]
    requests += [[*ids_flag(prompt(seed + 10 * k)), "--spec-k", k, *fixed] for k, seed in runs]
    head, results = serve(ort_native, eagle3_onnx, requests)
    engine = load_bundle(eagle3_onnx, runtime="ort", threads=2)
    assert isinstance(engine.drafter, OrtEagle3Drafter)
    assert head["host_check"] is not None and head["min_rows"] == (engine.exactness.min_rows or 1)
    plain = [generate_plain(engine.session, prompt(seed + 10 * k), max_new_tokens=TOKENS, params=GREEDY,
                            rng=np.random.default_rng(0), stop_ids=frozenset()).tokens for k, seed in runs]
    for (k, seed), ours, want in zip(runs, results[:len(runs)], plain):
        assert not ours["speculative"] and ours["tokens"] == want, f"plain k={k} seed={seed}"
    for (k, seed), ours, want in zip(runs, results[len(runs):], plain):
        theirs = generate_speculative(engine.session, engine.drafter, prompt(seed + 10 * k), max_new_tokens=TOKENS,
                                      params=GREEDY, rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup=False)
        stats = theirs.extra["spec"]
        assert theirs.tokens == want
        assert ours["speculative"] and ours["tokens"] == want, f"k={k} seed={seed}: {ours['notice']}"
        assert ours["drafter_calls"] == stats.drafter_calls > 0, f"k={k} seed={seed}"
        assert ours["accepted"] == [int(a) for a in stats.accepted], f"k={k} seed={seed}"
        assert ours["drafted"] == [int(d) for d in stats.drafted] and ours["target_passes"] == stats.target_calls
    alone = run(ort_native, eagle3_onnx, prompt(20), "--spec-k", "2", *fixed)  # edge-spec-run, a fresh process
    assert alone["tokens"] == plain[2] and alone["accepted"] == results[len(runs) + 2]["accepted"]


def test_accepted_drafts_are_recomputed_as_in_python(ort_native, eagle3_onnx):  # noqa: F811
    """A verifier that accepts every draft (the test build's --test-accept-all; Python's accept_all): the tokens are
    the drafts themselves, so the runner and the Python runtime agree only if every burst commits and rebuilds the
    drafter's rows from the target's states alike. One process, one engine, in order: a prompt at k = 2 and 4 (its
    rows kept), the prompt with token 4 changed (rows 4.. dropped), with token 0 changed (every row dropped), a prefix
    of it (the rows past it dropped), then another prompt under the real verifier."""
    base = prompt(7, 9)
    prompts = [(base, 2), (base, 4), (base[:4] + [base[4] + 1] + base[5:], 4), ([base[0] + 1] + base[1:], 3),
               (base[:6], 4)]
    flags = ["--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", str(TOKENS)]
    requests = [[*ids_flag(ids), "--spec-k", k, "--test-accept-all", *flags] for ids, k in prompts]
    requests.append([*ids_flag(prompt(3)), "--spec-k", 3, *flags])
    _, results = serve(ort_native, eagle3_onnx, requests)
    engine = load_bundle(eagle3_onnx, runtime="ort", threads=2)
    for i, ((ids, k), ours) in enumerate(zip(prompts, results)):
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, verifier=accept_all)
        assert ours["tokens"] == theirs.tokens, f"request {i}: k={k}"
        assert ours["accepted"] == [int(a) for a in theirs.extra["spec"].accepted] and sum(ours["accepted"]) >= 10
    last = generate_speculative(engine.session, engine.drafter, prompt(3), max_new_tokens=TOKENS, params=GREEDY,
                                rng=np.random.default_rng(0), stop_ids=frozenset(), k=3, vocab_size=engine.vocab_size)
    assert results[-1]["tokens"] == last.tokens
    assert results[-1]["accepted"] == [int(a) for a in last.extra["spec"].accepted]


def test_seeded_rejection_sampling_draws_the_python_tokens(ort_native, eagle3_onnx):  # noqa: F811
    """Seeded sampling (edge_spec.decoding.portable_rng.PortableRng on both sides), speculative with rejection
    sampling at k = 2 and 3: the eagle3 drafter's logits over its reduced vocabulary (mapped to target ids) set every
    acceptance probability and residual draw, so the tokens agree only if its logits do."""
    from edge_spec.decoding.portable_rng import PortableRng

    ids = prompt(4, 9)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    flags = ["--temperature", 0.9, "--top-k", 40, "--top-p", 0.95, "--ignore-eos", "--max-new-tokens", TOKENS,
             "--fixed-k", "--no-lookup"]
    runs = [(seed, k) for seed in (3, 11) for k in (2, 3)]
    _, results = serve(ort_native, eagle3_onnx, [[*ids_flag(ids), "--seed", seed, "--spec-k", k, *flags]
                                                 for seed, k in runs])
    engine = load_bundle(eagle3_onnx, runtime="ort", threads=2)
    for (seed, k), ours in zip(runs, results):
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=params,
                                      rng=PortableRng(seed), stop_ids=frozenset(), k=k, vocab_size=engine.vocab_size)
        assert ours["tokens"] == theirs.tokens, f"seed={seed} k={k}"
        assert ours["accepted"] == [int(a) for a in theirs.extra["spec"].accepted]
        assert ours["target_passes"] == theirs.extra["spec"].target_calls


def test_c_api_program_generates_the_python_tokens(ort_native, eagle3_onnx):  # noqa: F811
    """runtimes/native/tests/c_api_test.c on an eagle3 bundle (the C API unchanged: the bundle carries the drafter):
    plain and speculative greedy == the Python runtime's plain tokens."""
    ids = prompt(5, 9)
    done = subprocess.run([str(ort_native / "c_api_test"), str(eagle3_onnx), ",".join(map(str, ids)), "24", "onnx"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    plain = load_bundle(eagle3_onnx, runtime="ort", threads=2).generate(ids, max_new_tokens=24, speculative=False)
    assert out["plain"] == out["spec"] == plain.tokens and out["failures"] == 0


def test_a_long_prompt_runs_in_chunks_as_in_python(ort_native, eagle3_onnx):  # noqa: F811
    """A prompt longer than kv.EAGLE3_FIRST_CHUNK: the runner's first step runs it in chunks as the Python runtime
    does (runtimes/ort_eagle3.py), so under an accept-all verifier (the tokens are the drafts) both give the same
    tokens and accepted counts."""
    from edge_spec.contract import kv

    ids = prompt(5, 2 * kv.EAGLE3_FIRST_CHUNK - 30)  # 98 tokens + 20 new in a 128-token context
    flags = ["--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", "20"]
    _, [ours] = serve(ort_native, eagle3_onnx, [[*ids_flag(ids), "--spec-k", 4, "--test-accept-all", *flags]])
    engine = load_bundle(eagle3_onnx, runtime="ort", threads=2)
    theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=20, params=GREEDY,
                                  rng=np.random.default_rng(0), stop_ids=frozenset(), k=4,
                                  vocab_size=engine.vocab_size, verifier=accept_all)
    assert ours["tokens"] == theirs.tokens and sum(ours["accepted"]) >= 10
    assert ours["accepted"] == [int(a) for a in theirs.extra["spec"].accepted]
