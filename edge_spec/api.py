"""The Python API: `edge_spec.load(...)` -> Engine, `engine.generate(prompt, ...)` -> GenerationResult.

The same words as the CLI (`edge-spec generate --model M --prompt P --max-new-tokens N ...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from .backend import Session
from .checkpoints import BUILTIN_MODELS, LoadedModel
from .checkpoints import load as load_checkpoint
from .config import kv_layout
from .drafter import Drafter, check_pair, load_drafter
from .errors import CheckpointError, ConfigError
from .generate import GenerationResult, check_request, generate_plain
from .sampling import SamplingParams
from .speculative import generate_speculative
from .tokenizer import StreamDecoder

RUNTIMES = ("torch",)
DEFAULT_MAX_CONTEXT = 2048
DEFAULT_SPEC_K = 4
DEFAULT_MIN_CONFIDENCE = 0.3  # adaptive mode: stop a burst when the drafter is less sure than this
BUILTIN_DRAFTERS = Path(__file__).parent / "assets" / "drafters"


def resolve_drafter(drafter: str, model: str) -> Path:
    """'builtin' -> the drafter shipped for a built-in model; anything else is a folder path."""
    if drafter != "builtin":
        return Path(drafter).expanduser()
    folder = BUILTIN_DRAFTERS / model
    if model not in BUILTIN_MODELS or not (folder / "config.json").is_file():
        raise CheckpointError(f"no built-in drafter is shipped for model {model!r}",
                              "pass --drafter PATH to a drafter folder, or train one with edge-spec train-drafter")
    return folder


class Engine:
    def __init__(self, loaded: LoadedModel, *, drafter: Drafter | None = None, runtime: str = "torch",
                 max_context: int | None = None, threads: int | None = None, prefill_chunk: int = 128):
        if runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {runtime!r}", f"choose one of {', '.join(RUNTIMES)}")
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        cfg = loaded.config
        max_context = max_context or min(DEFAULT_MAX_CONTEXT, cfg.max_position_embeddings)
        layout = kv_layout(cfg, max_context)
        from edge_spec.runtimes.torch import TorchBackend  # the only runtime until the exporters land

        from edge_spec.runtimes.torch import TorchDrafter

        backend = TorchBackend(loaded.model, layout, threads=threads)
        self.session = Session(backend, prefill_chunk=prefill_chunk)
        self.drafter = None
        if drafter is not None:
            self.drafter = TorchDrafter(drafter, backend, check_pair(cfg, drafter.cfg))

    @property
    def max_context(self) -> int:
        return self.session.max_context

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat=chat)

    def generate(self, prompt: str | list[int], *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 stream: Callable[[str], None] | None = None, speculative: bool | None = None,
                 spec_k: int = DEFAULT_SPEC_K, adaptive: bool = False,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> GenerationResult:
        """Generate from a text prompt (or token ids). `stream` receives text deltas as they decode.

        Speculative decoding is on by default when the engine has a drafter (`speculative=False` turns
        it off); the output distribution is the target's either way (greedy: identical tokens)."""
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

        if speculative and self.drafter is None:
            raise ConfigError("speculative decoding needs a drafter", "load with drafter='builtin' or a drafter folder")
        if self.drafter is not None and speculative is not False:
            result = generate_speculative(self.session, self.drafter, ids, max_new_tokens=max_new_tokens, params=params,
                                          rng=rng, stop_ids=self.loaded.stop_ids, k=spec_k,
                                          vocab_size=self.loaded.config.vocab_size, adaptive=adaptive,
                                          min_confidence=min_confidence, on_token=on_token)
        else:
            result = generate_plain(self.session, ids, max_new_tokens=max_new_tokens, params=params, rng=rng,
                                    stop_ids=self.loaded.stop_ids, on_token=on_token)
        result.text = self.tokenizer.decode([t for t in result.tokens if t not in self.loaded.stop_ids])
        return result


def load(model: str = "smollm2-135m", *, drafter: str | None = None, runtime: str = "torch",
         max_context: int | None = None, threads: int | None = None) -> Engine:
    """Load a built-in model name or a local Hugging Face folder (+ optionally a drafter: 'builtin' or a
    folder) and return a ready Engine."""
    drafter_module = load_drafter(resolve_drafter(drafter, model)) if drafter else None
    return Engine(load_checkpoint(model), drafter=drafter_module, runtime=runtime, max_context=max_context,
                  threads=threads)
