"""Plain autoregressive generation over a Session (the baseline speculative decoding must equal)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from edge_spec.contract.backend import Session
from edge_spec.errors import ConfigError, ContextOverflowError
from edge_spec.decoding.sampling import SamplingParams, sample, token_probs


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only (including the stop token, if one was produced)
    prompt_tokens: int
    stop_reason: str  # "eos" | "length"
    prefill_s: float  # prompt processing up to the first new token
    total_s: float
    text: str = ""  # decoded new tokens (filled by the API, which owns the tokenizer)
    extra: dict = field(default_factory=dict)  # speculative stats etc., filled by other loops

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first one (the steady-state decode speed)."""
        decode_s = self.total_s - self.prefill_s
        return (self.new_tokens - 1) / decode_s if self.new_tokens > 1 and decode_s > 0 else 0.0

    def summary(self) -> str:
        return (f"prompt {self.prompt_tokens} tok | new {self.new_tokens} tok | "
                f"first token {self.prefill_s * 1000:.0f} ms | decode {self.decode_tok_s:.1f} tok/s | "
                f"total {self.total_s:.2f} s | stop: {self.stop_reason}")


def check_request(prompt_ids: list[int], max_new_tokens: int, max_context: int) -> None:
    """Refuse before doing any work, so a bad request loses nothing."""
    if not prompt_ids:
        raise ConfigError("the prompt encodes to zero tokens", "pass a non-empty prompt")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}",
                          "pass --max-new-tokens 1 or more (the number of tokens to generate)")
    if len(prompt_ids) + max_new_tokens > max_context:
        raise ContextOverflowError(
            f"context overflow: prompt {len(prompt_ids)} + max_new_tokens {max_new_tokens} > max context {max_context}",
            "shorten the prompt, lower --max-new-tokens, or raise --max-context")


def pick_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """logits: [V] -> next token. Greedy is a plain argmax (no random draw consumed)."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(token_probs(logits, params), rng)


def generate_plain(session: Session, prompt_ids: list[int], *, max_new_tokens: int, params: SamplingParams,
                   rng: np.random.Generator, stop_ids: frozenset[int],
                   on_token: Callable[[int], None] | None = None) -> GenerationResult:
    check_request(prompt_ids, max_new_tokens, session.max_context)
    start = time.perf_counter()
    session.reset()
    out = session.prefill(prompt_ids)
    token = pick_token(out.logits[-1], params, rng)
    prefill_s = time.perf_counter() - start
    tokens = [token]
    if on_token:
        on_token(token)
    while token not in stop_ids and len(tokens) < max_new_tokens:
        out = session.forward([token], last_only=True)  # `token` is the one not yet in the cache
        session.commit(1)
        token = pick_token(out.logits[-1], params, rng)
        tokens.append(token)
        if on_token:
            on_token(token)
    stop = "eos" if token in stop_ids else "length"
    return GenerationResult(tokens, len(prompt_ids), stop, prefill_s, time.perf_counter() - start)
