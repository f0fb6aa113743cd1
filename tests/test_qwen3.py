"""Qwen3 targets (`qwen3` family: llama blocks + a per-head RMSNorm of q and of k before the rotation, a head dim of
their own) == transformers' Qwen3ForCausalLM, through config parsing, eager decoding, the fused op forms, int4 ONNX
bundles and the GGUF importer. fp32 bundles of every format that runs here: tests/test_contract.py's qwen3 rows.

Tiny random checkpoints only (tests/tiny.py's qwen3_config: head_dim 32 != hidden / heads = 16, tied embeddings).
"""

import copy
import json

import gguf
import numpy as np
import onnx
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from edge_spec.cli import main
from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.contract.bundle import export_bundle
from edge_spec.contract.layout import kv_layout
from edge_spec.contract.manifest import read_manifest
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.errors import CheckpointError
from edge_spec.exporters.onnx_fused import FusedOps
from edge_spec.loading import checkpoints
from edge_spec.loading.gguf_import import convert_gguf_to_hf
from edge_spec.model.config import FULL, QWEN3, from_hf_dict
from edge_spec.model.drafter import save_drafter
from edge_spec.model.ops import PACKED_SPELLED_GELU, pack_modules
from edge_spec.runtimes.torch import TorchBackend
from tests.contract import OracleDrafter, differing_windows, host_checked_session, tiny_drafter
from tests.parity import LOGITS_TOL, prompt_ids
from tests.tiny import qwen3_config, save_reference

GREEDY = SamplingParams()


def reference_logits(ref, ids: list[int]) -> np.ndarray:
    """transformers' logits [T, V] of one forward over `ids`."""
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float().numpy()


# ---- config -----------------------------------------------------------------------------------------------------
def test_config_reads_head_dim_norm_free_fields_and_refuses_sliding_windows():
    raw = qwen3_config(sliding_window=4096, max_window_layers=2).to_dict()  # off: use_sliding_window false
    cfg = from_hf_dict(raw)
    assert cfg.family == QWEN3 and cfg.head_dims == (32,) * 3 and cfg.kv_heads == (2,) * 3
    assert cfg.layer_kinds == (FULL,) * 3 and cfg.sliding_window is None and cfg.tie_word_embeddings
    assert cfg.rope[FULL].theta == 1e6 and cfg.rope[FULL].torch_pow and cfg.norm_weight_offset == 0.0
    assert from_hf_dict({**raw, "head_dim": None}).head_dims[0] == 128  # Qwen3Config's default, not hidden / heads
    with pytest.raises(CheckpointError, match="use_sliding_window true is not supported") as err:
        from_hf_dict({**raw, "use_sliding_window": True})
    assert "use_sliding_window false" in str(err.value)
    with pytest.raises(CheckpointError, match="other than full attention"):
        from_hf_dict({**raw, "layer_types": ["full_attention", "sliding_attention", "full_attention"]})


# ---- eager ------------------------------------------------------------------------------------------------------
def test_eager_prefill_and_cached_decode_match_transformers(tiny_qwen3):
    """A prefill, then one token at a time through the KV cache: each step's logits == transformers' there."""
    folder, ref = tiny_qwen3
    loaded = checkpoints.load(str(folder))
    assert loaded.model.model.layers[0].self_attn.q_norm.weight.shape == (32,)
    ids = prompt_ids(30, seed=3)
    theirs = reference_logits(ref, ids)
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)), prefill_chunk=12)
    rows = [session.forward(ids[:12]).logits]
    session.commit(12)
    for token in ids[12:]:
        rows.append(session.forward([token]).logits)
        session.commit(1)
    ours = np.concatenate(rows)
    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1e-4
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_attention_bias_variant_matches_transformers(tmp_path):
    """attention_bias true: q/k/v and o projections with biases (perturbed: transformers initializes them to 0)."""
    ref = save_reference(qwen3_config(attention_bias=True), tmp_path, seed=2)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    ref.save_pretrained(tmp_path)
    loaded = checkpoints.load(str(tmp_path))
    assert loaded.model.model.layers[0].self_attn.o_proj.bias.abs().max() > 0
    ids = prompt_ids(20, seed=6)
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)), prefill_chunk=len(ids))
    assert np.abs(session.forward(ids).logits - reference_logits(ref, ids)).max() <= 1e-4


def test_fused_and_packed_op_forms_give_the_same_logits_in_eager(tiny_qwen3):
    """The packed q/k/v projection (ONNX FusedOps, ExecuTorch's pack_modules) norms q and k after the split
    (Attention.norm_packed): bit-identical to the three projections."""
    loaded = checkpoints.load(str(tiny_qwen3[0]))
    model, t = loaded.model, 20
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 320, (1, t)))
    causal = torch.triu(torch.full((t, t), -1e9), 1)[None, None]
    masks = {FULL: causal}
    empty = [torch.zeros(1, c.num_kv_heads, 0, c.head_dim) for c in kv_layout(loaded.config, 64).caches]
    packed = copy.deepcopy(model)
    assert pack_modules(packed) == 2 * loaded.config.num_layers  # q/k/v and gate/up of every layer
    with torch.no_grad():
        plain = model(ids, torch.arange(t)[None], masks, empty, empty).logits
        fused = model(ids, torch.arange(t)[None], masks, empty, empty, ops=FusedOps(model, 64)).logits
        modules = packed(ids, torch.arange(t)[None], masks, empty, empty, ops=PACKED_SPELLED_GELU).logits
    assert plain.abs().max() > 0 and torch.equal(fused, plain) and torch.equal(modules, plain)


# ---- ONNX -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("binding", [kv.BINDING_IO, kv.BINDING_SHARED])
def test_int4_onnx_bundle_is_exact_and_speculative_equals_plain(tiny_qwen3, binding, tmp_path):
    """int4 (and the fp32 rows of tests/test_contract.py): verify passes == decode steps bit for bit in the host
    check's row mode, and greedy speculative decoding (the bundle's drafter; bursts of mostly-right drafts, accepted
    and rejected) gives plain greedy's tokens. `shared`: one GroupQueryAttention per layer, fed the normed q/k/v."""
    target = checkpoints.load(str(tiny_qwen3[0]))
    drafter = tiny_drafter(target.config, head_from="target")
    folder = export_bundle(target, tmp_path / binding, format="onnx", drafter=drafter, precision="int4",
                           max_context=160, binding=binding)
    ops = [n.op_type for n in onnx.load(folder / "onnx" / "target.onnx", load_external_data=False).graph.node]
    assert ops.count("GroupQueryAttention") == (3 if binding == kv.BINDING_SHARED else 0)
    session = host_checked_session(folder)
    assert differing_windows(session, prompt_ids(70, seed=5), ((58, 6), (61, 5), (40, 2), (64, 4))) == []
    prompt = prompt_ids(9, seed=1)
    expected = generate_plain(session, prompt, max_new_tokens=40, params=GREEDY, rng=np.random.default_rng(0),
                              stop_ids=frozenset()).tokens
    oracle = OracleDrafter(expected, len(prompt), lambda p: p % 3 == 0)
    out = generate_speculative(session, oracle, prompt, max_new_tokens=40, params=GREEDY,
                               rng=np.random.default_rng(0), stop_ids=frozenset(), k=4, vocab_size=320)
    assert out.tokens == expected and out.extra["spec"].tau > 1.5
    from edge_spec.api import load_bundle

    engine = load_bundle(folder, threads=2)
    plain = engine.generate(prompt, max_new_tokens=30, speculative=False)
    for k in (1, 4):
        spec = engine.generate(prompt, max_new_tokens=30, spec_k=k, lookup=False, adaptive=False)
        assert spec.tokens == plain.tokens and "spec" in spec.extra, f"k={k}"


def test_cli_exports_a_qwen3_folder(tiny_qwen3, tmp_path, capsys):
    """`edge-spec export --model FOLDER` (a Hugging Face qwen3 folder, default binding: shared) and `generate` on it
    give the eager model's text."""
    folder = tiny_qwen3[0]
    drafter_dir = save_drafter(tiny_drafter(checkpoints.load(str(folder)).config, num_layers=1), tmp_path / "drafter")
    out = tmp_path / "bundle"
    assert main(["export", "--model", str(folder), "--drafter", str(drafter_dir), "--max-context", "64",
                 "--out", str(out)]) == 0
    assert read_manifest(out).binding == kv.BINDING_SHARED  # GroupQueryAttention: full-attention llama-like layers
    capsys.readouterr()
    base = ["generate", "--prompt", "w5 w6 w7", "--max-new-tokens", "10", "--quiet"]
    texts = []
    for extra in (["--bundle", str(out)], ["--model", str(folder)]):
        assert main(base + extra) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0].strip() and texts[0] == texts[1]


# ---- GGUF -------------------------------------------------------------------------------------------------------
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXTS = ["Hello world, it's 2025!", "I'll say: they've 12345 apples\n\nand   spaces",
         "naïve café — ünïcode 東京", "cafe\u0301 (NFC: café)",
         "<|im_start|>user\nhi there<|im_end|>\n", "don'T  x\r\n\ty"]


def qwen2_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE shaped as Qwen2/3's tokenizer.json (NFC, the qwen2 split, bytes unmapped by regex), trained
    here to exactly `vocab_size` tokens (the model's vocabulary)."""
    tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    words = ("the model said hello world they've spaces apples there user assistant token merges rotary heads norm "
             "query keys values cache draft verify accept reject greedy tokens bundle export runtime").split()
    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(words, 12)) + f", it's {i}!\n" for i in range(400)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    assert tok.get_vocab_size() == vocab_size
    return tok


def write_qwen3_gguf(ref, tok: Tokenizer, path, arch: str = "qwen3") -> None:
    """`ref` (a transformers Qwen3ForCausalLM) as convert_hf_to_gguf's Qwen3Model writes it: `qwen3.*` hparams with
    head_dim as key_length, tensors renamed by gguf-py's map and not permuted (a Qwen2Model), fp32; the vocabulary as
    its _set_vocab_gpt2 does (tokens by id, control specials, merges "a b", pre "qwen2")."""
    c = ref.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    merges = json.loads(tok.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, c.num_hidden_layers)
    for name, tensor in ref.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_import_gives_transformers_logits_and_the_qwen2_tokenizer(tiny_qwen3, tmp_path):
    """A qwen3 GGUF -> a Hugging Face folder: our model's logits == transformers' on the model the GGUF was written
    from (q/k rows not permuted, q/k norms kept, head_dim from key_length), and the rebuilt tokenizer encodes and
    decodes as the tokenizer.json the vocabulary came from."""
    ref = tiny_qwen3[1]
    tok = qwen2_tokenizer(ref.config.vocab_size)
    write_qwen3_gguf(ref, tok, tmp_path / "tiny-qwen3.gguf")
    folder = convert_gguf_to_hf(tmp_path / "tiny-qwen3.gguf", tmp_path / "hf", progress=False)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == 32 and config["tie_word_embeddings"]
    loaded = checkpoints.load(str(folder))
    ids = prompt_ids(24, seed=4)
    session = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64)), prefill_chunk=len(ids))
    assert np.abs(session.forward(ids).logits - reference_logits(ref, ids)).max() <= 1e-4
    ours = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text).ids == tok.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == tok.decode(tok.encode(text).ids,
                                                                                            skip_special_tokens=False)
    assert loaded.tokenizer.eos_token_id == tok.token_to_id("<|im_end|>")


def test_gguf_of_another_architecture_or_a_llama_with_qk_norms_is_refused(tiny_qwen3, tmp_path):
    ref, tok = tiny_qwen3[1], qwen2_tokenizer(tiny_qwen3[1].config.vocab_size)
    write_qwen3_gguf(ref, tok, tmp_path / "qwen2.gguf", arch="qwen2")
    with pytest.raises(CheckpointError, match="architecture is 'qwen2'; only 'llama', 'qwen3' and 'gemma3'"):
        convert_gguf_to_hf(tmp_path / "qwen2.gguf", tmp_path / "a", progress=False)
    write_qwen3_gguf(ref, tok, tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(CheckpointError, match="unexpected tensor 'blk.0.attn_q_norm.weight' for a llama model"):
        convert_gguf_to_hf(tmp_path / "llama.gguf", tmp_path / "b", progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
