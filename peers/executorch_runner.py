"""`edge-spec bench --peer executorch`: ExecuTorch's own LLM runner decoding the same checkpoint, as an ExecuTorch user
would run it: the target exported by ExecuTorch's own Llama exporter (`executorch.examples.models.llama.export_llama`,
shipped in the executorch wheel: KV cache, `llama::sdpa_with_kv_cache`, XNNPACK; fp32 - see ET_PRECISIONS) and
decoded by `TextLLMRunner` (executorch.extension.llm.runner, the
Python binding of ExecuTorch's C++ runner), plain greedy.

The .pte is built once per checkpoint and precision and cached (written to a temp folder, then renamed):
  1. the Hugging Face folder's weights renamed to ExecuTorch's Llama names (`meta_checkpoint`: the q/k projections
     stay in Hugging Face's rotate-half layout, and the params say `use_hf_rope`),
  2. `export_llama` run in a subprocess (its own CLI; its logs go to the cache folder's export.log).
Llama-family checkpoints only (SmolLM2); other families raise a ConfigError.

The runner takes text: each prompt's token ids are decoded back to text and the runner re-tokenizes them with the
same tokenizer.json (`prompt_tokens` in the result counts the ids it saw). The runner's own logs go to runner.log
beside the .pte.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from edge_spec.errors import ConfigError
from edge_spec.logs import IMPORT_NOISE, quiet

from .times import PeerTimes, disk_bytes

# fp32 only: ExecuTorch 1.5.1's export_llama fails on 8da4w with this torch / torchao (measured 2026-12-01: the
# legacy `-qmode 8da4w` trips a dequantize_affine dtype assertion while re-exporting, `-qmode torchao:8da4w` needs
# torchao's CPU kernel library, which the torchao wheel here does not load)
ET_PRECISIONS = ("fp32",)
MAX_SEQ_LEN = 1024  # the peer's KV cache (prompt + new tokens of the bench prompts fit)


def _require_runner():
    try:
        with quiet(*IMPORT_NOISE):  # the kernels of ExecuTorch's LLM ops (llama::custom_sdpa, update_cache) first
            import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    except ImportError as err:
        raise ConfigError("--peer executorch needs the executorch wheel's LLM runner",
                          "pip install executorch==1.5.1") from err
    return GenerationConfig, TextLLMRunner


def et_params(config: dict) -> dict:
    """ExecuTorch Llama ModelArgs (params.json) of a Hugging Face Llama config."""
    if config.get("model_type") != "llama":
        raise ConfigError(f"--peer executorch exports Llama-family checkpoints only (this one is "
                          f"{config.get('model_type')!r})", "drop --peer executorch for this model")
    return {"dim": config["hidden_size"], "n_layers": config["num_hidden_layers"],
            "n_heads": config["num_attention_heads"],
            "n_kv_heads": config.get("num_key_value_heads", config["num_attention_heads"]),
            "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
            "hidden_dim": config["intermediate_size"], "vocab_size": config["vocab_size"],
            "norm_eps": config["rms_norm_eps"], "rope_theta": rope_theta(config),
            "use_hf_rope": True, "attention_qkv_bias": bool(config.get("attention_bias", False)),
            "use_scaled_rope": False}


def rope_theta(config: dict) -> float:
    """The rope base of a config.json: transformers >= 5 writes it under rope_parameters, older ones at the top."""
    return float((config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0)


_NAMES = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
          "lm_head.weight": "output.weight"}
_LAYER = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
          "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
          "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm",
          "post_attention_layernorm": "ffn_norm"}


def meta_name(hf: str) -> str:
    """A Hugging Face Llama parameter name as ExecuTorch's Llama names it (model.layers.3.mlp.up_proj.weight ->
    layers.3.feed_forward.w3.weight)."""
    if hf in _NAMES:
        return _NAMES[hf]
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 5:
        raise ConfigError(f"unexpected Llama parameter {hf!r}", "--peer executorch supports Llama-family checkpoints")
    module, kind = ".".join(parts[3:-1]), parts[-1]
    if module not in _LAYER:
        raise ConfigError(f"unexpected Llama parameter {hf!r}", "--peer executorch supports Llama-family checkpoints")
    return f"layers.{parts[2]}.{_LAYER[module]}.{kind}"


def meta_checkpoint(folder: Path) -> dict:
    """The folder's safetensors weights under ExecuTorch's Llama names (a tied head gets output.weight)."""
    import torch
    from safetensors.torch import load_file

    weights = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(str(path)))
    out = {meta_name(k): v.to(torch.float32) for k, v in weights.items()}
    out.setdefault("output.weight", out["tok_embeddings.weight"])
    return out


def et_runner_model(source: Path, precision: str, cache: Path) -> Path:
    """ExecuTorch's own export of the checkpoint folder `source` at `precision`, cached; returns the .pte path."""
    import executorch  # noqa: F401  (fail here, not inside the subprocess)
    import torch

    if precision not in ET_PRECISIONS:
        raise ConfigError(f"unknown ExecuTorch peer precision {precision!r}", f"choose from {', '.join(ET_PRECISIONS)}")
    config = json.loads((Path(source) / "config.json").read_text())
    params = et_params(config)
    out = cache / f"executorch-1.5.1-{Path(source).name}-{precision}"
    if (out / "model.pte").is_file():
        return out / "model.pte"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(meta_checkpoint(source), tmp / "checkpoint.pth")
    (tmp / "params.json").write_text(json.dumps(params))
    eos = config.get("eos_token_id", 2)
    metadata = {"get_bos_id": config.get("bos_token_id", 1), "get_eos_ids": eos if isinstance(eos, list) else [eos]}
    cmd = [sys.executable, "-m", "executorch.examples.models.llama.export_llama", "--model", "smollm2",
           "--checkpoint", str(tmp / "checkpoint.pth"), "--params", str(tmp / "params.json"), "-kv",
           "--use_sdpa_with_kv_cache", "-X", "-d", "fp32", "--max_seq_length", str(MAX_SEQ_LEN),
           "--max_context_length", str(MAX_SEQ_LEN), "--metadata", json.dumps(metadata),
           "--output-dir", str(tmp), "--output_name", "model.pte"]
    with open(tmp / "export.log", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    if done.returncode != 0 or not (tmp / "model.pte").is_file():
        tail = (tmp / "export.log").read_text().strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"ExecuTorch's export_llama failed on {source} ({precision}): {tail[0][:300]}",
                          f"see {tmp / 'export.log'}")
    (tmp / "checkpoint.pth").unlink()
    tmp.rename(out)
    return out / "model.pte"


@contextlib.contextmanager
def _native_output_to(path: Path):
    """File descriptors 1 and 2 (where the native runner prints its stats and logs) appended to `path` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            for fd, old in zip((1, 2), saved):
                os.dup2(old, fd)
                os.close(old)


class ExecutorchRunnerPeer(PeerTimes):
    """Plain greedy decode through ExecuTorch's TextLLMRunner, same prompts and token budget as the other peers
    (edge_spec.benchmark.bench: interleaved with our plain runs). Timing from the runner's own stats (milliseconds), kept by
    the peers' shared bookkeeping."""

    def __init__(self, pte: Path, tokenizer_json: Path, decode, *, threads: int | None, precision: str):
        self.GenerationConfig, runner = _require_runner()
        from edge_spec.runtimes.executorch import set_threads

        super().__init__(set_threads(threads))
        self.pte, self.precision, self.decode = Path(pte), precision, decode
        self.log = self.pte.parent / "runner.log"
        with _native_output_to(self.log):
            self.runner = runner(str(pte), str(tokenizer_json))
        self.prompt_tokens: list[int] = []
        self.outputs: list[str] = []

    def _generate(self, ids: list[int], max_new_tokens: int) -> tuple[str, object]:
        stats, pieces = [], []
        config = self.GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0,
                                       seq_len=MAX_SEQ_LEN, num_bos=0, num_eos=0)
        self.runner.reset()
        with _native_output_to(self.log):  # the C++ runner prints stats and logs per call
            self.runner.generate(self.decode(ids), config, token_callback=pieces.append, stats_callback=stats.append)
        if not stats:
            raise ConfigError("ExecuTorch's runner returned no stats", "rerun without --peer executorch")
        return "".join(pieces), stats[-1]

    def warm_up(self, ids: list[int]) -> None:
        self._generate(ids[:8], 2)

    def run(self, ids: list[int], max_new_tokens: int) -> None:
        text, s = self._generate(ids, max_new_tokens)
        self.outputs.append(text)
        self.prompt_tokens.append(int(s.num_prompt_tokens))
        self.record(max(1, int(s.num_generated_tokens)), s.inference_start_ms / 1000, s.first_token_ms / 1000,
                    s.inference_end_ms / 1000)

    def result(self) -> dict:
        return {"peer": "executorch", "model": self.pte.parent.name, "precision": self.precision,
                "model_bytes": disk_bytes(self.pte), **self.timing(),
                "prompt_tokens": int(np.sum(self.prompt_tokens)), "runner": "TextLLMRunner (executorch 1.5.1)"}

