"""The real default target: SmolLM2-135M-Instruct through our loader/model/session == transformers."""

import numpy as np
import pytest
import torch

from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.decoding.generate import generate_plain
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.decoding.sampling import SamplingParams

PROMPTS = [
    ("The capital of France is", False),
    ("def fibonacci(n):\n    ", False),
    ("What is speculative decoding?", True),
    ("List three uses of a hash map.", True),
    ("In 1969, the first humans", False),
]


def encode(model, prompt, chat):
    return model.tokenizer.encode_prompt(prompt, chat=chat)


def test_logits_match_transformers(smollm2, reference_model):
    for prompt, chat in PROMPTS[:3]:
        ids = encode(smollm2, prompt, chat)
        session = Session(TorchBackend(smollm2.model, kv_layout(smollm2.config, 256)))
        ours = session.forward(ids).logits
        with torch.no_grad():
            theirs = reference_model(torch.tensor([ids])).logits[0].numpy()
        assert np.abs(ours - theirs).max() <= 1e-4, prompt


def test_greedy_32_tokens_identical_to_transformers(smollm2, reference_model):
    session = Session(TorchBackend(smollm2.model, kv_layout(smollm2.config, 512)))
    for prompt, chat in PROMPTS:
        ids = encode(smollm2, prompt, chat)
        ours = generate_plain(session, ids, max_new_tokens=32, params=SamplingParams(0.0),
                              rng=np.random.default_rng(0), stop_ids=frozenset()).tokens
        with torch.no_grad():
            out = reference_model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=0, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
        theirs = out[0, len(ids):].tolist()
        assert len(theirs) == 32 and ours == theirs, prompt


def test_chat_answer_is_sensible(smollm2):
    session = Session(TorchBackend(smollm2.model, kv_layout(smollm2.config, 256)))
    ids = encode(smollm2, "What is the capital of France?", True)
    result = generate_plain(session, ids, max_new_tokens=20, params=SamplingParams(0.0),
                            rng=np.random.default_rng(0), stop_ids=frozenset(smollm2.config.eos_token_ids))
    assert "Paris" in smollm2.tokenizer.decode(result.tokens)
    assert result.stop_reason == "eos"
