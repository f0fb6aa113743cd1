"""Drafter training pipeline on a tiny target: data split, packing, teacher passes, loss goes down, resume, CLI."""

import gzip
import json

import numpy as np
import pytest
import torch

from edge_spec.loading import checkpoints
from edge_spec.cli import main
from edge_spec.loading.checkpoints import load_drafter
from edge_spec.model.drafter import check_pair, new_drafter
from edge_spec.errors import ConfigError
from edge_spec.decoding.generate import generate_plain
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.train import data as D
from edge_spec.train.pipeline import pack, run
from edge_spec.train.teacher import batched_greedy, extract
from edge_spec.train.trainer import ShardData, TrainConfig, anchor_masks, mtp_loss


def test_held_out_split_is_deterministic_and_disjoint():
    keys = [f"file_{i}.txt" for i in range(2000)]
    held = {k for k in keys if D.is_held_out(k)}
    assert held == {k for k in keys if D.is_held_out(k)}
    assert 60 < len(held) < 140  # ~5 %
    train_prompts = set(D.chat_prompts(["os", "re", "json"], held_out=False))
    assert not train_prompts & set(D.chat_prompts(["os", "re", "json"], held_out=True))
    more = D.chat_prompts(["os", "re", "json"], held_out=False, templates_per_topic=4)
    assert len(more) == len(set(more)) == 2 * len(train_prompts) and train_prompts <= set(more)
    assert not set(more) & set(D.chat_prompts(["os", "re", "json"], held_out=True, templates_per_topic=8))
    with pytest.raises(ConfigError, match="templates per topic"):
        D.chat_prompts(["os"], held_out=False, templates_per_topic=9)


def test_a_text_file_by_itself_is_a_corpus_of_pieces(tmp_path):
    """`--data corpus.txt`: the file (any size: this one is past the 400 kB a file inside a folder may have) is cut
    into pieces at blank lines, split into train and held-out pieces; nothing is lost or repeated."""
    paragraphs = [" ".join(f"w{(i * 7 + j) % 300}" for j in range(150)) for i in range(1000)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    assert path.stat().st_size > 400_000
    pieces = list(D.file_pieces(path))
    assert "".join(pieces) == path.read_text() and all(len(p) >= D.PIECE_CHARS for p in pieces[:-1])
    train = list(D.iter_documents([path], held_out=False, min_chars=0))
    held = list(D.iter_documents([path], held_out=True, min_chars=0))
    assert train and held and len(train) + len(held) == len(pieces)
    assert sorted(d.text for d in train + held) == sorted(pieces)


def test_pack_and_anchor_masks_exact():
    assert pack([[1, 2, 3], [4, 5]], 3, 100, sep=0).tolist() == [[1, 2, 3], [0, 4, 5]]
    mask = anchor_masks(t=4, n_anchors=2, window=None)[0, 0]
    assert (mask == 0).tolist() == [[True, False, False, False], [True, True, False, False]]
    mask = anchor_masks(t=6, n_anchors=5, window=2)[0, 0]  # sliding: L - s <= window + 1
    assert (mask[4] == 0).tolist() == [False, False, True, True, True, False]


def test_batched_greedy_equals_plain_greedy(tiny_llama):
    loaded = checkpoints.load(str(tiny_llama[0]))
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20]]
    outs = batched_greedy(loaded.model, prompts, max_new_tokens=10, stop_ids=frozenset())
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)))
    for p, o in zip(prompts, outs):
        ref = generate_plain(session, p, max_new_tokens=10, params=SamplingParams(), rng=np.random.default_rng(0),
                             stop_ids=frozenset()).tokens
        assert o == ref


def test_batched_greedy_inside_the_sliding_window_equals_plain_greedy(tiny_gemma4):
    loaded = checkpoints.load(str(tiny_gemma4[0]))
    window = loaded.config.sliding_window
    prompts = [[5, 6, 7], [9, 10, 11, 12], [20]]
    new = window - 4  # the longest prompt + new tokens fill the window exactly
    outs = batched_greedy(loaded.model, prompts, max_new_tokens=new, stop_ids=frozenset())
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)))
    for p, o in zip(prompts, outs):
        ref = generate_plain(session, p, max_new_tokens=new, params=SamplingParams(), rng=np.random.default_rng(0),
                             stop_ids=frozenset()).tokens
        assert o == ref
    with pytest.raises(ConfigError, match="sliding window"):
        batched_greedy(loaded.model, prompts, max_new_tokens=new + 1, stop_ids=frozenset())


def test_extract_matches_the_session_forward(tiny_gemma4):
    loaded = checkpoints.load(str(tiny_gemma4[0]))
    seqs = np.random.default_rng(0).integers(4, 320, (3, 16)).astype(np.int32)
    out = extract(loaded.model, seqs, [0], dtype=torch.float32)  # layer 0: a sliding layer with its own cache
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)))
    ref = session.forward(seqs[1].tolist())
    assert np.abs(out["hidden"][1].astype(np.float32) - ref.hidden).max() < 1e-2  # stored as fp16
    assert out["k_0"].shape == (3, 2, 16, 16)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i in range(40):  # a learnable language: runs of consecutive word ids
        start = rng.integers(4, 200, 30)
        words = " ".join(f"w{int(s) + j}" for s in start for j in range(6))
        (folder / f"doc_{i}.txt").write_text(words)
    return folder


@pytest.fixture(scope="module")
def peaky_llama(tmp_path_factory):
    """A tiny random llama whose next-token law is sharp (a random init's is nearly uniform: nothing to learn)."""
    from tests.tiny import llama_config, save_reference

    folder = tmp_path_factory.mktemp("peaky")
    model = save_reference(llama_config(), folder)
    with torch.no_grad():
        model.model.norm.weight.mul_(30.0)
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("shard_bits", [16, 4])
def test_training_reduces_loss_and_resumes(peaky_llama, corpus, tmp_path, shard_bits):
    loaded = checkpoints.load(str(peaky_llama))
    cfg = TrainConfig(batch_seqs=2, lr=1e-2, warmup=5, checkpoint_every=20)
    out = tmp_path / "drafter"
    report = run(loaded, out, data=[str(corpus)], max_tokens=40 * 180, hidden_size=32, num_layers=1,
                 intermediate_size=64, num_centroids=16, top_k_clusters=4, train_cfg=cfg, max_steps=40,
                 shard_bits=shard_bits)
    assert report["shard_bits"] == shard_bits
    assert any((tmp_path / "drafter.work").glob("shards*/*/shard_0000.top64.npz"))
    history = json.loads((out / "training_report.json").read_text())
    assert report["steps"] == 40 and history["steps"] == 40
    drafter = load_drafter(out)
    check_pair(loaded.config, drafter.cfg)
    ckpt = torch.load(tmp_path / "drafter.work" / "run_drafter" / "checkpoint.pt", weights_only=False)
    losses = [h["loss"] for h in ckpt["history"]]
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    # resume: a longer run continues from step 40 instead of starting over
    again = run(loaded, out, data=[str(corpus)], max_tokens=40 * 180, hidden_size=32, num_layers=1,
                intermediate_size=64, num_centroids=16, top_k_clusters=4, train_cfg=cfg, max_steps=45,
                shard_bits=shard_bits)
    ckpt = torch.load(tmp_path / "drafter.work" / "run_drafter" / "checkpoint.pt", weights_only=False)
    assert again["steps"] == 45 and len(ckpt["history"]) == 45


def test_a_training_chunk_stops_on_time_and_the_next_continues_the_schedule(peaky_llama, corpus, tmp_path):
    loaded = checkpoints.load(str(peaky_llama))
    cfg = TrainConfig(batch_seqs=2, lr=1e-2, warmup=5, checkpoint_every=20)
    kwargs = dict(data=[str(corpus)], max_tokens=20 * 180, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, num_centroids=16, top_k_clusters=4, train_cfg=cfg, max_steps=12)
    out = tmp_path / "drafter"
    first = run(loaded, out, minutes=0.0, **kwargs)  # out of time after its first step
    assert (first["steps"], first["total_steps"]) == (1, 12)
    assert json.loads((out / "training_report.json").read_text())["steps"] == 1
    assert load_drafter(out).cfg.raw["text_config"]["num_attention_heads"] == 2
    second = run(loaded, out, **kwargs)
    ckpt = torch.load(tmp_path / "drafter.work" / "run_drafter" / "checkpoint.pt", weights_only=False)
    assert second["steps"] == 12 and [h["step"] for h in ckpt["history"]] == list(range(1, 13))


def test_cached_shards_are_checked_against_tokens_layers_and_target(peaky_llama, tiny_llama, tmp_path):
    """A shard is reused only for the same token rows and source layers; a work folder of another target is
    refused (its regenerated text and activations would be that target's)."""
    from edge_spec.train.pipeline import check_work_target, make_shards

    loaded = checkpoints.load(str(peaky_llama))
    seqs = np.random.default_rng(0).integers(4, 300, (3, 16))
    folder = tmp_path / "shards"
    [path] = make_shards(loaded, seqs, [2], folder, dtype=torch.float32)
    stamp = path.stat().st_mtime_ns
    make_shards(loaded, seqs, [2], folder, dtype=torch.float32)
    assert path.stat().st_mtime_ns == stamp  # same rows, same layers: reused
    other = seqs.copy()
    other[1, 5] += 1  # same shape, one token different: recomputed
    make_shards(loaded, other, [2], folder, dtype=torch.float32)
    with np.load(path) as z:
        assert np.array_equal(z["tokens"], other)
    make_shards(loaded, other, [1, 2], folder, dtype=torch.float32)  # another source layer
    with np.load(path) as z:
        assert {"k_1", "v_1", "k_2", "v_2"} <= set(z.files)
    work = tmp_path / "work"
    work.mkdir()
    check_work_target(work, loaded)
    check_work_target(work, loaded)  # same target: fine
    with pytest.raises(ConfigError, match="another target"):
        check_work_target(work, checkpoints.load(str(tiny_llama[0])))


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_teacher_forced_predictions_are_what_a_burst_proposes(tiny_llama, tiny_gemma4, family):
    """The batched teacher-forced drafter (eval-drafter --teacher-forced) proposes, at every anchor and step, the
    same token as a real TorchDrafter burst started at that anchor and fed the true tokens (same inputs,
    positions, masks - sliding rings included - and head)."""
    from edge_spec.runtimes.torch import TorchDrafter
    from edge_spec.train.evaluate import teacher_forced_predictions

    folder = tiny_llama[0] if family == "llama" else tiny_gemma4[0]
    loaded = checkpoints.load(str(folder))
    kwargs = dict(head_from="target") if family == "llama" else dict(clustered=False)
    drafter = new_drafter(loaded.config, hidden_size=32, num_layers=2, intermediate_size=64, num_centroids=16,
                          top_k_clusters=4, seed=3, **kwargs).eval()
    sources = check_pair(loaded.config, drafter.cfg)
    seq = np.random.default_rng(1).integers(4, 300, 30)
    steps, first = 3, 12
    preds = teacher_forced_predictions(loaded.model, drafter, sources, seq, first, steps)
    assert preds.shape == (steps, len(seq) - steps - first)
    backend = TorchBackend(loaded.model, kv_layout(loaded.config, 64))
    session, runner = Session(backend), TorchDrafter(drafter, backend, sources)
    for i, anchor in enumerate(range(first, len(seq) - steps)):
        session.reset()
        out = session.prefill(seq[:anchor].tolist())  # cache = positions < anchor, hidden = H[anchor - 1]
        runner.begin(session.length, session.state.drafter_masks(), session.length)
        hidden = out.hidden[-1]
        for j in range(1, steps + 1):
            step = runner.step(int(seq[anchor + j - 1]), hidden)
            best = step.logits.max()
            assert int(step.token_ids[step.logits == best].min()) == preds[j - 1, i], (anchor, j)
            hidden = step.hidden


def test_eval_drafter_cli_writes_tau_and_acceptance(tiny_llama, tmp_path, capsys):
    loaded = checkpoints.load(str(tiny_llama[0]))
    from edge_spec.model.drafter import save_drafter

    folder = save_drafter(new_drafter(loaded.config, hidden_size=32, num_layers=1, intermediate_size=64,
                                      num_centroids=16, top_k_clusters=4), tmp_path / "d")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7", "chat": false, "kind": "docs"}\n{"prompt": "w9", "chat": true}\n')
    out = tmp_path / "r.json"
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--spec-k", "1", "2", "--temperature", "0", "0.7", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 4 and {r["k"] for r in rows} == {1, 2}
    for r in rows:
        assert r["tau"] >= 1.0 and len(r["acceptance_by_position"]) == r["k"] and "docs" in r["by_kind"]
        assert r["prompts"] == 2 and r["by_kind"]["docs"]["prompts"] == 1  # the kind-less row counts once
        assert set(r["by_kind"]) == {"docs"}
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--max-new-tokens", "12", "--spec-k", "2", "--teacher-forced", "--json", str(out)])
    assert code == 0 and "teacher-forced [" in capsys.readouterr().out
    [row] = json.loads(out.read_text())
    assert len(row["teacher_forced_by_position"]) == 2 and all(0 <= a <= 1 for a in row["teacher_forced_by_position"])
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--temperature", "0.7", "--teacher-forced"])
    assert code == 2 and "--temperature 0" in capsys.readouterr().err
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--spec-k", "2", "--no-mtp", "--lookup", "--json", str(out)])
    [row] = json.loads(out.read_text())
    assert code == 0 and row["mtp"] is False and row["lookup"] is True and row["tau"] >= 1.0
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder), "--prompts", str(prompts),
                 "--no-mtp"])
    assert code == 2 and "no draft source" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt field"}\n')
    code = main(["eval-drafter", "--model", str(tiny_llama[0]), "--drafter", str(folder),
                 "--prompts", str(tmp_path / "bad.jsonl")])
    assert code == 2 and "needs a string field 'prompt'" in capsys.readouterr().err


def test_eval_drafter_on_a_bundle_matches_the_checkpoint_pair(tiny_llama, tmp_path):
    """The ORT bundle path measures the same tau (greedy: same tokens, same acceptances) as eager."""
    from edge_spec.model.drafter import save_drafter
    from edge_spec.exporters.onnx import export_bundle

    loaded = checkpoints.load(str(tiny_llama[0]))
    drafter = new_drafter(loaded.config, hidden_size=32, num_layers=1, intermediate_size=64, num_centroids=16,
                          top_k_clusters=4)
    folder = save_drafter(drafter, tmp_path / "d")
    bundle = export_bundle(loaded, tmp_path / "b", drafter=drafter, drafter_source=str(folder), max_context=96)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7", "chat": false}\n{"prompt": "w9 w2", "chat": false}\n')
    rows = {}
    for name, source in {"eager": ["--model", str(tiny_llama[0]), "--drafter", str(folder)],
                         "ort": ["--bundle", str(bundle)]}.items():
        assert main(["eval-drafter", *source, "--prompts", str(prompts), "--max-new-tokens", "10", "--spec-k", "2",
                     "--json", str(tmp_path / f"{name}.json")]) == 0
        rows[name] = json.loads((tmp_path / f"{name}.json").read_text())[0]
    assert rows["ort"]["runtime"] == "ort" and rows["eager"]["runtime"] == "torch"
    assert rows["ort"]["tau"] == rows["eager"]["tau"]
    assert rows["ort"]["acceptance_by_position"] == rows["eager"]["acceptance_by_position"]
    assert main(["eval-drafter", "--bundle", str(export_bundle(loaded, tmp_path / "plain", max_context=96)),
                 "--prompts", str(prompts)]) == 2


def test_committed_regenerated_answers_are_reused_not_generated_again(tiny_llama, peaky_llama, tmp_path, monkeypatch):
    from edge_spec.train import pipeline

    loaded = checkpoints.load(str(tiny_llama[0]))
    prompts = ["hello there", "a second prompt", "three"]
    (tmp_path / "w1").mkdir()
    first = pipeline.chat_sequences(loaded, prompts, max_new_tokens=6, batch=2, dtype=torch.float32,
                                    cache=tmp_path / "w1" / "chat.jsonl")
    data = tmp_path / "data"
    pipeline.write_regenerated(data, tmp_path / "w1", loaded, {"chat": True})
    with gzip.open(data / "chat.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    assert [len(r["new"]) for r in rows] == [6, 6, 6] and all("prompt" not in r for r in rows)  # ids only, no text

    def no_generation(*args, **kwargs):
        raise AssertionError("a seeded prompt was generated again")

    monkeypatch.setattr(pipeline, "batched_greedy", no_generation)
    (tmp_path / "w2").mkdir()
    again = pipeline.chat_sequences(loaded, prompts, max_new_tokens=6, batch=2, dtype=torch.float32,
                                    cache=tmp_path / "w2" / "chat.jsonl",
                                    seeded=pipeline.read_regenerated(data, loaded)["chat"])
    assert np.array_equal(first, again)
    with pytest.raises(ConfigError, match="another target"):
        pipeline.read_regenerated(data, checkpoints.load(str(peaky_llama)))


def test_a_regeneration_chunk_stops_before_the_teacher_pass(tiny_llama, tmp_path, monkeypatch):
    """`--stop-after regenerate`: the answers reach the committed folder, nothing is trained or written to OUT, and
    the next run (without it) reuses them instead of generating them again."""
    from edge_spec.train import pipeline

    loaded = checkpoints.load(str(tiny_llama[0]))
    out, data = tmp_path / "drafter", tmp_path / "regenerated"
    kwargs = dict(data=["chat"], max_tokens=20 * 180, max_chat_prompts=8, chat_max_new=80, hidden_size=32,
                  num_layers=1, intermediate_size=64, num_centroids=16, top_k_clusters=4,
                  train_cfg=TrainConfig(batch_seqs=2, warmup=1), max_steps=2, regenerated=data)
    report = run(loaded, out, stop_after="regenerate", **kwargs)
    assert report["stopped_after"] == "regenerate" and "chat" in report["data"]
    assert not out.exists() and not any((tmp_path / "drafter.work").glob("shards*"))
    with gzip.open(data / "chat.jsonl.gz", "rt") as f:
        assert len(f.readlines()) == 8

    def no_generation(*args, **kwargs):
        raise AssertionError("a regenerated prompt was generated again")

    monkeypatch.setattr(pipeline, "batched_greedy", no_generation)
    with pytest.raises(ConfigError, match="unknown stage"):
        run(loaded, out, stop_after="teacher", **kwargs)
    assert run(loaded, out, **kwargs)["steps"] == 2 and (out / "training_report.json").exists()
