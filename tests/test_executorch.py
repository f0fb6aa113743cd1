"""ExecuTorch export + runtime: one .pte, target and drafter methods sharing the KV buffers (the `state` binding).

Tiny random checkpoints (tests/tiny.py); each bundle is exported once per module (a tiny export takes ~1 min: most
of it XNNPACK's lowering of each delegated partition).
"""

import json

import numpy as np
import pytest

from edge_spec.loading import checkpoints
from edge_spec.contract import kv
from edge_spec.api import load_bundle
from edge_spec.contract.backend import DraftStep, Session
from edge_spec.cli import main
from edge_spec.errors import BundleError, ConfigError
from edge_spec.exporters.executorch import DRAFTER_METHOD, PROGRAM_FILE, TARGET_METHOD, export_bundle
from edge_spec.decoding.generate import generate_plain
from edge_spec.contract.manifest import MANIFEST, read_manifest, sha256_file
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from tests.parity import assert_drafter_matches_eager, assert_target_matches_eager, prompt_ids
from tests.test_onnx import differing_windows, host_checked_session, tiny_drafter

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def llama(tiny_llama_pte_pair):
    """Tiny llama + a clustered drafter scoring with the target's (tied) table (tests/conftest.py, shared)."""
    return tiny_llama_pte_pair


@pytest.fixture(scope="module")
def gemma(tiny_gemma4_pte_pair):
    """Tiny Gemma-4 (sliding rings of 6 + 9 = 15 slots, KV sharing) + a dense-head drafter (tests/conftest.py)."""
    return tiny_gemma4_pte_pair


@pytest.fixture(params=["llama", "gemma"])
def pair(request):
    return request.getfixturevalue(request.param)


def parts(folder):
    engine = load_bundle(folder, threads=2)
    return engine.session.backend, engine.drafter, engine


class OracleDrafter:
    """Proposes the known greedy continuation, wrong where `wrong(position)` says: always right, always wrong,
    every third wrong, or at random - accepted bursts, rejected ones, rewrites of rejected slots."""

    def __init__(self, continuation, prompt_len, wrong):
        self.continuation, self.prompt_len, self.wrong = continuation, prompt_len, wrong

    def begin(self, position, masks, n_cached):
        self.position, self.offset = position, 0

    def step(self, token, hidden):
        self.offset += 1
        pos = self.position + self.offset
        i = pos - self.prompt_len
        tok = self.continuation[i] if 0 <= i < len(self.continuation) else 4
        if self.wrong(pos):
            tok = 4 + (tok + 1) % 300
        return DraftStep(np.array([tok]), np.array([1.0], dtype=np.float32), hidden)


# ---- the bundle --------------------------------------------------------------------------------------
def test_manifest_records_one_program_with_two_methods_and_state_rings(llama, gemma):
    m = read_manifest(llama[0])
    assert (m.format, m.binding, m.layout.binding, m.precision) == ("executorch", "state", "state", "fp32")
    assert {g.file for g in m.graphs.values()} == {PROGRAM_FILE}
    assert (m.graphs["target"].method, m.graphs["drafter"].method) == (TARGET_METHOD, DRAFTER_METHOD)
    assert [t.name for t in m.graphs["target"].io.inputs] == ["input_ids", "position_ids", "mask.full"]
    assert not m.tables  # the drafter reads the target's table inside the program
    g = read_manifest(gemma[0])
    assert g.layout.max_pass == 9 and g.layout.slots(kv.SLIDING) == 6 + 9  # W + max_pass under `state`


# ---- parity ---------------------------------------------------------------------------------------
def test_target_logits_match_eager_through_commits_and_rewinds(pair):
    """The program writes every row of a pass (rejected ones too); KVState's masks hide the unaccepted ones."""
    assert_target_matches_eager(pair[0], pair[1], threads=2)


def test_drafter_steps_match_eager(pair):
    """The drafter method reads, in place, the cache buffers the target method wrote."""
    assert_drafter_matches_eager(*pair, threads=2)


# ---- exactness ----------------------------------------------------------------------------------
def test_verify_rows_are_bit_identical_to_decode_steps(pair):
    """XNNPACK picks microkernels per CPU too: the host check decides the row mode, and in it a verify pass gives
    the same bits as one-token steps, across bucket edges and (gemma) ring wraps."""
    folder = pair[0]
    session = host_checked_session(folder)
    windows = ((58, 6), (61, 5), (40, 2), (64, 4), (26, 9)) if session.state.layout.max_pass == 9 else \
        ((58, 6), (61, 5), (40, 2), (64, 4), (120, 9))
    assert differing_windows(session, prompt_ids(130, seed=5), windows) == []


@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_greedy_equals_plain_greedy(pair, k):
    folder = pair[0]
    engine = load_bundle(folder, threads=2)
    ids = prompt_ids(9, seed=1)
    plain = engine.generate(ids, max_new_tokens=40, speculative=False)
    spec = engine.generate(ids, max_new_tokens=40, spec_k=k)
    assert spec.tokens == plain.tokens and "spec" in spec.extra


@pytest.mark.parametrize("wrong", ["never", "always", "every third", "random"])
def test_rejected_drafts_written_into_the_state_never_change_later_tokens(gemma, wrong):
    """The program writes rejected drafts into its caches (rings included); whatever the drafter proposes, greedy
    speculative output through the program equals plain greedy output, over 70 tokens that wrap 15-slot rings."""
    session = load_bundle(gemma[0], threads=2).session
    prompt = prompt_ids(11, seed=1)
    expected = generate_plain(session, prompt, max_new_tokens=70, params=GREEDY, rng=np.random.default_rng(0),
                              stop_ids=frozenset()).tokens
    rng = np.random.default_rng(7)
    rule = {"never": lambda p: False, "always": lambda p: True, "every third": lambda p: p % 3 == 0,
            "random": lambda p: rng.random() < 0.4}[wrong]
    out = generate_speculative(session, OracleDrafter(expected, len(prompt), rule), prompt, max_new_tokens=70,
                               params=GREEDY, rng=np.random.default_rng(0), stop_ids=frozenset(), k=4, vocab_size=320)
    assert out.tokens == expected
    tau = out.extra["spec"].tau
    assert (tau > 4.0) if wrong == "never" else (tau == 1.0) if wrong == "always" else (1.0 < tau < 4.0)


# ---- bad input ----------------------------------------------------------------------------------
def _rehash(folder, rel):
    raw = json.loads((folder / MANIFEST).read_text())
    path = folder / rel
    raw["files"][rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))


@pytest.fixture()
def damaged(llama, tmp_path):
    import shutil

    dst = tmp_path / "bundle"
    shutil.copytree(llama[0], dst)
    return dst


def test_truncated_or_corrupt_programs_name_the_file(damaged):
    path = damaged / PROGRAM_FILE
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(BundleError, match=r"program\.pte is truncated"):
        load_bundle(damaged)
    _rehash(damaged, PROGRAM_FILE)  # checksums re-recorded: only executorch can tell now
    with pytest.raises(BundleError, match=r"program\.pte: executorch cannot load this program") as err:
        load_bundle(damaged)
    assert "re-export" in str(err.value)


def test_a_manifest_naming_a_missing_method_is_refused(damaged):
    raw = json.loads((damaged / MANIFEST).read_text())
    raw["graphs"]["drafter"]["method"] = "draft_step"
    (damaged / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=r"has no method 'draft_step'"):
        load_bundle(damaged)


def test_cli_export_generate_and_errors(tiny_llama, llama, tmp_path, capsys):
    assert main(["export", "--model", str(tiny_llama[0]), "--format", "executorch", "--quant", "int4",
                 "--out", str(tmp_path / "x")]) == 2
    assert "no precision 'int4'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    base = ["generate", "--bundle", str(llama[0]), "--prompt", "w5 w6 w7", "--max-new-tokens", "10", "--quiet",
            "--threads", "2"]
    assert main(base) == 0
    spec = capsys.readouterr()
    assert main(base + ["--no-spec"]) == 0
    plain = capsys.readouterr()
    assert spec.out == plain.out and "[executorch]" in spec.err and "tau" in spec.err
    assert main(base + ["--provider", "xnnpack"]) == 2
    assert "--provider applies to onnx and qnn bundles, not the executorch runtime" in capsys.readouterr().err
    assert main(["generate", "--bundle", str(llama[0]), "--runtime", "ort", "--prompt", "w5"]) == 2
    assert "does not run 'executorch' bundles" in capsys.readouterr().err


def test_8da4w_logits_within_bound_and_speculative_exact(llama, tmp_path):
    """int8 dynamic activations x int4 weights (groups of 32): logits within a relative bound of eager fp32 on the
    tiny random llama (set when torchao's symmetric int4 measured 6-9% of the logits' scale; the exact-code form
    of edge_spec.exporters.exact_int4 passes it too), top-1 agreement >= 0.85, and greedy
    speculative == plain through the quantized program."""
    _, target, drafter = llama
    folder = export_bundle(target, tmp_path / "q", drafter=drafter, precision="8da4w", max_context=64)
    assert read_manifest(folder).precision == "8da4w"
    engine = load_bundle(folder, threads=2)
    ref = Session(TorchBackend(target.model, engine.session.state.layout))
    ids = prompt_ids(24, seed=11)
    a, b = engine.session.forward(ids).logits, ref.forward(ids).logits
    assert np.abs(a - b).max() <= 0.25 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.85
    engine.session.reset()
    plain = engine.generate(ids[:8], max_new_tokens=24, speculative=False)
    assert engine.generate(ids[:8], max_new_tokens=24, spec_k=2).tokens == plain.tokens
    with pytest.raises(ConfigError, match="no precision"):
        export_bundle(target, tmp_path / "bad", precision="int8")


# ---- the real SmolLM2 ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_pte(smollm2, converted):
    """SmolLM2-135M + the built-in drafter as one fp32 .pte (~8 min to export on 2 cores, 3.2 GB peak RSS)."""
    from edge_spec.api import resolve_drafter
    from edge_spec.model.drafter import load_drafter

    drafter = load_drafter(resolve_drafter("builtin", "smollm2-135m"))
    return export_bundle(smollm2, converted.parent / "bundle-et-fp32", drafter=drafter, max_context=256)


def test_smollm2_pte_matches_eager_and_speculates_exactly(smollm2, smollm2_pte):
    """fp32 .pte logits as close to a float64 reference as eager fp32 is (the bound of test_onnx.py's SmolLM2 test),
    greedy output == eager's argmax, and greedy speculative == plain through the program at k = 2."""
    from tests.test_onnx import FP32_ERROR_RATIO, float64_logits

    engine = load_bundle(smollm2_pte, threads=2)
    ids = smollm2.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    plain = engine.generate(ids, max_new_tokens=16, speculative=False)
    assert "Paris" in plain.text
    sequence = ids + plain.tokens[:-1]
    engine.session.reset()
    ours = engine.session.forward(sequence).logits
    ref = Session(TorchBackend(smollm2.model, engine.session.state.layout)).forward(sequence).logits
    exact = float64_logits(smollm2.model, sequence)
    assert np.abs(ours - exact).max() <= FP32_ERROR_RATIO * np.abs(ref - exact).max()
    assert ref[len(ids) - 1:].argmax(-1).tolist() == plain.tokens
    spec = engine.generate(ids, max_new_tokens=16, spec_k=2)
    assert spec.tokens == plain.tokens and spec.extra["spec"].tau > 1.0


@pytest.mark.parametrize("fmt", ["executorch", "onnx"])
def test_e2b_sized_drafter_exports_and_matches_eager(e2b_pair, tmp_path, fmt):
    """The mission's drafter at its real size through the two CPU formats (the Core ML and QNN tests do the same for
    theirs): a random Gemma-4 E2B-assistant-shaped drafter (hidden 256, 4 layers [3 sliding, 1 full], vocab 262,144
    in 2,048 clusters, top 32) beside a 2-layer target of the same vocabulary (tests/tiny.e2b_pair): three draft steps
    through the bundle == eager (the clustered head's 4,096 candidates equal), export time, size and step time
    printed."""
    import importlib
    import resource
    import time


    target, drafter = e2b_pair
    start = time.perf_counter()
    export = importlib.import_module(f"edge_spec.exporters.{fmt}").export_bundle
    options = {"exporter": "torchscript"} if fmt == "onnx" else {}
    out = export(target, tmp_path / "bundle", drafter=drafter, precision="fp32", max_context=64, max_draft_len=2,
                 max_pass=3, **options)
    export_s = time.perf_counter() - start
    assert read_manifest(out).drafter.candidates_per_step == 32 * 262144 // 2048
    assert_drafter_matches_eager(out, target, drafter)
    engine = load_bundle(out, host_check=False)
    engine.session.prefill(prompt_ids(5))
    engine.drafter.begin(engine.session.length, engine.session.state.drafter_masks(), engine.session.length)
    hidden = np.zeros(target.config.hidden_size, np.float32)
    engine.drafter.step(5, hidden)
    start = time.perf_counter()
    for _ in range(3):
        engine.drafter.step(5, hidden)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
    print(f"\nE2B-sized drafter + shallow target -> {fmt} fp32: export {export_s:.0f} s, bundle {size:.0f} MB, drafter "
          f"step {(time.perf_counter() - start) / 3 * 1000:.1f} ms, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
