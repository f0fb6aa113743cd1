"""Optimisers for drafter training: AdamW (torch) and Muon (momentum orthogonalised by Newton-Schulz).

Muon updates 2-D weight matrices only; embeddings-like tables, norms and vectors use AdamW, as usual.
"""

from __future__ import annotations

import torch


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximately orthogonalise g ([m, n]) with a quintic Newton-Schulz iteration (bf16-safe)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float() / (g.norm() + 1e-7)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    for _ in range(steps):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return x.T if transposed else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                update = newton_schulz(p.grad + group["momentum"] * buf)  # Nesterov-style
                scale = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-group["lr"] * scale)


class Combined:
    """Several optimisers stepped together (Muon for matrices + AdamW for the rest)."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return [o.state_dict() for o in self.optimizers]

    def load_state_dict(self, states):
        for o, s in zip(self.optimizers, states):
            o.load_state_dict(s)

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]


def make_optimizer(model: torch.nn.Module, name: str, lr: float, weight_decay: float = 0.01):
    if name == "adamw":
        return Combined(torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98)))
    if name == "muon":
        matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "centroids" not in n]
        others = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "centroids" not in n)]
        return Combined(Muon(matrices, lr=lr * 20), torch.optim.AdamW(others, lr=lr, weight_decay=weight_decay))
    raise ValueError(f"unknown optimizer {name!r} (adamw | muon)")
