"""`edge-spec bench --runtime native`: the C++ runner (build/native/edge-spec-run) measured with bench's rows.

The runner is built as tests/test_native.py builds it (its `native` fixture: CMake into build/native, what `make
native` runs; a skip naming the fix without cmake / a compiler); the bundles are the session's tiny .pte (and, when
the build has the onnx backend, a tiny fp32 ONNX export). No speed is asserted: the rows' fields, their arithmetic,
greedy exactness on every prompt, the runner's host-check verdict, and the refusals.
"""

import json

import pytest

from tests.prereq import skip_or_fail

from edge_spec.cli import main
from tests.test_native import native  # noqa: F401 (the build fixture)

PROMPTS = ('{"prompt": "w5 w6 w7", "chat": false, "kind": "docs"}\n'
           '{"prompt": "w9 w3 w3 w8 w1", "chat": true, "kind": "code"}\n')


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(PROMPTS)
    return path


def _bench(native, bundle, prompts, out, *extra):  # noqa: F811
    return main(["bench", "--bundle", str(bundle), "--runtime", "native", "--native-bin",
                 str(native / "edge-spec-run"), "--prompts", str(prompts), "--spec-k", "1", "3", "--adaptive",
                 "--max-new-tokens", "16", "--threads", "1", "--json", str(out / "b.json"), "--markdown",
                 str(out / "b.md"), *extra])


def _check_rows(rows, runtime, check):
    assert [r["k"] for r in rows] == [1, 3, "adaptive"]
    for r in rows:
        assert r["runtime"] == runtime and r["precision"] == "fp32" and r["prompts"] == 2 and r["temperature"] == 0
        assert r["greedy_exact"] and r["greedy_exact_prompts"] == 2  # the native tokens == the native plain tokens
        assert r["plain_tok_s"] > 0 and r["spec_tok_s"] > 0
        assert r["speedup"] == pytest.approx(r["spec_tok_s"] / r["plain_tok_s"])
        assert 1.0 <= r["tau"] <= r["k_max"] + 1 and len(r["acceptance_by_position"]) == r["k_max"]
        assert r["tokens"]["plain"] == r["tokens"]["spec"] > 0
        for split in r["time_split"].values():
            assert split["drafter"] + split["target"] + split["overhead"] == pytest.approx(1.0)
            assert split["target"] > 0
        assert r["time_split"]["plain"]["drafter"] == 0.0
        # the bench's rows against the runner's own `--check`, run apart (not the row against itself)
        assert r["host_check"]["verdict"] == check["verdict"] and r["min_rows"] == check["min_rows"]
        assert r["peak_rss_mb"] > 1 and r["notice"] is None
    assert rows[2]["mean_k"] is not None and rows[0]["mean_k"] == 1.0


def _check(native, bundle):  # noqa: F811
    import subprocess

    done = subprocess.run([str(native / "edge-spec-run"), "--bundle", str(bundle), "--check", "--threads", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bench_native_pte_writes_json_markdown_plot(native, tiny_llama_pte, prompts, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert _bench(native, tiny_llama_pte, prompts, out, "--plot", str(out / "b.png")) == 0
    stdout = capsys.readouterr().out
    rows = json.loads((out / "b.json").read_text())
    _check_rows(rows, "native-executorch", _check(native, tiny_llama_pte))
    assert (out / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "b.md").read_text()
    assert md.startswith("`edge-spec ")  # the command line (sys.argv: pytest's here)
    assert md.count("\n| native-executorch | fp32 | 0 |") == 3 and "| 2/2 |" in md
    assert "exactness: host-checked" in md
    assert stdout.strip().splitlines()[-1].startswith("best speculative: ")  # bench's summary line, last


def test_bench_native_onnx(native, tiny_llama, prompts, tmp_path, capsys):  # noqa: F811
    built = (native / "formats.txt").read_text().split()
    if "onnx" not in built:
        skip_or_fail(f"{native} was built without the onnx backend ({' '.join(built)}); fix: apt-get install npm, "
                    "then make native")
    from edge_spec.exporters.onnx import export_bundle

    from edge_spec.loading import checkpoints
    from tests.test_onnx import tiny_drafter

    target = checkpoints.load(str(tiny_llama[0]))
    bundle = export_bundle(target, tmp_path / "onnx", drafter=tiny_drafter(target.config, head_from="target"),
                           max_context=96)
    out = tmp_path / "out"
    # onnxruntime-genai's own model of the checkpoint decodes each prompt between the runner's runs, as in the
    # Python bench (the bundle records the tiny checkpoint's folder as its source)
    assert _bench(native, bundle, prompts, out, "--peer", "onnxruntime-genai") == 0
    rows = json.loads((out / "b.json").read_text())
    _check_rows([r for r in rows if "peer" not in r], "native-onnx", _check(native, bundle))
    (genai,) = [r for r in rows if "peer" in r]
    assert genai["peer"] == "onnxruntime-genai" and genai["tokens"] == 2 * 15 and genai["tok_s"] > 0  # first: TTFT
    text = capsys.readouterr().out
    assert "| native-onnx | fp32 |" in text and "| onnxruntime-genai |" in text


# ---- refusals (no build needed: they come first) -------------------------------------------------------------
def _refused(args, capsys):
    code = main(["bench", "--runtime", "native", "--max-new-tokens", "4", *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    return err


def test_bench_native_refuses_model_and_other_formats(prompts, tmp_path, capsys):
    err = _refused(["--model", "smollm2-135m", "--prompts", str(prompts)], capsys)
    assert "not --model" in err and "--bundle" in err
    coreml = tmp_path / "coreml"
    coreml.mkdir()
    (coreml / "manifest.json").write_text(json.dumps({"format": "coreml"}))
    err = _refused(["--bundle", str(coreml), "--prompts", str(prompts)], capsys)
    assert "runs executorch, onnx and qnn bundles, not 'coreml' ones" in err and "--format executorch" in err


def test_bench_native_names_the_build_and_the_options_it_lacks(prompts, tmp_path, capsys):
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"format": "executorch"}))
    err = _refused(["--bundle", str(bundle), "--prompts", str(prompts), "--native-bin", str(tmp_path / "none")],
                   capsys)
    assert "native runner is not built" in err and "make native" in err
    err = _refused(["--bundle", str(bundle), "--prompts", str(prompts), "--no-spin"], capsys)
    assert "does not take --no-spin" in err
    assert "--native-bin applies to --runtime native" in _bench_python_with_bin(bundle, prompts, capsys)


def _bench_python_with_bin(bundle, prompts, capsys):
    code = main(["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--native-bin", "x"])
    err = capsys.readouterr().err
    assert code == 2
    return err
