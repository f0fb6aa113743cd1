"""The native runner's qnn backend (runtimes/native/src/qnn_backend.cpp) against the Python runtime "qnn".

The runner is built as tests/test_native.py builds it (its `native` fixture: CMake into build/native); the qnn backend
is compiled with the onnx one, so every test here skips saying why when CMake found no onnxruntime. The bundles are
the session's tiny 16a8w qnn bundles (tests/contract.py: llama, context 64; Gemma-4 with 14-slot sliding rings,
context 48; the default two target graphs, of 5 tokens (decode steps and verify passes, padded) and 9 (the prefill
chunk), the host's float graph of position 0, the drafter step with its own tables), and the llama pair exported for
a phone (position 0 from a precomputed table). Every comparison is token for token with the Python runtime on the same bundle and provider:
  * provider cpu (the QDQ graphs on onnxruntime's CPU provider): greedy plain, speculative k = 1, 4 and 3 (verify
    passes of 2, 5 and 4 rows, the last padded to the graph of 5; the prompt's first pass: row 0 through the sink, 8
    rows padded to 9), drafts made wrong (rejected rows never committed), seeded rejection sampling, the host check's
    verdict, the C API (the provider from $EDGE_SPEC_QNN_PROVIDER), `edge-spec bench --runtime native --provider cpu`;
  * provider qnn (the context binaries on onnxruntime-qnn's simulated HTP; ~2 s a run on the tiny llama here): plain
    and speculative greedy;
and the refusals: no QNN plugin (the fix names the wheel and --provider cpu), an unknown provider, a graph that does
not fit the manifest's fixed shapes.
"""

import json
import shutil
import subprocess

import numpy as np
import pytest

from tests.prereq import skip_or_fail

from edge_spec.api import load_bundle
from edge_spec.contract.manifest import MANIFEST, sha256_file
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from tests.parity import prompt_ids
from tests.test_native import native, run  # noqa: F401 (the build fixture, the CLI helper)

GREEDY = SamplingParams()
TOKENS = 30  # prompt 9 + 30 (+ a verify pass of 5) fits the gemma bundle's context of 48


@pytest.fixture(scope="module")
def qnn_native(native):  # noqa: F811
    """build/native when it has the qnn backend (its formats.txt, written by CMake, says so); a skip naming why not
    otherwise, before any export (the tests ask for this fixture first)."""
    formats = (native / "formats.txt").read_text().strip()
    if "qnn" not in formats.split():
        skip_or_fail(f"{native} was built without the qnn backend ({formats}; it needs onnxruntime): fix: install npm "
                    "(apt-get install npm) so CMake can fetch onnxruntime's headers, then make native")
    return native


@pytest.fixture(scope="module")
def llama(tiny_bundles):
    return tiny_bundles.get("qnn", "llama")[0]


@pytest.fixture(scope="module")
def gemma(tiny_bundles):
    return tiny_bundles.get("qnn", "gemma")[0]


@pytest.fixture(params=["llama", "gemma"])
def bundle(request):
    return request.getfixturevalue(request.param)


_ENGINES = {}


def python_engine(folder, provider):
    """The Python runtime's engine on `provider` (2 threads, host-checked), loaded once per module."""
    key = (str(folder), provider)
    if key not in _ENGINES:
        _ENGINES[key] = load_bundle(folder, provider=provider, threads=2)
    return _ENGINES[key]


def python_plain(folder, provider, ids, n=TOKENS):
    engine = python_engine(folder, provider)
    return generate_plain(engine.session, ids, max_new_tokens=n, params=GREEDY, rng=np.random.default_rng(0),
                          stop_ids=frozenset()).tokens


def python_spec(folder, provider, ids, k, n=TOKENS, params=GREEDY, rng=None, lookup=True):
    engine = python_engine(folder, provider)
    return generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=n, params=params,
                                rng=rng or np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                vocab_size=engine.vocab_size, lookup=lookup)


def runq(native, folder, ids, provider, *flags, check=True):  # noqa: F811
    return run(native, folder, ids, "--provider", provider, *flags, check=check)


# ---- greedy parity -----------------------------------------------------------------------------------------
def test_plain_and_speculative_greedy_equal_the_python_runtime_on_the_cpu_provider(qnn_native, bundle):
    """The QDQ graphs on the CPU provider, llama and Gemma-4: plain; fixed k = 1 and 4 with prompt lookup (verify
    passes of 2 and 5 rows); k = 3 with the drafter graph alone (4 rows padded to 5): the C++ tokens == the Python
    runtime's plain tokens == its speculative tokens, with the same tau, target passes and drafter calls; the host
    check's verdict on this CPU is Python's."""
    ids = prompt_ids(9, seed=2)
    expected = python_plain(bundle, "cpu", ids)
    fixed = ["--fixed-k", "--ignore-eos", "--max-new-tokens", str(TOKENS)]
    plain = runq(qnn_native, bundle, ids, "cpu", "--no-spec", *fixed)
    assert plain["tokens"] == expected
    assert plain["host_check"] == ("exact-one-row" if python_engine(bundle, "cpu").exactness.min_rows == 1
                                   else "exact-two-row")
    for k, lookup in ((1, True), (4, True), (3, False)):
        ours = runq(qnn_native, bundle, ids, "cpu", "--spec-k", str(k), *fixed, *([] if lookup else ["--no-lookup"]))
        theirs = python_spec(bundle, "cpu", ids, k, lookup=lookup)
        assert ours["tokens"] == theirs.tokens == expected, f"k={k} lookup={lookup}"
        assert ours["speculative"] and ours["target_passes"] == theirs.extra["spec"].target_calls
        assert ours["tau"] == pytest.approx(theirs.extra["spec"].tau, abs=1e-6)
        assert ours["drafter_calls"] == theirs.extra["spec"].drafter_calls


@pytest.mark.parametrize("wrong", ["third", "random"])
def test_rejected_drafts_never_change_later_tokens(qnn_native, bundle, wrong):
    """Drafts of the known continuation made wrong where told: the runner commits only the accepted rows of a padded
    verify pass (gemma: its 14-slot rings wrap), so the output is the plain greedy output."""
    ids = prompt_ids(11, seed=1)
    expected = python_plain(bundle, "cpu", ids)
    ours = runq(qnn_native, bundle, ids, "cpu", "--spec-k", "4", "--fixed-k", "--no-lookup", "--ignore-eos",
                "--max-new-tokens", str(TOKENS), "--test-oracle-drafts", ",".join(map(str, expected)),
                "--test-wrong", wrong)
    assert ours["tokens"] == expected and 1.0 < ours["tau"] < 5.0


def test_seeded_rejection_sampling_draws_the_python_tokens(qnn_native, llama):
    """Seeded sampling (edge_spec.decoding.portable_rng.PortableRng on both sides), speculative k = 2: the drafter
    graph's logits set every acceptance probability and residual draw."""
    from edge_spec.decoding.portable_rng import PortableRng

    ids = prompt_ids(9, seed=4)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    flags = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--ignore-eos", "--max-new-tokens", "24"]
    spec = python_spec(llama, "cpu", ids, 2, n=24, params=params, rng=PortableRng(5), lookup=False)
    ours = runq(qnn_native, llama, ids, "cpu", "--spec-k", "2", "--fixed-k", "--no-lookup", "--seed", "5", *flags)
    assert ours["tokens"] == spec.tokens and ours["target_passes"] == spec.extra["spec"].target_calls


# ---- the HTP (onnxruntime-qnn's simulator on x86-64) ------------------------------------------------------------
def test_the_htp_provider_generates_the_python_tokens(qnn_native, llama):
    """The context binaries on the QNN EP (the plugin registered from the onnxruntime-qnn wheel, CPU fallback
    disabled): plain and speculative k = 2 greedy == the Python runtime on the same provider; the identity names the
    HTP and the plugin."""
    ids = prompt_ids(9, seed=2)
    expected = python_plain(llama, "qnn", ids, n=16)
    flags = ["--fixed-k", "--ignore-eos", "--max-new-tokens", "16"]
    assert runq(qnn_native, llama, ids, "qnn", "--no-spec", *flags)["tokens"] == expected
    ours = runq(qnn_native, llama, ids, "qnn", "--spec-k", "2", *flags)
    theirs = python_spec(llama, "qnn", ids, 2, n=16)
    assert ours["tokens"] == theirs.tokens == expected and ours["target_passes"] == theirs.extra["spec"].target_calls
    check = subprocess.run([str(qnn_native / "edge-spec-run"), "--bundle", str(llama), "--threads", "2", "--check"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr
    runtime = json.loads(check.stdout)["runtime"]  # stdout is the JSON alone (the QNN libraries print when they load)
    assert runtime.startswith("qnn 16a8w QDQ on HTP sm8650 (v75), onnxruntime-qnn 2.7.0") and "native" in runtime


# ---- the C API -------------------------------------------------------------------------------------------
def test_c_api_program_generates_the_python_tokens(qnn_native, gemma):
    """runtimes/native/tests/c_api_test.c on the gemma bundle, the provider from $EDGE_SPEC_QNN_PROVIDER (the C API's
    open options carry none): plain and speculative greedy via callbacks, cancel; its tokens == the Python runtime's."""
    import os

    ids = prompt_ids(9, seed=3)
    done = subprocess.run([str(qnn_native / "c_api_test"), str(gemma), ",".join(map(str, ids)), "24", "qnn"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "EDGE_SPEC_QNN_PROVIDER": "cpu"})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    plain = python_engine(gemma, "cpu").generate(ids, max_new_tokens=24, speculative=False)
    assert out["plain"] == out["spec"] == plain.tokens
    assert out["failures"] == 0 and out["checks"] >= 12 and out["cancelled_after"] == 3


# ---- edge-spec bench --runtime native ------------------------------------------------------------------------
def test_bench_runs_the_runner_on_the_provider_it_is_given(qnn_native, llama, tmp_path):
    """`edge-spec bench --runtime native --provider cpu` passes the provider on to the runner (--requests -): its rows
    are the runner's (greedy exact on both prompts), their host-check identity names the CPU provider."""
    from edge_spec.cli import main
    from tests.test_bench_native import PROMPTS

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(PROMPTS)
    assert main(["bench", "--bundle", str(llama), "--runtime", "native", "--native-bin",
                 str(qnn_native / "edge-spec-run"), "--prompts", str(prompts), "--spec-k", "1", "3",
                 "--max-new-tokens", "12", "--threads", "2", "--provider", "cpu", "--json",
                 str(tmp_path / "b.json")]) == 0
    rows = json.loads((tmp_path / "b.json").read_text())
    assert [r["k"] for r in rows] == [1, 3] and all(r["greedy_exact_prompts"] == 2 for r in rows)
    assert all(r["runtime"] == "native-qnn" and "QDQ on CPU provider" in r["host_check"]["runtime"] for r in rows)


# ---- refusals ----------------------------------------------------------------------------------------------
def test_a_phone_bundle_reads_position_0_from_its_table(qnn_native, tiny_qnn_phone):
    """--qnn-position0 table (no host graph, QDQ graphs or weights.data): on the simulated HTP the runner's plain and
    speculative k = 2 tokens == the Python runtime's for a prompt starting with a table token, its identity says so,
    its host check passes; a prompt starting otherwise runs with the notice on stderr; --provider cpu is refused."""
    phone, _ = tiny_qnn_phone
    ids = [1] + prompt_ids(8, seed=2)
    expected = python_plain(phone, "qnn", ids, n=12)
    flags = ["--fixed-k", "--ignore-eos", "--max-new-tokens", "12"]
    plain = runq(qnn_native, phone, ids, "qnn", "--no-spec", *flags)
    assert plain["tokens"] == expected and plain["host_check"] == "exact-one-row"
    assert runq(qnn_native, phone, ids, "qnn", "--spec-k", "2", *flags)["tokens"] == expected
    other = run(qnn_native, phone, [17, 42, 99], "--provider", "qnn", "--max-new-tokens", "3", check=False)
    assert other.returncode == 0 and "precomputes position 0 only for first tokens [1, 3]" in other.stderr
    check = subprocess.run([str(qnn_native / "edge-spec-run"), "--bundle", str(phone), "--threads", "2", "--check"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0 and "position 0 precomputed for tokens [1, 3]" in json.loads(check.stdout)["runtime"]
    err = _refusal(qnn_native, phone, "--provider", "cpu")
    assert "was exported for a phone (--qnn-position0 table)" in err and "--provider qnn" in err


def _refusal(native, folder, *flags):  # noqa: F811
    done = run(native, folder, [5, 6, 7], "--max-new-tokens", "2", *flags, check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    return done.stderr


def test_a_missing_plugin_and_an_unknown_provider_are_refused(qnn_native, llama, tmp_path):
    """--provider qnn without the QNN EP plugin fails naming the wheel to install and --provider cpu (which still
    runs); $EDGE_SPEC_QNN_EP points elsewhere the same way; a provider the qnn runtime lacks is refused."""
    import os

    missing = tmp_path / "onnxruntime_qnn" / "libonnxruntime_providers_qnn.so"
    err = _refusal(qnn_native, llama, "--provider", "qnn", "--qnn-ep", str(missing))
    assert f"the QNN execution provider is not installed: no plugin library {missing}" in err
    assert "fix: pip install onnxruntime-qnn==2.7.0" in err and "--provider cpu" in err
    done = subprocess.run([str(qnn_native / "edge-spec-run"), "--bundle", str(llama), "--prompt-ids", "5,6,7",
                           "--max-new-tokens", "2", "--json"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "EDGE_SPEC_QNN_EP": str(missing)})
    assert done.returncode == 2 and "no plugin library" in done.stderr
    assert runq(qnn_native, llama, [5, 6, 7], "cpu", "--qnn-ep", str(missing), "--max-new-tokens", "2")["tokens"]
    err = _refusal(qnn_native, llama, "--provider", "xnnpack")
    assert "the qnn runtime has no provider 'xnnpack'" in err and "--provider cpu" in err


def test_a_graph_that_does_not_fit_the_fixed_shapes_is_refused(qnn_native, llama, tmp_path):
    """target_5's QDQ graph replaced by target_9's (checksums re-recorded, so only the IO check can tell): refused
    naming the file, the tensor and the shape the manifest's fixed lengths make it."""
    folder = tmp_path / "bundle"
    shutil.copytree(llama, folder)
    rel = "qnn/target_5.qdq.onnx"
    shutil.copyfile(folder / "qnn/target_9.qdq.onnx", folder / rel)
    raw = json.loads((folder / MANIFEST).read_text())
    raw["files"][rel] = {"sha256": sha256_file(folder / rel), "bytes": (folder / rel).stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))
    err = _refusal(qnn_native, folder, "--provider", "cpu")
    assert f"{folder / rel}: graph input input_ids is int32[1, 9], the manifest's fixed shapes make it int32[1, 5]" \
        in err
    assert "fix: re-export the bundle: edge-spec export --format qnn" in err
