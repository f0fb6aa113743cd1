"""Read a Speculators `eagle3` folder (config.json + *.safetensors) into `edge_spec.model.eagle3.Eagle3Drafter`.

json and safetensors only: edge-spec never imports the `speculators` package (its tests do, as the oracle). The
format is Speculators 0.9's `Eagle3SpeculatorConfig` / `Eagle3DraftModel`:

  config.json  speculators_model_type "eagle3"; transformer_layer_config (a llama or qwen3 config of the drafter's
               decoder layers; no model_type means qwen3, as Speculators reads it); draft_vocab_size;
               eagle_aux_hidden_state_layer_ids (null: the verifier's defaults); norm_before_residual,
               norm_before_fc, fc_norm, norm_output; target_hidden_size (unused by Speculators' model)
  tensors      fc, layers.N.*, norm, lm_head [Vd, H], embed_tokens [V, H] (may be left out: the verifier's own),
               d2t [Vd] int64 offsets and t2d [V] bool (when Vd < V); verifier_* are training-only and skipped

Anything else is refused by name with the fix, so a drafter never loads into something that computes another
function.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from edge_spec.errors import CheckpointError
from edge_spec.loading.checkpoints import check_tensor, read_safetensors
from edge_spec.model.config import FULL, from_hf_dict
from edge_spec.model.eagle3 import Eagle3Config, Eagle3Drafter

LAYER_TYPES = {"llama": False, "qwen3": True}  # transformer_layer_config.model_type -> per-head q/k norms
NORM_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# top-level keys that change nothing edge-spec computes (training, provenance, Hugging Face bookkeeping)
INERT_KEYS = {"architectures", "auto_map", "dtype", "torch_dtype", "embed_requires_grad", "speculators_config",
              "speculators_version", "tie_word_embeddings", "transformers_version", "_name_or_path", "name_or_path",
              "model_type", "provenance", "use_cache"}
READ_KEYS = {"speculators_model_type", "transformer_layer_config", "draft_vocab_size", "target_hidden_size",
             "eagle_aux_hidden_state_layer_ids", *NORM_OPTIONS}
TRAINING_ONLY_TENSORS = ("verifier_lm_head.", "verifier_norm.")
SPEC = "Speculators 0.9's eagle3 format"


def speculators_model_type(folder: str | Path) -> str | None:
    """folder/config.json's speculators_model_type ("eagle3", or another Speculators algorithm): how a Speculators
    folder marks itself. None: no such key, or no readable config.json (the caller's own loader reports that)."""
    path = Path(folder) / "config.json"
    try:
        kind = json.loads(path.read_text()).get("speculators_model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return None if kind is None else str(kind)


def is_eagle3_folder(folder: str | Path) -> bool:
    """True when folder/config.json says speculators_model_type "eagle3"."""
    return speculators_model_type(folder) == "eagle3"


def read_eagle3_config(folder: str | Path) -> Eagle3Config:
    """folder/config.json as an Eagle3Config (validated; no tensors read)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json", "pass the folder Speculators' save_pretrained wrote")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err})",
                              "restore config.json from the original checkpoint") from err
    return eagle3_config_from_dict(raw, str(path))


def eagle3_config_from_dict(d: dict, source: str = "config.json") -> Eagle3Config:
    kind = d.get("speculators_model_type")
    if kind != "eagle3":
        raise CheckpointError(f"{source}: speculators_model_type is {kind!r}, not 'eagle3'",
                              "pass the folder of a Speculators EAGLE-3 drafter (other Speculators algorithms "
                              "are not supported yet)")
    unknown = sorted(k for k, v in d.items() if k not in READ_KEYS | INERT_KEYS and v not in (None, False))
    if unknown:
        raise CheckpointError(f"{source}: option(s) {unknown} are not part of {SPEC}, so edge-spec cannot tell "
                              "what they change", "convert the drafter with Speculators 0.9, or add the option to "
                              "edge_spec/loading/speculators_eagle3.py and edge_spec/model/eagle3.py with an oracle test")
    if d.get("norm_before_fc") and d.get("fc_norm"):
        raise CheckpointError(f"{source}: norm_before_fc and fc_norm are both set (Speculators refuses this too)",
                              "set one of them to false: they are two ways of normalizing the fc input")
    layer = dict(d.get("transformer_layer_config") or {})
    layer_type = layer.get("model_type", "qwen3")
    if layer_type not in LAYER_TYPES:
        raise CheckpointError(f"{source}: transformer_layer_config.model_type {layer_type!r} is not supported",
                              f"edge-spec builds eagle3 layers of model_type {sorted(LAYER_TYPES)}, as Speculators 0.9 does")
    if layer_type == "qwen3" and not layer.get("head_dim"):
        layer["head_dim"] = 128  # Qwen3Config's default (not hidden / heads)
    types = set(layer.get("layer_types") or ["full_attention"])
    if types != {"full_attention"} or layer.get("use_sliding_window"):
        raise CheckpointError(f"{source}: transformer_layer_config has sliding-window layers ({sorted(types)})",
                              "edge-spec's eagle3 layers attend over their whole cache; use a full-attention drafter")
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    if float(rope.get("partial_rotary_factor", layer.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise CheckpointError(f"{source}: partial_rotary_factor != 1 (partial rotation) is not supported",
                              "use a drafter whose decoder layer rotates the whole head")
    stack = from_hf_dict({**layer, "model_type": "llama"}, f"{source} transformer_layer_config")
    if FULL not in stack.rope or set(stack.layer_kinds) != {FULL}:
        raise CheckpointError(f"{source}: transformer_layer_config is not a full-attention stack")
    spec = stack.rope[FULL]
    if spec.rope_type not in ("default", "llama3"):
        raise CheckpointError(f"{source}: RoPE type {spec.rope_type!r} is not supported for eagle3 layers",
                              "use a drafter with default or llama3 RoPE")
    if spec.rope_type == "default":  # transformers' inv_freq bit for bit (torch's pow, as RopeSpec.torch_pow says)
        stack = dataclasses.replace(stack, rope={FULL: dataclasses.replace(spec, torch_pow=True)})
    hidden = stack.hidden_size
    target_hidden = d.get("target_hidden_size")
    if target_hidden not in (None, hidden):
        raise CheckpointError(f"{source}: target_hidden_size {target_hidden} != hidden_size {hidden}; Speculators "
                              "0.9's eagle3 model has no projection for a target of another width either",
                              "use a drafter whose hidden size equals its target's")
    vd = int(d.get("draft_vocab_size", 32000))
    if not 0 < vd <= stack.vocab_size:
        raise CheckpointError(f"{source}: draft_vocab_size {vd} is not in [1, vocab_size {stack.vocab_size}]",
                              "use the config.json that came with the checkpoint")
    ids = d.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and (not ids or len(set(ids)) != len(ids) or min(ids) < 0):
        raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids {ids} must be distinct layer ids >= 0",
                              "use the config.json that came with the checkpoint")
    options = {name: bool(d.get(name, False)) for name in NORM_OPTIONS}
    return Eagle3Config(layers=stack, qk_norm=LAYER_TYPES[layer_type], draft_vocab_size=vd,
                        num_aux=len(ids) if ids else 3, aux_layer_ids=tuple(int(i) for i in ids) if ids else None,
                        **options)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, source: str = "d2t") -> torch.Tensor:
    """d2t [Vd] int offsets, t2d [V] bool -> the target ids [Vd] of the draft vocabulary (d + d2t[d]); raises unless
    they are distinct ids in [0, V) and exactly the ones t2d marks."""
    targets = torch.arange(d2t.shape[0]) + d2t.long()
    if targets.min() < 0 or targets.max() >= vocab_size:
        raise CheckpointError(f"{source}: d2t maps draft ids outside the target vocabulary [0, {vocab_size})",
                              "d2t holds offsets (target id - draft id); regenerate it with Speculators")
    if targets.unique().numel() != targets.numel():
        raise CheckpointError(f"{source}: d2t maps two draft ids to one target id", "regenerate d2t with Speculators")
    if t2d.shape != (vocab_size,) or not torch.equal(t2d.bool().nonzero().flatten(), targets.sort().values):
        raise CheckpointError(f"{source}: t2d does not mark exactly the target ids d2t maps to",
                              "regenerate d2t and t2d together with Speculators")
    return targets


def load_eagle3(folder: str | Path, target_embedding: torch.Tensor | None = None) -> Eagle3Drafter:
    """The drafter of a Speculators eagle3 folder, float32, in eval mode. `target_embedding` [V, H]: the target's
    input embedding, used when the checkpoint leaves embed_tokens out (Speculators then takes the verifier's)."""
    folder = Path(folder)
    cfg = read_eagle3_config(folder)
    model = Eagle3Drafter(cfg)
    expected = model.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    for key, (file, tensor) in read_safetensors(folder).items():
        if key.startswith(TRAINING_ONLY_TENSORS):
            continue
        if key in ("d2t", "t2d") and not cfg.mapped:  # a full draft vocabulary: the maps must be the identity
            if key == "d2t" and bool(tensor.any()):
                raise CheckpointError(f"{file}: d2t is not the identity, yet draft_vocab_size == vocab_size",
                                      "set draft_vocab_size to the length of d2t")
            continue
        check_tensor(file, key, tensor, expected, "this eagle3 config's drafter (its layer count, norm options)")
        loaded[key] = tensor if key in ("d2t", "t2d") else tensor.float()
    if "embed_tokens.weight" not in loaded and target_embedding is not None:
        if tuple(target_embedding.shape) != tuple(expected["embed_tokens.weight"].shape):
            raise CheckpointError(f"the target embedding has shape {tuple(target_embedding.shape)}, this drafter "
                                  f"needs {tuple(expected['embed_tokens.weight'].shape)}",
                                  "pair the drafter with the target it was trained for")
        loaded["embed_tokens.weight"] = target_embedding.detach().float()
    missing = [k for k in expected if k not in loaded]
    if missing:
        fix = ("pass target_embedding= (the target's input embedding): this checkpoint leaves embed_tokens to the "
               "verifier" if missing == ["embed_tokens.weight"] else "the checkpoint is incomplete; re-save it")
        raise CheckpointError(f"{folder}: tensors {missing[:4]} are missing", fix)
    if cfg.mapped:
        check_vocab_map(loaded["d2t"], loaded["t2d"], cfg.target_vocab_size, f"{folder} d2t")
        loaded["d2t"], loaded["t2d"] = loaded["d2t"].long(), loaded["t2d"].bool()
    model.load_state_dict(loaded)
    return model.eval()
