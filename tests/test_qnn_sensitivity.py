"""exporters/qnn_sensitivity.py: the 16a8w recipe's choice of layers whose weights stay at 16 bits (tiny models, eager;
the exporter's use of it: tests/test_qnn.py)."""

import numpy as np
import pytest
import torch

from edge_spec.exporters.qnn import WIDE_WEIGHTS
from edge_spec.exporters.qnn_sensitivity import (HEAD, candidates, choose, fake_quant, graph_name, linear_gains,
                                                 mean_kl, sequence_logits)
from edge_spec.loading import checkpoints


def test_fake_quant_rounds_each_row_to_its_own_symmetric_grid():
    w = torch.tensor([[1.0, -0.5, 0.26], [100.0, 1.0, -0.3]])
    q = fake_quant(w, 8)  # row 0: step 1/127, row 1: step 100/127
    assert torch.equal(q[0], torch.round(w[0] * 127) / 127)
    assert q[1, 0] == 100.0 and q[1, 1] == pytest.approx(100 / 127) and q[1, 2] == 0.0
    assert torch.equal(fake_quant(torch.zeros(2, 3), 8), torch.zeros(2, 3))
    assert (fake_quant(w, 16) - w).abs().max() <= 100 / 32767 / 2 + 1e-6


def test_mean_kl_is_zero_for_equal_logits_and_exact_for_two_tokens():
    a = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    assert mean_kl(a, a) == 0.0
    p, q = np.array([0.5, 0.5]), np.exp([2.0, 0.0]) / np.exp([2.0, 0.0]).sum()
    assert mean_kl(torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 0.0]])) == pytest.approx(float((p * np.log(p / q)).sum()))


def test_choose_takes_the_largest_cuts_per_byte_within_the_budget():
    # recipe KL 1.0; KL with each alone at 16 bits: a 0.5 (cut 50%), b 0.97 (3%: below GAIN), c 0.7 (30%), d 0.8 (20%)
    kl = {"a": 0.5, "b": 0.97, "c": 0.7, "d": 0.8}
    assert choose(1.0, kl, dict.fromkeys(kl, 10), 1000) == ("a", "c", "d")
    assert choose(1.0, kl, dict.fromkeys(kl, 10), 1000, budget=0.02) == ("a", "c")  # 20 bytes of 1000
    dear = {"a": 100, "b": 10, "c": 10, "d": 10}  # a: 0.005 of cut per byte, c 0.03, d 0.02: a comes last
    assert choose(1.0, kl, dear, 1000, budget=0.1) == ("c", "d")  # 20 + 100 > 100: a does not fit
    assert choose(1.0, kl, dear, 1000, budget=0.12) == ("a", "c", "d")
    assert choose(1.0, kl, dear, 1000, budget=0.12, gain=0.25) == ("a", "c")
    assert choose(1.0, {"a": 0.99, "b": float("nan")}, {"a": 1, "b": 1}, 1000) == ()


def test_graph_names_are_the_onnx_weight_paths():
    assert graph_name("model.layers.11.mlp.down_proj") == "layers.11/mlp/down_proj"
    assert graph_name("model.layers.0.self_attn.o_proj") == "layers.0/self_attn/o_proj"
    assert graph_name(HEAD) == "lm_head"


@pytest.fixture
def tiny(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


def test_a_linear_with_an_outlier_weight_cuts_most_and_the_weights_come_back(tiny):
    """One large weight per output row of layer 1's down_proj blows its 8-bit rows' grids (the rest rounds to 0):
    16 bits there cut the KL most, and it is chosen; every weight is bit-identical afterwards, the head still tied."""
    model = tiny.model
    with torch.no_grad():
        down = model.model.layers[1].mlp.down_proj.weight  # [hidden, inter]
        down[:, 0] = 40.0 * down.abs().max()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = np.random.default_rng(0)
    sequences = [rng.integers(4, model.cfg.vocab_size, 24).tolist() for _ in range(3)]
    recipe, with_16 = linear_gains(model, sequences, WIDE_WEIGHTS)
    extra = candidates(model, WIDE_WEIGHTS)
    assert list(with_16) == list(extra) and len(extra) == 3 * 4 + 1  # o, gate, up, down per layer; the head
    assert extra["model.layers.0.mlp.gate_proj"] == 64 * 128 and extra[HEAD] == 320 * 64
    assert min(with_16, key=with_16.get) == "model.layers.1.mlp.down_proj"
    assert with_16["model.layers.1.mlp.down_proj"] < 0.5 * recipe
    assert "model.layers.1.mlp.down_proj" in choose(recipe, with_16, extra, sum(p.numel() for p in model.parameters()))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_sequence_logits_match_transformers(tiny, tiny_llama):
    """The causal pass from position 0 the sensitivity scores on gives transformers' logits (the oracle)."""
    ids = [5, 9, 11, 40, 7]
    with torch.no_grad():
        oracle = tiny_llama[1](torch.tensor([ids])).logits[0]
    torch.testing.assert_close(sequence_logits(tiny.model, torch.tensor([ids]))[0], oracle, atol=1e-4, rtol=1e-4)


def test_passes_split_to_bound_the_logits_give_the_same_figures(tiny, monkeypatch):
    """A 262k-vocabulary head scores a few sequences per pass (`LOGITS_PER_BATCH`); the figures do not depend on it."""
    import edge_spec.exporters.qnn_sensitivity as sensitivity

    rng = np.random.default_rng(1)
    sequences = [rng.integers(4, tiny.model.cfg.vocab_size, n).tolist() for n in (16, 16, 16, 9)]
    whole = linear_gains(tiny.model, sequences, WIDE_WEIGHTS)
    monkeypatch.setattr(sensitivity, "LOGITS_PER_BATCH", 1)  # one sequence per pass
    split = linear_gains(tiny.model, sequences, WIDE_WEIGHTS)
    assert split[0] == pytest.approx(whole[0], rel=1e-4)
    assert split[1] == pytest.approx(whole[1], rel=1e-4)
