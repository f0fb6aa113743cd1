"""Residual headroom for fp16 programs (edge_spec.model.headroom): the stream carried divided by a power of two gives
the same model, and an fp16 stream that overflows without it stays finite with it - in eager (the stream rounded to
fp16 after every block, as an fp16 program holds it) and through a Core ML fp16 package (MIL executor).
Tiny random checkpoints (tests/tiny.py); gemma-3-270m's own stream (104,061 in fp32): tests/test_gemma3_formats.py.
"""

import dataclasses

import numpy as np
import pytest
import torch

from edge_spec.api import load_bundle
from edge_spec.exporters import calibration
from edge_spec.contract.backend import Session
from edge_spec.loading import checkpoints
from edge_spec.model import headroom
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.coreml import EXECUTOR_ENV
from edge_spec.runtimes.torch import TorchBackend
from tests.parity import prompt_ids
from tests.tiny import gemma3_config, gemma4_config, llama_config, save_gemma3_reference, save_reference

S = 16


def forward(model, cfg, ids) -> tuple[np.ndarray, np.ndarray, list]:
    """(logits [T, V], hidden [T, H], the new K rows) of one pass over `ids` from an empty cache."""
    backend = TorchBackend(model, kv_layout(cfg, 64))
    out = Session(backend, prefill_chunk=len(ids)).forward(ids)
    return out.logits, out.hidden, [k.clone() for k in backend._pending[0]]


def fp16_stream(model):
    """Hooks that round the residual stream to fp16 where an fp16 program holds it: the embeddings, each block's
    output. Returns the hook handles."""
    def round_output(module, inputs, output):
        if isinstance(output, tuple):
            return (output[0].half().float(),) + tuple(output[1:])
        return output.half().float()

    handles = [b.register_forward_hook(round_output) for b in model.model.layers]
    scale = float(model.embed_scale)  # the hook sees the table rows; the program holds them times the scale
    handles.append(model.model.embed_tokens.register_forward_hook(
        lambda m, i, out: (out * scale).half().float() / scale))
    return handles


@pytest.fixture(scope="module", params=["llama", "gemma3", "gemma4-ple", "gemma4-moe"])
def loaded(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        save_reference(llama_config(), folder)
    elif request.param == "gemma3":
        save_gemma3_reference(gemma3_config(), folder, seed=3)
    else:
        moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24)
        save_reference(gemma4_config(**(moe if request.param == "gemma4-moe" else {})), folder)
    return checkpoints.load(str(folder))


def test_scale_is_the_smallest_power_of_two_with_headroom():
    assert headroom.scale_for(104_061) == 16  # gemma-3-270m: 104,061 * 8 / 16 = 52,031 <= 65,504
    assert headroom.scale_for(24_880) == 4  # SmolLM2
    assert headroom.scale_for(65_504 / 8) == 1 and headroom.scale_for(65_504 / 8 + 1) == 2
    assert headroom.scale_for(0.0) == 1
    with pytest.raises(ValueError, match="overflows"):
        headroom.scale_for(float("inf"))
    with pytest.raises(ValueError, match="power of two"):
        headroom.scaled_stream(None, 12)


def test_scaled_stream_is_the_same_model_with_a_smaller_stream(loaded):
    """Same logits, hidden states and K rows (exact in real arithmetic; fp32 rounding here); every block's output
    is 1/S of the original's; the original model is left as it was."""
    model, cfg = loaded.model.eval(), loaded.config
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scaled = headroom.scaled_stream(model, S)
    ids = prompt_ids(20, seed=5)
    logits, hidden, keys = forward(model, cfg, ids)
    s_logits, s_hidden, s_keys = forward(scaled, cfg, ids)
    assert np.abs(s_logits - logits).max() <= 1e-5 * max(1.0, np.abs(logits).max())
    assert np.abs(s_hidden - hidden).max() <= 1e-5 * max(1.0, np.abs(hidden).max())
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(keys, s_keys))
    peak = headroom.stream_peak(model, lambda i: forward(model, cfg, i), [ids])
    s_peak = headroom.stream_peak(scaled, lambda i: forward(scaled, cfg, i), [ids])
    assert s_peak == pytest.approx(peak / S, rel=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert headroom.scaled_stream(model, 1) is model


@pytest.fixture(scope="module")
def loud_gemma3(tmp_path_factory):
    """A tiny Gemma-3 whose feed-forward branches write ~2e5 into the stream (gemma-3-270m reaches 104,061)."""
    folder = tmp_path_factory.mktemp("loud-gemma3")
    save_gemma3_reference(gemma3_config(), folder, seed=4)
    loaded = checkpoints.load(str(folder))
    with torch.no_grad():
        for block in loaded.model.model.layers:
            block.post_feedforward_layernorm.weight.mul_(2e4)
    return loaded


def test_an_fp16_stream_overflows_without_the_scale_and_not_with_it(loud_gemma3):
    model, cfg = loud_gemma3.model.eval(), loud_gemma3.config
    ids = prompt_ids(12, seed=6)
    ref, _, _ = forward(model, cfg, ids)
    assert headroom.stream_peak(model, lambda i: forward(model, cfg, i), [ids]) > headroom.FP16_MAX
    s = headroom.scale_for(headroom.stream_peak(model, lambda i: forward(model, cfg, i), [ids]))
    assert s > 1
    for candidate, finite in ((model, False), (headroom.scaled_stream(model, s), True)):
        handles = fp16_stream(candidate)
        try:
            logits, _, _ = forward(candidate, cfg, ids)
        finally:
            for h in handles:
                h.remove()
        assert np.isfinite(logits).all() == finite  # without the scale: inf in the stream, inf / inf in the norm
    assert np.abs(logits - ref).max() <= 1e-2 * np.abs(ref).max()
    assert (logits.argmax(-1) == ref.argmax(-1)).all()


def test_coreml_fp16_package_scales_the_stream_and_stays_finite(loud_gemma3, tmp_path, monkeypatch):
    """The Core ML exporter measures the stream on the bench prompts and scales it; the fp16 package (MIL
    executor) then gives eager's logits within the fp16 bound, where the stream alone would be inf."""
    from edge_spec.exporters.coreml import export_bundle

    monkeypatch.setenv(EXECUTOR_ENV, "mil")
    s, peak = calibration.stream_scale(loud_gemma3)
    assert peak > headroom.FP16_MAX and s > 1
    steps = []
    folder = export_bundle(loud_gemma3, tmp_path / "cm", drafter=None, precision="fp16", max_context=32,
                           max_draft_len=1, max_pass=2, progress=steps.append)
    assert any(f"residual stream / {s}" in step for step in steps)
    engine = load_bundle(folder)
    ids = prompt_ids(10, seed=7)
    out = []
    for token in ids:  # decode steps
        out.append(engine.session.forward([token]).logits)
        engine.session.commit(1)
    got = np.concatenate(out)
    ref, _, _ = forward(loud_gemma3.model.eval(), loud_gemma3.config, ids)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


# ---- real tier: gemma-3-270m (the `gemma3` fixture) --------------------------------------------------------------
def test_gemma3_270m_stream_needs_the_scale_and_keeps_greedy_with_it(gemma3):
    """gemma-3-270m's stream peaks above fp16's largest value on the bench prompts (104,061 measured): held in fp16
    it overflows on a chat prompt; divided by the exporter's scale it gives fp32 eager's greedy tokens."""
    from tests.test_gemma3 import greedy

    s, peak = calibration.stream_scale(gemma3)
    print(f"\ngemma-3-270m stream peak {peak:,.0f} -> scale {s}")
    assert peak > headroom.FP16_MAX and s >= 2
    ids = gemma3.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    want = greedy(gemma3, ids, 12, max_context=128)
    scaled = headroom.scaled_stream(gemma3.model, s)
    for model, finite in ((gemma3.model, False), (scaled, True)):
        handles = fp16_stream(model)
        try:
            logits, _, _ = forward(model, gemma3.config, ids)
            assert np.isfinite(logits).all() == finite
            if finite:
                assert greedy(dataclasses.replace(gemma3, model=model), ids, 12, max_context=128) == want
        finally:
            for h in handles:
                h.remove()
