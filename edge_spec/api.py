"""The Python API: `edge_spec.load(...)` -> Engine, `engine.generate(prompt, ...)` -> GenerationResult.

The same words as the CLI (`edge-spec generate --model M --prompt P --max-new-tokens N ...`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .backend import Session
from .checkpoints import LoadedModel
from .checkpoints import load as load_checkpoint
from .config import kv_layout
from .errors import ConfigError
from .generate import GenerationResult, check_request, generate_plain
from .sampling import SamplingParams
from .tokenizer import StreamDecoder

RUNTIMES = ("torch",)
DEFAULT_MAX_CONTEXT = 2048


class Engine:
    def __init__(self, loaded: LoadedModel, *, runtime: str = "torch", max_context: int | None = None,
                 threads: int | None = None, prefill_chunk: int = 128):
        if runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(RUNTIMES)}")
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        cfg = loaded.config
        max_context = max_context or min(DEFAULT_MAX_CONTEXT, cfg.max_position_embeddings)
        layout = kv_layout(cfg, max_context)
        from edge_spec.runtimes.torch import TorchBackend  # the only runtime until the exporters land

        self.session = Session(TorchBackend(loaded.model, layout, threads=threads), prefill_chunk=prefill_chunk)

    @property
    def max_context(self) -> int:
        return self.session.max_context

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat=chat)

    def generate(self, prompt: str | list[int], *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 stream: Callable[[str], None] | None = None) -> GenerationResult:
        """Generate from a text prompt (or token ids). `stream` receives text deltas as they decode."""
        params = SamplingParams(temperature, top_k, top_p)  # validates before any work
        ids = list(prompt) if isinstance(prompt, list) else self.encode(prompt, chat=chat)
        check_request(ids, max_new_tokens, self.max_context)
        rng = np.random.default_rng(seed)
        on_token = None
        if stream is not None:
            decoder = StreamDecoder(self.tokenizer)
            stop = self.loaded.stop_ids

            def on_token(token: int) -> None:
                if token not in stop:
                    delta = decoder.push(token)
                    if delta:
                        stream(delta)

        result = generate_plain(self.session, ids, max_new_tokens=max_new_tokens, params=params, rng=rng,
                                stop_ids=self.loaded.stop_ids, on_token=on_token)
        result.text = self.tokenizer.decode([t for t in result.tokens if t not in self.loaded.stop_ids])
        return result


def load(model: str = "smollm2-135m", *, runtime: str = "torch", max_context: int | None = None,
         threads: int | None = None) -> Engine:
    """Load a built-in model name or a local Hugging Face folder and return a ready Engine."""
    return Engine(load_checkpoint(model), runtime=runtime, max_context=max_context, threads=threads)
