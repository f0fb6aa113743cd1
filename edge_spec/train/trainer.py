"""Multi-step MTP distillation of a drafter from cached teacher shards.

For every anchor position L of a sequence (cache = positions < L, bonus token x[L]):
    step 1: input (E[x[L]], H[L-1])       -> match softmax(H[L] E^T)      (the target's next-token law)
    step j: input (E[x[L+j-1]], g_{j-1})  -> match softmax(H[L+j-1] E^T)
where g is the drafter's own projected hidden (fed back, as at inference), E the target's output table.
All anchors of a batch run at once as query rows at positions L with a strict causal mask over the
source layer's cached keys. Loss = sum_j decay^(j-1) (CE_tokens + w * CE_clusters), soft cross-entropies
against the target's law truncated to its top 64 tokens (see mtp_loss).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from edge_spec.errors import ConfigError
from edge_spec.model.drafter import Drafter
from edge_spec.contract.kv import NEG_INF
from edge_spec.train.dist import Dist, check_batch, rows, sum_over_ranks, wrap
from edge_spec.train.shard_quant import decode_arrays


@dataclass
class TrainConfig:
    steps_ahead: int = 3  # MTP depth trained
    step_decay: float = 0.7  # weight of step j = decay^(j-1)
    cluster_weight: float = 0.5
    optimizer: str = "adamw"  # adamw | muon
    lr: float = 2e-3
    batch_seqs: int = 4
    epochs: float = 1.0
    warmup: int = 50
    seed: int = 0
    checkpoint_every: int = 200
    vocab_sample: int = 4096  # uniform negatives of the sampled softmax (0 = full vocabulary)
    bf16: bool = True  # the drafter's matmuls in bf16 (autocast); False: fp32 throughout (slower; see mtp_loss)


def anchor_masks(t: int, n_anchors: int, window: int | None, first: int = 1,
                 device: torch.device | None = None) -> torch.Tensor:
    """[1, 1, n_anchors, t] additive: anchor L = first + i sees keys s < L (and L - s <= window + 1 if sliding:
    the drafter's view at run time, `kv.drafter_window`)."""
    anchors = torch.arange(first, first + n_anchors, device=device)[:, None]
    keys = torch.arange(t, device=device)[None, :]
    ok = keys < anchors
    if window is not None:
        ok &= (anchors - keys) <= window + 1
    return torch.where(ok, 0.0, float(NEG_INF))[None, None]


def teacher_top(hidden: torch.Tensor, table16: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [..., Ht] -> the target's next-token law truncated to its top k: (ids [..., k], probs [..., k])."""
    with torch.no_grad():
        logits = hidden.to(torch.bfloat16) @ table16.T  # [..., V]
        vals, ids = logits.topk(k, dim=-1)
        return ids, torch.softmax(vals.float(), dim=-1)


def candidate_set(top_ids: list[torch.Tensor], vocab: int, extra: int, generator: torch.Generator | None = None):
    """Sorted token ids scored by a sampled-softmax step: every teacher top-k id of the batch plus `extra`
    uniform negatives (so every token is pushed down now and then), drawn on the CPU. Returns [U] int64 on the
    ids' device."""
    negatives = torch.randint(vocab, (extra,), generator=generator).to(top_ids[0].device)
    return torch.unique(torch.cat([t.reshape(-1).long() for t in top_ids] + [negatives]))


def mtp_loss(drafter: Drafter, tokens: torch.Tensor, hidden: torch.Tensor, kv: dict, embed: torch.Tensor,
             table: torch.Tensor, cluster_of: torch.Tensor | None, cfg: TrainConfig, embed_scale: float = 1.0,
             with_metrics: bool = True, top: tuple[torch.Tensor, torch.Tensor] | None = None,
             candidates: torch.Tensor | None = None):
    """tokens: [B, T]; hidden: [B, T, Ht] (teacher, after final norm); kv: kind -> (k, v) [B, H_kv, T, D];
    embed/table: the target's input/output tables [V, Ht] (table may be bf16); top: the teacher's cached
    (ids, probs) [B, T, TOP_TARGET] (computed here when None); candidates: the sampled softmax's sorted token ids
    [U] (made here from this batch when None; a rank of a distributed run passes those of the whole global batch).
    Every tensor on one device (bf16 autocast on its type). Returns (loss, per-step metrics): means over rows.

    cfg.bf16 (default): the drafter's matmuls and the head's run in bf16. A bf16 matmul rounds its output, so a
    weight gradient (a sum over rows) is rounded per rank before DDP averages it: ranks then agree with one process
    to bf16 precision only (~1e-3 relative per step). With cfg.bf16 False every matmul here is fp32 and they agree to
    fp32 rounding (tests/test_train_distributed.py).

    Soft cross-entropy against the target's law truncated to its top `TOP_TARGET` tokens (renormalised).
    With cfg.vocab_sample > 0 the drafter's log-softmax runs over a sampled candidate set (all teacher top
    ids of the batch + vocab_sample uniform negatives) instead of the full vocabulary: the head matmul is
    the bulk of a step, and the clustered head only ever scores a few thousand tokens at run time anyway.

    Which vector scores which table follows the drafter's head: head_from "target" scores its projected hidden
    [Ht] against `table`; head_from "drafter" scores its final-norm state h [Ha] against its own token table
    (`Drafter.table_rows`: the stored table, or - table_from "target" - the bound target embedding through the
    learned projection P, so gradients reach P while the target's embedding stays frozen). That table's rows are
    made once per call (one optimiser step), only the candidate rows under a sampled softmax, and shared by
    every MTP step."""
    b, t = tokens.shape
    n = t - cfg.steps_ahead  # anchors L = 1 .. n
    device, amp = tokens.device, tokens.device.type  # autocast per device type: "cpu" | "cuda"
    mm = torch.bfloat16 if cfg.bf16 else torch.float32  # the head's matmul
    pos = torch.arange(1, n + 1, device=device)[None].expand(b, n)
    masks = {kind: anchor_masks(t, n, drafter.cfg.layers.sliding_window if kind == "sliding" else None, device=device)
             for kind in set(drafter.cfg.layers.layer_kinds)}
    table16 = table.to(torch.bfloat16)
    if top is None:
        top = teacher_top(hidden[:, 1:n + cfg.steps_ahead], table16, TOP_TARGET)  # rows 1 .. n+S-1
        top = (F.pad(top[0], (0, 0, 1, 0)), F.pad(top[1], (0, 0, 1, 0)))  # re-index so row r = position r
    steps = range(1, cfg.steps_ahead + 1)
    top_ids = [top[0][:, j:n + j].long() for j in steps]  # the law of x[L + j]: [B, N, K]
    top_p = [top[1][:, j:n + j].float() for j in steps]
    cand = None
    if cfg.vocab_sample:
        cand = candidates if candidates is not None else candidate_set(top_ids, table.shape[0], cfg.vocab_sample)
    own_head = drafter.cfg.head_from == "drafter"
    if own_head:  # the drafter's own table (or P(target embedding)), differentiable, once per step
        with torch.autocast(amp, dtype=torch.bfloat16, enabled=cfg.bf16):
            head = drafter.table_rows(cand).to(mm)  # [U or V, Ha]
    else:
        head_table = table16 if cfg.bf16 else table.float()
        head = head_table[cand] if cand is not None else head_table  # [U or V, Ht]
    prev = hidden[:, 0:n]  # H[L-1]
    total = 0.0
    metrics = []
    for j in steps:
        tok = tokens[:, j:n + j]  # x[L + j - 1]
        ids, p_top = top_ids[j - 1], top_p[j - 1]
        with torch.autocast(amp, dtype=torch.bfloat16, enabled=cfg.bf16):
            h, g = drafter.states(embed[tok] * embed_scale, prev, pos, masks, kv)  # [B, N, Ha], [B, N, Ht]
        flat = h if own_head else g  # what the head scores, as at run time (Drafter.head)
        logits = flat.to(mm) @ head.T  # [B, N, U or V]
        lse = torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # [B, N, 1]
        cols = torch.searchsorted(cand, ids) if cand is not None else ids
        logq_top = logits.gather(-1, cols).float() - lse
        ce = -(p_top * logq_top).sum(-1).mean()
        loss_j = ce
        m = {"ce": float(ce.detach())}
        if cluster_of is not None and drafter.masked_embedding is not None:
            c = drafter.cfg.num_centroids
            with torch.autocast(amp, dtype=torch.bfloat16, enabled=cfg.bf16):
                cl = drafter.masked_embedding.centroids(flat)
            p_cluster = torch.zeros(b, n, c, device=device).scatter_add_(2, cluster_of[ids], p_top)
            loss_c = -(p_cluster * F.log_softmax(cl.float(), dim=-1)).sum(-1).mean()
            loss_j = loss_j + cfg.cluster_weight * loss_c
            if with_metrics:
                with torch.no_grad():
                    topk = cl.topk(drafter.cfg.top_k_clusters, dim=-1).indices
                    best = cluster_of[ids[..., 0]]
                    m["cluster_recall"] = float((topk == best[..., None]).any(-1).float().mean())
        if with_metrics:
            with torch.no_grad():  # does the drafter's best token (within the scored set) equal the target's best?
                m["top1"] = float((logits.float().argmax(-1) == cols[..., 0]).float().mean())
        total = total + cfg.step_decay ** (j - 1) * loss_j
        metrics.append(m)
        prev = g.float()
    return total, metrics


TOP_TARGET = 64


def top_sidecar(shard: Path) -> Path:
    return shard.with_name(f"{shard.stem}.top{TOP_TARGET}.npz")


def write_teacher_top(path: Path, hidden: np.ndarray, table16: torch.Tensor) -> None:
    """The teacher's top-k law for every position of a shard: ids int32 / probs fp16 [N, T, K], atomically
    (computed on table16's device)."""
    ids, probs = [], []
    for start in range(0, hidden.shape[0], 16):  # [16, T, Ht] -> [16, T, V] bf16 at a time
        h = torch.from_numpy(hidden[start:start + 16].astype(np.float32)).to(table16.device)
        i, p = teacher_top(h, table16, TOP_TARGET)
        ids.append(i.to(torch.int32).cpu().numpy())
        probs.append(p.to(torch.float16).cpu().numpy())
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ids=np.concatenate(ids), probs=np.concatenate(probs))
    tmp.replace(path)


def ensure_teacher_top(shard: Path, table16: torch.Tensor) -> None:
    """Write a shard's top-k sidecar unless it exists, from the hidden states the shard stores (fp16, or decoded
    4-bit codes: 4-bit shards normally get theirs at extraction, from the exact hidden states)."""
    side = top_sidecar(shard)
    if not side.exists():
        with np.load(shard) as z:
            hidden = decode_arrays({k: z[k] for k in z.files if k.split(".")[0] == "hidden"})["hidden"]
        write_teacher_top(side, hidden, table16)


class Batch(NamedTuple):
    """One rank's rows of a global batch, on the CPU: tokens [b, T] int64, hidden [b, T, Ht] fp32, kv: kind -> (k, v)
    [b, H_kv, T, D] fp32, top: the teacher's (ids int32, probs fp16) [b, T, K] or None; batch_top: the teacher's
    top ids of the whole global batch [B, T, K] (what its sampled-softmax candidates are made of) or None."""
    tokens: torch.Tensor
    hidden: torch.Tensor
    kv: dict
    top: tuple[torch.Tensor, torch.Tensor] | None
    batch_top: torch.Tensor | None

    def to(self, device: torch.device) -> tuple:
        """(tokens, hidden, kv, top) on `device` (the same tensors on the CPU)."""
        kv = {kind: (k.to(device), v.to(device)) for kind, (k, v) in self.kv.items()}
        top = None if self.top is None else (self.top[0].to(device), self.top[1].to(device))
        return self.tokens.to(device), self.hidden.to(device), kv, top


class ShardData:
    """Teacher shards (npz) -> shuffled training batches. Shards hold tokens, hidden and source-layer K/V.

    With `table` (the target's output table), each batch also carries the teacher's top-k law per position,
    computed once per shard and cached next to it (`shard_NNNN.top64.npz`, normally by the teacher pass): it is a
    quarter of a step's work otherwise, repeated every epoch."""

    def __init__(self, shard_paths: list[Path], sources: dict[str, int], table: torch.Tensor | None = None):
        self.paths = [Path(p) for p in shard_paths]
        self.sources = sources
        self.table16 = None if table is None else table.to(torch.bfloat16)
        self.sizes = [int(np.load(p)["tokens"].shape[0]) for p in shard_paths]  # npz members load lazily

    def __len__(self) -> int:
        return sum(self.sizes)

    def _top(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        ensure_teacher_top(path, self.table16)
        with np.load(top_sidecar(path)) as z:
            return z["ids"], z["probs"]

    def batches(self, batch: int, rng: np.random.Generator, part: slice = slice(None)):
        """Yields a Batch per `batch` sequences: the rows `part` of it (a rank's, dist.rows; all by default). Which
        sequences form each global batch depends on `rng` alone, so ranks seeded alike draw the same batches."""
        for i in rng.permutation(len(self.paths)):
            with np.load(self.paths[i]) as z:
                data = decode_arrays({k: z[k] for k in z.files})  # 4-bit shards -> float32; fp16 passes through
            top = self._top(self.paths[i]) if self.table16 is not None else None
            order = rng.permutation(data["tokens"].shape[0])
            for start in range(0, len(order) - batch + 1, batch):
                every = order[start:start + batch]  # the global batch
                idx = every[part]  # this rank's rows of it
                kv = {kind: (torch.from_numpy(data[f"k_{l}"][idx].astype(np.float32)),
                             torch.from_numpy(data[f"v_{l}"][idx].astype(np.float32)))
                      for kind, l in self.sources.items()}
                yield Batch(torch.from_numpy(data["tokens"][idx].astype(np.int64)),
                            torch.from_numpy(data["hidden"][idx].astype(np.float32)), kv,
                            None if top is None else (torch.from_numpy(top[0][idx]), torch.from_numpy(top[1][idx])),
                            None if top is None else torch.from_numpy(top[0][every]))


class DrafterLoss(torch.nn.Module):
    """`mtp_loss` as a module's forward: DDP syncs the gradients of what its forward ran (dist.wrap)."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, *args, **kwargs):
        return mtp_loss(self.drafter, *args, **kwargs)


def lr_scale(step: int, total_steps: int, warmup: int) -> float:
    """Linear warmup, cosine decay over the whole run, floored at 5 % of the base learning rate."""
    scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total_steps))
    return max(scale, 0.05)


def cluster_index(drafter: Drafter) -> torch.Tensor | None:
    """[V] the cluster of every token (clusters are runs of num_centroids-equal size in token_ordering)."""
    if drafter.masked_embedding is None:
        return None
    order = drafter.masked_embedding.token_ordering
    per = drafter.cfg.vocab_size // drafter.cfg.num_centroids
    cluster_of = torch.empty_like(order)
    cluster_of[order] = torch.arange(drafter.cfg.num_centroids, device=order.device).repeat_interleave(per)
    return cluster_of


def global_step_values(dist: Dist, loss: float, metrics: list[dict], stop: bool) -> tuple[float, list[dict], bool]:
    """A step's rank means -> global means (equal parts: the mean of the rank means), and stop when any rank is out
    of time (every rank must leave the loop at the same step). One all_reduce; the values themselves alone."""
    if not dist.active:
        return loss, metrics, stop
    total = sum_over_ranks(dist, [loss] + [v for m in metrics for v in m.values()] + [float(stop)])
    means = iter(v / dist.world_size for v in total[:-1])
    loss = next(means)
    return loss, [{k: next(means) for k in m} for m in metrics], total[-1] > 0


def train(drafter: Drafter, data: ShardData, embed: torch.Tensor, table: torch.Tensor, cfg: TrainConfig,
          work: Path, *, embed_scale: float = 1.0, held_out: ShardData | None = None, progress: bool = True,
          max_steps: int | None = None, minutes: float | None = None, dist: Dist = Dist()) -> dict:
    """Train in place on dist.device; resumable from work/checkpoint.pt (at any world size). Returns a report dict.
    `minutes`: stop this invocation (a checkpoint written) after that long; the schedule stays the whole run's, so
    the next invocation continues it.

    Several ranks (torchrun, `dist`): every rank draws the same global batch of cfg.batch_seqs sequences and trains
    on its rows of it under DDP, so the steps, learning rates and weights are those of one process (up to float
    rounding); the sampled softmax's candidates are the global batch's, its negatives one stream seeded alike on
    every rank. Rank 0 alone writes the checkpoint and evaluates the held-out shards."""
    from tqdm.auto import tqdm

    from edge_spec.train.optim import make_optimizer

    check_batch(cfg.batch_seqs, dist.world_size)
    device = dist.device
    torch.manual_seed(cfg.seed)
    drafter.to(device)
    embed, table = embed.to(device), table.to(device)
    opt = make_optimizer(drafter, cfg.optimizer, cfg.lr)
    if not sum(size // cfg.batch_seqs for size in data.sizes):  # a batch is drawn from one shard
        raise ConfigError(f"no shard holds a batch of {cfg.batch_seqs} sequences (--batch-seqs; the shards hold "
                          f"{sorted(set(data.sizes))} sequences)" if data.sizes else "no training sequences",
                          "pass more --data (or a larger --max-tokens), or a smaller --batch-seqs")
    steps_per_epoch = len(data) // cfg.batch_seqs
    total_steps = max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    ckpt_path = work / "checkpoint.pt"
    step, history, seconds_before = 0, [], 0.0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=device)
        drafter.load_state_dict(ckpt["drafter"])
        opt.load_state_dict(ckpt["optimizer"])
        step, history = ckpt["step"], ckpt["history"]
        seconds_before = ckpt.get("train_seconds", 0.0)  # training time of earlier (interrupted) invocations
    cluster_of = cluster_index(drafter)
    base_lrs = [g["lr"] for g in opt.param_groups]
    rng = np.random.default_rng(cfg.seed + step)  # the batches: the same on every rank
    negatives = torch.Generator().manual_seed(cfg.seed)  # the sampled softmax's uniform negatives, as rng
    part = rows(cfg.batch_seqs, dist)
    loss_fn = wrap(DrafterLoss(drafter), dist)
    bar = tqdm(total=total_steps, initial=step, desc="train drafter", disable=not (progress and dist.main), unit="step")
    drafter.train()
    started = time.perf_counter()
    deadline = None if minutes is None else started + 60 * minutes
    out_of_time = False
    while step < total_steps and not out_of_time:
        for batch in data.batches(cfg.batch_seqs, rng, part):
            if step >= total_steps:
                break
            for g, base in zip(opt.param_groups, base_lrs):
                g["lr"] = base * lr_scale(step, total_steps, cfg.warmup)
            cand = None
            if cfg.vocab_sample and batch.batch_top is not None:  # positions 1 .. T-1: every step's targets
                cand = candidate_set([batch.batch_top[:, 1:]], table.shape[0], cfg.vocab_sample, negatives)
            tokens, hidden, kv, top = batch.to(device)
            loss, metrics = loss_fn(tokens, hidden, kv, embed, table, cluster_of, cfg, embed_scale,
                                    with_metrics=step % 10 == 0, top=top,
                                    candidates=None if cand is None else cand.to(device))
            opt.zero_grad()
            loss.backward()  # DDP: the rank gradients averaged = the global batch's gradient
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            step += 1
            out_of_time = deadline is not None and time.perf_counter() > deadline
            value, metrics, out_of_time = global_step_values(dist, float(loss.detach()), metrics, out_of_time)
            history.append({"step": step, "loss": value, "steps": metrics})
            bar.update(1)
            if "top1" in metrics[0]:
                bar.set_postfix(loss=f"{value:.3f}", top1=" ".join(f"{m['top1']:.2f}" for m in metrics))
            if dist.main and (step % cfg.checkpoint_every == 0 or step == total_steps or out_of_time):
                tmp = ckpt_path.with_suffix(".tmp")
                torch.save({"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step,
                            "history": history, "config": asdict(cfg),
                            "train_seconds": seconds_before + time.perf_counter() - started}, tmp)
                tmp.replace(ckpt_path)
            if out_of_time:
                break
    bar.close()
    drafter.eval()
    report = {"config": asdict(cfg), "steps": step, "total_steps": total_steps, "world_size": dist.world_size,
              "device": str(device), "train_seconds": seconds_before + time.perf_counter() - started,
              "final_train": next((h for h in reversed(history) if "top1" in h["steps"][0]), None)}
    if held_out is not None and dist.main:
        report["held_out"] = evaluate_loss(drafter, held_out, embed, table, cluster_of, cfg, embed_scale)
    return report


@torch.no_grad()
def evaluate_loss(drafter, data: ShardData, embed, table, cluster_of, cfg: TrainConfig, embed_scale: float = 1.0,
                  max_batches: int = 20) -> list[dict]:
    """Mean per-step soft CE / top-1 agreement / cluster recall on held-out shards (teacher-forced tokens)."""
    sums, count = None, 0
    for i, batch in enumerate(data.batches(cfg.batch_seqs, np.random.default_rng(0))):
        if i >= max_batches:
            break
        tokens, hidden, kv, top = batch.to(embed.device)
        _, metrics = mtp_loss(drafter, tokens, hidden, kv, embed, table, cluster_of, replace(cfg, vocab_sample=0),
                              embed_scale, top=top)  # full vocabulary: exact held-out numbers
        sums = metrics if sums is None else [{k: a[k] + m[k] for k in a} for a, m in zip(sums, metrics)]
        count += 1
    return [{k: v / max(count, 1) for k, v in s.items()} for s in (sums or [])]
