"""The native runner's Core ML backend (runtimes/native/src/coreml_backend.mm, coreml_model.mm): what of it can be
checked on Linux, where neither the Objective-C++ against Apple's SDK nor Core ML itself can run.

- The format-neutral half it stands on (runtimes/native/src/fixed.cpp: padding to the exported lengths, masks, the
  `state` write slots, the `io` commits; tensor.cpp: strided and fp16 reads) equals runtimes/fixed.py, through the
  shared vectors tests/vectors/fixed_cases.json (written by make_fixed_vectors.py) replayed in C++.
- The two .mm files pass a clang syntax check (Objective-C++, ARC, blocks, warnings as errors) against stand-in
  Foundation / CoreML declarations (runtimes/native/tests/objc), and a misspelled selector fails it; CMakeLists.txt's
  `if(APPLE)` branch, forced on Linux, compiles them with -fobjc-arc and C++17 into object files.
- A Linux build refuses coreml bundles naming the fix, and the `--compute-units` option is checked as the Python
  CLI checks it (its values; refused for other formats).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prereq import skip_or_fail

from edge_spec.contract import kv
from edge_spec.contract.atomic import write_bundle
from edge_spec.contract.manifest import GraphEntry, Manifest, ModelEntry
from edge_spec.runtimes import fixed
from tests.test_native import native  # noqa: F401 (the build fixture)

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "runtimes" / "native"
VECTORS = NATIVE / "tests" / "vectors" / "fixed_cases.json"
SYNTAX_CHECK = NATIVE / "tests" / "objc" / "check_coreml_syntax.sh"
CLANGS = ("clang++", "clang++-19", "clang++-18", "clang++-17", "clang++-16", "clang++-15", "clang++-14")


def _vector_writer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixed_vectors", NATIVE / "tests" / "make_fixed_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixed_vectors_are_what_runtimes_fixed_computes():
    """The committed vectors == what runtimes/fixed.py computes now (a change there regenerates them:
    .venv/bin/python runtimes/native/tests/make_fixed_vectors.py runtimes/native/tests/vectors/fixed_cases.json)."""
    assert json.loads(VECTORS.read_text()) == json.loads(json.dumps(_vector_writer().vectors())), (
        "runtimes/fixed.py changed: regenerate the shared vectors and make runtimes/native/src/fixed.cpp pass them")


def test_fixed_vectors_pass_in_cpp(native):  # noqa: F811
    done = subprocess.run([str(native / "fixed_vectors_test"), str(VECTORS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "all equal" in done.stdout


# ---- the Objective-C++ -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clang():
    found = next((c for c in CLANGS if shutil.which(c)), None)
    if found is None:
        pytest.skip("no clang++ here: the Objective-C++ syntax check needs clang (fix: apt-get install clang)")
    return found


def test_coreml_backend_passes_the_syntax_check(clang):
    done = subprocess.run(["bash", str(SYNTAX_CHECK), clang], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "coreml syntax check: 2 Objective-C++ file(s) + engine.cpp (ES_HAVE_COREML) pass" in done.stdout


def test_the_syntax_check_fails_on_a_misspelled_selector(clang, tmp_path):
    """Negative control: the check is a real one (an unknown selector is an error under ARC)."""
    for name in ("coreml_model.mm", "coreml_model.h"):
        shutil.copyfile(NATIVE / "src" / name, tmp_path / name)
    damaged = tmp_path / "coreml_model.mm"
    text = damaged.read_text()
    assert "getBytesWithHandler:" in text
    damaged.write_text(text.replace("getBytesWithHandler:", "getBytesWithHandlr:"))
    done = subprocess.run(["bash", str(SYNTAX_CHECK), clang, str(damaged)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "no visible @interface for 'MLMultiArray' declares the selector 'getBytesWithHandlr:'" in done.stderr


def test_the_cmake_apple_branch_compiles_the_backend(clang, tmp_path):
    """CMakeLists.txt's `if(APPLE)` branch, taken on Linux with -DAPPLE=1 and the stand-in headers: it enables
    OBJCXX, lists coreml in formats.txt, and compiles the two .mm files (with -fobjc-arc from the source property:
    without it they #error) and engine.cpp with ES_HAVE_COREML into object files. Nothing is linked (no frameworks)."""
    if shutil.which("cmake") is None or shutil.which("make") is None:
        skip_or_fail("cmake / make not found (apt-get install cmake make)")
    build = tmp_path / "apple"
    configure = ["cmake", "-S", str(NATIVE), "-B", str(build), f"-DES_PYTHON={sys.executable}", "-DES_WITH_ORT=OFF",
                 "-DAPPLE=1", f"-DCMAKE_OBJCXX_COMPILER={shutil.which(clang)}",
                 f"-DCMAKE_OBJCXX_FLAGS=-isystem {NATIVE / 'tests' / 'objc' / 'include'} -fblocks "
                 "-fobjc-runtime=macosx-15.0"]
    done = subprocess.run(configure, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "with the Core ML backend" in done.stdout
    assert (build / "formats.txt").read_text().split() == ["executorch", "coreml"]
    objects = ["src/coreml_model.o", "src/coreml_backend.o", "src/engine.o"]
    done = subprocess.run(["make", "-C", str(build), "VERBOSE=1", *objects], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    compiles = [line for line in done.stdout.splitlines() if "-x objective-c++" in line]
    assert len(compiles) == 2 and all("-fobjc-arc" in c and "-std=c++17" in c and "-DES_HAVE_COREML" in c
                                      for c in compiles), done.stdout[-3000:]
    for name in ("coreml_model.mm.o", "coreml_backend.mm.o", "engine.cpp.o"):
        assert (build / "CMakeFiles" / "edge_spec_runner.dir" / "src" / name).stat().st_size > 0


# ---- a Linux build: coreml bundles refused, --compute-units checked --------------------------------------------
def _fake_bundle(out: Path, fmt: str) -> Path:
    """A manifest the runner reads and verifies (contract IO, checksums), over a placeholder package: enough for
    every refusal that comes before Core ML would load anything."""
    layout = kv.KVLayout((kv.CacheSpec(0, kv.FULL, 2, 4, 32, None), kv.CacheSpec(1, kv.FULL, 2, 4, 32, None)), 32, 9,
                         kv.BINDING_IO)
    lengths = fixed.pass_lengths(4, 9)
    package = "coreml/program.mlpackage" if fmt == "coreml" else "target.onnx"

    def build(tmp: Path) -> Manifest:
        (tmp / package).parent.mkdir(parents=True, exist_ok=True)
        if fmt == "coreml":
            (tmp / package).mkdir()
            (tmp / package / "Manifest.json").write_text("{}")
        else:
            (tmp / package).write_bytes(b"not a graph")
        fixed_entry = {"lengths": {str(t): f"target_{t}" for t in lengths},
                       "slots": fixed.function_slots(layout, lengths)} if fmt == "coreml" else None
        graphs = {"target": GraphEntry(package, "fp16" if fmt == "coreml" else "fp32", kv.target_io(layout, 16, 8),
                                       method="target_1" if fmt == "coreml" else None, fixed=fixed_entry)}
        return Manifest(format=fmt, precision=graphs["target"].precision, target=ModelEntry("fake", "0" * 64, {}),
                        drafter=None, layout=layout, binding=kv.BINDING_IO, vocab_size=16, hidden_size=8,
                        embed_scale=1.0, bos_token_id=None, eos_token_ids=(), pad_token_id=None, chat_template=None,
                        tokenizer_files=(), max_draft_len=4, graphs=graphs, tables={})

    return write_bundle(out, build)


def _refusal(native, folder, *flags):  # noqa: F811
    command = [str(native / "edge-spec-run"), "--bundle", str(folder), "--prompt-ids", "1,2", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    return done.stderr


def test_coreml_bundles_and_compute_units_on_a_linux_build(native, tmp_path):  # noqa: F811
    built = (native / "formats.txt").read_text().split()
    if "coreml" in built:
        pytest.skip(f"{native} has the Core ML backend ({' '.join(built)}): this checks a build without it")
    coreml = _fake_bundle(tmp_path / "coreml", "coreml")
    err = _refusal(native, coreml)
    assert f"{coreml / 'manifest.json'}: this native runner has no runtime for 'coreml' bundles" in err
    assert "fix: run it with a macOS or iOS build of this runner" in err
    err = _refusal(native, coreml, "--compute-units", "ane")
    assert "unknown compute units 'ane'\n  fix: choose one of all, cpu_and_ne, cpu_and_gpu, cpu" in err
    err = _refusal(native, coreml, "--compute-units", "cpu_and_ne")  # a valid value: the format is what is missing
    assert "has no runtime for 'coreml' bundles" in err
    onnx = _fake_bundle(tmp_path / "onnx", "onnx")
    err = _refusal(native, onnx, "--compute-units", "cpu")
    assert "--compute-units applies to coreml bundles, not the native-onnx runtime\n  fix: drop --compute-units" in err
