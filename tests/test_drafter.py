"""The MTP drafter vs transformers' Gemma4AssistantForCausalLM + its candidate generator."""

import numpy as np
import pytest
import torch

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.loading.checkpoints import load_drafter
from edge_spec.model.drafter import check_pair, new_drafter, save_drafter
from edge_spec.model.config import from_hf_dict
from edge_spec.errors import CheckpointError
from edge_spec.runtimes.torch import TorchBackend, TorchDrafter
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from tests.tiny import gemma4_assistant, gemma4_config, llama_config, save_reference

PROMPT = [int(i) for i in np.random.default_rng(3).integers(4, 320, 10)]
K = 4


@pytest.fixture(scope="module", params=[True, False], ids=["clustered", "dense"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    target_ref = save_reference(gemma4_config(), folder / "target", seed=4)
    assistant_ref = gemma4_assistant(target_ref.config, ordered=request.param, seed=5, num_assistant_tokens=K)
    assistant_ref.save_pretrained(folder / "drafter")
    target = checkpoints.load(str(folder / "target"))
    drafter = load_drafter(folder / "drafter")
    return target_ref, assistant_ref, target, drafter


def reference_bursts(target_ref, assistant_ref, max_new_tokens):
    """transformers' assisted generate, recording every assistant call's logits."""
    calls = []
    hook = assistant_ref.register_forward_hook(lambda m, args, out: calls.append(out.logits[0, -1].clone()))
    try:
        with torch.no_grad():
            out = target_ref.generate(torch.tensor([PROMPT]), assistant_model=assistant_ref, do_sample=False,
                                      max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    finally:
        hook.remove()
    return out[0, len(PROMPT):].tolist(), calls


def test_first_burst_draft_logits_and_tokens_match(pair):
    target_ref, assistant_ref, target, drafter = pair
    _, calls = reference_bursts(target_ref, assistant_ref, max_new_tokens=K + 2)
    backend = TorchBackend(target.model, kv_layout(target.config, 64))
    session = Session(backend)
    out = session.prefill(PROMPT)
    token, hidden = int(out.logits[-1].argmax()), out.hidden[-1]
    runner = TorchDrafter(drafter, backend, check_pair(target.config, drafter.cfg))
    runner.begin(session.length, session.state.drafter_masks(), session.length)
    assert len(calls) >= K
    for ref_logits in calls[:K]:  # the first burst right after the prefill
        step = runner.step(token, hidden)
        ref = ref_logits.numpy()
        assert np.abs(step.logits - ref[step.token_ids]).max() <= 1e-4
        token = int(step.token_ids[np.argmax(step.logits)])
        assert token == int(ref.argmax())  # same draft token (outside tokens hold min - 1 in transformers)
        hidden = step.hidden


def test_speculative_greedy_equals_transformers_assisted_generate(pair):
    target_ref, assistant_ref, target, drafter = pair
    theirs, _ = reference_bursts(target_ref, assistant_ref, max_new_tokens=20)
    backend = TorchBackend(target.model, kv_layout(target.config, 64))
    ours = generate_speculative(Session(backend), TorchDrafter(drafter, backend, check_pair(target.config, drafter.cfg)),
                                PROMPT, max_new_tokens=20, params=SamplingParams(), rng=np.random.default_rng(0),
                                stop_ids=frozenset(), k=K, vocab_size=target.config.vocab_size)
    assert ours.tokens == theirs


def test_save_load_round_trip_and_clustered_candidates(tmp_path, tiny_llama):
    cfg = checkpoints.load(str(tiny_llama[0])).config
    drafter = new_drafter(cfg, hidden_size=32, num_layers=2, intermediate_size=64, num_centroids=16, top_k_clusters=4)
    assert drafter.cfg.candidates_per_step == 4 * 320 // 16
    again = load_drafter(save_drafter(drafter, tmp_path / "d"))
    for key, value in drafter.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key
    assert not list(tmp_path.glob("*.tmp-*"))


def test_mismatched_drafter_is_refused(tiny_llama, tiny_gemma4):
    llama = checkpoints.load(str(tiny_llama[0])).config
    gemma = checkpoints.load(str(tiny_gemma4[0])).config
    drafter = new_drafter(llama, hidden_size=32, num_layers=1, intermediate_size=64, num_centroids=16)
    with pytest.raises(CheckpointError, match="drafter does not match the target"):
        check_pair(gemma, drafter.cfg)
    wider = from_hf_dict(llama_config(hidden_size=128).to_dict())
    with pytest.raises(CheckpointError, match="target hidden size 64, target has 128"):
        check_pair(wider, drafter.cfg)


def test_token_ordering_must_be_a_permutation(tmp_path, tiny_llama):
    cfg = checkpoints.load(str(tiny_llama[0])).config
    drafter = new_drafter(cfg, hidden_size=32, num_layers=1, intermediate_size=64, num_centroids=16)
    drafter.masked_embedding.token_ordering.zero_()
    with pytest.raises(CheckpointError, match="not a permutation"):
        load_drafter(save_drafter(drafter, tmp_path / "d"))
