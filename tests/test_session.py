"""Session + KV contract on real (tiny) models: chunking, rings and rewinds change nothing."""

import dataclasses

import numpy as np
import pytest

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.errors import ContextOverflowError, KVStateError
from edge_spec.contract.kv import KVLayout
from edge_spec.runtimes.torch import TorchBackend

IDS = [int(i) for i in np.random.default_rng(2).integers(4, 320, 30)]


def session(loaded, max_context=64, chunk=128, ring_slots=None):
    layout = kv_layout(loaded.config, max_context)
    if ring_slots is not None:  # resize the sliding rings (e.g. to max_context: nothing is ever evicted)
        layout = KVLayout(tuple(dataclasses.replace(c, slots=ring_slots) if c.window else c for c in layout.caches),
                          max_context)
    return Session(TorchBackend(loaded.model, layout), prefill_chunk=chunk)


def stepwise_logits(s: Session, ids, prefill: int) -> np.ndarray:
    """Chunked prefill of ids[:prefill], then one token at a time -> logits of every position [T, V]."""
    out = [s.forward(ids[:prefill]).logits]
    s.commit(prefill)
    for token in ids[prefill:]:
        out.append(s.forward([token]).logits)
        s.commit(1)
    return np.concatenate(out)


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gemma4"])
def loaded(request):
    folder, _ = request.getfixturevalue(request.param)
    return checkpoints.load(str(folder))


def test_chunked_prefill_and_steps_equal_one_full_forward(loaded):
    full = session(loaded).forward(IDS).logits
    s = session(loaded, chunk=7)
    s.prefill(IDS[:17])  # 7 + 7 + 3
    for t in range(17, len(IDS)):
        logits = s.forward([IDS[t]]).logits
        s.commit(1)
        assert np.abs(logits[0] - full[t]).max() <= 1e-4
    assert np.abs(stepwise_logits(session(loaded), IDS, 11) - full).max() <= 1e-4


def test_sliding_ring_equals_full_windowed_attention(tiny_gemma4):
    loaded = checkpoints.load(str(tiny_gemma4[0]))
    assert loaded.config.sliding_window == 6 and len(IDS) > 4 * 6
    ring = stepwise_logits(session(loaded), IDS, 5)  # ring of W + 1 = 7 slots, wrapped 4 times
    no_eviction = stepwise_logits(session(loaded, ring_slots=64), IDS, 5)
    assert np.abs(ring - no_eviction).max() <= 1e-5


def test_rewind_then_redecode_is_exact_and_across_eviction_raises(tiny_gemma4):
    loaded = checkpoints.load(str(tiny_gemma4[0]))
    s = session(loaded)
    s.prefill(IDS[:20])
    before = s.forward(IDS[20:22]).logits
    s.commit(2)
    s.rewind(21)  # within reach of the 6-slot ring
    again = s.forward([IDS[21]]).logits
    assert np.abs(again[0] - before[1]).max() <= 1e-5
    with pytest.raises(KVStateError, match="evicted"):
        s.rewind(10)


def test_context_overflow_raises_before_running(tiny_llama):
    loaded = checkpoints.load(str(tiny_llama[0]))
    s = session(loaded, max_context=16)
    s.prefill(IDS[:10])
    with pytest.raises(ContextOverflowError, match="max context 16"):
        s.forward(IDS[10:17])
    assert s.length == 10
