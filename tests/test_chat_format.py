"""edge_spec.loading.chat_format: detecting the simple form a chat template renders, and its Python renderer."""

import random

import pytest

from edge_spec.loading.chat_format import CHATML, GEMMA, ChatFormat, detect_chat_format, render_chat, render_template

# SmolLM2-135M-Instruct's template, as its GGUF carries it (tokenizer.chat_template).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

PLAIN_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# A Gemma turn template written here in the style of Google's: the first system message goes in front of the first
# user turn, roles must alternate.
GEMMA_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{% if loop.first %}{{ prefix }}{% endif %}{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' "
    "+ m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def conversations(seed: int, count: int):
    """Alternating chats (with or without a leading system message) with awkward contents."""
    rng = random.Random(seed)
    pieces = ["Hi", "What is 2+2?", "  padded  ", "line\nbreak", "\ttab", "ünï 日本 🙂", "<b>x</b>", "'quote'", "",
              "\u3000wide space\u3000", "ends with newline\n"]
    for _ in range(count):
        chat = [{"role": "system", "content": rng.choice(pieces[:4] + ["Be brief."])}] if rng.random() < 0.4 else []
        for turn in range(rng.randint(1, 5)):
            chat.append({"role": "user" if turn % 2 == 0 else "assistant", "content": rng.choice(pieces)})
        yield chat, rng.random() < 0.7


def test_smollm2_template_is_chatml_with_its_default_system_prompt():
    fmt = detect_chat_format(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert fmt == ChatFormat(CHATML, default_system=SMOLLM2_SYSTEM)
    assert fmt.manifest() == {"chat_format": "chatml", "default_system": SMOLLM2_SYSTEM, "bos_token": ""}
    assert render_chat(fmt, [{"role": "user", "content": "Hi"}]) == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_plain_chatml_has_no_default_system_prompt():
    assert detect_chat_format(PLAIN_CHATML) == ChatFormat(CHATML)


def test_gemma_style_template_is_gemma_with_its_bos_text():
    assert detect_chat_format(GEMMA_STYLE, bos_token="<bos>", eos_token="<eos>") == ChatFormat(GEMMA, bos_token="<bos>")


def test_the_gemma3_importers_template_is_gemma():
    gguf_gemma3 = pytest.importorskip("edge_spec.loading.gguf_gemma3")
    fmt = detect_chat_format(gguf_gemma3.GEMMA_TURN_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    assert fmt == ChatFormat(GEMMA, bos_token="<bos>")
    for chat, generation in conversations(seed=3, count=300):  # the importer's template: any chat, not just probes
        assert render_chat(fmt, chat, add_generation_prompt=generation) == render_template(
            gguf_gemma3.GEMMA_TURN_TEMPLATE, chat, add_generation_prompt=generation, bos_token="<bos>")


@pytest.mark.parametrize("template", [LLAMA3_STYLE, "{{ messages[0]['content'] }}", "", None,
                                      "{{ raise_exception('no system role') if messages[0]['role'] == 'system' }}"])
def test_other_templates_have_no_simple_form(template):
    assert detect_chat_format(template, bos_token="<s>") is None


@pytest.mark.parametrize("template, bos", [(SMOLLM2_TEMPLATE, ""), (PLAIN_CHATML, ""), (GEMMA_STYLE, "<bos>")])
def test_render_chat_equals_the_template_on_many_chats(template, bos):
    fmt = detect_chat_format(template, bos_token=bos)
    compared = 0
    for chat, generation in conversations(seed=1, count=400):
        if template is GEMMA_STYLE and chat[0]["role"] == "system" and chat[0]["content"] != chat[0]["content"].strip():
            continue  # Google-style templates keep the system text's whitespace; ours trim it (see the module doc)
        want = render_template(template, chat, add_generation_prompt=generation, bos_token=bos)
        assert render_chat(fmt, chat, add_generation_prompt=generation) == want, chat
        compared += 1
    assert compared > 300


def test_unknown_role_and_form_are_refused():
    with pytest.raises(ValueError, match="role 'tool'"):
        render_chat(ChatFormat(CHATML), [{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="'llama3' is not supported"):
        render_chat(ChatFormat("llama3"), [{"role": "user", "content": "x"}])
