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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..drafter import Drafter
from ..kv import NEG_INF


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


def anchor_masks(t: int, n_anchors: int, window: int | None) -> torch.Tensor:
    """[1, 1, n_anchors, t] additive: anchor L = 1 + i sees keys s < L (and L - s <= window + 1 if sliding)."""
    anchors = torch.arange(1, n_anchors + 1)[:, None]
    keys = torch.arange(t)[None, :]
    ok = keys < anchors
    if window is not None:
        ok &= (anchors - keys) <= window + 1
    return torch.where(ok, 0.0, float(NEG_INF))[None, None]


def mtp_loss(drafter: Drafter, tokens: torch.Tensor, hidden: torch.Tensor, kv: dict, embed: torch.Tensor,
             table: torch.Tensor, cluster_of: torch.Tensor | None, cfg: TrainConfig, embed_scale: float = 1.0,
             with_metrics: bool = True):
    """tokens: [B, T]; hidden: [B, T, Ht] (teacher, after final norm); kv: kind -> (k, v) [B, H_kv, T, D];
    embed/table: the target's input/output tables [V, Ht] (table may be bf16). Returns (loss, per-step metrics).

    The target's next-token law is truncated to its top `TOP_TARGET` tokens (renormalised): soft cross-entropy
    against the drafter's full-vocabulary log-softmax. One full-vocabulary pass per step instead of five."""
    b, t = tokens.shape
    n = t - cfg.steps_ahead  # anchors L = 1 .. n
    pos = torch.arange(1, n + 1)[None].expand(b, n)
    masks = {kind: anchor_masks(t, n, drafter.cfg.layers.sliding_window if kind == "sliding" else None)
             for kind in set(drafter.cfg.layers.layer_kinds)}
    prev = hidden[:, 0:n]  # H[L-1]
    total = 0.0
    metrics = []
    table16 = table.to(torch.bfloat16)
    for j in range(1, cfg.steps_ahead + 1):
        tok = tokens[:, j:n + j]  # x[L + j - 1]
        with torch.no_grad():
            target_logits = hidden[:, j:n + j].to(torch.bfloat16) @ table16.T  # H[L + j - 1] E^T, [B, N, V]
            top_vals, top_ids = target_logits.topk(TOP_TARGET, dim=-1)  # [B, N, K]
            p_top = torch.softmax(top_vals.float(), dim=-1)
            del target_logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, g = drafter.states(embed[tok] * embed_scale, prev, pos, masks, kv)  # [B, N, Ht]
        logits = g.to(torch.bfloat16) @ table16.T  # [B, N, V]
        lse = torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # [B, N, 1]
        logq_top = logits.gather(-1, top_ids).float() - lse
        ce = -(p_top * logq_top).sum(-1).mean()
        loss_j = ce
        m = {"ce": float(ce.detach())}
        if cluster_of is not None and drafter.masked_embedding is not None:
            c = drafter.cfg.num_centroids
            with torch.autocast("cpu", dtype=torch.bfloat16):
                cl = drafter.masked_embedding.centroids(g)
            p_cluster = torch.zeros(b, n, c).scatter_add_(2, cluster_of[top_ids], p_top)
            loss_c = -(p_cluster * F.log_softmax(cl.float(), dim=-1)).sum(-1).mean()
            loss_j = loss_j + cfg.cluster_weight * loss_c
            if with_metrics:
                with torch.no_grad():
                    topk = cl.topk(drafter.cfg.top_k_clusters, dim=-1).indices
                    best = cluster_of[top_ids[..., 0]]
                    m["cluster_recall"] = float((topk == best[..., None]).any(-1).float().mean())
        if with_metrics:
            with torch.no_grad():  # does the drafter's best token equal the target's best?
                m["top1"] = float((logits.float().argmax(-1) == top_ids[..., 0]).float().mean())  # no bf16 ties
        total = total + cfg.step_decay ** (j - 1) * loss_j
        metrics.append(m)
        prev = g.float()
    return total, metrics


TOP_TARGET = 64


class ShardData:
    """Teacher shards (npz) -> shuffled training batches. Shards hold tokens, hidden and source-layer K/V."""

    def __init__(self, shard_paths: list[Path], sources: dict[str, int]):
        self.paths = shard_paths
        self.sources = sources
        self.sizes = [int(np.load(p)["tokens"].shape[0]) for p in shard_paths]  # npz members load lazily

    def __len__(self) -> int:
        return sum(self.sizes)

    def batches(self, batch: int, rng: np.random.Generator):
        for i in rng.permutation(len(self.paths)):
            with np.load(self.paths[i]) as z:
                data = {k: z[k] for k in z.files}
            order = rng.permutation(data["tokens"].shape[0])
            for start in range(0, len(order) - batch + 1, batch):
                idx = order[start:start + batch]
                kv = {kind: (torch.from_numpy(data[f"k_{l}"][idx].astype(np.float32)),
                             torch.from_numpy(data[f"v_{l}"][idx].astype(np.float32)))
                      for kind, l in self.sources.items()}
                yield (torch.from_numpy(data["tokens"][idx].astype(np.int64)),
                       torch.from_numpy(data["hidden"][idx].astype(np.float32)), kv)


def train(drafter: Drafter, data: ShardData, embed: torch.Tensor, table: torch.Tensor, cfg: TrainConfig,
          work: Path, *, embed_scale: float = 1.0, held_out: ShardData | None = None, progress: bool = True,
          max_steps: int | None = None) -> dict:
    """Train in place; resumable from work/checkpoint.pt. Returns a report dict."""
    from tqdm.auto import tqdm

    from .optim import make_optimizer

    torch.manual_seed(cfg.seed)
    opt = make_optimizer(drafter, cfg.optimizer, cfg.lr)
    steps_per_epoch = len(data) // cfg.batch_seqs
    total_steps = max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    ckpt_path = work / "checkpoint.pt"
    step, history = 0, []
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        drafter.load_state_dict(ckpt["drafter"])
        opt.load_state_dict(ckpt["optimizer"])
        step, history = ckpt["step"], ckpt["history"]
    cluster_of = None
    if drafter.masked_embedding is not None:
        order = drafter.masked_embedding.token_ordering
        per = drafter.cfg.vocab_size // drafter.cfg.num_centroids
        cluster_of = torch.empty_like(order)
        cluster_of[order] = torch.arange(drafter.cfg.num_centroids).repeat_interleave(per)
    base_lrs = [g["lr"] for g in opt.param_groups]
    rng = np.random.default_rng(cfg.seed + step)
    bar = tqdm(total=total_steps, initial=step, desc="train drafter", disable=not progress, unit="step")
    drafter.train()
    started = time.perf_counter()
    while step < total_steps:
        for tokens, hidden, kv in data.batches(cfg.batch_seqs, rng):
            if step >= total_steps:
                break
            scale = min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            for g, base in zip(opt.param_groups, base_lrs):
                g["lr"] = base * max(scale, 0.05)
            loss, metrics = mtp_loss(drafter, tokens, hidden, kv, embed, table, cluster_of, cfg, embed_scale,
                                     with_metrics=step % 10 == 0)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            step += 1
            history.append({"step": step, "loss": float(loss.detach()), "steps": metrics})
            bar.update(1)
            if "top1" in metrics[0]:
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}", top1=" ".join(f"{m['top1']:.2f}" for m in metrics))
            if step % cfg.checkpoint_every == 0 or step == total_steps:
                tmp = ckpt_path.with_suffix(".tmp")
                torch.save({"drafter": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step,
                            "history": history, "config": asdict(cfg)}, tmp)
                tmp.replace(ckpt_path)
    bar.close()
    drafter.eval()
    report = {"config": asdict(cfg), "steps": step, "train_seconds": time.perf_counter() - started,
              "final_train": next((h for h in reversed(history) if "top1" in h["steps"][0]), None)}
    if held_out is not None:
        report["held_out"] = evaluate_loss(drafter, held_out, embed, table, cluster_of, cfg, embed_scale)
    return report


@torch.no_grad()
def evaluate_loss(drafter, data: ShardData, embed, table, cluster_of, cfg: TrainConfig, embed_scale: float = 1.0,
                  max_batches: int = 20) -> list[dict]:
    """Mean per-step soft CE / top-1 agreement / cluster recall on held-out shards (teacher-forced tokens)."""
    sums, count = None, 0
    for i, (tokens, hidden, kv) in enumerate(data.batches(cfg.batch_seqs, np.random.default_rng(0))):
        if i >= max_batches:
            break
        _, metrics = mtp_loss(drafter, tokens, hidden, kv, embed, table, cluster_of, cfg, embed_scale)
        sums = metrics if sums is None else [{k: a[k] + m[k] for k in a} for a, m in zip(sums, metrics)]
        count += 1
    return [{k: v / max(count, 1) for k, v in s.items()} for s in (sums or [])]
