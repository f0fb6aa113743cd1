"""A Speculators EAGLE-3 folder as the drafter of `edge_spec.load(model, drafter=FOLDER)` and of the CLI's
`--drafter FOLDER` (issue 48): told apart from an MTP drafter folder by its config.json, run on the eager runtime
(runtimes/torch_eagle3), greedy speculative == plain; a drafter that does not fit the target and an export with one
are refused with the fix. The folders are written here with safetensors (the layout Speculators' save_pretrained
writes, as edge_spec/loading/speculators_eagle3.py reads it), so nothing needs the speculators package."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edge_spec.api import load
from edge_spec.cli import main
from edge_spec.errors import CheckpointError, ConfigError
from edge_spec.loading.speculators_eagle3 import eagle3_config_from_dict
from edge_spec.model.eagle3 import Eagle3Drafter
from edge_spec.runtimes.torch_eagle3 import TorchEagle3Drafter
from tests.tiny_eagle3 import randomize, vocab_map

TARGET_HIDDEN, TARGET_VOCAB = 64, 320  # tests/tiny.llama_config


def write_eagle3(folder: Path, *, hidden: int = TARGET_HIDDEN, aux=(0, 1, 3), draft_vocab: int = 160,
                 embed: bool = False, seed: int = 0) -> Path:
    """A random eagle3 drafter folder for the tiny llama target: config.json as Speculators writes it (inert keys
    included) + model.safetensors; without embed_tokens unless `embed` (the drafter then reads the target's)."""
    layer = {"model_type": "llama", "vocab_size": TARGET_VOCAB, "hidden_size": hidden, "intermediate_size": 128,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
           "draft_vocab_size": draft_vocab, "transformer_layer_config": layer, "norm_before_residual": True,
           "eagle_aux_hidden_state_layer_ids": list(aux), "torch_dtype": "float32"}
    model = Eagle3Drafter(eagle3_config_from_dict(cfg))
    randomize(model, seed)
    if model.cfg.mapped:
        d2t, t2d = vocab_map(TARGET_VOCAB, draft_vocab, seed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if embed or k != "embed_tokens.weight"}
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(autouse=True)
def host_check_cache(monkeypatch, tmp_path_factory):
    """The host check's cache in a folder of this test session, not the user's."""
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "eagle3-cache"))


@pytest.fixture(scope="module")
def eagle3_folder(tmp_path_factory):
    return write_eagle3(tmp_path_factory.mktemp("eagle3") / "drafter")


def test_load_detects_the_folder_and_greedy_speculative_equals_plain(tiny_llama, eagle3_folder):
    engine = load(str(tiny_llama[0]), drafter=str(eagle3_folder), max_context=128)
    assert isinstance(engine.drafter, TorchEagle3Drafter) and engine.runtime == "torch"
    assert engine.exactness is not None  # the host check ran (eager torch is often found not batch-invariant)
    # the checkpoint left embed_tokens to the verifier: the drafter reads the target's
    assert torch.equal(engine.drafter.drafter.embed_tokens.weight, engine.loaded.model.model.embed_tokens.weight)
    for seed in range(2):
        prompt = [int(i) for i in np.random.default_rng(seed).integers(4, TARGET_VOCAB, 10)]
        plain = engine.generate(prompt, max_new_tokens=24, speculative=False)
        spec = engine.generate(prompt, max_new_tokens=24, speculative=True, allow_inexact=True, lookup=False,
                               spec_k=3, adaptive=False)
        assert spec.tokens == plain.tokens and "spec" in spec.extra
        assert spec.extra["spec"].drafter_calls > 0 and spec.extra["spec"].drafted.sum() > 0
    # without allow_inexact: speculative where the host check found this host exact, else plain with the notice
    honest = engine.generate(prompt, max_new_tokens=8)
    assert honest.tokens == plain.tokens[:8]
    assert ("spec" in honest.extra) == engine.exactness.exact
    assert ("notice" in honest.extra) == (not engine.exactness.exact)


def test_an_embedded_table_is_the_drafters_own(tiny_llama, tmp_path):
    folder = write_eagle3(tmp_path / "d", embed=True, draft_vocab=TARGET_VOCAB, seed=1)
    engine = load(str(tiny_llama[0]), drafter=str(folder), max_context=64, host_check=False)
    assert not torch.equal(engine.drafter.drafter.embed_tokens.weight, engine.loaded.model.model.embed_tokens.weight)
    prompt = [5, 6, 7, 8]
    assert (engine.generate(prompt, max_new_tokens=12, speculative=True, allow_inexact=True, lookup=False).tokens
            == engine.generate(prompt, max_new_tokens=12, speculative=False).tokens)


def test_cli_generate_check_and_eval_drafter(tiny_llama, eagle3_folder, tmp_path, capsys):
    model, drafter = str(tiny_llama[0]), str(eagle3_folder)
    assert main(["generate", "--model", model, "--drafter", drafter, "--prompt", "w5 w6 w7",
                 "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "prompt 3 tok" in err and "Traceback" not in err
    assert "[spec k=" in err or "notice:" in err  # speculative, or plain with the host check's notice
    code = main(["check", "--model", model, "--drafter", drafter])
    out, err = capsys.readouterr()
    assert code in (0, 1) and "edge-spec check" in out and "Traceback" not in err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7", "chat": false, "kind": "docs"}\n{"prompt": "w9 w11", "chat": false}\n')
    result = tmp_path / "r.json"
    assert main(["eval-drafter", "--model", model, "--drafter", drafter, "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--spec-k", "2", "--json", str(result)]) == 0
    assert "tau" in capsys.readouterr().out
    [row] = json.loads(result.read_text())
    assert row["tau"] >= 1.0 and len(row["acceptance_by_position"]) == 2 and row["prompts"] == 2
    assert row["drafter"] == drafter
    code = main(["eval-drafter", "--model", model, "--drafter", drafter, "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--teacher-forced"])
    err = capsys.readouterr().err
    assert code == 2 and "--teacher-forced" in err and "fix:" in err and "Traceback" not in err, err


@pytest.mark.parametrize("options, names", [
    ({"hidden": 32}, ["hidden size", "32", str(TARGET_HIDDEN)]),
    ({"aux": (0, 1, 7)}, ["aux layers", "(0, 1, 7)", "[0, 3]"]),
])
def test_a_drafter_that_does_not_fit_the_target_is_refused(tiny_llama, tmp_path, options, names):
    folder = write_eagle3(tmp_path / "d", **options)
    with pytest.raises(ConfigError) as err:
        load(str(tiny_llama[0]), drafter=str(folder), max_context=64)
    text = str(err.value)
    assert all(name in text for name in names) and "fix:" in text and str(folder) in text


def test_another_speculators_algorithm_is_refused_by_name(tiny_llama, tmp_path):
    folder = tmp_path / "mlp"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "mlp_speculator"}))
    with pytest.raises(CheckpointError, match="'mlp_speculator', not 'eagle3'"):
        load(str(tiny_llama[0]), drafter=str(folder))


@pytest.mark.parametrize("fmt", [["--format", "onnx", "--exporter", "torchscript"],
                                 ["--format", "qnn", "--max-draft-len", "2", "--max-pass", "6"]])
def test_export_writes_an_eagle3_drafter_into_a_bundle(tiny_llama, eagle3_folder, tmp_path, capsys, fmt):
    out = tmp_path / "bundle"
    code = main(["export", "--model", str(tiny_llama[0]), "--drafter", str(eagle3_folder), *fmt,
                 "--max-context", "64", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["drafter"]["kind"] == "eagle3"
    capsys.readouterr()
    args = ["generate", "--bundle", str(out), "--prompt", "hello world", "--max-new-tokens", "8", "--quiet"]
    assert main(args + ["--no-spec"]) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--spec-k", "2"]) == 0
    assert capsys.readouterr().out == plain


def test_export_with_another_speculators_algorithm_is_refused(tiny_llama, tmp_path, capsys):
    """Speculators' other algorithms, in any format (every shipped format takes eagle3 since 2026-12-07)."""
    drafter = tmp_path / "mlp"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"speculators_model_type": "mlp_speculator"}))
    out = tmp_path / "bundle"
    code = main(["export", "--model", str(tiny_llama[0]), "--drafter", str(drafter), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "error:" in err and "fix:" in err and "Traceback" not in err
    assert "'mlp_speculator'" in err
    assert not out.exists()


@pytest.mark.parametrize("flag, ships", [(None, False), ("--datastore", True), ("--no-datastore", False)])
def test_export_ships_no_datastore_beside_an_eagle3_drafter_unless_asked(tiny_llama, eagle3_folder, tmp_path, capsys,
                                                                         monkeypatch, flag, ships):
    """The static datastore lowers an EAGLE-3 drafter's tau (api.datastore_by_default): export leaves it out by
    default and says so; --datastore ships it anyway. (The writer is recorded, not run: the tiny target has no
    regenerated answers.)"""
    from edge_spec.api import datastore_by_default
    from edge_spec.decoding import datastore_source
    from edge_spec.loading import checkpoints
    from tests.contract import tiny_drafter

    asked = []
    monkeypatch.setattr(datastore_source, "bundle_datastore", lambda *a: asked.append(a) or (lambda tmp, sha: None))
    out = tmp_path / "bundle"
    args = ["export", "--model", str(tiny_llama[0]), "--drafter", str(eagle3_folder), "--format", "onnx",
            "--exporter", "torchscript", "--max-context", "64", "--out", str(out)]
    assert main(args + ([flag] if flag else [])) == 0
    assert bool(asked) == ships
    assert ("no static datastore beside an EAGLE-3 drafter" in capsys.readouterr().err) == (flag is None)
    target = checkpoints.load(str(tiny_llama[0]))
    assert datastore_by_default(tiny_drafter(target.config)) and datastore_by_default(None)
