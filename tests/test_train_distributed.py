"""`train-drafter` under torchrun on this CPU (gloo): 2 ranks train what 1 rank trains, a run stopped at 2 ranks
resumes at 1, a failing rank fails the launch and leaves no drafter; the teacher pass is split, not duplicated."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from edge_spec.cli import main
from edge_spec.errors import ConfigError
from edge_spec.loading import checkpoints
from edge_spec.train.dist import Dist, check_batch, rows
from edge_spec.train.pipeline import chat_sequences, make_shards
from edge_spec.train.teacher import extract
from edge_spec.train.trainer import top_sidecar

STEPS = 12
SMALL = ["--hidden-size", "32", "--layers", "1", "--intermediate-size", "64", "--centroids", "16",
         "--top-k-clusters", "4", "--batch-seqs", "4", "--lr", "1e-2", "--max-tokens", "70000"]  # 3 shards
CHAT = ["chat", "--max-chat-prompts", "6", "--regen-tokens", "8", "--regen-batch", "2", "--regen-text", "3"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny llama whose next-token law is sharp (as tests/test_train.py's peaky_llama) and a plain .txt corpus."""
    from tests.tiny import llama_config, save_reference

    folder = tmp_path_factory.mktemp("dist")
    model = save_reference(llama_config(), folder / "target")
    with torch.no_grad():
        model.model.norm.weight.mul_(30.0)
    model.save_pretrained(folder / "target")
    rng = np.random.default_rng(0)
    text = "\n\n".join(" ".join(f"w{int(s) + j}" for s in rng.integers(4, 200, 30) for j in range(6))
                       for _ in range(400))
    (folder / "corpus.txt").write_text(text)
    return folder


def launch(folder, *args, ranks=2, script=None, timeout=120):
    """torchrun (--standalone: a free port per launch) of `edge-spec train-drafter` or `script`."""
    entry = [str(script)] if script else ["-m", "edge_spec.cli"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *entry,
           "train-drafter", "--target", str(folder / "target"), "--data", str(folder / "corpus.txt"), *args]
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def alone(folder, *args):
    """The same command in one process, no torchrun (this test process, one thread as each rank)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(["train-drafter", "--target", str(folder / "target"), "--data", str(folder / "corpus.txt"), *args])
    finally:
        torch.set_num_threads(threads)


def history(work, out):
    return torch.load(work / f"run_{out}" / "checkpoint.pt", weights_only=False)["history"]


def assert_same_run(folder, a, b, work, rtol=1e-5, wtol=5e-5):
    """Same losses step by step (to `rtol`) and same drafter weights (to `wtol` of each tensor's largest value; in
    fp32 most weights come out bit-equal, the largest difference seen was 7.5e-6, an element AdamW moved on a
    near-zero gradient)."""
    la = [h["loss"] for h in history(work, a)]
    lb = [h["loss"] for h in history(work, b)]
    assert len(la) == len(lb) == STEPS
    np.testing.assert_allclose(la, lb, rtol=rtol)
    wa, wb = load_file(str(folder / a / "model.safetensors")), load_file(str(folder / b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_allclose(wa[k].numpy(), wb[k].numpy(), rtol=0, atol=wtol * float(wa[k].abs().max()),
                                   err_msg=k)


@pytest.fixture(scope="module")
def two_ranks(target):
    """One 2-rank run on the text file and a little regenerated chat: (its work folder, its report)."""
    work = target / "work"
    done = launch(target, *CHAT, "--out", str(target / "d2"), "--work", str(work), "--max-steps", str(STEPS), *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((target / "d2" / "training_report.json").read_text())
    printed = json.loads(done.stdout[:done.stdout.rindex("}") + 1])
    assert report["world_size"] == printed["world_size"] == 2 and printed["steps"] == STEPS
    return work, report


def test_two_ranks_train_what_one_rank_trains(target, two_ranks):
    """Same global batch (4 sequences: 2 per rank), same schedule: the same loss at every step and the same weights
    as one process (which reuses the 2-rank run's shards, so both train on the very same teacher activations).
    fp32 (--fp32): to fp32 rounding; bf16 autocast (the default): to bf16's, which rounds each rank's weight
    gradients before DDP averages them (trainer.mtp_loss)."""
    work, _ = two_ranks
    chunk = ["--work", str(work), "--max-steps", str(STEPS), *SMALL]
    done = launch(target, "--out", str(target / "e2"), "--fp32", *chunk)
    assert done.returncode == 0, done.stderr[-3000:]
    assert alone(target, "--out", str(target / "e1"), "--fp32", *chunk) == 0
    assert json.loads((target / "e1" / "training_report.json").read_text())["world_size"] == 1
    assert_same_run(target, "e1", "e2", work)
    assert alone(target, *CHAT, "--out", str(target / "d1"), *chunk) == 0  # as the 2-rank bf16 run of the fixture
    assert_same_run(target, "d1", "d2", work, rtol=1e-3, wtol=5e-2)  # seen: 1.3e-5, 1.0e-2


def test_the_split_teacher_pass_is_the_one_process_teacher_pass(target, two_ranks, tmp_path):
    """Each rank wrote its share: every shard (and top-k sidecar) exists once and holds what one process computes;
    the regenerated answers of both ranks were merged into one cache, equal to one process's answers."""
    work, report = two_ranks
    dtype = getattr(torch, report["teacher_dtype"].removeprefix("torch."))
    loaded = checkpoints.load(str(target / "target"))
    shards = sorted((work / "shards" / "text").glob("shard_[0-9][0-9][0-9][0-9].npz"))
    assert len(shards) >= 2 and all(top_sidecar(p).exists() for p in shards)
    for path in shards:
        with np.load(path) as z:
            ref = extract(loaded.model, z["tokens"], [], dtype=dtype)
            np.testing.assert_allclose(z["hidden"].astype(np.float32), ref["hidden"].astype(np.float32), atol=2e-2)
    assert not list(work.glob("*.rank*.jsonl"))  # the ranks' parts are merged and gone
    rows_2 = [json.loads(line) for line in (work / "chat.jsonl").read_text().splitlines()]
    prompts = [r["prompt"] for r in rows_2]
    assert len(prompts) == len(set(prompts)) == 6
    again = chat_sequences(loaded, prompts, max_new_tokens=8, batch=2, dtype=dtype, cache=tmp_path / "chat.jsonl")
    assert np.array_equal(again, chat_sequences(loaded, prompts, max_new_tokens=8, batch=2, dtype=dtype,
                                                cache=work / "chat.jsonl"))


def test_a_run_stopped_at_two_ranks_resumes_at_one(target, two_ranks):
    """--minutes 0 stops after one step (rank 0's checkpoint); one process continues it to the end, exactly as one
    process continues a one-process run stopped at the same step."""
    work, _ = two_ranks
    chunk = ["--work", str(work), "--max-steps", str(STEPS), "--fp32", *SMALL]
    done = launch(target, "--out", str(target / "r2"), "--minutes", "0", *chunk)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((target / "r2" / "training_report.json").read_text())["steps"] == 1
    assert alone(target, "--out", str(target / "r2"), *chunk) == 0
    assert alone(target, "--out", str(target / "r1"), "--minutes", "0", *chunk) == 0
    assert alone(target, "--out", str(target / "r1"), *chunk) == 0
    assert_same_run(target, "r1", "r2", work)


FAILING = """import os, sys
from edge_spec.cli import main
from edge_spec.errors import ConfigError
from edge_spec.train import trainer

if os.environ["RANK"] == "1":  # rank 1 fails in its third training step; rank 0 waits for it in DDP's all_reduce
    real, calls = trainer.mtp_loss, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ConfigError("rank 1 failed on purpose", "nothing: a test")
        return real(*args, **kwargs)

    trainer.mtp_loss = failing
sys.exit(main(sys.argv[1:]))
"""


def test_a_failing_rank_fails_the_launch_and_leaves_no_drafter(target, two_ranks):
    work, _ = two_ranks
    script = target / "failing.py"
    script.write_text(FAILING)
    done = launch(target, "--out", str(target / "bad"), "--work", str(work), "--max-steps", str(STEPS), *SMALL,
                  script=script)
    assert done.returncode != 0
    assert "error: rank 1 failed on purpose" in done.stderr  # the rank's own line
    assert "ConfigError: rank 1 failed on purpose" in done.stderr[done.stderr.index("Root Cause"):]  # torchrun's
    assert not (target / "bad").exists() and not list(target.glob(".bad*"))


def test_the_global_batch_must_split_evenly_over_the_ranks():
    assert rows(4, Dist(rank=1, world_size=2)) == slice(2, 4)
    with pytest.raises(ConfigError, match=r"multiple of 2 \(e.g. 4\)"):
        check_batch(3, 2)
    check_batch(3, 1)


def test_make_shards_writes_only_the_shards_of_its_rank(target, tmp_path):
    loaded = checkpoints.load(str(target / "target"))
    seqs = np.random.default_rng(0).integers(4, 300, (10, 16))
    paths = make_shards(loaded, seqs, [2], tmp_path / "a", dtype=torch.float32, shard_seqs=4, dist=Dist(1, 2))
    assert [p.name for p in paths] == ["shard_0000.npz", "shard_0001.npz", "shard_0002.npz"]
    assert [p.exists() for p in paths] == [False, True, False] and top_sidecar(paths[1]).exists()
    paths = make_shards(loaded, seqs, [2], tmp_path / "b", dtype=torch.float32, shard_seqs=4, dist=Dist(1, 2), first=3)
    assert [p.exists() for p in paths] == [True, False, True]  # dealt on from the run's earlier shard sets
