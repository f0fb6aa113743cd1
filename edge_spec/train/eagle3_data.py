"""EAGLE-3 teacher shards and the draft vocabulary (`train-drafter --arch eagle3`; the MTP shards are teacher.py's).

**Shards.** One npz per `shard_seqs` token windows of a source (pipeline.sequences), written atomically and reused
when it holds exactly these token rows for these aux layers and this top-k (a resumed run recomputes nothing):

    tokens    [N, T] int32    the window (x[0..T-1])
    aux       [N, T, n * H]   fp16 (fp32 where a value exceeds fp16's range: `storable`), the target's residual stream entering each aux layer (ModelOutput.aux: id i <
                              L enters layer i, id L leaves the last layer before the final norm), in the drafter's
                              eagle_aux_hidden_state_layer_ids order: what `Eagle3Drafter.fuse` reads at run time
                              (runtimes/torch_eagle3.AuxTarget records the same states)
    top_ids   [N, T, K] int32 the target's K most likely next tokens after position t (target-vocabulary ids)
    top_p     [N, T, K] fp16  their probabilities under the target's full softmax (not renormalised)
    aux_layers [n] int64      which layers `aux` holds

Bytes per token: 2 n H + 6 K + 4 (SmolLM2-135M, H 576, n 3, K 64: 3,844 B; 400k tokens ~ 1.5 GB).

**Why the top-k law and not the full one, nor the argmax.** Speculators' loss is a KL divergence from the
target's logits restricted to the draft vocabulary (verifier_lm_head holds only the draft rows) to the drafter's. The
full law is V fp16 numbers a token (98 kB for SmolLM2's 49,152 tokens), 25x the aux states: not storable on a CPU
box. An argmax label (4 bytes) throws away what the soft loss learns from (how sure the target is, its second
choice: what a sampled draft is accepted on) and makes the loss a hard cross-entropy. The top-64 law keeps nearly
all of the mass of a peaked LM distribution (the remainder is what the MTP trainer also drops, trainer.TOP_TARGET)
for 384 bytes a token; the trainer restricts it to the draft vocabulary and renormalises, which is exactly
Speculators' target when the top-64 hold the mass. It is stored against the *target* vocabulary, so another
`--draft-vocab` reuses the shards.

**Draft vocabulary.** `draft_vocabulary`: the N most frequent tokens of the training windows (ties: the lower id;
fewer than N distinct tokens: the lowest unused ids fill up), as Speculators' build_vocab_mappings_from_distribution,
stored as d2t offsets [N] int64 (target id = d + d2t[d]) and the t2d mask [V] bool.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from edge_spec.contract.kv import NEG_INF
from edge_spec.errors import ConfigError
from edge_spec.model.transformer import Transformer
from edge_spec.train.dist import Dist, owns
from edge_spec.train.teacher import _causal_mask, cast_model

TOP_K = 64  # the teacher's law kept per position (as the MTP shards' sidecars, trainer.TOP_TARGET)
SHARD_SEQS = 128


def bytes_per_token(hidden_size: int, num_aux: int, top_k: int = TOP_K) -> int:
    """What one token costs in a shard: aux fp16, top ids int32 + probs fp16, the token int32."""
    return 2 * num_aux * hidden_size + 6 * top_k + 4


@torch.no_grad()
def extract_eagle3(model: Transformer, sequences: np.ndarray, aux_layers: tuple[int, ...], *, dtype: torch.dtype,
                   batch: int = 4, top_k: int = TOP_K) -> dict[str, np.ndarray]:
    """sequences [N, T] -> aux fp16 [N, T, n H], top_ids int32 / top_p fp16 [N, T, K] (see the module docstring).
    The target runs in `dtype` (teacher.cast_model) on its device; the law is a softmax in fp32 of its logits
    (final-logit soft-capping included, as it decodes)."""
    cfg = model.cfg
    device = next(model.parameters()).device
    model = cast_model(model, dtype)
    cached = list(cfg.cached_layers())
    n, t = sequences.shape
    mask = _causal_mask(torch.ones(1, t, dtype=torch.bool, device=device), t)
    masks = {kind: mask for kind in cfg.kinds()}
    if "sliding" in masks:
        q = torch.arange(t, device=device)[:, None]
        k = torch.arange(t, device=device)[None, :]
        masks["sliding"] = torch.where((k <= q) & (q - k < cfg.sliding_window), 0.0, float(NEG_INF))[None, None]
    aux, ids, probs = [], [], []
    for start in range(0, n, batch):
        tokens = torch.from_numpy(sequences[start:start + batch].astype(np.int64)).to(device)  # [b, T]
        b = tokens.shape[0]
        pos = torch.arange(t, device=device)[None].expand(b, t)
        empty = [torch.zeros(b, cfg.kv_heads[l], 0, cfg.head_dims[l], dtype=dtype, device=device) for l in cached]
        out = model(tokens, pos, masks, empty, list(empty), aux_layers=tuple(aux_layers))
        aux.append(out.aux.float().cpu().numpy())  # [b, T, n H]
        for row in out.logits:  # [T, V] one sequence at a time: a [b, T, V] fp32 copy can be gigabytes
            p, i = torch.softmax(row.float(), dim=-1).topk(top_k, dim=-1)
            ids.append(i.to(torch.int32).cpu().numpy())
            probs.append(p.to(torch.float16).cpu().numpy())
    return {"aux": storable(np.concatenate(aux)), "top_ids": np.stack(ids), "top_p": np.stack(probs)}


FP16_MAX = float(np.finfo(np.float16).max)


def storable(aux: np.ndarray) -> np.ndarray:
    """fp32 aux states as a shard stores them: fp16 (half the bytes) when every value fits fp16's range, else fp32 as
    is. gemma-3-270m's residual stream reaches ~1e5 (edge_spec/model/headroom.py), which fp16 turns into inf, and one
    inf aux state makes the drafter's loss NaN."""
    return aux.astype(np.float16) if np.abs(aux).max(initial=0.0) <= FP16_MAX else aux.astype(np.float32)


def _shard_matches(path: Path, chunk: np.ndarray, aux_layers: tuple[int, ...], top_k: int) -> bool:
    try:
        with np.load(path) as z:  # members load lazily: the token rows and two small arrays
            return (np.array_equal(z["tokens"], chunk) and tuple(z["aux_layers"].tolist()) == tuple(aux_layers)
                    and z["top_ids"].shape[-1] == top_k and bool(np.isfinite(z["aux"]).all()))  # no fp16 overflow
    except (OSError, ValueError, KeyError):  # a damaged or foreign file is recomputed
        return False


def make_eagle3_shards(model: Transformer, sequences: np.ndarray, aux_layers: tuple[int, ...], folder: Path, *,
                       dtype: torch.dtype, shard_seqs: int = SHARD_SEQS, top_k: int = TOP_K, dist: Dist = Dist(),
                       first: int = 0) -> list[Path]:
    """The EAGLE-3 teacher shards of `sequences` in `folder` (shard_NNNN.npz); returns every shard's path. Several
    ranks: shard i is rank (first + i) mod W's to check and write, as pipeline.make_shards deals them; the caller
    waits at a barrier before reading the others'."""
    folder.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(sequences), shard_seqs)
    paths = [folder / f"shard_{i:04d}.npz" for i in range(len(starts))]
    mine = [i for i in range(len(starts)) if owns(first + i, dist)]
    bar = tqdm(total=sum(len(sequences[starts[i]:starts[i] + shard_seqs]) for i in mine),
               desc=f"eagle3 teacher pass ({folder.name})", unit="seq", disable=not dist.main)
    for i in mine:
        path, chunk = paths[i], sequences[starts[i]:starts[i] + shard_seqs]
        if path.exists() and not _shard_matches(path, chunk, aux_layers, top_k):
            path.unlink()
        if not path.exists():
            arrays = extract_eagle3(model, chunk, aux_layers, dtype=dtype, top_k=top_k)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, tokens=chunk, aux_layers=np.asarray(aux_layers, dtype=np.int64), **arrays)
            tmp.replace(path)
        bar.update(len(chunk))
    bar.close()
    return paths


class Eagle3Batch:
    """One rank's rows of a global batch (CPU): tokens [b, T] int64, aux [b, T, n H] fp32, top_ids [b, T, K]
    int64, top_p [b, T, K] fp32."""

    def __init__(self, tokens, aux, top_ids, top_p):
        self.tokens, self.aux, self.top_ids, self.top_p = tokens, aux, top_ids, top_p

    def to(self, device: torch.device) -> tuple:
        return tuple(x.to(device) for x in (self.tokens, self.aux, self.top_ids, self.top_p))


class Eagle3Shards:
    """EAGLE-3 shards -> shuffled batches; a global batch comes from one shard (as trainer.ShardData)."""

    def __init__(self, paths: list[Path]):
        self.paths = [Path(p) for p in paths]
        self.sizes = []
        for p in self.paths:
            with np.load(p) as z:
                self.sizes.append(int(z["tokens"].shape[0]))

    def __len__(self) -> int:
        return sum(self.sizes)

    def batches(self, batch: int, rng: np.random.Generator, part: slice = slice(None)):
        """Yields an Eagle3Batch per `batch` sequences: the rows `part` of it (dist.rows). Which sequences form each
        global batch depends on `rng` alone, so ranks seeded alike draw the same batches."""
        for i in rng.permutation(len(self.paths)):
            with np.load(self.paths[i]) as z:
                data = {k: z[k] for k in ("tokens", "aux", "top_ids", "top_p")}
            order = rng.permutation(data["tokens"].shape[0])
            for start in range(0, len(order) - batch + 1, batch):
                idx = order[start:start + batch][part]
                yield Eagle3Batch(torch.from_numpy(data["tokens"][idx].astype(np.int64)),
                                  torch.from_numpy(data["aux"][idx].astype(np.float32)),
                                  torch.from_numpy(data["top_ids"][idx].astype(np.int64)),
                                  torch.from_numpy(data["top_p"][idx].astype(np.float32)))


def token_counts(windows: list[np.ndarray], vocab_size: int) -> np.ndarray:
    """[V] int64: how often each target token occurs in the training windows."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for w in windows:
        if w.size:
            counts += np.bincount(w.reshape(-1).astype(np.int64), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocabulary(counts: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The `size` most frequent tokens (ties and never-seen tokens: lower id first) as Speculators stores them:
    (d2t [size] int64 offsets, t2d [V] bool); None when `size` is the whole vocabulary (no map)."""
    vocab = len(counts)
    if not 0 < size <= vocab:
        raise ConfigError(f"--draft-vocab {size} is not in [1, {vocab}] (the target's vocabulary)",
                          f"pass a draft vocabulary of at most {vocab} tokens")
    if size == vocab:
        return None
    order = np.lexsort((np.arange(vocab), -counts))  # by count descending, then id ascending
    chosen = np.sort(order[:size])
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.from_numpy(chosen)] = True
    return torch.from_numpy(chosen).long() - torch.arange(size), t2d


def target_to_draft_index(d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[V] int64: each target id's draft id, -1 outside the draft vocabulary (the identity without a map)."""
    if d2t is None:
        return torch.arange(vocab_size)
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[torch.arange(len(d2t)) + d2t.long().cpu()] = torch.arange(len(d2t))
    return index
