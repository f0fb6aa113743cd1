"""The MTP drafter (Gemma-4 "assistant" design, generalised to any target).

One draft step, with no KV cache of its own:

    x   = pre_projection(cat(target_embed(last token) [Ht], hidden [Ht]))     # [1, 1, Ha]
    x   = N query-only layers attending into the target's caches (named target layers, one per kind)
    h   = norm(x)                                                             # [1, 1, Ha]
    out = head(h)  -> candidate token ids + their logits (clustered or dense)
    hidden_next = post_projection(h)                                          # [1, 1, Ht] fed to the next step

Within a burst the position stays at the bonus token's position and the caches do not change; only
the token and the hidden state move. Parameter names follow transformers' Gemma4AssistantForCausalLM,
so Google's assistant checkpoints load as they are, and our own drafters use the same file format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from edge_spec.model.config import GEMMA4, REUSE, ModelConfig
from edge_spec.model.drafter_config import DrafterConfig, drafter_config_dict, drafter_config_from_dict
from edge_spec.errors import CheckpointError
from edge_spec.model.transformer import RMSNorm, Block
from edge_spec.model.forms import SPLIT, Form
from edge_spec.model.ops import EAGER, Ops


class DraftOutput(NamedTuple):
    token_ids: torch.Tensor  # [N] int64 candidate ids (N = candidates_per_step; arange(V) for a dense head)
    logits: torch.Tensor  # [N] float32 logits of those candidates
    hidden: torch.Tensor  # [1, 1, Ht] fed to the next draft step


class _Stack(nn.Module):
    """Named `model` in Drafter so parameter names match transformers' assistant checkpoints."""

    def __init__(self, cfg: ModelConfig, own_table: bool = True):
        super().__init__()
        if own_table:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # only used as the output head
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class ClusteredHead(nn.Module):
    """Score C centroids, keep the top-k clusters, score only their tokens (token_ordering: [V] = [C, V/C])."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.centroids = nn.Linear(cfg.head_dim_in, cfg.num_centroids, bias=False)
        self.register_buffer("token_ordering", torch.arange(cfg.vocab_size, dtype=torch.long))
        self.num_centroids, self.top_k = cfg.num_centroids, cfg.top_k_clusters

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h: [d]; table: [V, d] -> (ids [k * V/C], logits [k * V/C])."""
        top = torch.topk(self.centroids(h), self.top_k).indices  # [k]
        ids = self.token_ordering.view(self.num_centroids, -1)[top].reshape(-1)  # [k * V/C]
        rows = table.index_select(0, ids)  # [k * V/C, d]: exports as Gather (GatherND was 2x slower in ORT)
        # h [1, d] @ rows^T: onnxruntime runs this 3x faster than rows @ h (matrix-vector), measured in
        # docs/architecture.md
        return ids, (h[None] @ rows.T)[0]


UNBOUND_FIX = ("pair it with its target first: drafter.bind_target(target.model.embed_tokens.weight), or "
               "edge_spec.model.drafter.pair(target_model, drafter) (edge-spec's loaders, exporters and trainer do)")


def _tracing() -> bool:
    """Inside torch.jit.trace / torch.export / dynamo: the bound table must be read as it is (a constant)."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        if cfg.layers.family != GEMMA4:
            raise CheckpointError("drafter layers must be gemma4-style blocks")
        self.cfg = cfg
        own_table = cfg.head_from == "drafter" and cfg.table_from == "own"
        self.model = _Stack(cfg.layers, own_table=own_table)
        if own_table:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            self.lm_head.weight = self.model.embed_tokens.weight
        if cfg.table_from == "target":
            self.table_projection = nn.Linear(cfg.target_hidden_size, cfg.hidden_size, bias=False)  # P [Ha, Ht]
            # the materialized table [V, Ha]: a buffer (moved by .to(), a constant of exported graphs), never saved
            self.register_buffer("bound_table", None, persistent=False)
            object.__setattr__(self, "_target_embedding", None)  # not a submodule / parameter: the target owns it
            self._bound_key = None
        self.pre_projection = nn.Linear(2 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.post_projection = nn.Linear(cfg.hidden_size, cfg.target_hidden_size, bias=False)
        self.masked_embedding = ClusteredHead(cfg) if cfg.clustered else None
        for kind, spec in cfg.layers.rope.items():
            with torch.device("cpu"):  # numpy maths, also when built on the meta device (drafter_sizes)
                inv_freq = torch.from_numpy(spec.inv_freq())
            self.register_buffer(f"inv_freq_{kind}", inv_freq, persistent=False)

    # ---- the token table ([V, Ha], head_from == "drafter") ----
    def bind_target(self, embedding: torch.Tensor) -> Drafter:
        """Pair with the target's input embedding [V, Ht]: a table_from="target" drafter materializes its table
        embedding @ P^T now (and again by itself whenever P changes, e.g. after training); no-op otherwise."""
        if self.cfg.table_from != "target":
            return self
        want = (self.cfg.vocab_size, self.cfg.target_hidden_size)
        if tuple(embedding.shape) != want:
            raise CheckpointError(f"the target embedding has shape {tuple(embedding.shape)}, this drafter derives "
                                  f"its table from one of shape {want}",
                                  "pair the drafter with the target it was trained for")
        object.__setattr__(self, "_target_embedding", embedding)
        self._materialize()
        return self

    @property
    def bound(self) -> bool:
        return self.cfg.table_from != "target" or self._target_embedding is not None

    def _check_bound(self) -> None:
        if not self.bound:
            raise CheckpointError("this drafter derives its token table from its target's embedding "
                                  "(config.json edge_spec.table_from = 'target') and is not paired with a target",
                                  UNBOUND_FIX)

    def _projection_key(self):
        w = self.table_projection.weight
        return w._version, w.data_ptr(), w.dtype

    def _materialize(self) -> None:
        with torch.no_grad():
            self.bound_table = self.table_rows().detach()
        self._bound_key = self._projection_key()

    def table_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Rows `ids` (all when None) of the token table, differentiable in P / the own table (what training uses:
        only the rows its loss scores, projected once per step)."""
        if self.cfg.table_from == "own":
            w = self.lm_head.weight
            return w if ids is None else w.index_select(0, ids)
        self._check_bound()
        emb = self._target_embedding.detach()  # the target's embedding stays frozen
        rows = emb if ids is None else emb.index_select(0, ids)
        return self.table_projection(rows.to(self.table_projection.weight.dtype))

    @property
    def table(self) -> torch.Tensor:
        """The token table [V, Ha] the head scores (own, or the bound target-derived one)."""
        if self.cfg.table_from == "own":
            return self.lm_head.weight
        self._check_bound()
        if not _tracing() and self._bound_key != self._projection_key():
            self._materialize()  # P changed (training, load_state_dict, .to()) since the table was made
        return self.bound_table

    def states(self, token_embed: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
               masks: dict[str, torch.Tensor], kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
               form: Form = SPLIT, ops: Ops = EAGER):
        """Batched core of a draft step (training runs many anchors at once as N query rows).

        token_embed, hidden: [B, N, Ht]; position_ids: [B, N]; masks: kind -> [B|1, 1, N, S];
        kv: kind -> (k, v) [B, H_kv, S, D]; form / ops: as Transformer.forward takes them.
        Returns (h [B, N, Ha] after the final norm, projected [B, N, Ht])."""
        x = self.pre_projection(torch.cat([token_embed, hidden], dim=-1))
        cfg = self.cfg.layers
        rope = {kind: ops.rope(self, kind, position_ids) for kind in cfg.rope}
        # REUSE layers read shared[kind] = ((k parts), (v parts)); a plain (k, v) pair is one part each
        shared = {kind: ((k,), (v,)) if torch.is_tensor(k) else (k, v) for kind, (k, v) in kv.items()}
        run = form.begin(position_ids, masks, shared)
        for layer, block in enumerate(self.model.layers):
            x, _ = block(x, rope[cfg.layer_kinds[layer]], run, ops, None, (None, None))
        h = self.model.norm(x)
        projected = self.post_projection(h)
        return h, projected + hidden if self.cfg.residual else projected

    def forward(self, token_embed: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                masks: dict[str, torch.Tensor], kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                target_table: torch.Tensor | None = None, form: Form = SPLIT, ops: Ops = EAGER) -> DraftOutput:
        """token_embed, hidden: [1, 1, Ht]; position_ids: [1, 1]; masks: kind -> [1, 1, 1, S_kind];
        kv: kind -> (k, v) target cache [1, H_kv, S_kind, D] of the source layer of that kind;
        target_table: the target's output embedding [V, Ht] (needed when head_from == "target")."""
        h, projected = self.states(token_embed, hidden, position_ids, masks, kv, form, ops)  # [1, 1, Ha], [1, 1, Ht]
        ids, logits = self.head(h[0, 0], projected[0, 0], target_table)
        return DraftOutput(ids, logits, projected)

    def head(self, h: torch.Tensor, projected: torch.Tensor, target_table: torch.Tensor | None):
        """One step's candidates: h [Ha], projected [Ht] (one row of `states`) -> (ids [N], logits [N] fp32)."""
        if self.cfg.head_from == "target":
            flat, table = projected, target_table
        else:
            flat, table = h, self.table
        if self.masked_embedding is not None:
            ids, logits = self.masked_embedding(flat, table)
        else:
            ids, logits = torch.arange(self.cfg.vocab_size), table @ flat
        return ids, logits.float()


# ---- pairing with a target -----------------------------------------------------------------------
def kv_sources(target: ModelConfig, drafter: DrafterConfig) -> dict[str, int]:
    """kind -> target layer whose cache the drafter's layers of that kind read."""
    kinds = set(drafter.layers.layer_kinds)
    if drafter.kv_source_layers:
        sources = dict(drafter.kv_source_layers)
    else:  # Gemma-4 rule: the last target layer of each kind that owns a cache
        cached = target.cached_layers()
        sources = {k: max((i for i in cached if target.layer_kinds[i] == k), default=-1) for k in kinds}
    for kind in kinds:
        if sources.get(kind, -1) < 0:
            raise CheckpointError(f"the drafter has {kind} layers but the target has no cached {kind} layer",
                                  "pair the drafter with the target it was trained for")
    return sources


def check_pair(target: ModelConfig, drafter: DrafterConfig) -> dict[str, int]:
    """Refuse a drafter that does not fit the target; returns kv_sources on success."""
    problems = []
    if drafter.target_hidden_size != target.hidden_size:
        problems.append(f"drafter expects target hidden size {drafter.target_hidden_size}, target has {target.hidden_size}")
    if drafter.vocab_size != target.vocab_size:
        problems.append(f"drafter vocab {drafter.vocab_size} != target vocab {target.vocab_size}")
    if not problems:
        sources = kv_sources(target, drafter)
        for layer, kind in enumerate(drafter.layers.layer_kinds):
            src = sources[kind]
            if target.kv_sharing[src] == REUSE:
                problems.append(f"target layer {src} owns no cache (it reuses another layer's)")
                continue
            if (drafter.layers.head_dims[layer], drafter.layers.kv_heads[layer]) != (target.head_dims[src], target.kv_heads[src]):
                problems.append(f"drafter layer {layer} ({kind}) expects head_dim/kv_heads "
                                f"{drafter.layers.head_dims[layer]}/{drafter.layers.kv_heads[layer]}, target layer {src} "
                                f"has {target.head_dims[src]}/{target.kv_heads[src]}")
            if drafter.layers.num_heads % target.kv_heads[src]:
                problems.append(f"drafter heads {drafter.layers.num_heads} not a multiple of target KV heads {target.kv_heads[src]}")
        for kind in set(drafter.layers.layer_kinds):
            if not np.array_equal(drafter.layers.rope[kind].inv_freq(), target.rope[kind].inv_freq()):
                problems.append(f"drafter RoPE for {kind} layers differs from the target's")
            if kind == "sliding" and drafter.layers.sliding_window != target.sliding_window:
                problems.append(f"drafter sliding window {drafter.layers.sliding_window} != target {target.sliding_window}")
    if problems:
        raise CheckpointError("drafter does not match the target: " + "; ".join(problems),
                              "use the drafter trained for this target (or train one: edge-spec train-drafter)")
    return sources


def pair(target, drafter: Drafter) -> dict[str, int]:
    """Where a drafter meets its target (`target`: the target Transformer): check the pair, bind the drafter to the
    target's embedding (a table_from="target" drafter materializes its table here), return kv_sources.
    The API, every exporter (contract.bundle.export) and the trainer pair through this."""
    sources = check_pair(target.cfg, drafter.cfg)
    drafter.bind_target(target.model.embed_tokens.weight)
    return sources


# ---- creating and saving (our own drafters use Google's assistant file format) -------------------
def new_drafter(target: ModelConfig, seed: int = 0, **kwargs) -> Drafter:
    """A randomly initialised drafter for `target` (normal(0, 0.02) weights, unit norms)."""
    raw = drafter_config_dict(target, **kwargs)
    drafter = Drafter(drafter_config_from_dict(raw, "new drafter"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return drafter


def save_drafter(drafter: Drafter, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json + model.safetensors atomically (temp folder + rename). `dtype` (e.g. torch.bfloat16):
    store the floating-point tensors in it (edge_spec.loading.checkpoints.load_drafter reads them back as float32).
    A table_from="target" drafter stores P, not its table (the table is a non-persistent buffer)."""
    import os
    import shutil

    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
                 for k, v in drafter.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(drafter.cfg.raw, indent=2))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
