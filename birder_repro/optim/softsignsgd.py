"""SoftSignSGD: Birder without compression (Birder paper, appendix B, Algorithm 1 there).

m = beta m + (1 - beta) g and b = beta b + (1 - beta) |g| with the same beta, so every element of m / b lies in
[-1, 1] (the appendix's point against Adam's sqrt(v) with its own beta2); the update is x = x - lr m / b. We add
eps to b, for elements whose gradient has always been zero (0 / 0), and decoupled weight decay as Birder's line
16 does, since the appendix runs SoftSignSGD with the weight decay of AdamW and Birder (0.05 for ResNet-20,
appendix B.1).

In DDP it takes the fp32-averaged gradient of DDP's all-reduce: in Algorithm 1 of section 2 that is Birder with
the identity in place of both quantizers Q (u = m / b, no errors), with m and b of the averaged gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from birder_repro.optim.birder import apply_update_
from birder_repro.optim.common import closure_loss

__all__ = ["SoftSignSGD", "softsign_direction_", "build_softsignsgd"]


def softsign_direction_(g: torch.Tensor, m: torch.Tensor, b: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """Appendix B Algorithm 1, lines 4-5, in place on m and b; returns m / (b + eps), in [-1, 1]."""
    m.mul_(beta).add_(g, alpha=1 - beta)
    b.mul_(beta).add_(g.abs(), alpha=1 - beta)
    return m / (b + eps)


class SoftSignSGD(torch.optim.Optimizer):
    r"""SoftSignSGD (Birder paper, appendix B, Algorithm 1).

    .. math::
        m_t = \beta m_{t-1} + (1-\beta) g_t,\quad b_t = \beta b_{t-1} + (1-\beta)|g_t|,\quad
        x_{t+1} = x_t - \alpha_t \left(\frac{m_t}{b_t + \epsilon} + \lambda x_t\right)

    Args:
        params: parameters or parameter groups.
        lr: the learning rate alpha (0.005 for ResNet-20, appendix B.1).
        beta: the one moving-average factor of m and b (0.95 for CNNs and ViT, 0.99 for the LSTM).
        weight_decay: decoupled weight decay lambda (0.05 for ResNet-20).
        eps: added to b before the division.
    """

    def __init__(
        self, params: Iterable, lr: float = 1e-3, beta: float = 0.95, weight_decay: float = 0.0, eps: float = 1e-8
    ):
        if not lr >= 0.0:
            raise ValueError(f"SoftSignSGD: lr must be >= 0, got {lr}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"SoftSignSGD: beta must be in [0, 1), got {beta}")
        if not weight_decay >= 0.0:
            raise ValueError(f"SoftSignSGD: weight_decay must be >= 0, got {weight_decay}")
        if not eps > 0.0:
            raise ValueError(f"SoftSignSGD: eps must be > 0, got {eps}")
        super().__init__(params, dict(lr=lr, beta=beta, weight_decay=weight_decay, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SoftSignSGD does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["b"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                u = softsign_direction_(p.grad, state["m"], state["b"], group["beta"], group["eps"])
                apply_update_(p, u, group["lr"], group["weight_decay"])
        return loss


def build_softsignsgd(params: Iterable, cfg: Mapping[str, Any]) -> SoftSignSGD:
    return SoftSignSGD(
        params, lr=cfg["lr"], beta=cfg["beta"], weight_decay=cfg.get("weight_decay", 0.0), eps=cfg.get("eps", 1e-8)
    )
