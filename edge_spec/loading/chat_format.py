"""Which simple chat form a Jinja chat template renders, for runtimes that cannot run Jinja (the native runner).

The native runner (runtimes/native/tokenizer, `es::format_chat`) knows two concrete forms:

    chatml   [<|im_start|>system\\n{default_system}<|im_end|>\\n]  - when the first message is not a system message
             <|im_start|>{role}\\n{content}<|im_end|>\\n ...  [<|im_start|>assistant\\n]
    gemma    {bos}<start_of_turn>user\\n[{system, trimmed}\\n\\n]{content, trimmed}<end_of_turn>\\n ...
             ("assistant" written "model")  [<start_of_turn>model\\n]

`detect_chat_format` renders a template on a few probe conversations and returns the form (with SmolLM2's kind of
default system prompt, or Gemma's BOS text) that renders every probe identically, or None when neither does.
`render_chat` is the Python twin of `es::format_chat`; the tests hold both to the templates' own renderings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edge_spec.errors import CheckpointError

CHATML = "chatml"
GEMMA = "gemma"

_IM_START, _IM_END = "<|im_start|>", "<|im_end|>"

# Conversations every supported template must render as its form does. Contents have no surrounding whitespace
# (Gemma's templates trim it, and Google's does not trim the system text).
PROBES: tuple[tuple[tuple[dict[str, str], ...], bool], ...] = (
    (({"role": "user", "content": "Hi there"},), True),
    (({"role": "user", "content": "Hi there"},), False),
    (({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}), True),
    (({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
      {"role": "user", "content": "Bye"}), True),
    (({"role": "system", "content": "S"}, {"role": "user", "content": "A\nB"},
      {"role": "assistant", "content": "C"}, {"role": "user", "content": "D"}), False),
)


@dataclass(frozen=True)
class ChatFormat:
    name: str                # CHATML or GEMMA
    default_system: str = ""  # chatml: the system turn added when the chat has none ("" for none)
    bos_token: str = ""      # gemma: the text the prompt starts with

    def manifest(self) -> dict[str, str]:
        """The language-neutral form for a bundle's manifest (what the native runner reads)."""
        return {"chat_format": self.name, "default_system": self.default_system, "bos_token": self.bos_token}


@lru_cache(maxsize=16)
def _compiled(template: str):
    from edge_spec.loading.tokenizer import _raise

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_template(template: str, messages, *, add_generation_prompt: bool = True, bos_token: str = "",
                    eos_token: str = "") -> str:
    """Renders a chat template the way edge_spec.loading.tokenizer.Tokenizer.apply_chat_template does."""
    return _compiled(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                      bos_token=bos_token, eos_token=eos_token)


def render_chat(fmt: ChatFormat, messages, *, add_generation_prompt: bool = True) -> str:
    """The prompt text of `messages` in the form `fmt` (the Python twin of es::format_chat)."""
    for message in messages:
        if message["role"] not in ("system", "user", "assistant"):
            raise ValueError(f"chat: role {message['role']!r} is not supported (system, user, assistant)")
    if fmt.name == CHATML:
        out = ""
        for index, message in enumerate(messages):
            if index == 0 and message["role"] != "system" and fmt.default_system:
                out += f"{_IM_START}system\n{fmt.default_system}{_IM_END}\n"
            out += f"{_IM_START}{message['role']}\n{message['content']}{_IM_END}\n"
        return out + (f"{_IM_START}assistant\n" if add_generation_prompt else "")
    if fmt.name == GEMMA:
        out, system = fmt.bos_token, ""
        for message in messages:
            if message["role"] == "system":
                system = message["content"].strip() + "\n\n"
                continue
            role = "model" if message["role"] == "assistant" else message["role"]
            out += f"<start_of_turn>{role}\n{system}{message['content'].strip()}<end_of_turn>\n"
            system = ""
        return out + ("<start_of_turn>model\n" if add_generation_prompt else "")
    raise ValueError(f"chat format {fmt.name!r} is not supported ({CHATML}, {GEMMA})")


def _candidates(first_render: str, bos_token: str) -> list[ChatFormat]:
    """Forms worth checking, read off the rendering of the first probe (one user message)."""
    found = [ChatFormat(GEMMA, bos_token=bos_token), ChatFormat(CHATML)]
    head = f"{_IM_START}system\n"
    if first_render.startswith(head) and _IM_END in first_render:
        found.append(ChatFormat(CHATML, default_system=first_render[len(head):first_render.index(_IM_END)]))
    return found


def detect_chat_format(template: str | None, *, bos_token: str = "", eos_token: str = "") -> ChatFormat | None:
    """The form `template` renders on every probe conversation, or None (no template, or neither form fits)."""
    if not template:
        return None
    try:
        renders = [render_template(template, messages, add_generation_prompt=generation, bos_token=bos_token,
                                   eos_token=eos_token) for messages, generation in PROBES]
    # a template that refuses one of the probes (raise_exception, e.g. no system role) has no simple form here
    except (TemplateError, CheckpointError, TypeError, ValueError, LookupError):
        return None
    for fmt in _candidates(renders[0], bos_token):
        if all(render_chat(fmt, messages, add_generation_prompt=generation) == render
               for (messages, generation), render in zip(PROBES, renders)):
            return fmt
    return None
