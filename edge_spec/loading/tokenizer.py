"""Tokenizer + chat template, read from a checkpoint folder (tokenizer.json, tokenizer_config.json).

The chat template is rendered with a sandboxed jinja2 environment, the way Hugging Face does it,
so any local checkpoint's own template works unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

from edge_spec.errors import CheckpointError


def _token_text(value) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise(message: str):
    raise CheckpointError(f"chat template error: {message}", "check the messages you passed to the template")


class Tokenizer:
    def __init__(self, folder: Path):
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{path} is missing", "the checkpoint folder needs a Hugging Face tokenizer.json")
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises plain Exception subclasses with terse text
            raise CheckpointError(f"{path} could not be read: {err}", "re-create tokenizer.json (it is corrupt)") from err
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template_file = folder / "chat_template.jinja"
        self.chat_template: str | None = (template_file.read_text() if template_file.is_file()
                                          else config.get("chat_template"))
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.bos_token_id = self.token_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self.token_id(self.eos_token) if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Plain text -> ids. Special-token strings in `text` map to their ids (chat templates rely on it)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos_token if add_bos is None else add_bos) and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise CheckpointError("this model has no chat template", "drop --chat and pass a plain prompt")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise
        template = env.from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_prompt(self, prompt: str, *, chat: bool) -> list[int]:
        """A user prompt -> ids, through the chat template when `chat` (the template adds BOS if it wants one)."""
        if chat:
            return self.encode(self.apply_chat_template([{"role": "user", "content": prompt}]), add_bos=False)
        return self.encode(prompt)


class StreamDecoder:
    """Turns a growing list of ids into printable text deltas, holding back incomplete UTF-8."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else text
        self.emitted = text
        return delta
