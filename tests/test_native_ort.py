"""The native runner's onnxruntime backend (runtimes/native/src/ort_backend.cpp) against the Python runtime "ort".

The runner is built as tests/test_native.py builds it (its `native` fixture: CMake into build/native, what `make
native` runs); the onnx backend is in it when CMake found onnxruntime's library and headers, else every test here
skips saying why. Tiny random ONNX bundles (tests/tiny.py, the drafters of tests/test_onnx.py) are exported once per
module, int8 (llama also int4: the 4-bit table), as `edge-spec export --format onnx` writes them (the dynamo
exporter; llama also with `--kv shared`, and a tiny Gemma-3 under its default `shared`); the fp32 ones are the contract suite's (tests/contract.py). Every comparison is
token for token with the Python runtime on the same bundle: greedy plain and speculative (the drafter graph over the
runner's caches), rejected drafts, seeded rejection sampling (the drafter's logits decide), the host check's verdict,
the C API; damaged graphs and formats without a backend are refused naming the file and the fix.
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
from edge_spec.loading import checkpoints
from tests.parity import prompt_ids
from tests.test_native import native, run  # noqa: F401 (the build fixture, the CLI helper)

GREEDY = SamplingParams()
TOKENS = 40


def _export(folder, out, drafter_args, precisions=("fp32", "int8"), fp32=None, **export_args):
    """The bundles of `precisions`; `fp32`: the session's fp32 bundle of the same pair and arguments, where the
    contract suite exports one (tests/contract.py; this file shares test_onnx.py's worker for it)."""
    from edge_spec.exporters.onnx import export_bundle
    from tests.test_onnx import tiny_drafter

    target = checkpoints.load(str(folder))
    drafter = tiny_drafter(target.config, **drafter_args)
    return {precision: fp32 if precision == "fp32" and fp32 is not None else
            export_bundle(target, out / precision, drafter=drafter, precision=precision, **export_args)
            for precision in precisions}


# ---- the bundles and the backend ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_onnx(tiny_llama, tiny_bundles, tmp_path_factory):
    """Tiny llama + a clustered drafter scoring with the target's tied table (tests/test_onnx.py's `llama`)."""
    return _export(tiny_llama[0], tmp_path_factory.mktemp("native-ort") / "llama", dict(head_from="target"),
                   ("fp32", "int8", "int4"), fp32=tiny_bundles.get("onnx", "llama", "io")[0], max_context=160,
                   binding="io")


@pytest.fixture(scope="module")
def llama_shared_onnx(tiny_llama, tiny_bundles, tmp_path_factory):
    """The same llama pair with the `shared` KV binding: GroupQueryAttention writing the runner's caches in place."""
    return _export(tiny_llama[0], tmp_path_factory.mktemp("native-ort") / "llama-shared", dict(head_from="target"),
                   fp32=tiny_bundles.get("onnx", "llama", "shared")[0], max_context=160, binding="shared")


@pytest.fixture(scope="module")
def gemma_onnx(tiny_gemma4, tiny_bundles, tmp_path_factory):
    """Tiny Gemma-4 (sliding rings of 6 + 9 - 1 = 14 slots, KV sharing, per-layer inputs) + a dense-head drafter with
    its own output table."""
    return _export(tiny_gemma4[0], tmp_path_factory.mktemp("native-ort") / "gemma", dict(clustered=False),
                   fp32=tiny_bundles.get("onnx", "gemma", "io")[0], max_context=96, max_pass=9)


@pytest.fixture(scope="module")
def gemma3_shared_onnx(tmp_path_factory):
    """Tiny Gemma-3 (sliding window 6, heads of 256 as gemma-3-270m's) + a dense-head drafter under its default
    `shared` binding: GroupQueryAttention with the window as its local_window_size, slot == position caches (no ring)
    the drafter reads too, verify passes capped at the kernel's scoring edge (kv.pass_cap)."""
    from tests.tiny import gemma3_config, save_gemma3_reference

    folder = tmp_path_factory.mktemp("native-ort") / "gemma3"
    save_gemma3_reference(gemma3_config(head_dim=256, query_pre_attn_scalar=256), folder / "ckpt", seed=3)
    return _export(folder / "ckpt", folder, dict(clustered=False), ("fp32", "int4"), max_context=96, max_pass=9)


@pytest.fixture(scope="module")
def ort_native(native):  # noqa: F811
    """build/native when it has the onnx backend (its formats.txt, written by CMake, says so); a skip naming why not
    otherwise, before any export (the tests ask for this fixture first)."""
    formats = (native / "formats.txt").read_text().strip()
    if "onnx" not in formats.split():
        skip_or_fail(f"{native} was built without the onnx backend ({formats}); fix: install npm (apt-get install "
                    "npm) so CMake can fetch onnxruntime's headers, then make native")
    return native


@pytest.fixture(params=["llama-fp32", "llama-int8", "llama-int4", "llama_shared-fp32", "llama_shared-int8", "gemma-fp32", "gemma-int8",
                        "gemma3_shared-fp32", "gemma3_shared-int4"])
def bundle(request):
    name, precision = request.param.split("-")
    return request.getfixturevalue(f"{name}_onnx")[precision]


@pytest.fixture(params=["llama", "gemma"])
def fp32_bundle(request):
    return request.getfixturevalue(f"{request.param}_onnx")["fp32"]


def python_plain(folder, ids, n=TOKENS):
    """The Python runtime's ("ort") plain greedy tokens, stop tokens ignored, and its engine."""
    engine = load_bundle(folder, runtime="ort", threads=2)
    return generate_plain(engine.session, ids, max_new_tokens=n, params=GREEDY, rng=np.random.default_rng(0),
                          stop_ids=frozenset()).tokens, engine


# ---- greedy parity -----------------------------------------------------------------------------------------
def test_plain_and_speculative_greedy_equal_the_python_runtime(ort_native, bundle):
    """fp32, int8 and int4 (MatMulNBits; int4's 4-bit table gathered by plain ops), llama and Gemma-4: plain; fixed k = 1, 2, 4 with prompt lookup; k = 2 with the
    drafter graph alone (its proposals decide tau); adaptive: the C++ tokens == the Python runtime's plain tokens ==
    its speculative tokens, with the same tau and lookup passes as Python's loop."""
    ids = prompt_ids(9, seed=2)
    expected, engine = python_plain(bundle, ids)
    fixed = ["--fixed-k", "--ignore-eos", "--max-new-tokens", str(TOKENS)]
    assert run(ort_native, bundle, ids, "--no-spec", *fixed)["tokens"] == expected
    for k, lookup in ((1, True), (2, True), (4, True), (2, False)):
        ours = run(ort_native, bundle, ids, "--spec-k", str(k), *fixed, *([] if lookup else ["--no-lookup"]))
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup=lookup)
        assert ours["tokens"] == theirs.tokens == expected, f"k={k} lookup={lookup}"
        assert ours["speculative"] and ours["lookup_passes"] == theirs.extra["spec"].lookup_passes
        assert ours["tau"] == pytest.approx(theirs.extra["spec"].tau, abs=1e-6)
        assert ours["target_passes"] == theirs.extra["spec"].target_calls
    adaptive = run(ort_native, bundle, ids, "--spec-k", "4", "--adaptive", "--ignore-eos", "--max-new-tokens", str(TOKENS))
    assert adaptive["tokens"] == expected and adaptive["speculative"]


def test_passes_across_the_scoring_edge_are_capped_as_in_python(ort_native, gemma3_shared_onnx):
    """Heads of 256 under `shared`: from a 50-token prompt, drafts of the known continuation (all right) at k = 8
    across position 64 - the C++ loop cuts its passes where Python's does (kv.pass_cap): the same tokens (== plain)
    in the same passes. 27 tokens: 9 (positions 50-58), 4 (the cap at 59: 64 keys with the dummy row), 9, 4 (the
    last); uncut they take 3 passes."""
    from tests.contract import OracleDrafter

    bundle = gemma3_shared_onnx["int4"]
    ids = prompt_ids(50, seed=2)
    expected, engine = python_plain(bundle, ids, n=27)
    ours = run(ort_native, bundle, ids, "--spec-k", "8", "--fixed-k", "--no-lookup", "--ignore-eos",
               "--max-new-tokens", "27", "--test-oracle-drafts", ",".join(map(str, expected)), "--test-wrong", "never")
    theirs = generate_speculative(engine.session, OracleDrafter(expected, len(ids), lambda position: False), ids,
                                  max_new_tokens=27, params=GREEDY, rng=np.random.default_rng(0),
                                  stop_ids=frozenset(), k=8, vocab_size=engine.vocab_size)
    assert ours["tokens"] == theirs.tokens == expected
    assert ours["target_passes"] == theirs.extra["spec"].target_calls == 4


@pytest.mark.parametrize("wrong", ["never", "third", "random"])
def test_rejected_drafts_never_change_later_tokens(ort_native, fp32_bundle, wrong):
    """Drafts of the known continuation, wrong where told: the runner commits only accepted rows into its caches
    (70 tokens: the Gemma bundle's 14-slot rings wrap many times; the llama caches cross a 64-slot bucket edge), so
    the output is the plain greedy output whatever was proposed."""
    ids = prompt_ids(11, seed=1)
    expected, _ = python_plain(fp32_bundle, ids, n=70)
    ours = run(ort_native, fp32_bundle, ids, "--spec-k", "4", "--fixed-k", "--no-lookup", "--ignore-eos",
               "--max-new-tokens", "70", "--test-oracle-drafts", ",".join(map(str, expected)), "--test-wrong", wrong)
    assert ours["tokens"] == expected
    assert (ours["tau"] > 4.0) if wrong == "never" else (1.0 < ours["tau"] < 4.0)


def test_seeded_rejection_sampling_draws_the_python_tokens(ort_native, fp32_bundle):
    """Seeded sampling with edge_spec.decoding.portable_rng.PortableRng on both sides: plain, and speculative with
    rejection sampling, where the drafter graph's logits set every acceptance probability and residual draw."""
    from edge_spec.decoding.portable_rng import PortableRng

    ids = prompt_ids(9, seed=4)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
    engine = load_bundle(fp32_bundle, runtime="ort", threads=2)
    flags = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--ignore-eos", "--max-new-tokens", "30"]
    for seed in (3, 11):
        plain = generate_plain(engine.session, ids, max_new_tokens=30, params=params, rng=PortableRng(seed),
                               stop_ids=frozenset()).tokens
        assert run(ort_native, fp32_bundle, ids, "--no-spec", "--seed", str(seed), *flags)["tokens"] == plain
        spec = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=30, params=params,
                                    rng=PortableRng(seed), stop_ids=frozenset(), k=2, vocab_size=engine.vocab_size)
        ours = run(ort_native, fp32_bundle, ids, "--spec-k", "2", "--fixed-k", "--no-lookup", "--seed", str(seed), *flags)
        assert ours["tokens"] == spec.tokens and ours["target_passes"] == spec.extra["spec"].target_calls


def test_stop_tokens_end_generation_as_in_python(ort_native, gemma_onnx):
    engine = load_bundle(gemma_onnx["fp32"], runtime="ort", threads=2)
    for seed in (1, 3):
        ids = prompt_ids(9, seed=seed)
        plain = engine.generate(ids, max_new_tokens=30, speculative=False)
        ours = run(ort_native, gemma_onnx["fp32"], ids, "--spec-k", "2", "--max-new-tokens", "30")
        assert ours["tokens"] == plain.tokens and ours["stop"] == plain.stop_reason


# ---- the host check and the threads option --------------------------------------------------------------------
def _check(native, folder, threads):
    done = subprocess.run([str(native / "edge-spec-run"), "--bundle", str(folder), "--threads", str(threads),
                           "--check", "--fresh-check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_host_check_verdict_equals_the_python_runtime(ort_native, bundle):
    """The exactness probe through onnxruntime's C++ API on this CPU: the Python probe's row mode."""
    ours = _check(ort_native, bundle, 2)
    engine = load_bundle(bundle, runtime="ort", threads=2)
    assert ours["min_rows"] == (engine.exactness.min_rows or 0)
    assert ours["verdict"] in ("exact-one-row", "exact-two-row", "inexact") and len(ours["windows"]) >= 4
    assert ours["runtime"].startswith("onnxruntime ") and "2 intra-op threads" in ours["runtime"]


def test_threads_option_sets_the_intra_op_pool(ort_native, llama_onnx):
    """--threads N is onnxruntime's intra-op thread count (the host check's identity records it); one thread gives
    the same greedy tokens."""
    folder = llama_onnx["int8"]
    assert "1 intra-op threads" in _check(ort_native, folder, 1)["runtime"]
    ids = prompt_ids(9, seed=5)
    one = subprocess.run([str(ort_native / "edge-spec-run"), "--bundle", str(folder), "--prompt-ids",
                          ",".join(map(str, ids)), "--threads", "1", "--json", "--no-spec", "--max-new-tokens", "20",
                          "--ignore-eos"], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(one.stdout)["tokens"] == python_plain(folder, ids, n=20)[0]


# ---- the C API -------------------------------------------------------------------------------------------
def test_c_api_program_generates_the_python_tokens(ort_native, gemma_onnx):
    """runtimes/native/tests/c_api_test.c on an onnx bundle (libedge_spec.so picks the backend from the manifest):
    codes + messages, plain and speculative greedy via callbacks, cancel; its tokens == the Python runtime's."""
    ids = prompt_ids(9, seed=3)
    done = subprocess.run([str(ort_native / "c_api_test"), str(gemma_onnx["int8"]), ",".join(map(str, ids)), "24", "onnx"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    plain = load_bundle(gemma_onnx["int8"], runtime="ort", threads=2).generate(ids, max_new_tokens=24, speculative=False)
    assert out["plain"] == out["spec"] == plain.tokens
    assert out["failures"] == 0 and out["checks"] >= 12 and out["cancelled_after"] == 3


# ---- refusals ----------------------------------------------------------------------------------------------
def _rehash(folder, rel):
    raw = json.loads((folder / MANIFEST).read_text())
    path = folder / rel
    raw["files"][rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))


def _refusal(native, folder):
    done = run(native, folder, [5, 6, 7], "--max-new-tokens", "2", check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    return done.stderr


def test_damaged_onnx_bundles_and_other_formats_are_refused(ort_native, llama_onnx, gemma_onnx, tmp_path):
    """A graph onnxruntime cannot load, a graph of the wrong role (checksums re-recorded, so only the graph IO check
    can tell), and a format this runner has no backend for: refused with the file named and the fix."""
    folder = tmp_path / "bundle"
    shutil.copytree(llama_onnx["fp32"], folder)
    raw = json.loads((folder / MANIFEST).read_text())
    target = raw["graphs"]["target"]["file"]
    data = (folder / target).read_bytes()
    (folder / target).write_bytes(data[: len(data) // 2])
    _rehash(folder, target)
    err = _refusal(ort_native, folder)
    assert f"{folder / target}: onnxruntime " in err and "cannot load this graph" in err and "fix: re-export" in err
    for rel in (target, target + ".data"):  # another model's target graph (same table shape: it loads)
        shutil.copyfile(gemma_onnx["fp32"] / rel, folder / rel)
        _rehash(folder, rel)
    err = _refusal(ort_native, folder)
    assert f"{folder / target}: graph inputs [input_ids, position_ids, mask.full, mask.sliding" in err
    assert "differ from the manifest's [input_ids, position_ids, mask.full, k_cache.0" in err
    for rel in (target, target + ".data"):
        shutil.copyfile(llama_onnx["fp32"] / rel, folder / rel)
        _rehash(folder, rel)
    raw = json.loads((folder / MANIFEST).read_text())
    raw["format"], raw["drafter"] = "coreml", None  # coreml's io binding + a target-only manifest: a valid manifest
    del raw["graphs"]["drafter"]
    (folder / MANIFEST).write_text(json.dumps(raw))
    err = _refusal(ort_native, folder)
    assert "has no runtime for 'coreml' bundles (it runs executorch, onnx and qnn bundles)" in err and "fix:" in err


def test_eagle3_bundles_the_runner_cannot_run_are_refused(ort_native, tiny_llama, tmp_path):
    """EAGLE-3 drafters run in every shipped format (tests/test_native_eagle3.py, tests/test_native_eagle3_qnn.py;
    Core ML on Apple builds only): an onnx eagle3 manifest relabelled coreml is refused here for the backend this
    build lacks, not for its drafter; an eagle3 bundle whose target graph does not return the aux states the drafter
    reads is refused naming the fix, and so is one whose drafter entry names another target."""
    from edge_spec.contract.bundle import export_bundle
    from tests.test_eagle3_speculative import drafter_for

    target = checkpoints.load(str(tiny_llama[0]))
    folder = export_bundle(target, tmp_path / "eagle3", format="onnx", drafter=drafter_for(target), max_context=64,
                           exporter="torchscript")

    def edited(name, edit):
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        raw = json.loads((copy / MANIFEST).read_text())
        edit(raw)
        (copy / MANIFEST).write_text(json.dumps(raw))
        return copy

    err = _refusal(ort_native, edited("coreml", lambda raw: raw.update(format="coreml", precision="fp16")))
    assert "no runtime for 'coreml' bundles" in err and "eagle3 drafter" not in err, err

    def other_target(raw):  # an eagle3 drafter paired with another target (its check skipped eagle3 until 2026-12-07)
        raw["drafter"]["target_content_sha256"] = "0" * 64

    err = _refusal(ort_native, edited("other-target", other_target))
    assert "a drafter from another target" in err and "fix: export the drafter together with its own target" in err

    def drop_aux(raw):
        outs = raw["graphs"]["target"]["outputs"]
        outs[:] = [o for o in outs if o["name"] != "aux_hidden"]

    err = _refusal(ort_native, edited("no-aux", drop_aux))
    assert "the target graph has no aux_hidden output" in err and "--drafter EAGLE3_FOLDER" in err
