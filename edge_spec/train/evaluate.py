"""`edge-spec eval-drafter`: speculative generation over JSONL prompts -> tau and acceptance by position.

Prompt lines: {"prompt": "...", "chat": true|false, "kind": "chat|docs|code" (optional)}.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge_spec.errors import ConfigError
from edge_spec.contract.kv import SLIDING

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
             seed: int = 0, progress: bool = True, teacher_forced: bool = False, lookup: bool = False,
             datastore: bool = False, adaptive: bool = True, mtp: bool = True) -> dict:
    """Aggregate speculative stats over prompts, overall and per kind.

    `acceptance_by_position[j-1]` = the fraction of bursts whose first j drafts were all accepted (cumulative:
    tau = 1 + their sum at full k). `teacher_forced` (eager runtime, greedy) also scores the drafter at every
    position of the generated text fed the true tokens (`teacher_forced_predictions`): `teacher_forced_by_position`
    has the same cumulative definition, over all positions instead of the ones a live run drafts at.
    `lookup` / `datastore`: prompt lookup / the engine's static datastore draft first (default: the drafter alone);
    `adaptive` False drafts exactly k every pass; `mtp` False: retrieval alone drafts (the ablation of the sources)."""
    from tqdm.auto import tqdm

    if teacher_forced:
        if engine.runtime != "torch" or engine.drafter is None:
            raise ConfigError("--teacher-forced runs the eager target and drafter",
                              "evaluate a checkpoint pair (--model/--drafter), not a --bundle")
        if temperature != 0.0:
            raise ConfigError("--teacher-forced compares with the target's greedy tokens", "use --temperature 0")
        from edge_spec.model.drafter import Drafter, check_pair

        if not isinstance(getattr(engine.drafter, "drafter", None), Drafter):
            raise ConfigError("--teacher-forced scores an MTP drafter; EAGLE-3 drafters are measured live only so far "
                              "(issue 48)", "drop --teacher-forced (tau and acceptance by position are still measured)")
        model, drafter = engine.loaded.model, engine.drafter.drafter
        sources = check_pair(engine.loaded.config, drafter.cfg)
    groups: dict[str, dict] = {}
    for i, row in enumerate(tqdm(prompts, desc=f"eval k={k} T={temperature}", disable=not progress)):
        prompt_ids = engine.encode(row["prompt"], chat=row["chat"])
        result = engine.generate(prompt_ids, max_new_tokens=max_new_tokens,
                                 temperature=temperature, seed=seed + i, spec_k=k, speculative=True, lookup=lookup,
                                 datastore=datastore, adaptive=adaptive, mtp=mtp,
                                 allow_inexact=True)  # acceptance is measured, the output is not used
        stats = result.extra["spec"]
        agree = count = np.zeros(k)
        if teacher_forced:
            seq = np.array(prompt_ids + result.tokens, dtype=np.int64)
            preds = teacher_forced_predictions(model, drafter, sources, seq, len(prompt_ids), k)  # [k, n]
            anchors = np.arange(len(prompt_ids), len(seq) - k)
            right = np.stack([preds[j - 1] == seq[anchors + j] for j in range(1, k + 1)])  # [k, n]
            agree = np.cumprod(right, axis=0).sum(axis=1).astype(float)  # steps 1..j all right, as a burst counts
            count = np.full(k, float(len(anchors)))
        for name in {"all", row["kind"]}:  # a row without a kind counts once, in "all"
            g = groups.setdefault(name, {"emitted": 0, "passes": 0, "drafted": np.zeros(k), "accepted": np.zeros(k),
                                         "prompts": 0, "drafter_s": 0.0, "target_s": 0.0, "lookup_passes": 0, "datastore_passes": 0,
                                         "tf_agree": np.zeros(k), "tf_count": np.zeros(k)})
            g["tf_agree"] += agree
            g["tf_count"] += count
            g["emitted"] += stats.emitted_by_passes
            g["passes"] += stats.target_calls
            g["drafted"] += stats.drafted
            g["accepted"] += stats.accepted
            g["prompts"] += 1
            g["lookup_passes"] += stats.lookup_passes
            g["datastore_passes"] += stats.datastore_passes
            g["drafter_s"] += stats.drafter_s
            g["target_s"] += stats.target_s
    out = {"k": k, "temperature": temperature, "max_new_tokens": max_new_tokens, "lookup": lookup,
           "datastore": datastore, "adaptive": adaptive, "mtp": mtp, "by_kind": {}}
    for name, g in groups.items():
        entry = {"prompts": g["prompts"], "tau": g["emitted"] / max(g["passes"], 1),
                 "acceptance_by_position": [float(a / d) if d else None for a, d in zip(g["accepted"], g["drafted"])],
                 "drafter_time_share": g["drafter_s"] / max(g["drafter_s"] + g["target_s"], 1e-9),
                 "lookup_share": g["lookup_passes"] / max(g["passes"], 1),  # passes drafted by retrieval
                 "datastore_share": g["datastore_passes"] / max(g["passes"], 1)}  # by the static datastore
        if teacher_forced:
            entry["teacher_forced_by_position"] = [float(a / c) if c else None for a, c in zip(g["tf_agree"], g["tf_count"])]
        if name == "all":
            out.update(entry)
        else:
            out["by_kind"][name] = entry
    return out


def teacher_forced_predictions(model, drafter, sources: dict[str, int], seq: np.ndarray, first: int,
                               steps: int) -> np.ndarray:
    """What the drafter proposes at every anchor of `seq` when fed the *true* tokens, as training sees it.

    seq: [N] token ids; anchors L = first .. N - 1 - steps (cache = positions < L, bonus token seq[L]); draft step j
    gets (embedding of seq[L + j - 1], the previous step's hidden; H[L - 1] first) at position L, exactly what a
    speculative burst at L feeds it when its drafts so far were right. Returns [steps, n_anchors] proposed ids (the
    runtime's choice: argmax over the candidates, lowest id on ties). On a greedy continuation, entry [j - 1, i]
    == seq[L_i + j] is the draft the target accepts, so the mean per step is the acceptance a live run would see
    if every position were drafted (tests/test_train.py checks the proposals against TorchDrafter bursts)."""
    import torch

    from edge_spec.decoding.speculative import greedy_draft
    from edge_spec.train.teacher import extract
    from edge_spec.train.trainer import anchor_masks

    ex = extract(model, seq[None], sorted(set(sources.values())), dtype=torch.float32, batch=1, store=np.float32)
    hidden = torch.from_numpy(ex["hidden"][0])  # [N, Ht]
    kv = {kind: (torch.from_numpy(ex[f"k_{l}"]), torch.from_numpy(ex[f"v_{l}"])) for kind, l in sources.items()}
    anchors = torch.arange(first, len(seq) - steps)  # [n]
    masks = {kind: anchor_masks(len(seq), len(anchors), drafter.cfg.layers.sliding_window if kind == SLIDING else None,
                                first=first) for kind in sources}  # [1, 1, n, N]
    ids = torch.from_numpy(seq.astype(np.int64))
    prev, out = hidden[anchors - 1][None], []
    with torch.no_grad():
        for j in range(1, steps + 1):
            h, projected = drafter.states(model.embed(ids[anchors + j - 1][None]), prev, anchors[None], masks, kv)
            out.append([greedy_draft(*drafter.head(h[0, i], projected[0, i], model.lm_head.weight))
                        for i in range(len(anchors))])
            prev = projected
    return np.array(out, dtype=np.int64).reshape(steps, len(anchors))
