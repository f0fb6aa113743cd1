"""The built-in SmolLM2 cut to its first N layers (real widths and weights), for probes that need its shapes and
numerics at a fraction of the export time (scripts/qnn_quality.py, scripts/et_binding_cost.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def truncated_smollm2(layers: int, out: Path) -> Path:
    """The built-in SmolLM2's HF folder with only its first `layers` layers (config and safetensors)."""
    from safetensors.torch import load_file, save_file

    from edge_spec.loading.gguf_common import cache_root

    src = cache_root() / "smollm2-135m-instruct"
    if not (src / "config.json").is_file():
        from edge_spec.api import load

        load("smollm2-135m", drafter=None)  # converts the built-in GGUF into that folder
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(str(src / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(keep, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out
