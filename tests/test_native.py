"""The native runner (runtimes/native: C++ over the manifest, ExecuTorch's C++ runtime) against the Python runtime.

Built once per session with CMake into build/native (what `make native` runs); tiny random .pte bundles (tests/tiny.py)
exported once per module. Every comparison is token for token: the C++ loop's greedy output == the Python runtime's,
plain and speculative (k = 1, 2, 4, fixed and adaptive, with prompt lookup), and with a drafter that proposes the known
continuation made wrong never / always / every third position / at random (accepted bursts, rejected ones, rejected
rows rewritten in the program's rings). Damaged bundles are refused with the file named, as the Python loader does.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.prereq import skip_or_fail

from edge_spec.loading import checkpoints
from edge_spec.api import load_bundle
from edge_spec.decoding.generate import generate_plain
from edge_spec.contract.manifest import MANIFEST, sha256_file
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from tests.parity import prompt_ids

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "native"
GREEDY = SamplingParams()
TOKENS = 40


# ---- the build and the bundles ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def native():
    """build/native/{edge-spec-run, edge-spec-run-test (with the test hooks), c_api_test, kv_vectors_test},
    configured and built as `make native` does; one build at a time (a lock beside the folder: pytest-xdist workers
    that both ask for it wait for one another, and the second finds it up to date)."""
    import fcntl

    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        skip_or_fail(f"{' and '.join(missing)} not found: the native runner cannot be built here "
                    "(apt-get install cmake g++)")
    configure = ["cmake", "-S", str(ROOT / "runtimes" / "native"), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DES_PYTHON={sys.executable}"]
    BUILD.parent.mkdir(parents=True, exist_ok=True)
    with open(BUILD.parent / "native.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for command in (configure, ["cmake", "--build", str(BUILD), "-j2"]):
            done = subprocess.run(command, capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return BUILD


def _tiny_drafter(cfg, **kwargs):
    from tests.test_onnx import tiny_drafter

    return tiny_drafter(cfg, **kwargs)


def _shared(request, name):
    """A session-wide export of the same bundle, where tests/conftest.py defines one (saves ~1 min per bundle)."""
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        return None


@pytest.fixture(scope="module")
def llama_pte(request, tiny_llama, tmp_path_factory):
    """Tiny llama + a clustered drafter scoring with the target's tied table (as tests/test_executorch.py)."""
    from edge_spec.exporters.executorch import export_bundle

    shared = _shared(request, "tiny_llama_pte")
    if shared is not None:
        return shared
    target = checkpoints.load(str(tiny_llama[0]))
    drafter = _tiny_drafter(target.config, head_from="target")
    return export_bundle(target, tmp_path_factory.mktemp("native") / "llama", drafter=drafter, max_context=160)


@pytest.fixture(scope="module")
def gemma_pte(request, tiny_gemma4, tmp_path_factory):
    """Tiny Gemma-4 (sliding rings of 6 + 9 slots, KV sharing, per-layer inputs) + a dense-head drafter."""
    from edge_spec.exporters.executorch import export_bundle

    shared = _shared(request, "tiny_gemma4_pte")
    if shared is not None:
        return shared
    target = checkpoints.load(str(tiny_gemma4[0]))
    drafter = _tiny_drafter(target.config, clustered=False)
    return export_bundle(target, tmp_path_factory.mktemp("native") / "gemma", drafter=drafter, max_context=96,
                         max_pass=9)


@pytest.fixture(params=["llama", "gemma"])
def bundle(request):
    return request.getfixturevalue(f"{request.param}_pte")


def run(native, folder, ids, *flags, check=True):
    """edge-spec-run --json on token ids -> its JSON line (or the CompletedProcess when check=False). The test-only
    flags (--test-oracle-drafts, --test-wrong) run the test build, edge-spec-run-test: edge-spec-run has no hooks."""
    binary = "edge-spec-run-test" if any(str(f).startswith("--test-") for f in flags) else "edge-spec-run"
    command = [str(native / binary), "--bundle", str(folder), "--prompt-ids", ",".join(map(str, ids)),
               "--threads", "2", "--json", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if not check:
        return done
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr}"
    return json.loads(done.stdout)


def python_plain(folder, ids, n=TOKENS):
    """The Python runtime's plain greedy tokens, without stop tokens (n tokens: the rings wrap several times)."""
    engine = load_bundle(folder, threads=2)
    return generate_plain(engine.session, ids, max_new_tokens=n, params=GREEDY, rng=np.random.default_rng(0),
                          stop_ids=frozenset()).tokens, engine


# ---- greedy parity with the Python runtime -------------------------------------------------------------------
def test_plain_and_speculative_greedy_equal_the_python_runtime(native, bundle):
    """Plain, fixed k = 1, 2, 4 and adaptive (prompt lookup on, as `edge-spec generate`): the C++ tokens == the
    Python runtime's plain tokens == its speculative tokens; the lookup passes and tau agree with Python's loop."""
    ids = prompt_ids(9, seed=2)
    expected, engine = python_plain(bundle, ids)
    assert run(native, bundle, ids, "--no-spec", "--ignore-eos", "--max-new-tokens", str(TOKENS))["tokens"] == expected
    for k in (1, 2, 4):
        ours = run(native, bundle, ids, "--spec-k", str(k), "--fixed-k", "--ignore-eos", "--max-new-tokens", str(TOKENS))
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup=True)
        assert ours["tokens"] == theirs.tokens == expected, f"k={k}"
        assert ours["speculative"] and ours["lookup_passes"] == theirs.extra["spec"].lookup_passes
        assert ours["tau"] == pytest.approx(theirs.extra["spec"].tau, abs=1e-6)
    adaptive = run(native, bundle, ids, "--spec-k", "4", "--adaptive", "--ignore-eos", "--max-new-tokens", str(TOKENS))
    assert adaptive["tokens"] == expected and adaptive["speculative"]


def test_stop_tokens_end_generation_as_in_python(native, gemma_pte):
    """With the bundle's EOS as the stop token (no --ignore-eos): same tokens and stop reason as Engine.generate."""
    engine = load_bundle(gemma_pte, threads=2)
    for seed in (1, 3):
        ids = prompt_ids(9, seed=seed)
        plain = engine.generate(ids, max_new_tokens=30, speculative=False)
        ours = run(native, gemma_pte, ids, "--spec-k", "2", "--max-new-tokens", "30")
        assert ours["tokens"] == plain.tokens and ours["stop"] == plain.stop_reason


@pytest.mark.parametrize("wrong", ["never", "always", "third", "random"])
def test_rejected_drafts_written_into_the_state_never_change_later_tokens(native, bundle, wrong):
    """A drafter proposing the known continuation, wrong where told: whatever it proposes, the C++ loop's output
    is the plain greedy output (70 tokens: the 15-slot rings of the Gemma bundle wrap many times), and tau says how
    many drafts were accepted (all / none / some)."""
    ids = prompt_ids(11, seed=1)
    expected, _ = python_plain(bundle, ids, n=70)
    ours = run(native, bundle, ids, "--spec-k", "4", "--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", "70",
               "--test-oracle-drafts", ",".join(map(str, expected)), "--test-wrong", wrong)
    assert ours["tokens"] == expected
    tau = ours["tau"]
    assert (tau > 4.0) if wrong == "never" else (tau == 1.0) if wrong == "always" else (1.0 < tau < 4.0)


def test_host_check_verdict_equals_the_python_runtime(native, bundle):
    """The exactness probe on this CPU, through ExecuTorch's C++ kernels: the same row mode as Python's probe."""
    ours = json.loads(subprocess.run([str(native / "edge-spec-run"), "--bundle", str(bundle), "--threads", "2",
                                      "--check", "--fresh-check"], capture_output=True, text=True, check=True).stdout)
    engine = load_bundle(bundle, threads=2)
    assert ours["min_rows"] == (engine.exactness.min_rows or 0)
    expected = {1: "exact-one-row", 2: "exact-two-row"}.get(engine.exactness.min_rows, "inexact")
    assert ours["verdict"] == expected and len(ours["windows"]) >= 4


# ---- the C API -------------------------------------------------------------------------------------------
def test_c_api_program_generates_the_python_tokens(native, llama_pte):
    """tests/c_api_test.c: open, bad arguments (codes + messages), plain and speculative greedy via callbacks,
    a callback that cancels; its plain tokens == the Python runtime's."""
    ids = prompt_ids(9, seed=3)
    done = subprocess.run([str(native / "c_api_test"), str(llama_pte), ",".join(map(str, ids)), "24"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    plain = load_bundle(llama_pte, threads=2).generate(ids, max_new_tokens=24, speculative=False)
    assert out["plain"] == out["spec"] == plain.tokens
    assert out["failures"] == 0 and out["checks"] >= 12 and out["cancelled_after"] == 3


# ---- damaged bundles ---------------------------------------------------------------------------------------
def _rehash(folder, rel):
    raw = json.loads((folder / MANIFEST).read_text())
    path = folder / rel
    raw["files"][rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))


def _refusal(native, folder):
    done = run(native, folder, [5, 6, 7], "--max-new-tokens", "2", check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    return done.stderr


def test_damaged_bundles_are_refused_with_the_file_named(native, llama_pte, tmp_path):
    from edge_spec.exporters.executorch import PROGRAM_FILE

    folder = tmp_path / "bundle"
    shutil.copytree(llama_pte, folder)
    program = folder / PROGRAM_FILE
    data = program.read_bytes()
    program.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert f"{program} is corrupt: its sha256 does not match the manifest" in _refusal(native, folder)
    program.write_bytes(data[:len(data) // 2])
    assert f"{program} is truncated or altered" in _refusal(native, folder)
    _rehash(folder, PROGRAM_FILE)  # checksums re-recorded: only executorch can tell now
    err = _refusal(native, folder)
    assert f"{program}: executorch cannot load this program" in err and "re-export" in err
    program.write_bytes(data)
    _rehash(folder, PROGRAM_FILE)
    raw = json.loads((folder / MANIFEST).read_text())
    raw["graphs"]["drafter"]["method"] = "draft_step"
    (folder / MANIFEST).write_text(json.dumps(raw))
    assert "has no method 'draft_step'" in _refusal(native, folder)
    raw["graphs"]["drafter"]["method"] = "drafter"
    raw["drafter"]["target_content_sha256"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(raw))
    assert "a drafter from another target" in _refusal(native, folder)
    raw["schema_version"] = 99
    (folder / MANIFEST).write_text(json.dumps(raw))
    assert "schema_version 99" in _refusal(native, folder)
    (folder / MANIFEST).unlink()
    assert f"{folder / MANIFEST} is missing" in _refusal(native, folder)


def test_bad_arguments_fail_before_any_work(native, llama_pte):
    assert "exceeds this bundle's max draft length 8" in run(native, llama_pte, [5, 6], "--spec-k", "9",
                                                             check=False).stderr
    assert "context overflow" in run(native, llama_pte, [5, 6], "--max-new-tokens", "500", check=False).stderr
    assert "temperature must be" in run(native, llama_pte, [5, 6], "--temperature", "-1", check=False).stderr
    assert "outside the vocabulary" in run(native, llama_pte, [5, 100000], check=False).stderr
    # --provider chooses a qnn bundle's qnn | cpu (tests/test_native_qnn.py); the executorch backend has none
    err = run(native, llama_pte, [5, 6], "--provider", "cpu", check=False).stderr
    assert "the native executorch backend has no provider 'cpu'" in err


# ---- seeded sampling: one portable RNG in both languages ------------------------------------------------------
def test_seeded_sampling_draws_the_python_tokens(native, bundle):
    """edge_spec.decoding.portable_rng.PortableRng and the runner's PortableRng (SplitMix64) give the same uniforms, and the
    sampling maths is the same float64 recipe: a seeded run samples the Python loop's tokens, plain and speculative
    (rejection sampling over the drafter's sampled drafts)."""
    from edge_spec.decoding.portable_rng import PortableRng

    ids = prompt_ids(9, seed=4)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    engine = load_bundle(bundle, threads=2)
    flags = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--ignore-eos", "--max-new-tokens", "30"]
    for seed in (3, 11):
        plain = generate_plain(engine.session, ids, max_new_tokens=30, params=params, rng=PortableRng(seed),
                               stop_ids=frozenset()).tokens
        assert run(native, bundle, ids, "--no-spec", "--seed", str(seed), *flags)["tokens"] == plain
        spec = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=30, params=params,
                                    rng=PortableRng(seed), stop_ids=frozenset(), k=2, vocab_size=engine.vocab_size)
        ours = run(native, bundle, ids, "--spec-k", "2", "--fixed-k", "--no-lookup", "--seed", str(seed), *flags)
        assert ours["tokens"] == spec.tokens and ours["target_passes"] == spec.extra["spec"].target_calls


def test_portable_rng_is_splitmix64():
    from edge_spec.decoding.portable_rng import PortableRng

    rng = PortableRng(0)
    assert [rng.next_u64() for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]  # the published sequence
    assert 0.0 <= PortableRng(7).random() < 1.0


# ---- shared KV vectors ------------------------------------------------------------------------------------
VECTORS = ROOT / "runtimes" / "native" / "tests" / "vectors" / "kv_cases.json"


def _vector_writer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_kv_vectors", VECTORS.parents[1] / "make_kv_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kv_vectors_are_what_edge_spec_kv_computes():
    """The committed vectors == what edge_spec/contract/kv.py computes now (a contract change regenerates them:
    .venv/bin/python runtimes/native/tests/make_kv_vectors.py runtimes/native/tests/vectors/kv_cases.json)."""
    assert json.loads(VECTORS.read_text()) == json.loads(json.dumps(_vector_writer().vectors())), (
        "edge_spec/contract/kv.py changed: regenerate the shared vectors and make runtimes/native/src/kv.cpp pass them")


def test_argmax_equals_its_one_pass_definition_in_cpp(native):
    """The greedy rule's argmax (two vectorizable passes) == the lowest index of the maximum, NaNs and ties included."""
    done = subprocess.run([str(native / "argmax_test")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "all equal" in done.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="mincore's residency bits are Linux's")
def test_only_the_cache_slots_in_use_are_resident_in_cpp(native):
    """es::IoCaches maps its buffers lazily: writing the first bucket of SmolLM2's 94 MB of caches leaves the rest
    out of memory (runtimes/native/tests/io_caches_test.cpp; tests/test_io_caches.py checks the Python caches)."""
    done = subprocess.run([str(native / "io_caches_test")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pages resident" in done.stdout


def test_kv_vectors_pass_in_cpp(native):
    done = subprocess.run([str(native / "kv_vectors_test"), str(VECTORS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "all equal" in done.stdout


# ---- the real SmolLM2 (the `real` tier: these fixtures depend on `smollm2` / `converted`) ---------------------
@pytest.fixture(scope="module", params=["fp32", "8da4w"])
def smollm2_native_pte(request, smollm2, converted):
    """SmolLM2-135M + the built-in drafter as one .pte (fp32: ~8 min to export on 2 cores; 8da4w: longer)."""
    from edge_spec.api import load_export_drafter, resolve_drafter
    from edge_spec.exporters.executorch import export_bundle

    drafter = load_export_drafter(resolve_drafter("builtin", "smollm2-135m", fmt="executorch"), smollm2)
    return export_bundle(smollm2, converted.parent / f"bundle-native-{request.param}", drafter=drafter,
                         precision=request.param, max_context=256)


def test_smollm2_native_equals_the_python_runtime(native, smollm2, smollm2_native_pte):
    """The real model through ExecuTorch's C++ kernels: greedy plain and speculative (k = 1, 2, 4, fixed; adaptive
    with lookup) == the Python runtime's tokens; the C++ tokenizer's chat prompt == Python's ids; tau > 1 at fixed k."""
    ids = smollm2.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    engine = load_bundle(smollm2_native_pte, threads=2)
    plain = engine.generate(ids, max_new_tokens=32, speculative=False)
    assert run(native, smollm2_native_pte, ids, "--no-spec", "--max-new-tokens", "32")["tokens"] == plain.tokens
    for k in ("1", "2", "4"):
        ours = run(native, smollm2_native_pte, ids, "--spec-k", k, "--fixed-k", "--max-new-tokens", "32")
        assert ours["tokens"] == plain.tokens, f"k={k}"
    assert ours["tau"] > 1.0  # k = 4, fixed: the drafts are the drafter's, so is tau (the answer is ~10 tokens)
    # adaptive: the cost model picks k from measured times, so its tau varies run to run (1.0 once on 2026-12-07,
    # when one rejected burst priced drafting out of a 10-token answer); its tokens do not
    ours = run(native, smollm2_native_pte, ids, "--spec-k", "4", "--max-new-tokens", "32")
    assert ours["tokens"] == plain.tokens
    done = subprocess.run([str(native / "edge-spec-run"), "--bundle", str(smollm2_native_pte), "--threads", "2",
                           "--prompt", "What is the capital of France?", "--chat", "--max-new-tokens", "32", "--json"],
                          capture_output=True, text=True, timeout=300)
    if "built without the C++ tokenizer" in done.stderr:
        pytest.skip("edge-spec-run was built without runtimes/native/tokenizer")
    assert done.returncode == 0, done.stderr
    text_run = json.loads(done.stdout)
    assert text_run["prompt_tokens"] == len(ids) and text_run["tokens"] == plain.tokens and "Paris" in text_run["text"]
