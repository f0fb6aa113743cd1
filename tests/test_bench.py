"""`edge-spec bench` on a tiny exported bundle: the report's fields, their arithmetic, and its errors.

No speed is asserted here (speed lives in docs/benchmarks.md, produced by the command itself)."""

import builtins
import json
import sys

import numpy as np
import pytest

from edge_spec.loading import checkpoints
from edge_spec.api import load_bundle
from edge_spec.benchmark.bench import Tally, markdown, measure, summary
from edge_spec.cli import main
from edge_spec.model.drafter import new_drafter
from edge_spec.errors import ConfigError
from edge_spec.exporters.onnx import export_bundle


@pytest.fixture(scope="module")
def bundles(tiny_llama, tmp_path_factory):
    target = checkpoints.load(str(tiny_llama[0]))
    drafter = new_drafter(target.config, seed=7, hidden_size=32, num_layers=1, intermediate_size=64,
                          num_centroids=16, top_k_clusters=4, head_from="target")
    root = tmp_path_factory.mktemp("bench")
    with_drafter = export_bundle(target, root / "spec", drafter=drafter, max_context=96)
    plain_only = export_bundle(target, root / "plain", max_context=96)
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7", "chat": false, "kind": "docs"}\n'
                       '{"prompt": "w9 w3 w3 w8 w1", "chat": false, "kind": "code"}\n')
    return with_drafter, plain_only, prompts


def test_bench_writes_json_markdown_and_plot(bundles, tmp_path, capsys):
    bundle, _, prompts = bundles
    out = tmp_path / "out"
    code = main(["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--spec-k", "1", "3",
                 "--temperature", "0", "0.7", "--adaptive", "--max-new-tokens", "12", "--threads", "1", "--no-lookup",
                 "--json", str(out / "b.json"), "--markdown", str(out / "b.md"), "--plot", str(out / "b.png")])
    stdout = capsys.readouterr().out
    assert code == 0
    rows = json.loads((out / "b.json").read_text())
    assert [(r["k"], r["temperature"]) for r in rows] == [(1, 0.0), (3, 0.0), ("adaptive", 0.0),
                                                          (1, 0.7), (3, 0.7), ("adaptive", 0.7)]
    for r in rows:
        for key in ("runtime", "precision", "k", "temperature", "plain_tok_s", "spec_tok_s", "speedup", "tau",
                    "acceptance_by_position", "first_token_ms", "peak_rss_mb", "time_split"):
            assert key in r, key
        assert r["runtime"] == "ort" and r["precision"] == "fp32" and r["prompts"] == 2
        assert r["speedup"] == pytest.approx(r["spec_tok_s"] / r["plain_tok_s"])
        assert 1.0 <= r["tau"] <= r["k_max"] + 1
        assert len(r["acceptance_by_position"]) == r["k_max"]
        for split in r["time_split"].values():
            assert split["overhead"] > 0  # kernel clocks run inside the decode clock
            assert split["drafter"] + split["target"] + split["overhead"] == pytest.approx(1.0)
        assert r["time_split"]["plain"]["drafter"] == 0.0 and r["time_split"]["spec"]["drafter"] > 0  # MTP only
        assert r["lookup_share"] == 0.0
        # a decode in a process of its own (edge_spec/benchmark/own_process.py), below this test process's peak,
        # which holds torch and every configuration's runs
        assert 10 < r["peak_rss_mb"] < r["bench_process_rss_mb"]
        assert r["bundle_bytes"] == sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        assert r["drafter_step_share"] == pytest.approx(r["drafter_step_ms"] / r["target_step_ms"])
    greedy = [r for r in rows if r["temperature"] == 0]
    assert all(r["greedy_exact"] and r["greedy_exact_prompts"] == 2 for r in greedy)  # lossless, via the bench
    assert all("greedy_exact" not in r for r in rows if r["temperature"] > 0)
    assert (out / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "b.md").read_text()
    assert md.startswith("`edge-spec ") and "| ort | fp32 | 0 | 3 |" in md and md.count("\n| ort |") == 6
    assert "| ort | fp32 |" in stdout
    assert f"peak resident memory {rows[0]['peak_rss_mb']:.0f} MB (a decode of every prompt in a process of its own" in md


def test_bench_drafts_with_retrieval_by_default(bundles, tmp_path, capsys):
    """The tiny model repeats itself, so retrieval drafts some passes; greedy output stays plain's. (With
    --no-memory-probe: the peak memory reported is the bench process's, no decode in a process of its own.)"""
    bundle, _, prompts = bundles
    out = tmp_path / "b.json"
    assert main(["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--spec-k", "3", "--max-new-tokens", "24",
                 "--threads", "1", "--json", str(out), "--no-memory-probe"]) == 0
    (row,) = json.loads(out.read_text())
    assert "bench_process_rss_mb" not in row and row["peak_rss_mb"] > 10
    assert row["lookup_share"] > 0 and row["greedy_exact"]
    # what a proposal costs is reported (prompt lookup; the tiny bundle has no datastore)
    assert row["lookup_ms_per_call"] > 0 and row["datastore_ms_per_call"] is None


class RecordingPeer:
    """Stands in for LlamaCppPeer: records when it runs, relative to our own runs."""

    def __init__(self, log):
        self.log = log

    def warm_up(self, ids):
        self.log.append("peer warm-up")

    def run(self, ids, max_new_tokens):
        self.log.append(("peer", tuple(ids), max_new_tokens))


def test_peers_run_right_after_our_plain_run_of_each_prompt(bundles):
    bundle, _, prompts = bundles
    engine = load_bundle(bundle, threads=1)
    log = []
    generate = engine.generate
    engine.generate = lambda prompt, **kw: log.append(("ours", prompt, kw.get("speculative"))) or generate(prompt, **kw)
    rows = [{"prompt": "w5 w6 w7", "chat": False}, {"prompt": "w9 w3", "chat": False}]
    measure(engine, rows, ks=[2], temperatures=[0.0, 0.7], adaptive=False, max_new_tokens=6, progress=False,
            peers=[RecordingPeer(log)])
    timed = log[log.index("peer warm-up") + 1:]  # after our warm-up runs and the peer's
    assert [(e[0], e[1] if e[0] == "ours" else None, e[2] if e[0] == "ours" else None) for e in timed] == [
        ("ours", "w5 w6 w7", False), ("peer", None, None), ("ours", "w5 w6 w7", True),
        ("ours", "w9 w3", False), ("peer", None, None), ("ours", "w9 w3", True),
        ("ours", "w5 w6 w7", False), ("ours", "w5 w6 w7", True),  # T=0.7: no peer (it decodes greedily)
        ("ours", "w9 w3", False), ("ours", "w9 w3", True)]
    assert [e[1] for e in timed if e[0] == "peer"] == [tuple(engine.encode(r["prompt"])) for r in rows]


def test_tally_split_and_markdown_arithmetic():
    t = Tally(tokens=30, decode_s=2.0, target_kernel_s=1.5, drafter_kernel_s=0.3)
    assert t.tok_s == 15.0
    assert t.split() == pytest.approx({"drafter": 0.15, "target": 0.75, "overhead": 0.1})
    row = {"runtime": "ort", "precision": "int8", "k": 2, "k_max": 2, "temperature": 0.0, "plain_tok_s": 10.0,
           "spec_tok_s": 25.0, "speedup": 2.5, "tau": 2.6, "acceptance_by_position": [0.9, None], "mean_k": None,
           "time_split": {"plain": t.split(), "spec": t.split()}, "python_overhead_plain": 0.1,
           "first_token_ms": {"plain": 12.0, "spec": 13.0}, "greedy_exact": True, "greedy_exact_prompts": 3,
           "prompts": 3}
    meta = {"date": "d", "machine": "m", "threads": 2, "prompts": 3, "max_new_tokens": 5}
    md = markdown([row], [{"peer": "llama.cpp", "model": "x.gguf", "precision": "q8_0", "tok_s": 80.0,
                           "first_token_ms": 9.0}], meta)
    assert "| ort | int8 | 0 | 2 | 10.0 | 25.0 | 2.50x | 2.60 | 0.90 - | 15% / 75% / 10% | 10% | - | - / - | 13 | 3/3 |" in md
    row.update(drafter_step_ms=1.0, target_step_ms=20.0, drafter_step_share=0.05, lookup_ms_per_call=0.0123,
               datastore_ms_per_call=0.25)
    assert "| 1.0 / 20.0 ms (5%) | 0.012 / 0.250 |" in markdown([row], [], meta)
    assert "| llama.cpp | x.gguf | q8_0 | 80.0 | 9 |" in md


def test_summary_names_the_best_speculative_run_and_each_peer():
    rows = [{"temperature": 0.0, "k": 1, "tau": 1.5, "plain_tok_s": 40.0, "spec_tok_s": 50.0},
            {"temperature": 0.0, "k": 2, "tau": 2.0, "plain_tok_s": 60.0, "spec_tok_s": 75.0},
            {"temperature": 0.7, "k": 2, "tau": 1.2, "plain_tok_s": 50.0, "spec_tok_s": 90.0}]  # sampled: not compared
    line = summary(rows, [{"peer": "onnxruntime-genai", "precision": "int4", "tok_s": 100.0}])
    assert line == ("best speculative: 75.0 tok/s (k = 2, tau 2.00) = 1.50x our plain 50.0 tok/s; "
                    "onnxruntime-genai int4 plain 100.0 tok/s (ours 0.75x it)")
    assert summary(rows[2:], []) == "no greedy speculative configuration was measured"


@pytest.mark.parametrize("args, message", [
    (["--spec-k", "0"], "--spec-k values must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--prompts", "/no/such.jsonl"], "does not exist"),
    (["--temperature", "-1"], "temperature"),
])
def test_bench_bad_options_exit_2(bundles, args, message, capsys):
    bundle, _, prompts = bundles
    base = ["bench", "--bundle", str(bundle), "--max-new-tokens", "4"]
    if "--prompts" not in args:
        base += ["--prompts", str(prompts)]
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_bench_needs_a_drafter_and_names_missing_peer(bundles, monkeypatch, capsys):
    bundle, plain_only, prompts = bundles
    assert main(["bench", "--bundle", str(plain_only), "--prompts", str(prompts)]) == 2
    assert "needs a drafter" in capsys.readouterr().err
    real_import = builtins.__import__

    def no_llama(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError("no llama_cpp here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama)
    gguf = prompts  # any existing file: the import check comes first
    assert main(["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--peer", "llama.cpp",
                 "--peer-gguf", str(gguf)]) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_onnxruntime_genai_peer_decodes_the_same_model(bundles, tiny_llama, tmp_path, monkeypatch, capsys):
    """The genai peer is built by onnxruntime-genai's own builder from the target's checkpoint folder: in fp32 it
    must produce our plain greedy tokens (same weights), and it reports through --json like llama.cpp."""
    from edge_spec.peers.genai import OrtGenaiPeer, genai_model

    bundle, _, prompts = bundles
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "cache"))
    engine = load_bundle(bundle, threads=1)
    peer = OrtGenaiPeer(genai_model(tiny_llama[0], "fp32", tmp_path / "peers"), threads=1, precision="fp32")
    for seed in range(3):
        ids = [int(i) for i in np.random.default_rng(seed).integers(4, 320, 9)]
        peer.run(ids, 10)
        assert peer.outputs[-1] == engine.generate(ids, max_new_tokens=10, speculative=False).tokens
    assert peer.result()["tokens"] == 27 and peer.result()["tok_s"] > 0
    with pytest.raises(ConfigError, match="no config.json"):
        genai_model(tmp_path, "fp32", tmp_path / "peers")
    out = tmp_path / "b.json"
    assert main(["bench", "--bundle", str(bundle), "--prompts", str(prompts), "--spec-k", "1", "--max-new-tokens",
                 "6", "--threads", "1", "--peer", "onnxruntime-genai", "--json", str(out)]) == 0
    assert "| onnxruntime-genai |" in capsys.readouterr().out
    (genai,) = [r for r in json.loads(out.read_text()) if "peer" in r]
    assert genai["peer"] == "onnxruntime-genai" and genai["precision"] == "fp32" and genai["tokens"] == 2 * 5
    assert genai["peak_rss_mb"] > 0  # its own process's (peers/isolated.py), not ours
    folder = next((tmp_path / "peers").rglob("genai_config.json")).parent  # the peer's own model folder, as du counts
    assert genai["model_bytes"] == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) > 0


def test_onnxruntime_genai_peer_builds_a_gemma3_checkpoint(tmp_path):
    """Gemma-3 as transformers 5 reads it (per-layer-type rope_parameters) goes through the builder's shim
    (peers/genai_builder.py: without it the 0.18 builder fails with KeyError 'rope_type'): in fp32 the peer gives our
    eager greedy tokens past the sliding window (6), so both RoPE bases are the checkpoint's."""
    from transformers import AutoConfig

    from edge_spec.peers.genai import OrtGenaiPeer, genai_model
    from edge_spec.peers.genai_builder import flatten_gemma3_rope
    from tests.test_gemma3 import greedy
    from tests.tiny import gemma3_config, save_gemma3_reference

    folder = tmp_path / "gemma3"
    save_gemma3_reference(gemma3_config(), folder, seed=5)
    config = AutoConfig.from_pretrained(folder)
    assert "rope_type" not in config.rope_parameters and getattr(config, "rope_local_base_freq", None) is None
    flatten_gemma3_rope(config)
    assert (config.rope_theta, config.rope_local_base_freq) == (1e6, 1e4)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    loaded = checkpoints.load(str(folder))
    peer = OrtGenaiPeer(genai_model(folder, "fp32", tmp_path / "peers"), threads=1, precision="fp32")
    for seed in range(2):
        ids = [int(i) for i in np.random.default_rng(seed).integers(4, 320, 9)]
        peer.run(ids, 12)
        assert peer.outputs[-1] == greedy(loaded, ids, 12, max_context=64)


def test_bench_eager_runtime_from_a_checkpoint(tiny_llama, tmp_path):
    from edge_spec.model.drafter import save_drafter

    target = checkpoints.load(str(tiny_llama[0]))
    folder = save_drafter(new_drafter(target.config, seed=3, hidden_size=32, num_layers=1, intermediate_size=64,
                                      num_centroids=16, top_k_clusters=4), tmp_path / "d")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7", "chat": false}\n')
    assert main(["bench", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--spec-k", "2", "--max-new-tokens", "8", "--json", str(tmp_path / "r.json")]) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())
    assert row["runtime"] == "torch" and row["greedy_exact"] and row["time_split"]["spec"]["drafter"] > 0


class _EchoPeer:
    """A stand-in peer for peers/isolated.py (module level: the child process imports it by name)."""

    def __init__(self, fail_on_build: bool = False):
        if fail_on_build:
            raise ValueError("cannot build this peer")
        self.runs = []

    def warm_up(self, ids):
        pass

    def run(self, ids, max_new_tokens):
        if max_new_tokens < 0:
            raise ConfigError("max_new_tokens < 0", "pass more")
        self.runs.append(list(ids))

    def result(self):
        return {"peer": "echo", "runs": self.runs, "pid": __import__("os").getpid()}


def test_an_isolated_peer_runs_in_its_own_process_and_its_errors_come_back():
    import os

    from edge_spec.peers.isolated import IsolatedPeer

    peer = IsolatedPeer(_EchoPeer)
    peer.warm_up([1])
    peer.run([1, 2], 4)
    result = peer.result()
    assert result["runs"] == [[1, 2]] and result["pid"] != os.getpid() and result["peak_rss_mb"] > 0
    with pytest.raises(ConfigError, match="max_new_tokens < 0"):
        peer.run([1], -1)
    peer.run([3], 1)  # still serving after an error
    assert peer.result()["runs"] == [[1, 2], [3]]
    peer.close()
    with pytest.raises(ConfigError, match="_EchoPeer peer failed: ValueError: cannot build this peer") as err:
        IsolatedPeer(_EchoPeer, fail_on_build=True)  # a library's own error: named, the CLI prints no traceback
    assert isinstance(err.value.__cause__, ValueError)


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss carried across exec is Linux's")
def test_an_isolated_peers_peak_memory_is_its_own_not_its_parents():
    """A peer spawned while the bench holds 400 MB more reports its own peak, not the forked copy's: Linux carries
    ru_maxrss across exec (the measurement before: 853 MB for this do-nothing peer beside a 600 MB parent)."""
    from edge_spec.peers.isolated import IsolatedPeer

    from edge_spec.peers.isolated import peak_rss_mb

    held = np.ones(400 * 2 ** 20 // 8)  # 400 MB touched in this process
    ours = peak_rss_mb()
    peer = IsolatedPeer(_EchoPeer)
    try:
        own = peer.result()["peak_rss_mb"]
    finally:
        peer.close()
    assert 0 < own < ours - 300, (own, ours)  # the child imports what this module imports, holds none of the 400 MB
    del held


def test_the_genai_peer_precision_follows_the_bundles_weights():
    """`--peer onnxruntime-genai` without --genai-precision builds genai's model of the bundle's weight precision."""
    from edge_spec.peers import genai_precision

    want = {"fp32": "fp32", "fp16": "fp32", "int8": "int8", "int4": "int4", "int4-gguf": "int4", "8da4w": "int4",
            "8da4w-gguf": "int4", "16a8w": "fp32"}
    assert {p: genai_precision(p) for p in want} == want


def test_the_llama_cpp_peer_decodes_the_targets_own_gguf_and_refuses_another_models():
    """Without --peer-gguf, llama.cpp decodes the GGUF the built-in target came from (a gemma-3-270m bundle used to
    get SmolLM2's, and llama.cpp failed on its token ids mid-run with a traceback); a target that is no built-in
    needs --peer-gguf; a GGUF whose vocabulary is not the target's is refused before any run."""
    from types import SimpleNamespace

    from edge_spec.loading.gguf_import import find_smollm2_gguf
    from edge_spec.peers import target_gguf

    def engine(name, vocab_size=49152):
        target = SimpleNamespace(name=name)
        return SimpleNamespace(manifest=SimpleNamespace(target=target, vocab_size=vocab_size), loaded=None)

    assert target_gguf(engine("smollm2-135m")) == find_smollm2_gguf()
    with pytest.raises(ConfigError, match="--peer-gguf"):
        target_gguf(engine("/some/checkpoint/folder"))
    pytest.importorskip("llama_cpp")  # the `peers` extra (built from source): not in `make venv`
    from edge_spec.peers.llamacpp import LlamaCppPeer

    with pytest.raises(ConfigError, match="vocabulary of 49,152 tokens, the target's has 262,144"):
        LlamaCppPeer(find_smollm2_gguf(), threads=1, vocab_size=262_144)
    assert LlamaCppPeer(find_smollm2_gguf(), threads=1, vocab_size=49_152).llm.n_vocab() == 49_152


def test_a_bench_whose_prompts_stop_at_once_says_so():
    """SmolLM2 given its everyday prompts without the chat template answers with a stop token within a few tokens:
    a bench over 95 tokens in all for 12 x 96 asked once went into the docs as a speed. The report now says so, in
    the Markdown and on stderr; long enough outputs get no warning."""
    from edge_spec.benchmark.bench import short_outputs

    row = {"runtime": "ort", "precision": "int4", "k": 2, "k_max": 2, "temperature": 0.0, "plain_tok_s": 170.0,
           "spec_tok_s": 200.0, "speedup": 1.2, "tau": 1.5, "acceptance_by_position": [0.5, 0.2], "mean_k": None,
           "time_split": {"plain": {"drafter": 0, "target": 1, "overhead": 0},
                          "spec": {"drafter": 0, "target": 1, "overhead": 0}},
           "python_overhead_plain": 0.0, "first_token_ms": {"plain": 1.0, "spec": 1.0}, "prompts": 12,
           "tokens": {"plain": 95, "spec": 95}}
    meta = {"date": "d", "machine": "m", "threads": 2, "prompts": 12, "max_new_tokens": 96}
    warning = short_outputs([row], 96)
    assert warning is not None and "8.9 new tokens per prompt of the 96 asked" in warning and "chat" in warning
    assert warning in markdown([row], [], meta)
    row["tokens"] = {"plain": 12 * 47, "spec": 12 * 47}  # 48 per prompt: half the budget
    assert short_outputs([row], 96) is None and "warning" not in markdown([row], [], meta)
    assert short_outputs([], 96) is None
