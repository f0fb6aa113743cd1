"""`bench --peer executorch`: the checkpoint as ExecuTorch's own Llama exporter sees it (peers/executorch_runner.py).

The peer is only a fair comparison if it decodes the same model: the renamed weights are loaded into ExecuTorch's own
Llama Transformer (executorch.examples.models.llama, shipped in the wheel) and its logits compared with ours.
"""

import json

import numpy as np
import pytest
import torch

from edge_spec.loading import checkpoints
from edge_spec.contract.backend import Session
from edge_spec.contract.layout import kv_layout
from edge_spec.errors import ConfigError
from edge_spec.peers.executorch_runner import et_params, meta_checkpoint, meta_name
from edge_spec.runtimes.torch import TorchBackend
from tests.parity import prompt_ids


def test_names_map_onto_executorch_llama():
    assert meta_name("model.layers.3.mlp.up_proj.weight") == "layers.3.feed_forward.w3.weight"
    assert meta_name("model.layers.0.self_attn.k_proj.weight") == "layers.0.attention.wk.weight"
    assert meta_name("model.layers.2.post_attention_layernorm.weight") == "layers.2.ffn_norm.weight"
    assert meta_name("model.embed_tokens.weight") == "tok_embeddings.weight"
    with pytest.raises(ConfigError, match="unexpected Llama parameter"):
        meta_name("model.layers.0.self_attn.rotary.inv_freq")


def test_only_llama_checkpoints_are_exported_for_the_peer(tiny_gemma4):
    config = json.loads((tiny_gemma4[0] / "config.json").read_text())
    with pytest.raises(ConfigError, match="Llama-family checkpoints only"):
        et_params(config)


def test_executorch_llama_with_the_renamed_weights_computes_our_logits(tiny_llama):
    """ExecuTorch's own Llama Transformer (no KV cache, eager) built from et_params + meta_checkpoint gives the
    logits of our model of the same folder: every weight is used (strict load) and the rope layout matches."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    folder = tiny_llama[0]
    config = json.loads((folder / "config.json").read_text())
    et = construct_transformer(ModelArgs(**et_params(config), generate_full_logits=True)).eval()
    missing, unexpected = et.load_state_dict(meta_checkpoint(folder), strict=False)
    assert not unexpected and not [k for k in missing if not k.endswith(("freqs_cos", "freqs_sin"))]
    loaded = checkpoints.load(str(folder))
    ids = prompt_ids(12, seed=4)
    mine = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64))).forward(ids).logits  # [T, V]
    with torch.no_grad():
        theirs = et(torch.tensor([ids])).float()[0].numpy()
    assert theirs.shape == mine.shape
    assert np.abs(theirs - mine).max() <= 1e-4
