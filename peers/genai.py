"""`edge-spec bench --peer onnxruntime-genai`: onnxruntime-genai's own model of the same checkpoint (built once by its
model builder), decoding the same prompt token ids, interleaved with our plain runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edge_spec.errors import ConfigError

from .times import PeerTimes, disk_bytes

from . import GENAI_PRECISIONS


def _require_genai():
    try:
        import onnxruntime_genai
    except ImportError as err:
        raise ConfigError("--peer onnxruntime-genai needs onnxruntime-genai",
                          "pip install onnxruntime-genai (use --no-deps to keep this onnxruntime)") from err
    return onnxruntime_genai


def genai_model(source: Path, precision: str, cache: Path) -> Path:
    """onnxruntime-genai's own ONNX model of the checkpoint folder `source` (config.json + safetensors), built
    by its model builder for the CPU provider and cached (written to a temp folder, then renamed)."""
    og = _require_genai()
    if precision not in GENAI_PRECISIONS:
        raise ConfigError(f"unknown onnxruntime-genai precision {precision!r}",
                          f"choose from {', '.join(GENAI_PRECISIONS)}")
    if not (Path(source) / "config.json").is_file():
        raise ConfigError(f"{source} is not a checkpoint folder (no config.json)",
                          "the genai peer is built from the target's Hugging Face folder: pass --model FOLDER")
    out = cache / f"genai-{og.__version__}-{Path(source).name}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # the builder itself, with a shim for Gemma-3's per-layer-type RoPE as transformers 5 reads it (genai_builder.py)
    cmd = [sys.executable, "-m", "edge_spec.peers.genai_builder", "-i", str(source), "-o", str(tmp / "model"),
           "-p", precision, "-e", "cpu", "-c", str(tmp / "hf-cache")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not (tmp / "model" / "genai_config.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"onnxruntime-genai's model builder failed on {source} ({precision}): "
                          f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no output'}",
                          "check that the folder is a supported Llama/Gemma checkpoint")
    (tmp / "model").rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


class OrtGenaiPeer(PeerTimes):
    """Plain greedy decode through onnxruntime-genai with the model its own builder made of the same checkpoint
    (fused GroupQueryAttention / RotaryEmbedding / SkipSimplifiedLayerNorm graph; its int4 is symmetric with a
    4-bit head, so its tokens can differ from ours). Same prompt ids, budget and interleaving as LlamaCppPeer."""

    def __init__(self, model_dir: Path, *, threads: int | None, precision: str):
        og = _require_genai()
        super().__init__(threads)
        self.model_dir, self.precision = Path(model_dir), precision
        config = og.Config(str(model_dir))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": self.threads, "inter_op_num_threads": 1}}}}))
        self.og, self.model = og, og.Model(config)
        self.outputs = []
        # its sliding-window attention refuses a KV capacity (max_length) below the window (gemma-3: 512)
        decoder = json.loads((self.model_dir / "genai_config.json").read_text())["model"]["decoder"]
        self.min_length = int((decoder.get("sliding_window") or {}).get("window_size", 0))

    def _generate(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], float, float, float]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max(len(ids) + max_new_tokens, self.min_length), do_sample=False)
        gen = self.og.Generator(self.model, params)
        start = time.perf_counter()
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        out, t_first = [], None
        while not gen.is_done() and len(out) < max_new_tokens:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
            if t_first is None:
                t_first = time.perf_counter()
        return out, start, t_first, time.perf_counter()

    def warm_up(self, ids: list[int]) -> None:
        self._generate(ids[:8], 2)

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        out, start, t_first, end = self._generate(ids, max_new_tokens)
        self.outputs.append(out)
        self.record(len(out), start, t_first, end)

    def result(self) -> dict:
        return {"peer": "onnxruntime-genai", "model": self.model_dir.name, "precision": self.precision,
                "model_bytes": disk_bytes(self.model_dir),
                **self.timing(), "onnxruntime_genai": self.og.__version__}
