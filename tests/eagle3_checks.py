"""Checks every EAGLE-3 bundle format's tests share (tests/test_eagle3_executorch.py, tests/test_eagle3_coreml.py)."""

from __future__ import annotations

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import accept_all, generate_speculative


def assert_accept_all_as_eager(engine, eager_pair, prompt: list[int], k: int, tokens: int, vocab_size: int) -> None:
    """Every draft accepted (a wrong verifier on purpose): the bundle and the eager runtime (`eager_pair`: its
    backend and drafter) give the same tokens only if every burst rebuilds the committed rows from the target's states
    alike; at least 10 drafts accepted."""
    backend, drafter = eager_pair
    runs = [generate_speculative(session, runner, prompt, max_new_tokens=tokens, params=SamplingParams(),
                                 rng=np.random.default_rng(0), stop_ids=frozenset(), k=k, vocab_size=vocab_size,
                                 verifier=accept_all)
            for session, runner in ((engine.session, engine.drafter), (Session(backend), drafter))]
    assert runs[0].tokens == runs[1].tokens and runs[0].extra["spec"].accepted.sum() >= 10


def assert_host_check_passes_and_speculates(folder, prompt: list[int], tokens: int) -> None:
    """The bundle loads with its host check, and greedy speculative at k = 3 == plain, having drafted."""
    engine = load_bundle(folder)
    plain = engine.generate(prompt, max_new_tokens=tokens, speculative=False)
    spec = engine.generate(prompt, max_new_tokens=tokens, speculative=True, lookup=False, spec_k=3, adaptive=False)
    assert spec.tokens == plain.tokens and spec.extra["spec"].drafted.sum() > 0
