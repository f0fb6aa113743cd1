"""`train-drafter --arch eagle3` (issue 48): an EAGLE-3 drafter trained for a tiny target with the training-time-test
unroll, written as a Speculators folder that edge-spec's reader loads unchanged. The loss falls; greedy speculative
generation with the trained folder == plain greedy (eager, and through an exported ONNX bundle); the draft vocabulary
is the most frequent tokens and round-trips through the writer and the reader; a --minutes chunk resumes; a warm
start from a folder keeps its shape; speculators itself loads the folder and its TTT forward gives the logits our
unroll trains (the format oracle); options of the other architecture are refused by name."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from edge_spec.api import load
from edge_spec.cli import main
from edge_spec.errors import ConfigError
from edge_spec.loading import checkpoints
from edge_spec.loading.speculators_eagle3 import check_vocab_map, load_eagle3, read_eagle3_config, save_eagle3
from edge_spec.model.eagle3 import chain_mask
from edge_spec.train.eagle3_data import draft_vocabulary, target_to_draft_index, token_counts
from edge_spec.train.eagle3_pipeline import new_eagle3_drafter, run_eagle3
from edge_spec.train.eagle3_trainer import Eagle3TrainConfig, ttt_logits, unroll_masks

pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
DRAFT_VOCAB = 200  # of the tiny llama's 320
SMALL = dict(draft_vocab=DRAFT_VOCAB, intermediate_size=64, max_tokens=40 * 180)


@pytest.fixture(autouse=True)
def host_check_cache(monkeypatch, tmp_path_factory):
    """The host check's cache in a folder of this test session, not the user's."""
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "train-eagle3-cache"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A learnable language: runs of consecutive word ids (as tests/test_train.py's)."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i in range(40):
        start = rng.integers(4, 200, 30)
        (folder / f"doc_{i}.txt").write_text(" ".join(f"w{int(s) + j}" for s in start for j in range(6)))
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


@pytest.fixture(scope="module")
def trained(peaky_llama, corpus, tmp_path_factory):
    """(target, drafter folder, report): 40 steps on the corpus and the target's own answers / continuations (8 chat
    prompts, 8 document openings: the regenerated data EAGLE trains on), 3 TTT steps, a 200-token draft vocabulary."""
    loaded = checkpoints.load(str(peaky_llama))
    out = tmp_path_factory.mktemp("trained") / "drafter"
    cfg = Eagle3TrainConfig(batch_seqs=2, lr=1e-2, warmup=5, checkpoint_every=20)
    report = run_eagle3(loaded, out, data=["chat", str(corpus)], max_chat_prompts=8, chat_max_new=64,
                        max_regen_text=8, chat_batch=8, train_cfg=cfg, max_steps=40, **SMALL)
    return loaded, out, report


# ---- pure parts --------------------------------------------------------------------------------------------------
def test_the_draft_vocabulary_is_the_most_frequent_tokens_and_round_trips(tiny_llama, tmp_path):
    counts = token_counts([np.array([[5, 5, 5, 7, 7, 2]]), np.array([[9, 7]])], 12)
    assert counts.tolist() == [0, 0, 1, 0, 0, 3, 0, 3, 0, 1, 0, 0]
    d2t, t2d = draft_vocabulary(counts, 4)  # 5 and 7 (3 each), then 2 and 9 (1 each): ties go to the lower id
    assert (torch.arange(4) + d2t).tolist() == [2, 5, 7, 9] and t2d.nonzero().flatten().tolist() == [2, 5, 7, 9]
    d2t, t2d = draft_vocabulary(counts, 6)  # only 4 tokens were seen: the lowest unused ids fill up
    assert (torch.arange(6) + d2t).tolist() == [0, 1, 2, 5, 7, 9]
    assert check_vocab_map(d2t, t2d, 12).tolist() == [0, 1, 2, 5, 7, 9]
    assert target_to_draft_index(d2t, 12).tolist() == [0, 1, 2, -1, -1, 3, -1, 4, -1, 5, -1, -1]
    assert draft_vocabulary(counts, 12) is None  # the whole vocabulary: no map
    with pytest.raises(ConfigError, match="--draft-vocab 13"):
        draft_vocabulary(counts, 13)
    # through the writer and the unchanged reader: the same map, the same draft -> target ids
    loaded = checkpoints.load(str(tiny_llama[0]))
    counts = token_counts([np.random.default_rng(0).integers(0, 320, (4, 64))], 320)
    vocab_map = draft_vocabulary(counts, DRAFT_VOCAB)
    drafter = new_eagle3_drafter(loaded, aux_layers=(0, 1, 3), vocab_map=vocab_map, intermediate_size=64)
    save_eagle3(drafter, tmp_path / "d")
    back = load_eagle3(tmp_path / "d", target_embedding=loaded.model.model.embed_tokens.weight)
    assert torch.equal(back.d2t, vocab_map[0]) and torch.equal(back.t2d, vocab_map[1])
    ids = torch.arange(DRAFT_VOCAB)
    assert torch.equal(back.target_ids(ids), vocab_map[1].nonzero().flatten())
    assert back.cfg == drafter.cfg and back.cfg.aux_layer_ids == (0, 1, 3)
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # lm_head starts as the target's output rows of the draft vocabulary
    assert torch.equal(back.lm_head.weight, loaded.model.lm_head.weight[back.target_ids(ids)])


def test_aux_states_beyond_fp16_are_stored_in_fp32_and_such_shards_are_not_reused(tmp_path):
    """gemma-3-270m's residual stream reaches ~1e5: fp16 made it inf (and the loss NaN), so a shard keeps fp32 aux
    states when a value exceeds fp16's range, fp16 otherwise; a shard holding an inf is recomputed, not reused."""
    from edge_spec.train.eagle3_data import FP16_MAX, _shard_matches, storable

    small = np.array([[1.5, -65504.0]], np.float32)
    assert storable(small).dtype == np.float16 and np.array_equal(storable(small), small)
    big = np.array([[1.5, 104061.0]], np.float32)
    assert storable(big).dtype == np.float32 and np.array_equal(storable(big), big) and big.max() > FP16_MAX
    chunk = np.zeros((1, 2), np.int32)
    for name, aux in (("ok", storable(big)), ("overflowed", big.astype(np.float16))):  # the old writer's inf
        np.savez(tmp_path / f"{name}.npz", tokens=chunk, aux_layers=np.array([1]), aux=aux[None],
                 top_ids=np.zeros((1, 2, 4), np.int32), top_p=np.zeros((1, 2, 4), np.float16))
    assert _shard_matches(tmp_path / "ok.npz", chunk, (1,), 4)
    assert not _shard_matches(tmp_path / "overflowed.npz", chunk, (1,), 4)


def test_bf16_autocast_is_kept_only_where_the_probe_picked_bf16():
    """`with_autocast`: a CPU whose timed probe picked fp32 (no bf16 units: bf16 matmuls were ~40x slower on the AMD
    EPYC) trains in fp32; where it picked bf16 the config is unchanged; --fp32 stays fp32 either way."""
    from edge_spec.train.eagle3_trainer import Eagle3TrainConfig
    from edge_spec.train.teacher import with_autocast
    from edge_spec.train.trainer import TrainConfig

    for cfg in (Eagle3TrainConfig(), TrainConfig()):
        assert cfg.bf16 and not with_autocast(cfg, torch.float32).bf16
        assert with_autocast(cfg, torch.bfloat16) == cfg
        off = with_autocast(cfg, torch.float32)
        assert not with_autocast(off, torch.bfloat16).bf16


def test_unroll_masks_are_speculators_ttt_masks():
    """Step 0 causal over the anchors, each later step one diagonal block per earlier chained step: what
    Speculators' extend_dense_mask_for_draft_tokens builds from a causal mask, and what our runtime's cache shows a
    chained draft row."""
    from speculators.models.eagle3.attention import extend_dense_mask_for_draft_tokens

    n = 5
    masks = unroll_masks(n, 3)
    theirs = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), 0.0, float("-inf"))[None, None]
    for j, mask in enumerate(masks):
        assert mask.shape == (1, 1, n, (j + 1) * n)
        assert torch.equal(mask == 0, theirs == 0), j
        theirs = extend_dense_mask_for_draft_tokens(theirs, n)
    assert (masks[2][0, 0, 3] == 0).tolist() == [True] * 4 + [False] + [False, False, False, True, False] * 2


# ---- a trained drafter ------------------------------------------------------------------------------------------
def test_training_reduces_the_loss_and_writes_a_speculators_folder(trained):
    loaded, out, report = trained
    work = out.parent / "drafter.work"
    ckpt = torch.load(work / "run_eagle3_drafter" / "checkpoint.pt", weights_only=False)
    losses = [h["loss"] for h in ckpt["history"]]
    assert report["steps"] == 40 and len(losses) == 40
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    first = ckpt["history"][0]["steps"]
    last = report["final_train"]["steps"]
    assert all(b["top1"] > a["top1"] + 0.2 for a, b in zip(first, last)), (first, last)
    assert report["held_out"] and len(report["held_out"]) == 3
    saved = json.loads((out / "training_report.json").read_text())
    assert saved["steps"] == 40 and saved["arch"] == "eagle3"
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 1, 0]  # Speculators' (2, L // 2, L - 3), L = 3
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    cfg = read_eagle3_config(out)
    assert cfg.mapped and cfg.norm_before_residual and cfg.norm_before_fc and cfg.norm_output
    # the shards: aux states + the target's top-64 law, 772 bytes a token for H 64, 3 aux layers (+ npz headers)
    shards = sorted(work.glob("eagle3-shards-aux2-1-0/text/shard_*.npz"))
    with np.load(shards[0]) as z:
        assert z["aux"].shape[1:] == (256, 3 * 64) and z["top_ids"].shape[1:] == (256, 64)
        assert z["aux"].dtype == np.float16 and z["aux_layers"].tolist() == [2, 1, 0]
    tokens = sum(np.load(p)["tokens"].size for p in shards)
    assert report["shard_bytes_per_token"] == 772
    assert 772 <= shards[0].stat().st_size / np.load(shards[0])["tokens"].size < 780 and tokens > 0


def test_the_trained_folder_drafts_and_greedy_speculative_equals_plain(trained):
    """Through edge_spec.load(target, drafter=FOLDER) (the eager runtime): greedy speculative == plain on random
    prompts and on prompts from the target's regenerated answers, where the trained drafter's drafts are accepted
    (the peaky tiny target falls into repeating one token there, which the drafter learned; on random prompts it
    goes to contexts the drafter never saw, so only the equality is asserted)."""
    loaded, out, _ = trained
    engine = load(str(loaded.folder), drafter=str(out), max_context=256)
    for seed in range(2):
        prompt = [int(i) for i in np.random.default_rng(seed).integers(4, 300, 10)]
        plain = engine.generate(prompt, max_new_tokens=24, speculative=False)
        spec = engine.generate(prompt, max_new_tokens=24, speculative=True, allow_inexact=True, lookup=False,
                               spec_k=3, adaptive=False)
        assert spec.tokens == plain.tokens
    work = out.parent / "drafter.work"
    accepted = drafted = 0
    for source in ("chat", "regen_text"):
        row = json.loads((work / f"{source}.jsonl").read_text().splitlines()[0])
        prompt = row["ids"][:len(row["ids"]) - 40]
        plain = engine.generate(prompt, max_new_tokens=24, speculative=False)
        spec = engine.generate(prompt, max_new_tokens=24, speculative=True, allow_inexact=True, lookup=False,
                               spec_k=3, adaptive=False)
        assert spec.tokens == plain.tokens
        accepted += int(spec.extra["spec"].accepted.sum())
        drafted += int(spec.extra["spec"].drafted.sum())
    assert accepted >= 0.8 * drafted > 0, (accepted, drafted)


def test_the_runtime_drafts_what_the_unroll_trains(trained):
    """A burst of the eager runtime (runtimes/torch_eagle3: committed rows from the target's recorded states, then
    chained rows through its cache), fed the window's tokens, gives at every step the logits of the training unroll
    for that anchor (fp32, no autocast): what is trained is what drafts."""
    from edge_spec.contract.backend import Session
    from edge_spec.contract.layout import kv_layout
    from edge_spec.runtimes.torch_eagle3 import eagle3_pair

    loaded, out, _ = trained
    drafter = load_eagle3(out, target_embedding=loaded.model.model.embed_tokens.weight)
    seq = np.random.default_rng(5).integers(4, 300, 24)
    t, steps = len(seq), 3
    aux = loaded.model(torch.from_numpy(seq)[None], torch.arange(t)[None], {"full": chain_mask(0, 0, t)},
                       [torch.zeros(1, 2, 0, 16)] * 3, [torch.zeros(1, 2, 0, 16)] * 3,
                       aux_layers=drafter.cfg.aux_layer_ids).aux.detach()
    with torch.no_grad():
        mine = ttt_logits(drafter, torch.from_numpy(seq)[None], aux, steps)
    backend, runner = eagle3_pair(loaded.model, drafter, kv_layout(loaded.config, 64))
    session = Session(backend)
    for anchor in (1, 9, t - steps):
        session.reset()
        prefill = session.prefill(seq[:anchor].tolist())  # positions < anchor committed, token `anchor` pending
        runner.begin(session.length, session.state.drafter_masks(), session.length)
        hidden = prefill.hidden[-1]
        for j in range(steps):
            step = runner.step(int(seq[anchor + j]), hidden)
            assert np.abs(step.logits - mine[j][0, anchor - 1].numpy()).max() < 1e-4, (anchor, j)
            hidden = step.hidden


@pytest.mark.skipif(importlib.util.find_spec("speculators") is None, reason="the `speculators` oracle")
def test_speculators_loads_the_folder_and_its_ttt_forward_is_our_unroll(trained):
    """The format oracle: Speculators' Eagle3DraftModel.from_pretrained reads the folder (its config, tensor names,
    d2t / t2d), and its training forward (3 TTT steps, teacher-forced) gives the per-step logits our unroll trains."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    from tests.tiny_eagle3 import speculators_draft_logits

    loaded, out, _ = trained
    config = Eagle3SpeculatorConfig.from_pretrained(out)
    config.transformer_layer_config._attn_implementation = "eager"
    assert config.speculators_config.verifier.name_or_path == str(loaded.folder)
    ref = Eagle3DraftModel.from_pretrained(out, config=config, dtype=torch.float32).eval()
    # the folder leaves the embedding to the verifier. Speculators 0.9 copies the verifier's only over a NaN table,
    # and from_pretrained leaves a missing tensor uninitialised (not NaN): set it as its verifier loading means to
    with torch.no_grad():
        ref.embed_tokens.weight.copy_(loaded.model.model.embed_tokens.weight)
    assert torch.equal(ref.verifier_lm_head.weight, loaded.model.lm_head.weight[ref.t2d])  # read from the verifier
    ours = load_eagle3(out, target_embedding=loaded.model.model.embed_tokens.weight)
    assert torch.equal(ref.d2t, ours.d2t) and torch.equal(ref.t2d, ours.t2d)
    t, steps = 14, 3
    tokens = torch.from_numpy(np.random.default_rng(3).integers(4, 300, (1, t)))
    aux = loaded.model(tokens, torch.arange(t)[None], {"full": chain_mask(0, 0, t)}, [torch.zeros(1, 2, 0, 16)] * 3,
                       [torch.zeros(1, 2, 0, 16)] * 3, aux_layers=ours.cfg.aux_layer_ids).aux.detach()
    theirs, _ = speculators_draft_logits(ref, aux[:, :t - 1], tokens[:, 1:], ttt_steps=steps)  # row i = our p = i + 1
    with torch.no_grad():
        mine = ttt_logits(ours, tokens, aux, steps)
    n = t - steps
    for j in range(steps):
        assert (mine[j][0] - theirs[j][0, :n]).abs().max() < 1e-4, j


def test_a_minutes_chunk_stops_and_the_next_continues(peaky_llama, corpus, tmp_path):
    loaded = checkpoints.load(str(peaky_llama))
    cfg = Eagle3TrainConfig(batch_seqs=2, lr=1e-2, warmup=5, checkpoint_every=20)
    out = tmp_path / "drafter"
    kwargs = dict(data=[str(corpus)], train_cfg=cfg, max_steps=10, **SMALL)
    first = run_eagle3(loaded, out, minutes=0.0, **kwargs)  # out of time after its first step
    assert (first["steps"], first["total_steps"]) == (1, 10)
    assert json.loads((out / "training_report.json").read_text())["steps"] == 1
    load_eagle3(out, target_embedding=loaded.model.model.embed_tokens.weight)  # a chunk's folder is a drafter
    shards = sorted((tmp_path / "drafter.work").glob("eagle3-shards-*/*/shard_*.npz"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    second = run_eagle3(loaded, out, **kwargs)
    ckpt = torch.load(tmp_path / "drafter.work" / "run_eagle3_drafter" / "checkpoint.pt", weights_only=False)
    assert second["steps"] == 10 and [h["step"] for h in ckpt["history"]] == list(range(1, 11))
    assert [p.stat().st_mtime_ns for p in shards] == stamps  # the teacher shards were reused
    assert not list(tmp_path.glob(".drafter.*"))  # no partial or old folder left behind
    # the checkpoint belongs to that vocabulary: another one is refused, not silently mixed in
    with pytest.raises(ConfigError, match="another draft vocabulary"):
        run_eagle3(loaded, out, **{**kwargs, "draft_vocab": DRAFT_VOCAB + 1, "max_steps": 12})


def test_a_warm_start_keeps_the_folders_shape_and_moves_its_weights(trained, corpus, tmp_path):
    loaded, init, _ = trained
    out = tmp_path / "again"
    cfg = Eagle3TrainConfig(batch_seqs=2, lr=1e-2, warmup=1)
    report = run_eagle3(loaded, out, data=[str(corpus)], train_cfg=cfg, max_steps=3, init=init, max_tokens=20 * 180,
                        intermediate_size=None)
    assert report["steps"] == 3 and report["drafter"]["init"] == str(init)
    a = load_eagle3(init, target_embedding=loaded.model.model.embed_tokens.weight)
    b = load_eagle3(out, target_embedding=loaded.model.model.embed_tokens.weight)
    assert a.cfg == b.cfg and torch.equal(a.d2t, b.d2t)
    assert not torch.equal(a.fc.weight, b.fc.weight)
    assert (a.fc.weight - b.fc.weight).abs().max() < 0.1  # trained on from there, not redrawn
    with pytest.raises(ConfigError, match="differs from the --init drafter's"):
        run_eagle3(loaded, tmp_path / "x", data=[str(corpus)], train_cfg=cfg, max_steps=1, init=init, draft_vocab=100)


# ---- the CLI ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, names", [
    (["--arch", "eagle3", "--centroids", "16", "--shard-bits", "4"], ["--centroids, --shard-bits", "--arch mtp"]),
    (["--arch", "eagle3", "--hidden-size", "32"], ["--hidden-size", "an MTP drafter's"]),
    (["--draft-vocab", "100"], ["--draft-vocab", "EAGLE-3", "--arch eagle3"]),
    (["--aux-layers", "0", "1", "3"], ["--aux-layers", "--arch eagle3"]),
    (["--arch", "eagle3", "--init", "builtin:mtp"], ["--init builtin:mtp", "an mtp drafter", "--init builtin:eagle3"]),
    (["--arch", "eagle3", "--init", "builtin"], ["no built-in drafter", "'nowhere'"]),
])
def test_options_of_the_other_architecture_are_refused(tmp_path, capsys, args, names):
    code = main(["train-drafter", "--target", "nowhere", "--out", str(tmp_path / "d"), *args])
    err = capsys.readouterr().err
    assert code == 2 and "fix:" in err and "Traceback" not in err, err
    assert all(name in err for name in names), err
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.work").exists()


def test_bad_eagle3_options_are_refused_before_any_work(tiny_llama, corpus, tmp_path, capsys):
    base = ["train-drafter", "--arch", "eagle3", "--target", str(tiny_llama[0]), "--data", str(corpus), "--out",
            str(tmp_path / "d")]
    for extra, name in [(["--aux-layers", "0", "1", "4"], "[0, 3]"), (["--aux-layers", "1", "1"], "distinct"),
                        (["--draft-vocab", "321"], "--draft-vocab 321"), (["--heads", "3"], "--heads 3"),
                        (["--init", str(corpus)], "not a Speculators eagle3 folder")]:
        code = main(base + extra)
        err = capsys.readouterr().err
        assert code == 2 and name in err and "fix:" in err and "Traceback" not in err, (extra, err)
    assert not list((tmp_path / "d.work").glob("eagle3-shards*"))


def test_cli_trains_exports_to_onnx_and_generates(peaky_llama, corpus, tmp_path, capsys):
    """The issue's path end to end: train-drafter --arch eagle3 -> export --drafter OUT --format onnx -> generate with
    the bundle: speculative output == plain output."""
    pytest.importorskip("onnxruntime")
    target, out, bundle = str(peaky_llama), tmp_path / "drafter", tmp_path / "bundle"
    code = main(["train-drafter", "--arch", "eagle3", "--target", target, "--data", str(corpus), "--out", str(out),
                 "--max-steps", "4", "--batch-seqs", "2", "--lr", "1e-2", "--intermediate-size", "64",
                 "--draft-vocab", str(DRAFT_VOCAB), "--max-tokens", "4000", "--save-dtype", "bfloat16"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert json.loads(printed.out[:printed.out.rindex("}") + 1])["steps"] == 4
    assert "drafter written to" in printed.err
    code = main(["export", "--model", target, "--drafter", str(out), "--format", "onnx", "--exporter", "torchscript",
                 "--max-context", "64", "--out", str(bundle)])
    assert code == 0, capsys.readouterr().err
    assert json.loads((bundle / "manifest.json").read_text())["drafter"]["kind"] == "eagle3"
    capsys.readouterr()
    args = ["generate", "--bundle", str(bundle), "--prompt", "w5 w6 w7 w8", "--max-new-tokens", "12", "--quiet"]
    assert main(args + ["--no-spec"]) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--spec-k", "2"]) == 0
    assert capsys.readouterr().out == plain and plain.strip()


def test_two_ranks_train_what_one_rank_trains(peaky_llama, corpus, tmp_path):
    """torchrun, 2 ranks on this CPU (gloo), --fp32: every rank draws the same global batch and trains on its half
    under DDP; the losses and the written weights are one process's (which reuses the 2-rank run's shards), to
    fp32 rounding (seen: 9e-8 on the losses, 6.9e-6 of a tensor's largest weight)."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    args = ["train-drafter", "--arch", "eagle3", "--target", str(peaky_llama), "--data", str(corpus), "--work",
            str(tmp_path / "work"), "--max-steps", "6", "--batch-seqs", "4", "--lr", "1e-2", "--intermediate-size",
            "64", "--draft-vocab", str(DRAFT_VOCAB), "--fp32"]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "edge_spec.cli", *args, "--out", str(tmp_path / "d2")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args, "--out", str(tmp_path / "d1")]) == 0
    finally:
        torch.set_num_threads(threads)
    reports = [json.loads((tmp_path / d / "training_report.json").read_text()) for d in ("d1", "d2")]
    assert [r["world_size"] for r in reports] == [1, 2]
    losses = [[h["loss"] for h in torch.load(tmp_path / "work" / f"run_eagle3_{d}" / "checkpoint.pt",
                                            weights_only=False)["history"]] for d in ("d1", "d2")]
    assert len(losses[0]) == 6
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("d1", "d2"))
    assert a.keys() == b.keys() and torch.equal(a["d2t"], b["d2t"]) and torch.equal(a["t2d"], b["t2d"])
    for k in (k for k in a if a[k].is_floating_point()):
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=0, atol=5e-5 * float(a[k].abs().max()), err_msg=k)


def test_a_gemma4_target_trains_and_drafts_exactly(tiny_gemma4, corpus, tmp_path):
    """A target with sliding-window layers, shared KV, per-layer inputs and soft-capped logits (tests/tiny.py): the
    teacher pass and the trained folder work the same way. Its 4 layers make Speculators' default aux layers
    (2, 2, 1) collide, which is refused with the fix; explicit ones train."""
    loaded = checkpoints.load(str(tiny_gemma4[0]))
    cfg = Eagle3TrainConfig(batch_seqs=2, lr=1e-2, warmup=1)
    kwargs = dict(data=[str(corpus)], train_cfg=cfg, max_steps=3, draft_vocab=DRAFT_VOCAB, intermediate_size=64,
                  max_tokens=20 * 180)
    with pytest.raises(ConfigError, match=r"default aux layers for 4 layers \(2, 2, 1\)") as err:
        run_eagle3(loaded, tmp_path / "d", **kwargs)
    assert "--aux-layers" in err.value.fix
    report = run_eagle3(loaded, tmp_path / "d", aux_layers=(1, 2, 4), **kwargs)
    assert report["steps"] == 3 and report["drafter"]["aux_layers"] == [1, 2, 4]
    engine = load(str(tiny_gemma4[0]), drafter=str(tmp_path / "d"), max_context=64, host_check=False)
    prompt = [5, 17, 42, 99, 7]
    assert (engine.generate(prompt, max_new_tokens=16, speculative=True, allow_inexact=True, lookup=False).tokens
            == engine.generate(prompt, max_new_tokens=16, speculative=False).tokens)
