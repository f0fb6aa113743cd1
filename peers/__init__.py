"""The tools a user would otherwise pick, timed beside us by `edge-spec bench --peer NAME`.

Each peer decodes the same prompt token ids right after our plain run of each prompt (edge_spec.benchmark.bench.measure), so
both see the same machine state. This package installs as `edge_spec.peers`; the bench core names no peer: the CLI
options come from `add_arguments`, the runners from `from_args`.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from edge_spec.errors import ConfigError

GENAI_PRECISIONS = ("fp32", "int8", "int4")  # onnxruntime-genai model builder precisions on the CPU provider
LLAMA_CPP_QUANTS = ("f32", "q8_0", "q4_0", "q4_1")  # what llama.cpp's own quantizer re-encodes the GGUF as
NAMES = ("llama.cpp", "onnxruntime-genai", "executorch")


def genai_precision(bundle_precision: str) -> str:
    """The onnxruntime-genai precision a bundle's is compared with: its family (int4-gguf: int4), the weights' bits
    for ExecuTorch's 8da4w[-gguf] (int4), fp32 for fp16 and anything genai does not build."""
    family = bundle_precision.split("-")[0]
    family = {"8da4w": "int4"}.get(family, family)
    return family if family in GENAI_PRECISIONS else "fp32"


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """`edge-spec bench`'s peer options."""
    bench.add_argument("--peer", action="append", choices=list(NAMES),
                       help="also time a peer's plain decode of the same model (llama.cpp: llama-cpp-python; "
                            "onnxruntime-genai: its model builder's graph of the target's checkpoint folder; "
                            "executorch: ExecuTorch's own Llama export of that folder run by its TextLLMRunner); "
                            "repeatable")
    bench.add_argument("--et-precision", nargs="+", default=None, choices=["fp32"],
                       help="--peer executorch precisions (fp32 only: ExecuTorch 1.5.1's export_llama fails on 8da4w "
                            "with this torch / torchao, docs/benchmarks.md)")
    bench.add_argument("--genai-precision", nargs="+", default=None, choices=list(GENAI_PRECISIONS),
                       help="--peer onnxruntime-genai model precisions (default: the bundle's, fp32 for fp16)")
    bench.add_argument("--peer-gguf", nargs="+", default=None, help="GGUF files for --peer llama.cpp")
    bench.add_argument("--peer-quant", nargs="+", default=None, choices=list(LLAMA_CPP_QUANTS),
                       help="--peer llama.cpp on the built-in target's own GGUF (SmolLM2: Q4_1, gemma-3-270m: "
                            "Q4_K_M) re-encoded by llama.cpp as these types (default: the file itself)")


def from_args(args: argparse.Namespace, engine) -> list:
    """The peer runners `args` asks for, built (and their models cached) before the long measurement starts, so a
    missing package or file fails first, not after it. Each runs in a process of its own (peers/isolated.py), so its
    peak resident memory is its own."""
    from edge_spec.loading.gguf_common import cache_root

    from .isolated import IsolatedPeer

    wanted, cache = args.peer or [], cache_root() / "peers"
    runners = []
    if "llama.cpp" in wanted:
        from .llamacpp import LlamaCppPeer, _require_llama_cpp, peer_gguf

        _require_llama_cpp()
        gguf = [Path(p) for p in args.peer_gguf or []]
        for p in gguf:
            if not p.is_file():
                raise ConfigError(f"GGUF file {p} does not exist", "pass existing files to --peer-gguf")
        if args.peer_quant or not gguf:
            source = target_gguf(engine)
            gguf += [peer_gguf(source, kind, cache) for kind in args.peer_quant] if args.peer_quant else [source]
        # a GGUF of another model would decode our token ids as its own (or fail inside llama.cpp): refused first
        runners += [IsolatedPeer(LlamaCppPeer, path, threads=args.threads, vocab_size=target_vocab_size(engine))
                    for path in gguf]
    if "onnxruntime-genai" in wanted:
        from .genai import OrtGenaiPeer, genai_model

        source = target_folder(engine)
        precisions = args.genai_precision or [genai_precision(engine.manifest.precision if engine.manifest else "fp32")]
        runners += [IsolatedPeer(OrtGenaiPeer, genai_model(source, p, cache), threads=args.threads, precision=p)
                    for p in precisions]
    if "executorch" in wanted:
        from .executorch_runner import ET_PRECISIONS, et_runner_model

        source = target_folder(engine)
        runners += [IsolatedPeer(_executorch_peer, et_runner_model(source, p, cache), source, args.threads, p)
                    for p in args.et_precision or ET_PRECISIONS[:1]]
    return runners


def _executorch_peer(model: Path, source: Path, threads: int | None, precision: str):
    """ExecutorchRunnerPeer with the checkpoint's own tokenizer (built in the peer's process: a plain function)."""
    from edge_spec.loading.tokenizer import Tokenizer

    from .executorch_runner import ExecutorchRunnerPeer

    decode = functools.partial(Tokenizer(source).decode, skip_special=False)
    return ExecutorchRunnerPeer(model, source / "tokenizer.json", decode, threads=threads, precision=precision)


def target_name(engine) -> str | None:
    """The target's built-in name (smollm2-135m, gemma3-270m) when it is one, else None."""
    from edge_spec.loading.checkpoints import BUILTIN_MODELS

    name = engine.manifest.target.name if engine.manifest else getattr(engine.loaded, "name", None)
    return name if name in BUILTIN_MODELS else None


def target_vocab_size(engine) -> int:
    return engine.manifest.vocab_size if engine.manifest else engine.loaded.config.vocab_size


def target_gguf(engine) -> Path:
    """The GGUF a built-in target was converted from: what `--peer llama.cpp` decodes without --peer-gguf."""
    name = target_name(engine)
    if name == "smollm2-135m":
        from edge_spec.loading.gguf_import import find_smollm2_gguf
        return find_smollm2_gguf()
    if name == "gemma3-270m":
        from edge_spec.loading.gguf_gemma3 import find_gemma3_gguf
        return find_gemma3_gguf()
    raise ConfigError("--peer llama.cpp has no GGUF of this target: it is not a built-in model (smollm2-135m, "
                      "gemma3-270m)", "pass --peer-gguf PATH, a GGUF of the same checkpoint")


def target_folder(engine) -> Path:
    """The target's checkpoint folder: the bundle's recorded source, or the loaded checkpoint's folder."""
    folder = engine.manifest.target.source if engine.manifest else getattr(engine.loaded, "folder", None)
    if not folder or not Path(folder).is_dir():
        raise ConfigError(f"the target's checkpoint folder {folder!r} is not on this machine",
                          "the peer is built from it: run on the machine that exported the bundle, or use "
                          "--model FOLDER")
    return Path(folder)
