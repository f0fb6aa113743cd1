"""`edge-spec train-drafter`: corpora -> sequences -> teacher shards -> clustering -> training -> drafter folder.

Every stage caches its output under `<out>/work/` and is skipped when already complete, so an
interrupted run resumes where it stopped (training resumes from its last checkpoint).

Launched by torchrun (`dist`), every rank runs this same function: the teacher pass is split between the ranks
(each writes its own shards and regenerated answers), a barrier, then every rank reads all of them; one-off caches
(the work folder's target, corpora, clusters) are written by rank 0 first; the drafter by rank 0 alone, at the end.
The work folder must be one that every rank sees (a shared filesystem across nodes).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from edge_spec.loading.checkpoints import LoadedModel, load_drafter
from edge_spec.model.clustering import balanced_kmeans
from edge_spec.model.drafter import new_drafter, pair, save_drafter
from edge_spec.errors import ConfigError
from edge_spec.train import data as D
from edge_spec.train.dist import Dist, agree, barrier, check_batch, main_first, owns
from edge_spec.train.folders import publish_folder
from edge_spec.train.shard_quant import encode_arrays
from edge_spec.train.teacher import autocast_dtype, with_autocast, batched_greedy, extract
from edge_spec.train.trainer import (ShardData, TrainConfig, ensure_teacher_top, top_sidecar, train,
                                     write_teacher_top)

SEQ_LEN = 256


def pack(token_lists, seq_len: int, max_tokens: int, sep: int) -> np.ndarray:
    """Concatenate token lists (separated by `sep`) and cut into [N, seq_len] windows."""
    stream: list[int] = []
    for ids in token_lists:
        stream.extend(ids + [sep])
        if len(stream) >= max_tokens:
            break
    n = min(len(stream), max_tokens) // seq_len
    return np.asarray(stream[:n * seq_len], dtype=np.int32).reshape(n, seq_len)


def text_sequences(loaded: LoadedModel, roots: list[Path], *, held_out: bool, max_tokens: int, kind: str | None = None):
    tok = loaded.tokenizer
    docs = (d for d in D.iter_documents(roots, held_out=held_out) if kind is None or d.kind == kind)
    return pack((tok.encode(d.text, add_bos=False) for d in docs), SEQ_LEN, max_tokens, _sep(loaded))


def _sep(loaded: LoadedModel) -> int:
    return next(iter(sorted(loaded.stop_ids)), 0)


def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:20]


def _cache_parts(cache: Path) -> list[Path]:
    """The per-rank parts of a regeneration cache (`chat.rank1.jsonl`) a distributed run writes before rank 0 merges
    them (left behind by an interrupted one)."""
    return sorted(cache.parent.glob(f"{cache.stem}.rank*.jsonl"))


def _read_cache(cache: Path) -> dict[str, list[int]]:
    done = {}
    for path in [cache, *_cache_parts(cache)]:
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                done[row["prompt"]] = row["ids"]
    return done


def _merge_parts(cache: Path) -> None:
    parts = _cache_parts(cache)
    if parts:
        with cache.open("a") as f:
            for part in parts:
                f.write(part.read_text())
        for part in parts:
            part.unlink()


def chat_sequences(loaded: LoadedModel, prompts: list[str], *, max_new_tokens: int, batch: int, dtype,
                   cache: Path, chat: bool = True, seeded: dict[str, list[int]] | None = None,
                   dist: Dist = Dist()) -> np.ndarray:
    """The target's own greedy answers / continuations (the text the drafter must predict at run time),
    cached as JSONL so an interrupted run resumes. `seeded`: prompt key -> new token ids generated earlier (committed
    data, `--regenerated`): those prompts are not generated again.

    Several ranks (`dist`): the prompts still to generate are cut into the batches one process would make (the same
    padding, so the same answers) and rank r generates batches r, r + W, ... into its own part of the cache; after a
    barrier rank 0 merges the parts into the cache, and every rank reads it."""
    done = _read_cache(cache)
    barrier(dist)  # every rank has read the cache before any rank writes to it
    if seeded:
        fresh = [p for p in prompts if p not in done and prompt_key(p) in seeded]
        for p in fresh:
            done[p] = loaded.tokenizer.encode_prompt(p, chat=chat) + seeded[prompt_key(p)]
        if dist.main:
            with cache.open("a") as f:
                f.writelines(json.dumps({"prompt": p, "ids": done[p]}) + "\n" for p in fresh)
    todo = [p for p in prompts if p not in done]
    chunks = [todo[start:start + batch] for start in range(0, len(todo), batch)]
    mine = [chunk for i, chunk in enumerate(chunks) if owns(i, dist)]
    part = cache.with_name(f"{cache.stem}.rank{dist.rank}.jsonl") if dist.active else cache
    bar = tqdm(total=len(prompts) - len(todo) + sum(map(len, mine)), initial=len(prompts) - len(todo),
               desc=f"regenerate ({cache.stem})", unit="prompt", disable=not dist.main)
    with part.open("a") as f:
        for chunk in mine:
            ids = [loaded.tokenizer.encode_prompt(p, chat=chat) for p in chunk]
            outs = batched_greedy(loaded.model, ids, max_new_tokens=max_new_tokens, stop_ids=loaded.stop_ids,
                                  dtype=dtype)
            for p, i, o in zip(chunk, ids, outs):
                done[p] = i + o
                f.write(json.dumps({"prompt": p, "ids": i + o}) + "\n")
            f.flush()
            bar.update(len(chunk))
    bar.close()
    barrier(dist)  # every rank's part is written
    if dist.main:
        _merge_parts(cache)
    if dist.active:
        barrier(dist)
        done = _read_cache(cache)
    return pack((done[p] for p in prompts), SEQ_LEN, 10 ** 9, _sep(loaded))


def read_regenerated(folder: Path, loaded: LoadedModel) -> dict[str, dict[str, list[int]]]:
    """Committed regenerated data: `<folder>/<source>.jsonl.gz`, one {"key", "new"} row per prompt (the prompt's sha256
    prefix and the target's new token ids; no prompt text), and `target.json` naming the target that generated it."""
    stamp = folder / "target.json"
    if not stamp.exists():
        return {}
    from edge_spec.contract.manifest import content_id

    recorded = json.loads(stamp.read_text())
    ident = content_id(loaded.config.raw, loaded.model.state_dict())
    if recorded.get("content_sha256") != ident:
        raise ConfigError(f"{folder} holds the regenerated answers of another target ({recorded.get('name')}); this "
                          f"target is {loaded.name}", "pass --regenerated with that target's folder, or a new one")
    out = {}
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            out[path.name[:-len(".jsonl.gz")]] = {r["key"]: r["new"] for r in map(json.loads, f)}
    return out


def write_regenerated(folder: Path, work: Path, loaded: LoadedModel, sources: dict[str, bool]) -> None:
    """Write the work folder's regenerated caches (`sources`: name -> chat form) as committed data (see above)."""
    from edge_spec.contract.manifest import content_id

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "target.json").write_text(json.dumps({"name": loaded.name, "content_sha256": content_id(
        loaded.config.raw, loaded.model.state_dict())}) + "\n")
    for name, chat in sources.items():
        cache = work / f"{name}.jsonl"
        if not cache.exists():
            continue
        rows = [json.loads(line) for line in cache.read_text().splitlines()]
        lines = []
        for r in rows:
            start = len(loaded.tokenizer.encode_prompt(r["prompt"], chat=chat))
            lines.append(json.dumps({"key": prompt_key(r["prompt"]), "new": r["ids"][start:]}) + "\n")
        tmp = folder / f"{name}.jsonl.gz.tmp"
        tmp.write_bytes(gzip.compress("".join(lines).encode(), mtime=0))  # no timestamp: same answers, same bytes
        tmp.replace(folder / f"{name}.jsonl.gz")


def make_shards(loaded: LoadedModel, sequences: np.ndarray, source_layers: list[int], folder: Path, *,
                dtype, shard_seqs: int = 128, bits: int = 16, dist: Dist = Dist(), first: int = 0) -> list[Path]:
    """Teacher activations of `sequences`, `shard_seqs` per npz file: fp16, or 4-bit Hadamard codes (bits=4), each
    with its teacher top-k sidecar (trainer.top_sidecar). Returns every shard's path.

    A cached shard is reused only if it holds exactly these token rows and every source layer's K/V (another
    --data / --max-tokens or drafter layout recomputes it); the work folder's target is checked by `run`.
    Several ranks (`dist`): shard i is rank (first + i) mod W's to check and write (`first`: how many shards the run's
    earlier sets have, so that ranks are dealt shards across sets); the caller waits at a barrier before reading the
    others'."""
    folder.mkdir(parents=True, exist_ok=True)
    table16 = loaded.model.lm_head.weight.detach().to(torch.bfloat16)  # [V, Ht] on the target's device
    starts = range(0, len(sequences), shard_seqs)
    paths = [folder / f"shard_{i:04d}.npz" for i in range(len(starts))]
    mine = [i for i in range(len(starts)) if owns(first + i, dist)]
    bar = tqdm(total=sum(len(sequences[starts[i]:starts[i] + shard_seqs]) for i in mine),
               desc=f"teacher pass ({folder.name})", unit="seq", disable=not dist.main)
    for i in mine:
        path = paths[i]
        chunk = sequences[starts[i]:starts[i] + shard_seqs]  # [n, T]
        if path.exists() and not _shard_matches(path, chunk, source_layers):
            path.unlink()
            top_sidecar(path).unlink(missing_ok=True)
        if not path.exists():
            arrays = extract(loaded.model, chunk, source_layers, dtype=dtype)
            if bits == 4:  # the teacher's targets come from the exact hidden states; only inputs are coded
                write_teacher_top(top_sidecar(path), arrays["hidden"], table16)
                arrays = encode_arrays(arrays)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, tokens=chunk, **arrays)
            tmp.replace(path)
        ensure_teacher_top(path, table16)  # fp16 shards: from the stored hidden states
        bar.update(len(chunk))
    bar.close()
    return paths


def _shard_matches(path: Path, chunk: np.ndarray, source_layers: list[int]) -> bool:
    try:
        with np.load(path) as z:  # npz members load lazily: only the token rows are read
            return (np.array_equal(z["tokens"], chunk)
                    and all(f"{kv}_{l}" in z.files for l in source_layers for kv in "kv"))
    except (OSError, ValueError, KeyError):  # a damaged file is recomputed
        return False


def check_work_target(work: Path, loaded: LoadedModel) -> None:
    """A work folder caches one target's regenerated text and activations: refuse to mix in another target's."""
    from edge_spec.contract.manifest import content_id

    stamp = work / "target.json"
    ident = content_id(loaded.config.raw, loaded.model.state_dict())
    if stamp.exists():
        recorded = json.loads(stamp.read_text())
        if recorded.get("content_sha256") != ident:
            raise ConfigError(f"work folder {work} holds the cached data of another target ({recorded.get('name')}, "
                              f"{str(recorded.get('content_sha256'))[:12]}); this target is {loaded.name} ({ident[:12]})",
                              "pass a fresh --work folder (or delete that one) for this target")
        return
    if any(work.glob("shards*")) or any(work.glob("*.jsonl")):  # written before targets were recorded
        print(f"warning: work folder {work} has no recorded target; its cached data is assumed to be "
              f"{loaded.name}'s from now on (use a fresh --work folder if it is not)", file=sys.stderr)
    stamp.write_text(json.dumps({"name": loaded.name, "content_sha256": ident}))


def sequences(loaded: LoadedModel, work: Path, *, data: list[str], max_tokens: int, chat_batch: int,
              chat_max_new: int, max_chat_prompts: int | None, chat_templates: int, max_regen_text: int,
              regenerated: Path | None, dtype, dist: Dist) -> dict[str, np.ndarray]:
    """Stage 1 of `run` (and of the EAGLE-3 pipeline, edge_spec/train/eagle3_pipeline.py): the corpora and the
    target's regenerated answers (cached in `work`, written back to `regenerated`) -> token windows [N, SEQ_LEN] per
    source name ("chat", "everyday", "regen_text", "text", "held_out_text": the held-out one is not trained on)."""
    roots = []
    for item in data:
        if item == "debian-docs":
            roots += main_first(dist, lambda: D.fetch_debian_docs(work / "corpora"))
        elif item == "stdlib":
            roots.append(D.stdlib_root())
        elif item not in ("chat", "everyday"):
            roots.append(Path(item))
    seqs = {}
    budget = max_tokens
    seeds = read_regenerated(regenerated, loaded) if regenerated else {}
    if "chat" in data:
        prompts = D.chat_prompts(D.stdlib_module_names(), held_out=False,
                                 templates_per_topic=chat_templates)[:max_chat_prompts]
        seqs["chat"] = chat_sequences(loaded, prompts, max_new_tokens=chat_max_new, batch=chat_batch, dtype=dtype,
                                      cache=work / "chat.jsonl", seeded=seeds.get("chat"), dist=dist)
        budget = max(0, max_tokens - seqs["chat"].size)
    if "everyday" in data:
        seqs["everyday"] = chat_sequences(loaded, D.everyday_prompts(held_out=False), max_new_tokens=chat_max_new,
                                          batch=chat_batch, dtype=dtype, cache=work / "everyday.jsonl",
                                          seeded=seeds.get("everyday"), dist=dist)
        budget = max(0, budget - seqs["everyday"].size)
    if roots and "chat" in data:  # the target's own continuations of document openings
        docs = list(D.iter_documents(roots, held_out=False, min_chars=800))
        openings = [D.prefix(d.text, 300) for d in docs[::max(1, len(docs) // max_regen_text)]][:max_regen_text]
        seqs["regen_text"] = chat_sequences(loaded, openings, max_new_tokens=chat_max_new, batch=chat_batch,
                                            dtype=dtype, cache=work / "regen_text.jsonl", chat=False,
                                            seeded=seeds.get("regen_text"), dist=dist)
        budget = max(0, budget - seqs["regen_text"].size)
    if roots:
        seqs["text"] = text_sequences(loaded, roots, held_out=False, max_tokens=budget)
        seqs["held_out_text"] = text_sequences(loaded, roots, held_out=True, max_tokens=20 * SEQ_LEN * 4)
    if regenerated and dist.main:  # what this run generated joins the committed data
        write_regenerated(regenerated, work, loaded, {"chat": True, "everyday": True, "regen_text": False})
    if not seqs:
        raise ConfigError("no training data", "pass --data debian-docs stdlib chat everyday or your own folders")
    return seqs


def run(loaded: LoadedModel, out: Path, *, data: list[str], max_tokens: int = 400_000, chat_batch: int = 16,
        chat_max_new: int = 128, max_chat_prompts: int | None = None, chat_templates: int = 2,
        max_regen_text: int = 200, hidden_size: int = 256, num_layers: int = 2, num_heads: int | None = None,
        intermediate_size: int = 1024,
        num_centroids: int = 1024, top_k_clusters: int = 32, head_from: str = "target", table_from: str = "own",
        train_cfg: TrainConfig = TrainConfig(), max_steps: int | None = None, work: Path | None = None,
        init: Path | None = None, shard_bits: int = 16, save_dtype: torch.dtype | None = None,
        minutes: float | None = None, regenerated: Path | None = None, dist: Dist | None = None,
        stop_after: str | None = None) -> dict:
    """Train a drafter for `loaded` into `out` (see the module docstring); `dist`: this process among the ranks
    torchrun started and its device (default: one CPU process). Returns the report (rank 0's is complete).
    `stop_after="regenerate"`: return once the corpora are cut and the regenerated answers written (a chunk of its
    own; no teacher pass, no training, nothing written to `out`)."""
    dist = dist or Dist()
    check_batch(train_cfg.batch_seqs, dist.world_size)  # before the teacher pass, not after it
    started = time.perf_counter()
    work = work or out.parent / f"{out.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    main_first(dist, lambda: check_work_target(work, loaded))
    dtype = agree(dist, autocast_dtype(dist.device) if dist.main else None)  # timed on the CPU: rank 0's choice
    train_cfg = with_autocast(train_cfg, dtype)
    loaded.model.to(dist.device)  # the teacher pass runs on the device
    cfg = loaded.config
    if init is not None:  # warm start: the initial drafter's shape and vocabulary clustering win
        probe = load_drafter(init)
        for p in probe.parameters():
            p.requires_grad_(True)
        hidden_size, num_layers = probe.cfg.layers.hidden_size, probe.cfg.layers.num_layers
        intermediate_size, num_centroids = probe.cfg.layers.intermediate_sizes[0], probe.cfg.num_centroids
        top_k_clusters, head_from = probe.cfg.top_k_clusters, probe.cfg.head_from
        table_from = probe.cfg.table_from
    else:
        probe = new_drafter(cfg, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                            intermediate_size=intermediate_size,
                            num_centroids=num_centroids, top_k_clusters=top_k_clusters, head_from=head_from,
                            residual=head_from == "target", table_from=table_from)
    probe.to(dist.device)  # beside the target it binds to
    sources = pair(loaded.model, probe)  # a table_from="target" drafter projects the target's embedding from here on
    source_layers = sorted(set(sources.values()))

    # 1. corpora -> sequences (train and held-out)
    seqs = sequences(loaded, work, data=data, max_tokens=max_tokens, chat_batch=chat_batch,
                     chat_max_new=chat_max_new, max_chat_prompts=max_chat_prompts, chat_templates=chat_templates,
                     max_regen_text=max_regen_text, regenerated=regenerated, dtype=dtype, dist=dist)
    if stop_after == "regenerate":
        return {"stopped_after": "regenerate", "data": {name: int(s.size) for name, s in seqs.items()},
                "total_seconds": time.perf_counter() - started}
    if stop_after is not None:
        raise ConfigError(f"unknown stage {stop_after!r} to stop after", "pass --stop-after regenerate or leave it out")

    # 2. teacher shards
    if shard_bits not in (16, 4):
        raise ConfigError(f"shard bits must be 16 or 4, got {shard_bits}")
    shard_root = work / ("shards" if shard_bits == 16 else "shards-4bit")
    shards, dealt = {}, 0
    for name, s in seqs.items():
        if len(s):
            shards[name] = make_shards(loaded, s, source_layers, shard_root / name, dtype=dtype, bits=shard_bits,
                                       dist=dist, first=dealt)
            dealt += len(shards[name])
    barrier(dist)  # every rank's shards are written
    train_shards = [p for name, ps in shards.items() if name != "held_out_text" for p in ps]

    # 3. clustering of the target's output table -> token_ordering + centroid init
    table = loaded.model.lm_head.weight.detach().float()
    embed = loaded.model.model.embed_tokens.weight.detach().float()
    drafter = probe
    if init is None:  # a warm start keeps the initial drafter's clustering
        clustering_path = work / f"clusters_{num_centroids}.npz"

        def clusters():
            if not clustering_path.exists():
                cl = balanced_kmeans(table.cpu().numpy(), num_centroids, iters=6)
                tmp = clustering_path.with_suffix(".tmp.npz")
                np.savez(tmp, token_ordering=cl.token_ordering, centroids=cl.centroids)
                tmp.replace(clustering_path)
            return np.load(clustering_path)

        z = main_first(dist, clusters)
        with torch.no_grad():
            drafter.masked_embedding.token_ordering.copy_(torch.from_numpy(z["token_ordering"]))
            if head_from == "target":
                drafter.masked_embedding.centroids.weight.copy_(torch.from_numpy(z["centroids"]) * 4.0)

    # 4. training (resumable)
    train_data = ShardData(train_shards, sources, table)
    held = ShardData(shards["held_out_text"], sources, table) if "held_out_text" in shards else None
    embed_scale = float(loaded.model.embed_scale)
    run_dir = work / f"run_{out.name}"
    run_dir.mkdir(exist_ok=True)
    report = train(drafter, train_data, embed, table, train_cfg, run_dir, embed_scale=embed_scale, held_out=held,
                   max_steps=max_steps, minutes=minutes, dist=dist)
    report.update({"data": {name: int(s.size) for name, s in seqs.items()}, "teacher_dtype": str(dtype),
                   "shard_bits": shard_bits, "shard_bytes": sum(p.stat().st_size for ps in shards.values() for p in ps),
                   "drafter": {"hidden_size": hidden_size, "num_layers": num_layers,
                               "num_heads": drafter.cfg.raw["text_config"]["num_attention_heads"],
                               "intermediate_size": intermediate_size, "num_centroids": num_centroids,
                               "top_k_clusters": top_k_clusters, "head_from": head_from, "table_from": table_from,
                               "parameters": sum(p.numel() for p in drafter.parameters())},
                   "total_seconds": time.perf_counter() - started})
    barrier(dist)  # every rank got through training: only then may a drafter appear
    if dist.main:
        publish(out, drafter.cpu(), report, save_dtype)
    barrier(dist)
    return report


def publish(out: Path, drafter, report: dict, dtype: torch.dtype | None) -> None:
    """Write the drafter (`dtype` bfloat16: half the bytes, what a committed drafter uses) and its report to `out`,
    atomically (edge_spec.train.folders.publish_folder)."""
    publish_folder(out, lambda folder: save_drafter(drafter, folder, dtype=dtype), report)
