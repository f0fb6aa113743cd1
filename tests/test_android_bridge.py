"""The Android demo's bridge on the host JVM: android_demo's JNI library (app/src/main/cpp/edge_spec_jni.cpp over the
runner's C API) and its Kotlin runner class (app/src/main/java/dev/edgespec/runner, no android.* import), built here
by android_demo/host/build_host.sh into build/android-host (CMake host mode against the executorch wheel and the JDK's
jni.h; kotlinc from the npm kotlin-compiler) and driven by android_demo/host/BridgeCheck.kt on a desktop JDK.

What the APK would run, minus Android: greedy tokens through the Kotlin callback API and the blocking iterator ==
the Python runtime's; cancel from the listener, from another thread and from the iterator; the runner's errors
(missing / damaged bundle, bad arguments, context overflow) as EdgeSpecException with the runner's message; the
listener's own exception reaching the caller; a text prompt with 2-, 3- and 4-byte UTF-8 characters through the
chat template == Python's ids and tokens. The tiny .pte bundle (byte-level BPE tokenizer) runs in `make test`; the
SmolLM2 .pte ("Paris") in `make test-real` (its fixture depends on `smollm2` / `converted`).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.prereq import skip_or_fail

from edge_spec.api import load_bundle
from tests.parity import prompt_ids

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "android-host"
KOTLIN_VERSION = "2.4.20"


@pytest.fixture(scope="session")
def android_host():
    """(libedge_spec_jni.so, bridge-check.jar), built by android_demo/host/build_host.sh (incremental: seconds)."""
    missing = [tool for tool in ("cmake", "c++", "java") if shutil.which(tool) is None]
    kotlinc = ROOT / "build" / "kotlin" / "node_modules" / "kotlin-compiler" / "bin" / "kotlinc"
    if not kotlinc.exists() and shutil.which("npm") is None:
        missing.append("npm (for kotlin-compiler)")
    if missing:
        skip_or_fail(f"{', '.join(missing)} not found: the Android bridge cannot be built on this host "
                    "(apt-get install cmake g++ openjdk-17-jdk-headless npm)")
    done = subprocess.run(["bash", str(ROOT / "android_demo" / "host" / "build_host.sh")], capture_output=True,
                          text=True, env={**os.environ, "JOBS": "2"})
    assert done.returncode == 0, f"build_host.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return OUT / "cmake" / "libedge_spec_jni.so", OUT / "bridge-check.jar"


def bridge_check(android_host, bundle, ids, *flags, timeout=300):
    """Runs BridgeCheck on the host JVM -> its JSON report (asserting the process itself ran)."""
    library, jar = android_host
    command = ["java", f"-Dedgespec.jni.library={library}", "-cp", str(jar), "dev.edgespec.host.BridgeCheckKt",
               "--bundle", str(bundle), "--ids", ",".join(map(str, ids)), *map(str, flags)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{' '.join(command)} printed no report (exit {done.returncode}):\n{done.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert done.returncode == 0 and report["failures"] == [], f"self-checks failed: {report['failures']}\n{done.stderr}"
    return report


def write_byte_level_bpe(path, vocab_size):
    """A byte-level BPE tokenizer.json (the family SmolLM2 uses, which the runner's C++ tokenizer reads) for the tiny
    model: the tiny checkpoints' specials at ids 0..3, the 256 byte symbols, then merges up to vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<bos>"]  # as tests/tiny.py (tokenizer_config.json: ChatML)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "speculative decoding on the edge",
              "h\u00e9llo w\u00f6rld \u2713 \U0001F680"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.add_special_tokens(specials)
    assert tok.get_vocab_size() <= vocab_size
    tok.save(str(path))


@pytest.fixture(scope="module")
def llama_pte(tiny_llama_pte, tmp_path_factory):
    """The session's tiny llama .pte (tests/conftest.py: a clustered drafter, exported once for every test file that
    runs .pte bundles), copied with a byte-level BPE tokenizer.json of the same vocabulary re-recorded in its
    manifest, so text prompts (chat template, non-ASCII, emoji) cross the bridge too (the tiny checkpoints'
    word-level tokenizer is not one the runner reads). Tokens are ids to the model: the program is unchanged."""
    from edge_spec.contract.manifest import MANIFEST, sha256_file
    from tests.tiny import llama_config

    out = tmp_path_factory.mktemp("android") / "llama"
    shutil.copytree(tiny_llama_pte, out)
    write_byte_level_bpe(out / "tokenizer.json", llama_config().vocab_size)
    raw = json.loads((out / MANIFEST).read_text())
    path = out / "tokenizer.json"
    raw["files"]["tokenizer.json"] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (out / MANIFEST).write_text(json.dumps(raw))
    return out


def _damaged_copy(bundle, folder):
    from edge_spec.exporters.executorch import PROGRAM_FILE

    shutil.copytree(bundle, folder)
    program = folder / PROGRAM_FILE
    data = bytearray(program.read_bytes())
    data[-1] ^= 1  # same size, one bit flipped: the manifest's sha256 catches it
    program.write_bytes(bytes(data))
    return folder, program


def test_bridge_generates_the_python_tokens_cancels_and_raises_the_runners_errors(android_host, llama_pte, tmp_path):
    ids = prompt_ids(9, seed=2)
    engine = load_bundle(llama_pte, threads=2)
    expected = engine.generate(ids, max_new_tokens=24, speculative=False).tokens
    text_prompt = "h\u00e9llo w\u00f6rld \u2713 \U0001F680 the fox"  # 2-, 3- and 4-byte UTF-8 (JNI's modified UTF-8 differs)
    text_ids = engine.tokenizer.encode_prompt(text_prompt, chat=True)
    text_expected = engine.generate(text_ids, max_new_tokens=24, speculative=False)
    damaged, program = _damaged_copy(llama_pte, tmp_path / "damaged")
    report = bridge_check(android_host, llama_pte, ids, "--max-new", 24, "--spec-k", 2, "--damaged", damaged,
                          "--prompt", text_prompt, "--chat")

    # greedy == the Python runtime, plain (callback API) and speculative k=2 (blocking iterator), speculation used
    assert report["plain"] == expected
    assert report["spec"] == expected and report["spec_used"] is True and report["tau"] > 1.0
    assert report["host_check"] in ("exact-one-row", "exact-two-row") and report["notice"] == ""
    info = json.loads(report["info"])
    assert info["format"] == "executorch" and info["drafter"] is True and info["max_draft_len"] == 8

    # cancel: listener stop after 3 tokens, cancel() from another thread, TokenStream.cancel() after 3 reads
    assert report["listener_stop_tokens"] == 3
    assert 2 <= report["thread_cancel_tokens"] < 100
    # the queue holds two events (one token + the end slot, either may be a token) and a put() may be in flight when
    # cancel() lands: up to 3 more than read, the bound android_demo/host/BridgeCheck.kt checks (a 6 came up once)
    assert 3 <= report["stream_cancel_read"] <= 6

    # the runner's errors, as EdgeSpecException(code, message) with its words
    assert report["missing_error"]["status"] == "bundle"
    assert "/nonexistent/edge-spec-bundle does not exist" in report["missing_error"]["message"]
    assert report["damaged_error"]["status"] == "bundle"
    assert f"{program} is corrupt: its sha256 does not match the manifest" in report["damaged_error"]["message"]
    assert "exceeds this bundle's max draft length 8" in report["spec_k_error"]["message"]
    assert report["context_error"]["status"] == "context" and "context overflow" in report["context_error"]["message"]
    assert "temperature must be" in report["temperature_error"]["message"]
    assert "outside the vocabulary" in report["vocab_error"]["message"]
    assert report["checks"] >= 23

    # a text prompt (UTF-8 bytes through JNI, the runner's tokenizer and ChatML chat form): the Python runtime's
    # prompt length and tokens, speculative and plain, and the same text
    assert "text_error" not in report, report.get("text_error")
    assert report["text_prompt_tokens"] == len(text_ids)
    assert report["text_tokens"] == report["text_plain_tokens"] == text_expected.tokens
    assert report["text_spec_used"] is True
    assert report["text"] == text_expected.text


# ---- the real SmolLM2 (the `real` tier: this fixture depends on `smollm2` / `converted`) ------------------------
@pytest.fixture(scope="module")
def smollm2_android_pte(smollm2, converted):
    """SmolLM2-135M + the built-in drafter as one fp32 .pte (what `edge-spec export --format executorch` writes; ~8 min
    on 2 cores). Reuses tests/test_native.py's export when that ran earlier in the same session."""
    from edge_spec.api import load_export_drafter, resolve_drafter
    from edge_spec.exporters.executorch import export_bundle

    shared = converted.parent / "bundle-native-fp32"
    if (shared / "manifest.json").exists():
        return shared
    drafter = load_export_drafter(resolve_drafter("builtin", "smollm2-135m", fmt="executorch"), smollm2)
    return export_bundle(smollm2, converted.parent / "bundle-android-fp32", drafter=drafter, precision="fp32",
                         max_context=256)


def test_bridge_on_smollm2_equals_the_python_runtime(android_host, smollm2, smollm2_android_pte):
    """The real model through the Kotlin class and the JNI bridge: greedy plain and speculative == the Python runtime's
    tokens; the text prompt through the runner's tokenizer and chat template gives the same ids and tokens, tau > 1."""
    prompt = "What is the capital of France?"
    ids = smollm2.tokenizer.encode_prompt(prompt, chat=True)
    expected = load_bundle(smollm2_android_pte, threads=2).generate(ids, max_new_tokens=32, speculative=False).tokens
    report = bridge_check(android_host, smollm2_android_pte, ids, "--max-new", 32, "--spec-k", 4, "--long", 64,
                          "--prompt", prompt, "--chat", timeout=900)
    assert report["plain"] == expected and report["spec"] == expected
    assert report["spec_used"] is True and report["host_check"] in ("exact-one-row", "exact-two-row")
    assert "text_error" not in report, report.get("text_error")
    assert report["text_prompt_tokens"] == len(ids)
    assert report["text_tokens"] == expected and report["text_plain_tokens"] == expected
    assert report["text_spec_used"] is True and report["text_tau"] > 1.0
    assert "Paris" in report["text"]
