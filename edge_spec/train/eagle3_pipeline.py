"""`edge-spec train-drafter --arch eagle3`: corpora -> regenerated answers (pipeline.sequences, unchanged) -> EAGLE-3
teacher shards (eagle3_data) -> draft vocabulary -> TTT training (eagle3_trainer) -> a Speculators eagle3 folder
(config.json + model.safetensors + training_report.json) that edge_spec/loading/speculators_eagle3.py reads, so
`generate --drafter OUT`, `eval-drafter` and `export --drafter OUT --format onnx` take it as they take any
Speculators drafter.

Every stage is cached in the work folder and skipped when complete; training resumes from its checkpoint. Under
torchrun the teacher pass is split between the ranks (pipeline.make_shards' dealing), every rank derives the same
draft vocabulary from the same windows, and rank 0 alone writes the folder.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from edge_spec.errors import ConfigError
from edge_spec.loading.checkpoints import LoadedModel
from edge_spec.model.config import FULL, ModelConfig
from edge_spec.model.eagle3 import Eagle3Drafter, check_eagle3_pair, default_aux_layers
from edge_spec.train.dist import Dist, agree, barrier, check_batch, main_first
from edge_spec.train.eagle3_data import (TOP_K, Eagle3Shards, bytes_per_token, draft_vocabulary, make_eagle3_shards,
                                         token_counts)
from edge_spec.train.eagle3_trainer import Eagle3TrainConfig, publish_eagle3, train_eagle3
from edge_spec.train.pipeline import check_work_target, sequences
from edge_spec.train.teacher import autocast_dtype, with_autocast

DEFAULT_DRAFT_VOCAB = 32000
# Speculators 0.9's eagle3 training defaults (train/config/schema.py): llama layers, these norm options on
NORM_DEFAULTS = {"norm_before_residual": True, "norm_before_fc": True, "fc_norm": False, "norm_output": True}


def layer_config(target: ModelConfig, *, num_layers: int = 1, num_heads: int | None = None,
                 intermediate_size: int | None = None) -> dict:
    """The drafter's transformer_layer_config (a llama config, as Speculators builds one from the verifier's): the
    target's width, vocabulary, heads (KV heads of its first full-attention layer), norm eps and RoPE theta; SiLU
    and default RoPE whatever the target uses (edge-spec's eagle3 layers take llama / qwen3 blocks only)."""
    heads = num_heads or target.num_heads
    if target.hidden_size % heads:
        raise ConfigError(f"--heads {heads} does not divide the target's hidden size {target.hidden_size}",
                          "pass a --heads that divides it (an EAGLE-3 drafter is as wide as its target)")
    full = [i for i, kind in enumerate(target.layer_kinds) if kind == FULL] or [0]
    kv = target.kv_heads[full[0]]
    if heads % kv:
        kv = heads
    rope = target.rope.get(FULL) or next(iter(target.rope.values()))
    return {"model_type": "llama", "vocab_size": target.vocab_size, "hidden_size": target.hidden_size,
            "intermediate_size": int(intermediate_size or target.intermediate_sizes[0]),
            "num_hidden_layers": int(num_layers), "num_attention_heads": heads, "num_key_value_heads": kv,
            "head_dim": target.hidden_size // heads, "hidden_act": "silu", "rms_norm_eps": target.rms_norm_eps,
            "max_position_embeddings": target.max_position_embeddings, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(rope.theta)}}


def resolve_aux_layers(target: ModelConfig, aux_layers) -> tuple[int, ...]:
    """--aux-layers, or Speculators' default low / middle / high (2, L // 2, L - 3), checked against the target."""
    ids = tuple(int(i) for i in aux_layers) if aux_layers else default_aux_layers(target.num_layers)
    n = target.num_layers
    if len(set(ids)) != len(ids) or any(not 0 <= i <= n for i in ids):
        where = "--aux-layers" if aux_layers else f"Speculators' default aux layers for {n} layers"
        raise ConfigError(f"{where} {ids} must be distinct target layer ids in [0, {n}] (id i: the stream entering "
                          f"layer i; {n}: the stream leaving the last one)",
                          f"pass --aux-layers with ids in [0, {n}], e.g. {' '.join(map(str, sorted({0, n // 2, n})))}")
    return ids


def new_eagle3_drafter(loaded: LoadedModel, *, aux_layers: tuple[int, ...], vocab_map, num_layers: int = 1,
                       num_heads: int | None = None, intermediate_size: int | None = None, seed: int = 0,
                       norms: dict | None = None) -> Eagle3Drafter:
    """A fresh drafter for `loaded`: random decoder layers and fc (torch's default init, seeded), the target's input
    embedding (frozen) and its output rows of the draft vocabulary as lm_head; `vocab_map`: (d2t, t2d) or None."""
    from edge_spec.loading.speculators_eagle3 import eagle3_config_from_dict

    target = loaded.config
    vd = target.vocab_size if vocab_map is None else len(vocab_map[0])
    config = {"speculators_model_type": "eagle3", "draft_vocab_size": vd,
              "eagle_aux_hidden_state_layer_ids": list(aux_layers), **(norms or NORM_DEFAULTS),
              "transformer_layer_config": layer_config(target, num_layers=num_layers, num_heads=num_heads,
                                                       intermediate_size=intermediate_size)}
    cfg = eagle3_config_from_dict(config, "the new eagle3 drafter's config")
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(loaded.model.model.embed_tokens.weight.detach().float().cpu())
        table = loaded.model.lm_head.weight.detach().float().cpu()  # [V, H]
        if vocab_map is not None:
            drafter.d2t.copy_(vocab_map[0])
            drafter.t2d.copy_(vocab_map[1])
            table = table[drafter.target_ids(torch.arange(vd))]
        drafter.lm_head.weight.copy_(table)
    drafter.embed_tokens.weight.requires_grad_(False)
    check_eagle3_pair(target, cfg, f"the target {loaded.name}", "the new eagle3 drafter")
    return drafter


def run_eagle3(loaded: LoadedModel, out: Path, *, data: list[str], max_tokens: int = 400_000, chat_batch: int = 16,
               chat_max_new: int = 128, max_chat_prompts: int | None = None, chat_templates: int = 2,
               max_regen_text: int = 200, num_layers: int = 1, num_heads: int | None = None,
               intermediate_size: int | None = None, draft_vocab: int | None = None, aux_layers=None,
               train_cfg: Eagle3TrainConfig = Eagle3TrainConfig(), max_steps: int | None = None,
               work: Path | None = None, init: Path | None = None, save_dtype: torch.dtype | None = None,
               minutes: float | None = None, regenerated: Path | None = None, dist: Dist | None = None,
               stop_after: str | None = None) -> dict:
    """Train an EAGLE-3 drafter for `loaded` into `out` (module docstring). `init`: a Speculators eagle3 folder to
    start from (its shape, aux layers and vocabulary map win; --draft-vocab / --aux-layers that differ are refused).
    Returns the report (rank 0's is complete)."""
    from edge_spec.loading.speculators_eagle3 import load_eagle3, read_eagle3_config

    dist = dist or Dist()
    check_batch(train_cfg.batch_seqs, dist.world_size)
    started = time.perf_counter()
    target = loaded.config
    work = work or out.parent / f"{out.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    main_first(dist, lambda: check_work_target(work, loaded))
    # the drafter's facts are checked before any long stage runs
    if init is not None:
        init_cfg = read_eagle3_config(init)
        ids = check_eagle3_pair(target, init_cfg, f"the target {loaded.name}", f"the --init drafter {init}")
        if aux_layers and tuple(aux_layers) != ids:
            raise ConfigError(f"--aux-layers {tuple(aux_layers)} differ from the --init drafter's {ids}",
                              "drop --aux-layers: a warm start keeps the initial drafter's aux layers")
        if draft_vocab and draft_vocab != init_cfg.draft_vocab_size:
            raise ConfigError(f"--draft-vocab {draft_vocab} differs from the --init drafter's "
                              f"{init_cfg.draft_vocab_size}", "drop --draft-vocab: a warm start keeps its vocabulary")
    else:
        ids = resolve_aux_layers(target, aux_layers)
        size = draft_vocab or min(target.vocab_size, DEFAULT_DRAFT_VOCAB)
        if not 0 < size <= target.vocab_size:
            raise ConfigError(f"--draft-vocab {size} is not in [1, {target.vocab_size}] (the target's vocabulary)",
                              f"pass a draft vocabulary of at most {target.vocab_size} tokens")
        layer_config(target, num_layers=num_layers, num_heads=num_heads, intermediate_size=intermediate_size)
    dtype = agree(dist, autocast_dtype(dist.device) if dist.main else None)
    train_cfg = with_autocast(train_cfg, dtype)
    loaded.model.to(dist.device)

    # 1. corpora -> windows (pipeline's stage 1, unchanged)
    seqs = sequences(loaded, work, data=data, max_tokens=max_tokens, chat_batch=chat_batch,
                     chat_max_new=chat_max_new, max_chat_prompts=max_chat_prompts, chat_templates=chat_templates,
                     max_regen_text=max_regen_text, regenerated=regenerated, dtype=dtype, dist=dist)
    if stop_after == "regenerate":
        return {"stopped_after": "regenerate", "data": {name: int(s.size) for name, s in seqs.items()},
                "total_seconds": time.perf_counter() - started}
    if stop_after is not None:
        raise ConfigError(f"unknown stage {stop_after!r} to stop after", "pass --stop-after regenerate or leave it out")

    # 2. teacher shards: aux states + the target's top-K law
    root = work / f"eagle3-shards-aux{'-'.join(map(str, ids))}"
    shards, dealt = {}, 0
    for name, s in seqs.items():
        if len(s):
            shards[name] = make_eagle3_shards(loaded.model, s, ids, root / name, dtype=dtype, dist=dist, first=dealt)
            dealt += len(shards[name])
    barrier(dist)
    train_paths = [p for name, ps in shards.items() if name != "held_out_text" for p in ps]

    # 3. the draft vocabulary and the drafter
    if init is not None:
        drafter = load_eagle3(init, target_embedding=loaded.model.model.embed_tokens.weight)
        for p in drafter.parameters():
            p.requires_grad_(True)
        drafter.embed_tokens.weight.requires_grad_(False)
    else:
        train_windows = [s for name, s in seqs.items() if name != "held_out_text"]
        vocab_map = draft_vocabulary(token_counts(train_windows, target.vocab_size), size)
        drafter = new_eagle3_drafter(loaded, aux_layers=ids, vocab_map=vocab_map, num_layers=num_layers,
                                     num_heads=num_heads, intermediate_size=intermediate_size, seed=train_cfg.seed)

    # 4. training (resumable)
    run_dir = work / f"run_eagle3_{out.name}"
    run_dir.mkdir(exist_ok=True)
    held = Eagle3Shards(shards["held_out_text"]) if "held_out_text" in shards else None
    report = train_eagle3(drafter, Eagle3Shards(train_paths), train_cfg, run_dir, held_out=held,
                          max_steps=max_steps, minutes=minutes, dist=dist)
    c = drafter.cfg
    report.update({"arch": "eagle3", "data": {name: int(s.size) for name, s in seqs.items()},
                   "teacher_dtype": str(dtype), "teacher_top_k": TOP_K,
                   "shard_bytes": sum(p.stat().st_size for ps in shards.values() for p in ps),
                   "shard_bytes_per_token": bytes_per_token(c.hidden_size, c.num_aux),
                   "drafter": {"aux_layers": list(ids), "draft_vocab_size": c.draft_vocab_size,
                               "num_layers": c.layers.num_layers, "num_heads": c.layers.num_heads,
                               "intermediate_size": c.layers.intermediate_sizes[0],
                               "init": str(init) if init else None,
                               **{k: getattr(c, k) for k in NORM_DEFAULTS},
                               "parameters": sum(p.numel() for p in drafter.parameters() if p.requires_grad)},
                   "target": loaded.name, "total_seconds": time.perf_counter() - started})
    barrier(dist)
    if dist.main:
        from edge_spec.contract.manifest import content_id

        provenance = {"trained_by": "edge-spec train-drafter --arch eagle3", "target": loaded.name,
                      "target_content_sha256": content_id(target.raw, loaded.model.state_dict())}
        publish_eagle3(out, drafter.cpu(), report, save_dtype, speculative_tokens=train_cfg.steps_ahead,
                       verifier_architectures=target.raw.get("architectures"),
                       verifier_name_or_path=str(loaded.folder), provenance=provenance)
    barrier(dist)
    return report
