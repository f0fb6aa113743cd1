"""Parity checks every runtime's bundle shares: its target and drafter against the eager reference."""

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.model.drafter import check_pair
from edge_spec.runtimes.torch import TorchBackend, TorchDrafter

LOGITS_TOL = 1e-4  # fp32 exported vs eager, max abs (tiny models: logits ~1, so ~1,000 ulps of headroom)


def prompt_ids(n, seed=0, vocab=320):
    return [int(i) for i in np.random.default_rng(seed).integers(4, vocab, n)]


def chunked_logits(session, ids, size):
    """Logits [len(ids), V] of every position, in committed passes of `size` tokens."""
    out = []
    for start in range(0, len(ids), size):
        out.append(session.forward(ids[start:start + size]).logits)
        session.commit(len(ids[start:start + size]))
    return np.concatenate(out)


def assert_target_matches_eager(folder, target, threads=1, tol=LOGITS_TOL):
    """Logits and hidden states == eager through chunked prefill, passes of 1-4 tokens with random accepted prefixes,
    rewinds that every ring still allows, and a reset (nothing stale may become visible). `tol`: on the logits
    (and, relative, on the hidden states: 10x it)."""
    engine = load_bundle(folder, threads=threads)
    ours = Session(engine.session.backend, prefill_chunk=7)
    ref = Session(TorchBackend(target.model, engine.session.state.layout), prefill_chunk=7)
    rng = np.random.default_rng(0)
    ids = prompt_ids(19)
    a, b = ours.prefill(ids), ref.prefill(ids)
    worst = np.abs(a.logits - b.logits).max()
    for step in range(40):
        tokens = prompt_ids(1 + step % 4, seed=step)
        a, b = ours.forward(tokens), ref.forward(tokens)
        worst = max(worst, np.abs(a.logits - b.logits).max())
        assert np.abs(a.hidden - b.hidden).max() <= 10 * tol * max(1.0, np.abs(b.hidden).max())
        n = int(rng.integers(1, len(tokens) + 1))
        ours.commit(n)
        ref.commit(n)
        if step in (12, 30):  # a rewind that every ring still allows, then keep going
            back = ours.length - 2  # gemma: a 14-slot ring for window 6 allows 9
            ours.rewind(back)
            ref.rewind(back)
    assert worst <= tol
    ours.reset()
    ref.reset()  # after a reset (buckets shrink, stale rows stay in the buffers) nothing stale is visible
    a, b = ours.prefill(ids[:5]), ref.prefill(ids[:5])
    assert np.abs(a.logits - b.logits).max() <= tol


def assert_drafter_matches_eager(folder, target, drafter, threads=1, tol=LOGITS_TOL):
    """Three draft steps after a prefill through the bundle's target: same candidates, logits and next hidden as
    the eager drafter reading the eager target's caches."""
    engine = load_bundle(folder, threads=threads)
    torch_backend = TorchBackend(target.model, engine.session.state.layout)
    ours, ref = Session(engine.session.backend), Session(torch_backend)
    eager = TorchDrafter(drafter, torch_backend, check_pair(target.config, drafter.cfg))
    ids = prompt_ids(13, seed=3)
    out = ours.prefill(ids)
    ref.prefill(ids)
    token, hidden = int(out.logits[-1].argmax()), out.hidden[-1]
    for runner in (engine.drafter, eager):
        runner.begin(ours.length, ours.state.drafter_masks(), ours.length)
    for _ in range(3):
        a, b = engine.drafter.step(token, hidden), eager.step(token, hidden)
        assert np.array_equal(a.token_ids, b.token_ids)
        assert np.abs(a.logits - b.logits).max() <= tol
        assert np.abs(a.hidden - b.hidden).max() <= tol * max(1.0, np.abs(b.hidden).max())
        token, hidden = int(a.token_ids[np.argmax(a.logits)]), a.hidden
