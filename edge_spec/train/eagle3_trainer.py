"""EAGLE-3 drafter training (`train-drafter --arch eagle3`): the training-time-test (TTT) unroll Speculators trains
with, run through edge-spec's own eager module (edge_spec/model/eagle3.py) and its stateless KV cache, as inference
runs it (runtimes/torch_eagle3.py).

A window x[0..T-1] with the target's aux states a[t] and next-token law q[t] (the law of x[t + 1]; eagle3_data
shards). Row p (position p) pairs a[p - 1] with token x[p] and predicts x[p + 1] (speculators' shift_batch). The
anchors are rows p = 1..n, n = T - S, all at once; step j = 0..S-1 of anchor p:

    step 0    hidden = fuse(a[p - 1]), token x[p],     position p;     attends to the step-0 rows 1..p (causal)
    step j    hidden = step j-1's output hidden (h, or norm(h) with norm_output), token x[p + j], position p + j;
              attends to the step-0 rows 1..p and to anchor p's own rows of steps 1..j (one diagonal per step)
    loss      soft cross-entropy of the drafter's draft-vocabulary logits against q[p + j] restricted to the draft
              vocabulary and renormalised (== Speculators' KL to its verifier_lm_head targets up to the target's
              entropy, which has no gradient), weighted step_decay ** j, mean over anchors

which is exactly what the runtime does when it drafts S tokens after row p through its cache: the step-0 rows are
the committed rows (computed from the target's states), each later step one chained row. The keys of step j are the
concatenated new K/V rows of steps 0..j-1 (the "cache" passed to `Eagle3Drafter.forward`) and the mask says which
of them each anchor sees; so the unroll is Speculators' Eagle3DraftModel.forward (its ttt_steps loop, the extended
diagonal masks) with tokens teacher-forced as Speculators 0.9 feeds them (the window's next token, which on the
regenerated data is the target's own greedy choice: the token a drafted prefix must have to be accepted).

Trained: fc, the norms, the decoder layers and lm_head (initialised with the target's output rows of the draft
vocabulary, as Speculators copies the verifier's; Speculators 0.9 then freezes it, this trains it: a 1-layer drafter
then needs not reproduce the target's final state exactly). Frozen: embed_tokens, the target's input embedding, which
the written folder leaves out (the reader and Speculators' verifier loading take the target's).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from edge_spec.errors import ConfigError
from edge_spec.model.eagle3 import NEG, Eagle3Drafter
from edge_spec.train.dist import Dist, check_batch, rows, wrap
from edge_spec.train.eagle3_data import Eagle3Shards, target_to_draft_index
from edge_spec.train.folders import publish_folder
from edge_spec.train.trainer import global_step_values, lr_scale


@dataclass
class Eagle3TrainConfig:
    steps_ahead: int = 3  # TTT steps unrolled (Speculators' ttt_steps)
    step_decay: float = 1.0  # weight of step j = decay ** j (Speculators' ttt_step_loss_decay default)
    optimizer: str = "adamw"  # adamw | muon (edge_spec.train.optim)
    lr: float = 1e-3  # Speculators' default
    batch_seqs: int = 4
    epochs: float = 1.0
    warmup: int = 50
    seed: int = 0
    checkpoint_every: int = 200
    bf16: bool = True  # the drafter's matmuls under bf16 autocast (on the CPU too, as the MTP trainer)


def unroll_masks(n: int, steps: int, device=None) -> list[torch.Tensor]:
    """The additive masks of the TTT unroll over n anchors: step j's is [1, 1, n, (j + 1) n], the step-0 block causal
    (anchor p sees rows 1..p), each later block diagonal (anchor p sees its own row of that step)."""
    i = torch.arange(n, device=device)
    causal = torch.where(i[None, :] <= i[:, None], 0.0, NEG)
    diag = torch.where(i[None, :] == i[:, None], 0.0, NEG)
    return [torch.cat([causal] + [diag] * j, dim=-1)[None, None] for j in range(steps)]


def ttt_logits(drafter: Eagle3Drafter, tokens: torch.Tensor, aux: torch.Tensor, steps: int, bf16: bool = False):
    """The unroll (module docstring): tokens [B, T] (target ids), aux [B, T, n H] -> per step j the draft-vocabulary
    logits [B, T - steps, Vd] of anchors p = 1..T - steps (row p - 1 of each)."""
    b, t = tokens.shape
    n = t - steps
    if n < 1:
        raise ConfigError(f"windows of {t} tokens leave no anchor for {steps} TTT steps", "lower --steps-ahead")
    device, amp = tokens.device, tokens.device.type
    masks = unroll_masks(n, steps, device)
    c = drafter.cfg.layers
    ks = [[] for _ in drafter.layers]
    vs = [[] for _ in drafter.layers]
    out = []
    with torch.autocast(amp, dtype=torch.bfloat16, enabled=bf16):
        hidden = drafter.fuse(aux[:, :n])  # a[p - 1] for p = 1..n
        for j in range(steps):
            if j:
                kc = [torch.cat(k, dim=2) for k in ks]
                vc = [torch.cat(v, dim=2) for v in vs]
            else:
                kc = [torch.zeros(b, c.kv_heads[0], 0, c.head_dims[0], device=device) for _ in drafter.layers]
                vc = list(kc)
            pos = torch.arange(1 + j, n + 1 + j, device=device)[None]  # [1, n]
            step = drafter(hidden, tokens[:, 1 + j:n + 1 + j], pos, masks[j], kc, vc)
            for i in range(len(drafter.layers)):
                ks[i].append(step.new_k[i])
                vs[i].append(step.new_v[i])
            out.append(step.logits)
            hidden = step.hidden
    return out


def ttt_loss(drafter: Eagle3Drafter, tokens: torch.Tensor, aux: torch.Tensor, top_ids: torch.Tensor,
             top_p: torch.Tensor, draft_index: torch.Tensor, cfg: Eagle3TrainConfig, with_metrics: bool = True):
    """tokens [B, T]; aux [B, T, n H]; top_ids / top_p [B, T, K] (the target's law after each position, target
    ids); draft_index [V]: each target id's draft id or -1 (eagle3_data.target_to_draft_index). Rows whose target
    law has no top-K mass inside the draft vocabulary have nothing to learn there and add 0. Returns (loss,
    per-step metrics): ce (the soft cross-entropy), top1 (the drafter's best token is the target's), cond (top1 at
    this step and every earlier one: what a greedy draft of this length is accepted on), in_vocab (the target's
    top-K mass inside the draft vocabulary)."""
    steps = cfg.steps_ahead
    n = tokens.shape[1] - steps
    logits = ttt_logits(drafter, tokens, aux, steps, cfg.bf16)
    target_of = drafter.target_ids(torch.arange(drafter.cfg.draft_vocab_size, device=tokens.device))  # [Vd]
    total, metrics, chain = 0.0, [], None
    for j, lg in enumerate(logits):
        ids = top_ids[:, 1 + j:n + 1 + j]  # q[p + j]: [B, n, K]
        did = draft_index[ids]  # draft ids, -1 outside the draft vocabulary
        p = top_p[:, 1 + j:n + 1 + j] * (did >= 0)
        mass = p.sum(-1)  # [B, n]
        valid = mass > 0
        p = p / mass.clamp_min(1e-12)[..., None]
        logq = F.log_softmax(lg.float(), dim=-1)  # [B, n, Vd]
        ce_rows = -(p * logq.gather(-1, did.clamp_min(0))).sum(-1)  # [B, n]
        # a mean over every row (a row whose target has no mass in the draft vocabulary adds 0): ranks' equal parts
        # then average to the global batch's mean exactly, whatever rows each rank's part holds (dist.rows)
        ce = (ce_rows * valid).sum() / valid.numel()
        total = total + cfg.step_decay ** j * ce
        m = {"ce": float(ce.detach())}
        if with_metrics:
            with torch.no_grad():
                hit = target_of[lg.argmax(-1)] == ids[..., 0]  # [B, n]
                chain = hit if chain is None else chain & hit
                m.update(top1=float(hit.float().mean()), cond=float(chain.float().mean()),
                         in_vocab=float(top_p[:, 1 + j:n + 1 + j].mul(did >= 0).sum(-1).mean()))
        metrics.append(m)
    return total, metrics


class Eagle3Loss(torch.nn.Module):
    """`ttt_loss` as a module's forward: DDP syncs the gradients of what its forward ran (dist.wrap)."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, *args, **kwargs):
        return ttt_loss(self.drafter, *args, **kwargs)


FROZEN = ("embed_tokens.weight",)  # the target's own embedding: neither trained nor checkpointed


def trainable_state(drafter: Eagle3Drafter) -> dict:
    return {k: v for k, v in drafter.state_dict().items() if k not in FROZEN}


def train_eagle3(drafter: Eagle3Drafter, data: Eagle3Shards, cfg: Eagle3TrainConfig, work: Path, *,
                 held_out: Eagle3Shards | None = None, max_steps: int | None = None, minutes: float | None = None,
                 progress: bool = True, dist: Dist = Dist()) -> dict:
    """Train in place on dist.device; resumable from work/checkpoint.pt (any world size), as trainer.train: the same
    global batches on every rank (one generator seeded with seed + step), each rank its rows under DDP, rank 0
    writes the checkpoint and evaluates the held-out shards. `minutes`: stop this invocation after that long (the
    schedule stays the whole run's). A checkpoint of another vocabulary map or aux layers is refused."""
    from tqdm.auto import tqdm

    from edge_spec.train.optim import make_optimizer

    check_batch(cfg.batch_seqs, dist.world_size)
    device = dist.device
    torch.manual_seed(cfg.seed)
    drafter.to(device)
    drafter.embed_tokens.weight.requires_grad_(False)
    opt = make_optimizer(drafter, cfg.optimizer, cfg.lr)
    if not sum(size // cfg.batch_seqs for size in data.sizes):
        raise ConfigError(f"no shard holds a batch of {cfg.batch_seqs} sequences (--batch-seqs; the shards hold "
                          f"{sorted(set(data.sizes))} sequences)" if data.sizes else "no training sequences",
                          "pass more --data (or a larger --max-tokens), or a smaller --batch-seqs")
    total_steps = max_steps or max(1, int(len(data) // cfg.batch_seqs * cfg.epochs))
    ckpt_path = work / "checkpoint.pt"
    step, history, seconds_before = 0, [], 0.0
    identity = {"d2t": None if drafter.d2t is None else drafter.d2t.cpu().tolist(),
                "aux_layers": list(drafter.cfg.aux_layer_ids or ())}
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False, map_location=device)
        if ckpt.get("identity") != identity:
            raise ConfigError(f"the checkpoint {ckpt_path} was trained with another draft vocabulary or other aux "
                              "layers (--draft-vocab, --aux-layers, or other training data)",
                              f"pass the options of that run again, or delete {work} to start over")
        missing, unexpected = drafter.load_state_dict(ckpt["drafter"], strict=False)
        if unexpected or set(missing) - set(FROZEN):
            raise ConfigError(f"the checkpoint {ckpt_path} holds another drafter shape",
                              f"pass the options of that run again, or delete {work} to start over")
        opt.load_state_dict(ckpt["optimizer"])
        step, history = ckpt["step"], ckpt["history"]
        seconds_before = ckpt.get("train_seconds", 0.0)
    draft_index = target_to_draft_index(drafter.d2t, drafter.cfg.target_vocab_size).to(device)
    base_lrs = [g["lr"] for g in opt.param_groups]
    rng = np.random.default_rng(cfg.seed + step)
    part = rows(cfg.batch_seqs, dist)
    loss_fn = wrap(Eagle3Loss(drafter), dist)
    bar = tqdm(total=total_steps, initial=step, desc="train eagle3 drafter", unit="step",
               disable=not (progress and dist.main))
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
            tokens, aux, top_ids, top_p = batch.to(device)
            loss, metrics = loss_fn(tokens, aux, top_ids, top_p, draft_index, cfg, with_metrics=step % 10 == 0)
            opt.zero_grad()
            loss.backward()
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
                torch.save({"drafter": trainable_state(drafter), "optimizer": opt.state_dict(), "step": step,
                            "history": history, "config": asdict(cfg), "identity": identity,
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
        report["held_out"] = evaluate_eagle3(drafter, held_out, cfg, draft_index)
    return report


@torch.no_grad()
def evaluate_eagle3(drafter: Eagle3Drafter, data: Eagle3Shards, cfg: Eagle3TrainConfig, draft_index: torch.Tensor,
                    max_batches: int = 20) -> list[dict]:
    """Mean per-step ce / top1 / cond / in_vocab over held-out shards (teacher-forced tokens, as trained)."""
    sums, count = None, 0
    device = draft_index.device
    size = max(1, min([cfg.batch_seqs, *data.sizes]))  # a held-out shard may hold fewer rows than a batch
    for i, batch in enumerate(data.batches(size, np.random.default_rng(0))):
        if i >= max_batches:
            break
        tokens, aux, top_ids, top_p = batch.to(device)
        _, metrics = ttt_loss(drafter, tokens, aux, top_ids, top_p, draft_index, cfg)
        sums = metrics if sums is None else [{k: a[k] + m[k] for k in a} for a, m in zip(sums, metrics)]
        count += 1
    return [{k: v / max(count, 1) for k, v in s.items()} for s in (sums or [])]


def publish_eagle3(out: Path, drafter: Eagle3Drafter, report: dict, dtype: torch.dtype | None = None,
                   **config_args) -> None:
    """The Speculators folder (loading.speculators_eagle3.save_eagle3) and its training_report.json, written into
    `.OUT.partial` and renamed to OUT (replacing an earlier chunk's), as pipeline.publish: no reader, and no crash,
    ever sees a half-written drafter folder."""
    from edge_spec.loading.speculators_eagle3 import save_eagle3

    publish_folder(out, lambda folder: save_eagle3(drafter, folder, dtype=dtype, **config_args), report)
