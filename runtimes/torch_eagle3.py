"""Eager EAGLE-3 drafting beside a TorchBackend: `AuxTarget` and `TorchEagle3Drafter` (a contract DrafterBackend).

Unlike the MTP drafter, an EAGLE-3 drafter (edge_spec/model/eagle3.py) owns a KV cache. Its committed rows follow
the target's committed positions: the row at position p pairs the target's aux states at p - 1 with token p, so
after the target commits positions [0, L) (token L pending) the drafter's rows 1..L are all final. Each burst:

  begin(L)        keep the committed rows whose tokens 0..p all still agree with the target's (row p read the
                  aux states at p - 1, which depend on every earlier token; a rewind or a new prompt drops the
                  rest, also when only its first token differs), and
  first step      run the missing rows c + 1..L in one pass (target aux [c, L), tokens c + 1..L), commit them:
                  row L's output is the first draft;
  later steps     one chained row each (the previous row's hidden, the draft token), written after the committed
                  rows but not committed: the next burst starts from the committed length again, which drops them
                  (the target rejected them, or re-ran them with its own states: EAGLE-3 recomputes accepted
                  positions from the target's states).

The target's aux states and tokens come from `AuxTarget`, the target module wrapped so that each forward also
records them by position: a committed position keeps the values of the pass that committed it.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from edge_spec.contract.backend import DraftStep
from edge_spec.errors import ConfigError
from edge_spec.model.eagle3 import NEG, Eagle3Drafter, check_eagle3_pair
from edge_spec.model.transformer import Transformer


class AuxTarget(nn.Module):
    """`model` whose every forward also records, by position, its input tokens and the aux states of `aux_layers`
    (ModelOutput.aux). Pass it to TorchBackend in place of the model."""

    def __init__(self, model: Transformer, aux_layers: tuple[int, ...], max_context: int):
        super().__init__()
        n = model.cfg.num_layers
        if any(not 0 <= i <= n for i in aux_layers):
            raise ConfigError(f"aux layer ids {aux_layers} are outside the target's layers [0, {n}]",
                              "pair the drafter with the target it was trained for")
        self.model, self.aux_layers, self.cfg = model, tuple(aux_layers), model.cfg
        self.ids = np.full(max_context, -1, dtype=np.int64)  # [S] token at each position
        self.aux = torch.zeros(max_context, len(aux_layers) * model.cfg.hidden_size)  # [S, n * H]

    def forward(self, input_ids, position_ids, *args, **kwargs):
        out = self.model(input_ids, position_ids, *args, aux_layers=self.aux_layers, **kwargs)
        pos = position_ids[0]  # [T]
        keep = pos < self.ids.shape[0]
        self.ids[pos[keep].numpy()] = input_ids[0, keep].numpy()
        self.aux[pos[keep]] = out.aux[0, keep].float()
        return out

    def embed(self, input_ids):
        return self.model.embed(input_ids)


class TorchEagle3Drafter:
    """DrafterBackend for an Eagle3Drafter beside a TorchBackend whose model is an AuxTarget."""

    def __init__(self, drafter: Eagle3Drafter, target):
        if not isinstance(target.model, AuxTarget):
            raise ConfigError("the target backend's model does not record aux states",
                              "build it as TorchBackend(AuxTarget(model, aux_layers, max_context), layout)")
        cfg = drafter.cfg
        ids = check_eagle3_pair(target.model.cfg, cfg)
        if ids != target.model.aux_layers:
            raise ConfigError(f"the target records aux layers {target.model.aux_layers}, the drafter reads {ids}",
                              "build the pair with eagle3_pair(model, drafter, layout)")
        self.drafter, self.aux_target = drafter, target.model
        capacity = len(self.aux_target.ids) + 1
        self.k, self.v = drafter.empty_caches(capacity)  # per layer [1, H_kv, S + 1, D]; slot p - 1: position p
        # the target's token at each position 0..committed when the committed rows were computed: row p read the
        # aux states at p - 1, which depend on tokens 0..p - 1, and token p
        self.tokens = np.full(capacity + 1, -1, dtype=np.int64)
        self.committed = 0  # rows 1..committed are final
        self.used = 0  # rows written this burst (committed + chained)
        self.position, self.fresh = 0, False
        ids = torch.arange(cfg.draft_vocab_size)
        self.token_ids = drafter.target_ids(ids).numpy()  # [Vd] target id of each draft logit
        self.kernel_s = 0.0

    def begin(self, position: int, masks, n_cached: int) -> None:
        """A burst after the target's committed positions [0, position); the masks are the target's (unused)."""
        keep = min(self.committed, position - 1)
        same = self.tokens[:keep + 1] == self.aux_target.ids[:keep + 1]  # tokens 0..keep
        # a token differing at position j stales the rows j.. (token 0 too: every row's aux states read it)
        self.committed = keep if same.all() else max(int(np.argmin(same)) - 1, 0)
        self.used, self.position, self.fresh = self.committed, position, True

    @torch.no_grad()
    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        first, self.fresh = self.fresh, False
        if first:  # the missing rows c + 1..L: target aux [c, L), tokens c + 1..L (token L: this step's)
            c, end = self.committed, self.position
            ids = np.append(self.aux_target.ids[c + 1:end], token)
            x = self.drafter.fuse(self.aux_target.aux[c:end][None])  # [1, T, H]
        else:  # one chained row after the last one written
            ids = np.array([token])
            x = torch.from_numpy(hidden).view(1, 1, -1)
        t, s = len(ids), self.used
        positions = torch.arange(s + 1, s + 1 + t)[None]  # [1, T]
        mask = torch.where(torch.ones(t, t, dtype=torch.bool).tril(), 0.0, NEG)[None, None]  # [1, 1, T, T]
        mask = torch.cat([torch.zeros(1, 1, t, s), mask], dim=-1)  # every written row is visible: [1, 1, T, S + T]
        start = time.perf_counter()
        out = self.drafter(x, torch.from_numpy(ids)[None], positions, mask, [k[:, :, :s] for k in self.k],
                           [v[:, :, :s] for v in self.v])
        self.kernel_s += time.perf_counter() - start
        for k, v, nk, nv in zip(self.k, self.v, out.new_k, out.new_v):
            k[:, :, s:s + t] = nk
            v[:, :, s:s + t] = nv
        self.used += t
        if first:
            self.tokens[0] = self.aux_target.ids[0]
            self.tokens[s + 1:s + 1 + t] = ids  # rows at positions s + 1..s + t
            self.committed = self.used
        return DraftStep(self.token_ids, out.logits[0, -1].numpy(), out.hidden[0, -1].numpy())


def eagle3_pair(model: Transformer, drafter: Eagle3Drafter, layout, **backend_args):
    """(TorchBackend over AuxTarget(model), TorchEagle3Drafter) for the drafter's aux layers (its config's, or
    Speculators' defaults for this target); a drafter that does not fit the target is refused (check_eagle3_pair)."""
    from edge_spec.runtimes.torch import TorchBackend

    ids = check_eagle3_pair(model.cfg, drafter.cfg)
    backend = TorchBackend(AuxTarget(model, ids, layout.max_context), layout, **backend_args)
    return backend, TorchEagle3Drafter(drafter, backend)
