"""`edge-spec eval-drafter`: speculative generation over JSONL prompts -> tau and acceptance by position.

Prompt lines: {"prompt": "...", "chat": true|false, "kind": "chat|docs|code" (optional)}.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "heldout.jsonl"


def read_prompts(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist", "pass a JSONL file of {\"prompt\": ..., \"chat\": ...}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{n} is not valid JSON ({err})", "one JSON object per line") from err
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ConfigError(f"{path}:{n} needs a string field 'prompt'", 'e.g. {"prompt": "Hello", "chat": true}')
        rows.append({"prompt": row["prompt"], "chat": bool(row.get("chat", False)), "kind": row.get("kind", "all")})
    if not rows:
        raise ConfigError(f"{path} holds no prompts")
    return rows


def evaluate(engine, prompts: list[dict], *, k: int, temperature: float = 0.0, max_new_tokens: int = 128,
             seed: int = 0, progress: bool = True) -> dict:
    """Aggregate speculative stats over prompts, overall and per kind."""
    from tqdm.auto import tqdm

    groups: dict[str, dict] = {}
    for i, row in enumerate(tqdm(prompts, desc=f"eval k={k} T={temperature}", disable=not progress)):
        result = engine.generate(row["prompt"], chat=row["chat"], max_new_tokens=max_new_tokens,
                                 temperature=temperature, seed=seed + i, spec_k=k, speculative=True)
        stats = result.extra["spec"]
        for name in ("all", row["kind"]):
            g = groups.setdefault(name, {"emitted": 0, "passes": 0, "drafted": np.zeros(k), "accepted": np.zeros(k),
                                         "prompts": 0, "drafter_s": 0.0, "target_s": 0.0})
            g["emitted"] += stats.emitted_by_passes
            g["passes"] += stats.target_calls
            g["drafted"] += stats.drafted
            g["accepted"] += stats.accepted
            g["prompts"] += 1
            g["drafter_s"] += stats.drafter_s
            g["target_s"] += stats.target_s
    out = {"k": k, "temperature": temperature, "max_new_tokens": max_new_tokens, "by_kind": {}}
    for name, g in groups.items():
        entry = {"prompts": g["prompts"], "tau": g["emitted"] / max(g["passes"], 1),
                 "acceptance_by_position": [float(a / d) if d else None for a, d in zip(g["accepted"], g["drafted"])],
                 "drafter_time_share": g["drafter_s"] / max(g["drafter_s"] + g["target_s"], 1e-9)}
        if name == "all":
            out.update(entry)
        else:
            out["by_kind"][name] = entry
    return out
