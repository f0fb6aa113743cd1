"""Why a fixed-shape pad row must not see only itself: SmolLM2's residual stream (max |x| after layer 16, eager fp32)
at each position of the chat prompt "What is the capital of France?", and for a few of its tokens run alone - what
a row that attends to nothing but itself computes (RoPE is relative, so it is a position-0 row).

    .venv/bin/python scripts/sink_rows.py
"""

from __future__ import annotations

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.runtimes.torch import TorchBackend


def main() -> None:
    target = checkpoints.load("smollm2-135m")
    seen = []  # [T] max |x| over channels after layer 16, one entry per forward
    target.model.model.layers[16].register_forward_hook(
        lambda module, args, out: seen.append((out[0] if isinstance(out, tuple) else out).detach().abs().amax(-1)[0]))
    ids = target.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    layout = kv_layout(target.config, 64)
    Session(TorchBackend(target.model, layout)).forward(ids)
    context = seen[-1].numpy()
    print("in context, per position:", context.round().astype(int).tolist())
    for pos in (5, 20, len(ids) - 1):
        Session(TorchBackend(target.model, layout)).forward([ids[pos]])
        print(f"position {pos} {target.tokenizer.decode([ids[pos]])!r}: alone {seen[-1][0]:.0f}, in context "
              f"{context[pos]:.0f}")


if __name__ == "__main__":
    main()
