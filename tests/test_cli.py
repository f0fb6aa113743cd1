"""The CLI: happy path and every bad input -> exit code 2, one clear message, no traceback."""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from edge_spec.cli import main


@pytest.fixture()
def folder(tiny_llama, tmp_path):
    """A private copy of the tiny llama checkpoint that a test may damage."""
    import shutil

    src, _ = tiny_llama
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def run_cli(capsys, *args):
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_happy_path_streams_and_prints_stats(folder, capsys):
    code, out, err = run_cli(capsys, "--model", str(folder), "--prompt", "w5 w6 w7", "--max-new-tokens", "5")
    assert code == 0
    assert "prompt 3 tok" in err and "new 5 tok" in err and "tok/s" in err
    assert out.strip()  # streamed text (word-level tokenizer: words separated by spaces)


def test_sampled_generation_is_reproducible_with_seed(folder, capsys):
    args = ("--model", str(folder), "--prompt", "w5 w6", "--max-new-tokens", "8", "--temperature", "1.0",
            "--top-k", "50", "--top-p", "0.9", "--seed", "7", "--quiet")
    first = run_cli(capsys, *args)[1]
    second = run_cli(capsys, *args)[1]
    assert first == second and first.strip()


@pytest.mark.parametrize("args, message", [
    (("--temperature", "-0.5"), "temperature must be"),
    (("--top-p", "0"), "top_p must be in (0, 1]"),
    (("--top-k", "-3"), "top_k must be"),
    (("--max-new-tokens", "0"), "max_new_tokens must be"),
    (("--max-context", "8", "--max-new-tokens", "7"), "context overflow"),
])
def test_bad_request_parameters(folder, capsys, args, message):
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "w5 w6", *args)
    assert code == 2 and message in err and "fix:" in err and "Traceback" not in err


def test_unknown_model_name(capsys):
    code, _, err = run_cli(capsys, "--model", "no-such-model", "--prompt", "hi")
    assert code == 2 and "neither a built-in" in err and "smollm2-135m" in err


def test_unknown_model_type(folder, capsys):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and "unsupported model_type 'mamba'" in err and "config.json" in err


@pytest.mark.parametrize("missing, message", [
    ("config.json", "config.json is missing"),
    ("tokenizer.json", "tokenizer.json is missing"),
    ("model.safetensors", "has no *.safetensors file"),
])
def test_missing_files(folder, capsys, missing, message):
    (folder / missing).unlink()
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and message in err


def test_truncated_safetensors(folder, capsys):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and "model.safetensors is corrupt or truncated" in err


def test_shape_mismatch_names_tensor_and_file(folder, capsys):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 100}))
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and "model.safetensors" in err and "mlp" in err and "has shape" in err


def test_dtype_mismatch(folder, capsys):
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    weights["model.norm.weight"] = weights["model.norm.weight"].to(__import__("torch").int32)
    save_file(weights, str(path))
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and "model.norm.weight" in err and "int32" in err


def test_corrupt_config_json(folder, capsys):
    (folder / "config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "hi")
    assert code == 2 and "not valid JSON" in err


def test_console_script_exit_code_without_traceback(tmp_path):
    """Through a real process, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "edge_spec.cli", "generate", "--model", str(tmp_path),
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_builtin_smollm2_through_the_cli(capsys, smollm2, monkeypatch):
    """The real default model end to end (the conversion cache points at the session's fresh conversion)."""
    monkeypatch.setattr("edge_spec.loading.checkpoints.resolve", lambda model: smollm2.folder)
    code, out, err = run_cli(capsys, "--prompt", "What is the capital of France?", "--chat", "--max-new-tokens", "24")
    assert code == 0 and "Paris" in out and "stop: eos" in err


@pytest.fixture()
def drafter_folder(folder, tmp_path):
    from edge_spec.loading import checkpoints
    from edge_spec.model.drafter import new_drafter, save_drafter

    cfg = checkpoints.load(str(folder)).config
    return save_drafter(new_drafter(cfg, hidden_size=32, num_layers=1, intermediate_size=64, num_centroids=16,
                                    top_k_clusters=4), tmp_path / "drafter")


@pytest.mark.parametrize("verdict", ["exact", "not exact"])
def test_the_cli_follows_the_host_checks_verdict(folder, drafter_folder, capsys, monkeypatch, tmp_path, verdict):
    """Eager torch is not batch-invariant on every CPU (its GEMMs block rows by M), so what eager speculation does is
    the host check's call: the probe's comparison is fixed here (bit-identical, or 1e-3 apart) so both branches run
    on every CPU. Exact: speculation runs and says it was host-checked. Not exact: plain decoding, said so, with
    plain's text. (Greedy speculative == plain token for token is asserted where the runtime is exact: the ONNX,
    ExecuTorch, Core ML and QNN tests and test_toy_format.py.)"""
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))  # no stored verdict: the probe runs
    diff = 0.0 if verdict == "exact" else 1e-3
    monkeypatch.setattr("edge_spec.decoding.hostcheck._run_mode", lambda *a: (diff, 1.0))
    base = ("--model", str(folder), "--prompt", "w5 w6 w7", "--max-new-tokens", "12", "--quiet")
    plain = run_cli(capsys, *base)
    spec = run_cli(capsys, *base, "--drafter", str(drafter_folder), "--spec-k", "3", "--adaptive")
    assert plain[0] == spec[0] == 0 and "tau" not in plain[2]
    if verdict == "exact":
        assert "tau" in spec[2] and "accept by pos" in spec[2] and "exactness: host-checked" in spec[2]
    else:
        assert "notice: exactness: NOT batch-invariant" in spec[2] and "speculative decoding is off" in spec[2]
        assert "tau" not in spec[2] and spec[1] == plain[1]


def test_bad_spec_k_and_mismatched_drafter(folder, drafter_folder, tiny_gemma4, capsys):
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "w5", "--drafter", str(drafter_folder),
                           "--spec-k", "0")
    assert code == 2 and "spec_k must be" in err
    code, _, err = run_cli(capsys, "--model", str(tiny_gemma4[0]), "--prompt", "w5", "--drafter", str(drafter_folder))
    assert code == 2 and "drafter does not match the target" in err
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "w5", "--drafter", "builtin")
    assert code == 2 and "no built-in drafter" in err


@pytest.mark.parametrize("source", ["stdin", "argv"])
def test_invalid_utf8_prompt_is_refused_before_loading(source, capsys, monkeypatch):
    """Bytes that are not UTF-8 get `error:` + `fix:` and exit 2, from stdin and from argv (surrogate escapes)."""
    import io
    import sys

    bad = b"ab\xff\xfe"
    if source == "stdin":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bad)))
        prompt = "-"
    else:
        prompt = bad.decode("utf-8", "surrogateescape")
    code, _, err = run_cli(capsys, "--model", "/does/not/exist", "--prompt", prompt)
    assert code == 2 and "not valid UTF-8" in err and "fix:" in err and "Traceback" not in err


def test_utf8_prompt_from_stdin_is_read_as_text(folder, capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("w5 w6 é".encode())))
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "-", "--max-new-tokens", "2")
    assert code == 0 and "prompt 3 tok" in err


@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
@pytest.mark.parametrize("fmt, family", [("onnx", "eagle3"), ("executorch", "eagle3"), ("qnn", "eagle3"), ("coreml", "eagle3")])
def test_export_names_the_builtin_drafter_a_format_gets(model, fmt, family, tmp_path, monkeypatch, capsys):
    """Both built-in models' default drafter is EAGLE-3, in every shipped format since 2026-12-07 (a format one of
    whose runtimes ran none exported the MTP drafter and said so: tests/test_drafter_table.py keeps that rule). The checkpoint load is stopped: only the choice is under test."""
    import edge_spec.api as api
    from edge_spec.errors import ConfigError
    from edge_spec.loading import checkpoints

    def stop(model):
        raise ConfigError("stopped before loading", "none")

    picked, real = [], api.resolve_drafter
    monkeypatch.setattr(checkpoints, "load", stop)
    monkeypatch.setattr(api, "resolve_drafter", lambda *a, **k: picked.append(real(*a, **k)) or picked[-1])
    assert main(["export", "--model", model, "--format", fmt, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert picked[0] == api.builtin_drafters(model)[family] and "stopped before loading" in err
    assert (f"shipping {model}'s built-in mtp drafter" in err) == (family == "mtp"), err
    assert not (tmp_path / "b").exists()
