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


# ---- writing (edge-spec's own EAGLE-3 trainer, edge_spec/train/eagle3_trainer.py) ------------------------------------
SPECULATORS_VERSION = "0.9.0"  # the format version written (and read above)


def eagle3_config_dict(cfg: Eagle3Config, *, speculative_tokens: int = 3, verifier_architectures=None,
                       verifier_name_or_path: str | None = None, provenance: dict | None = None) -> dict:
    """`cfg` as the config.json Speculators 0.9's save_pretrained writes for an Eagle3DraftModel: the keys
    `eagle3_config_from_dict` reads, plus the inert ones Speculators needs to load it (speculators_config with a
    greedy proposal of `speculative_tokens` and the verifier: its architectures and `verifier_name_or_path`, the
    target's HF folder or hub id, which Speculators' from_pretrained reads the verifier's embedding, lm_head and
    norm from; edge-spec ignores it). `provenance`: free-form facts (target name, content id, training), inert."""
    layer = dict(cfg.layers.raw)
    layer["model_type"] = "qwen3" if cfg.qk_norm else "llama"  # the reader parses every layer as llama
    out = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": cfg.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids) if cfg.aux_layer_ids else None,
        **{name: bool(getattr(cfg, name)) for name in NORM_OPTIONS},
        "embed_requires_grad": False,
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"architectures": list(verifier_architectures or []),
                         "name_or_path": verifier_name_or_path}},
    }
    if provenance:
        out["provenance"] = provenance
    return out


def save_eagle3(model: Eagle3Drafter, folder: str | Path, *, dtype: torch.dtype | None = None,
                with_embedding: bool = False, **config_args) -> Path:
    """Write `model` as a Speculators eagle3 folder: config.json (`eagle3_config_dict`, `config_args` passed on) and
    model.safetensors (Speculators' tensor names; d2t int64 offsets / t2d bool when the draft vocabulary is
    reduced; floating tensors in `dtype` if given). embed_tokens is left out unless `with_embedding` (a frozen copy
    of the target's input embedding: `load_eagle3(..., target_embedding=)` and Speculators' verifier loading take
    the target's). Written in place: the caller makes it atomic (train/eagle3_trainer.publish_eagle3).

    The written config is read back with `eagle3_config_from_dict` and must give `model.cfg` again, and the vocabulary
    map must pass `check_vocab_map`: a folder this writes is one `load_eagle3` reads unchanged."""
    from safetensors.torch import save_file

    folder = Path(folder)
    config = eagle3_config_dict(model.cfg, **config_args)
    again = eagle3_config_from_dict(json.loads(json.dumps(config)), "the config.json being written")
    if again != model.cfg:
        raise CheckpointError(f"the eagle3 config written to {folder} does not read back as the drafter's own "
                              f"({again} != {model.cfg})", "report this: the writer and the reader disagree")
    state = {}
    for key, value in model.state_dict().items():
        if key == "embed_tokens.weight" and not with_embedding:
            continue
        if value.is_floating_point() and dtype is not None:
            value = value.to(dtype)
        state[key] = value.detach().cpu().contiguous()
    if model.cfg.mapped:
        check_vocab_map(state["d2t"], state["t2d"], model.cfg.target_vocab_size, f"{folder} d2t")
        state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
