"""`edge-spec bench --peer llama.cpp`: llama.cpp (through llama-cpp-python) decoding a GGUF of the same checkpoint,
on the same prompt token ids, interleaved with our plain runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from edge_spec.errors import ConfigError

from .times import PeerTimes, disk_bytes

def _require_llama_cpp() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        raise ConfigError("--peer llama.cpp needs llama-cpp-python",
                          "pip install llama-cpp-python (builds llama.cpp from source, ~15 min on 2 cores)") from err


class LlamaCppPeer(PeerTimes):
    """Plain greedy decode of a GGUF through llama-cpp-python, on the same prompt token ids and token budget.

    `measure` runs it right after our plain run of each prompt, so both see the same machine state (this
    machine's speed drifts by 20-40% over minutes). `extra_bufts`: llama.cpp's extra CPU buffer types
    (AMX tiles, repacked quant layouts). Off by default: with them, llama-cpp-python 0.3.36 built here
    segfaults on quantized models on this AMX CPU (f32 runs)."""

    def __init__(self, gguf: Path, *, threads: int | None, label: str | None = None, extra_bufts: bool = False,
                 vocab_size: int | None = None):
        _require_llama_cpp()
        from llama_cpp import Llama
        import llama_cpp.llama_cpp as lowlevel

        if not Path(gguf).is_file():
            raise ConfigError(f"GGUF file {gguf} does not exist", "pass --peer-gguf PATH")
        super().__init__(threads)
        self.gguf, self.label, self.extra_bufts = Path(gguf), label, extra_bufts
        defaults = lowlevel.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = extra_bufts
            return p

        lowlevel.llama_model_default_params = params  # Llama() takes its model params from here
        try:
            self.llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=self.threads, n_threads_batch=self.threads,
                             verbose=False)
        finally:
            lowlevel.llama_model_default_params = defaults
        if vocab_size is not None and self.llm.n_vocab() != vocab_size:
            raise ConfigError(f"{self.gguf.name} has a vocabulary of {self.llm.n_vocab():,} tokens, the target's has "
                              f"{vocab_size:,}: it is another model, which would decode our token ids as its own",
                              "pass --peer-gguf PATH, a GGUF of the bundle's own checkpoint")

    def warm_up(self, ids: list[int]) -> None:
        self.llm.generate(ids[:8], temp=0.0).__next__()

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        stop = self.llm.token_eos()
        self.llm.reset()
        start = time.perf_counter()
        n, t_first = 0, None
        for tok in self.llm.generate(ids, temp=0.0, top_k=1, reset=True):
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
            if tok == stop or n >= max_new_tokens:
                break
        self.record(n, start, t_first, time.perf_counter())

    def result(self) -> dict:
        return {"peer": "llama.cpp", "model": self.gguf.name, "precision": self.label or _gguf_type(self.gguf),
                "model_bytes": disk_bytes(self.gguf),
                **self.timing(), "extra_bufts": self.extra_bufts,
                "llama_cpp_python": __import__("llama_cpp").__version__}


PEER_FTYPES = {"f32": "LLAMA_FTYPE_ALL_F32", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
               "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1"}


def peer_gguf(source: Path, kind: str, cache: Path) -> Path:
    """`source` re-encoded as `kind` by llama.cpp's own quantizer (cached). SmolLM2's only GGUF is Q4_1, so
    f32 / q8_0 / q4_0 peers hold exactly the weights our bundles are exported from (Q4_1 dequantized)."""
    import ctypes
    import llama_cpp

    if _gguf_type(source) == kind:
        return source
    if kind not in PEER_FTYPES:
        raise ConfigError(f"unknown peer quantization {kind!r}", f"choose from {', '.join(PEER_FTYPES)}")
    out = cache / f"{source.stem}.as-{kind.upper()}.gguf"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, PEER_FTYPES[kind])
    params.allow_requantize = True  # the source is already quantized: llama.cpp dequantizes, then encodes
    params.pure = True  # one type for every tensor (no k-quant mixtures)
    params.nthread = os.cpu_count() or 1
    tmp = out.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"llama.cpp could not re-encode {source.name} as {kind}", "pass --peer-gguf PATH instead")
    tmp.replace(out)
    return out


def _gguf_type(path: Path) -> str:
    name = Path(path).stem.lower()
    if ".as-" in name:
        return name.rsplit(".as-", 1)[1]
    for tag in ("q4_0", "q4_1", "q4_k_m", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32"):
        if tag in name:
            return tag
    return "gguf"


# ---- reporting -----------------------------------------------------------------------------------------
