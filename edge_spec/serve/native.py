"""`edge-spec serve --runtime native`: the C++ runner behind the server, through its C API (edge_spec.runtimes.native_capi).

`NativeEngine` has the surface the server uses of `edge_spec.api.Engine` (tokenizer, encode, vocab_size, max_context,
drafter, exactness, manifest, generate): requests are rendered and encoded by the Python tokenizer as for the Python
runtime, and decoded by the runner from those ids (es_generate_ids), so both runtimes see the same prompt. The
runner's token ids are turned into text by the same Python stream decoder as the Python runtime's (the runner reads
no tokenizer of some bundles, and one decoder means one text for the same tokens); a stop string, a cancel or the
time limit stop the runner at its next token.
The runner verifies the bundle's checksums and runs its own host check at open (its verdict is `exactness`).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from edge_spec.api import DEFAULT_SPEC_K, check_ids, check_seed
from edge_spec.contract.manifest import read_manifest
from edge_spec.decoding.generate import GenerationResult, check_request
from edge_spec.decoding.hostcheck import HostCheck
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.loading.tokenizer import StreamDecoder, Tokenizer
from edge_spec.runtimes.native_capi import Library, Runner, library_path

RUNTIME = "native"


def _host_check(info: dict | None) -> HostCheck | None:
    """The runner's verdict (es_bundle_info_json's host_check) as the Python runtime's HostCheck."""
    if not info:
        return None
    big = lambda v: float("inf") if v is None or v >= 1e300 else float(v)  # noqa: E731 (the runner writes inf as 1e300)
    return HostCheck(artifact="native", runtime=info["runtime"], cpu=info["cpu"],
                     windows=tuple(tuple(w) for w in info["windows"]), one_row_max_diff=big(info["one_row_max_diff"]),
                     two_row_max_diff=big(info["two_row_max_diff"]), one_row_step_ms=info["one_row_step_ms"] or 0.0,
                     two_row_step_ms=info["two_row_step_ms"] or 0.0)


class NativeEngine:
    """A bundle opened by the native runner (libedge_spec.so): `generate(ids, ...)` as Engine.generate does."""

    runtime = RUNTIME

    def __init__(self, folder: str | Path, *, threads: int | None = None, library: str | None = None,
                 host_check: bool = True):
        folder = Path(folder).expanduser()
        self.manifest = read_manifest(folder, verify_checksums=False)  # the runner checks every sha256 itself
        self.tokenizer = Tokenizer(folder)
        self.runner = Runner(Library(library_path(library)), folder, threads=threads, host_check=host_check)
        info = self.runner.info
        self.vocab_size = int(info["vocab_size"])
        self.max_draft_len = int(info["max_draft_len"]) or None
        self.stop_ids = frozenset(self.manifest.eos_token_ids)
        self.drafter = RUNTIME if info["drafter"] else None  # set to None to decode plainly (serve --no-spec)
        self.exactness = _host_check(info.get("host_check"))
        self.identity = info["runtime"]

    @property
    def max_context(self) -> int:
        return int(self.runner.info["max_context"])

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat=chat)

    def generate(self, prompt: list[int], *, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, stream: Callable[[str], None] | None = None,
                 adaptive: bool = True) -> GenerationResult:
        """Decode `prompt` (token ids) with the runner; `stream` receives its text deltas (an exception it raises
        stops the runner and is raised here)."""
        params = SamplingParams(temperature, top_k, top_p)  # the same refusals as Engine.generate
        check_seed(seed)
        ids = check_ids(list(prompt), self.vocab_size)
        check_request(ids, max_new_tokens, self.max_context)
        if seed is not None and not params.greedy:
            adaptive = False  # as Engine.generate: a seeded sample drafts a fixed k
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
        tokens: list[int] = []
        decoder = StreamDecoder(self.tokenizer)

        def on_token(token: int, _text: str) -> None:  # the runner's own text is not used: see the module's doc
            if token < 0:
                return
            tokens.append(token)
            if stream is not None and token not in self.stop_ids:
                delta = decoder.push(token)
                if delta:
                    stream(delta)

        stats = self.runner.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                     top_p=top_p, seed=seed, spec=self.drafter is not None,
                                     spec_k=min(DEFAULT_SPEC_K, self.max_draft_len or DEFAULT_SPEC_K),
                                     adaptive=adaptive, on_token=on_token)
        stop = "eos" if tokens and tokens[-1] in self.stop_ids else "length"
        result = GenerationResult(tokens=tokens, prompt_tokens=stats.prompt_tokens, stop_reason=stop,
                                  prefill_s=stats.prefill_s, total_s=stats.prefill_s + stats.decode_s,
                                  text=self.tokenizer.decode([t for t in tokens if t not in self.stop_ids]))
        if stats.spec_used:
            result.extra["spec"] = SimpleNamespace(tau=stats.tau, target_calls=stats.target_passes)
        if stats.notice:
            result.extra["notice"] = stats.notice
        return result

    def close(self) -> None:
        self.runner.close()
