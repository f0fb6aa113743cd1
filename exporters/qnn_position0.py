"""Position 0 precomputed (`--qnn-position0 table`): the host sink's rows for the tokens prompts start with, so that a
phone bundle needs neither the sink graph nor the second copy of the weights it reads (`qnn/weights.data`).

A pass from position 0 sees nothing but its own token: its logits, hidden state and new key / value rows depend on that
token alone. Chat prompts start with the template's first token (SmolLM2: `<|im_start|>`, Gemma: `<bos>`), so a table
of those rows answers every chat prompt's position 0 exactly as the sink would (the same bits: the table is the sink's
own output, run through the runtime's own first pass). Layout of the file: `qnn_htp.position0_file`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.errors import CheckpointError, ConfigError
from edge_spec.loading.checkpoints import LoadedModel
from edge_spec.runtimes import qnn_htp
from edge_spec.runtimes.fixed import FixedBackend


def first_tokens(target: LoadedModel) -> list[int]:
    """The tokens a prompt starts with: the chat template's first (whatever the message) and BOS, where the model has
    them."""
    tok, out = target.tokenizer, set()
    try:
        out.add(int(tok.encode_prompt("x", chat=True)[0]))
    except (CheckpointError, IndexError):  # no chat template
        pass
    if tok.bos_token_id is not None:
        out.add(int(tok.bos_token_id))
    if not out:
        raise ConfigError("this model has neither a chat template nor a BOS token: no first token to precompute "
                          "position 0 for", "export with --qnn-position0 graph (the host's float graph)")
    return sorted(out)


def write_table(sink: Path, layout: kv.KVLayout, length: int, slots: dict[str, int], tokens: list[int],
                out: Path, aux_width: int = 0) -> None:
    """Run each of `tokens` at position 0 through the sink graph at `sink` (the shortest target graph's float twin, of
    `length` rows) the way the runtime does (`FixedBackend.first_pass`), and write the rows it returns to `out`
    (`aux_width`: an eagle3 bundle's target returns its aux states too)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(sink), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    seen: list[dict] = []

    def record(feeds: dict) -> dict:
        seen.append(dict(zip(names, session.run(None, feeds))))
        return seen[-1]

    backend = FixedBackend({length: record}, layout, slots, "qnn position 0", name="qnn",
                           mask_floor=qnn_htp.MASK_FLOOR, placed=True, sink=record, aux_width=aux_width)
    run = Session(backend)
    with open(out, "wb") as f:
        for token in tokens:
            run.reset()
            run.forward([token])  # a first pass of one token: one call of the sink
            o = seen[-1]
            parts = [o[kv.LOGITS][0, 0], o[kv.HIDDEN][0, 0]] + \
                [o[name(c.layer)][0, :, 0] for c in layout.caches for name in (kv.k_new_name, kv.v_new_name)] + \
                ([o[kv.AUX_HIDDEN][0, 0]] if aux_width else [])
            f.write(np.concatenate([np.asarray(p, np.float32).ravel() for p in parts]).astype("<f4").tobytes())
