"""1-bit LAMB (1-bit LAMB paper, Algorithm 1; LAMB as its Eq. (1); hyperparameters from its Section 6,
"Training parameters", for BERT pre-training run on the NCCL backend of its Section 5).

Warmup, the first ``freeze_step`` steps (line 2): LAMB on the fp32-averaged gradient, per tensor l,
u = m/(sqrt(v)+eps) + wd*x, c = clip(||x||/||u||, c_min, c_max), x = x - lr*c*u, and the moving average
c_avg = beta3*c_avg + (1-beta3)*c of each tensor's scaling coefficient.

At the end of warmup (line 3) v is frozen as v_Tw, a "fresh" variance starts from it, c_avg stops, and each
tensor gets a fixed momentum scale (appendix A.5.2): the mean over tensors of ||m||/sqrt(numel) divided by its
own, so that all tensors reach the one-scale-per-bucket 1-bit compression at similar magnitudes.

Compression (lines 4-21): the momentum goes through 1-bit Adam's compressed all-reduce (the same hook,
:func:`birder_repro.comm.attach_onebit`, multiplying by the momentum scales before and dividing after); then per
tensor the gradient is reconstructed from this and the last averaged momentum, g = (m_t - beta1 m_{t-1})/(1-beta1)
(line 15), the fresh variance follows it (line 16), and the scaling ratio r compares frozen and fresh
(line 17), is kept within (1 +- r_threshold) of the last one (line 18) and within [r_min, r_max] (line 19);
c = r * c_avg (line 20) and x = x - lr * c * (m/(sqrt(v_Tw)+eps) + wd*x) (line 21).

Where the paper leaves a detail open, this follows DeepSpeed's released OnebitLamb (the implementation the
paper's results come from), and says so:

- the ratio of line 17 is the largest element of (sqrt(v_Tw)+eps)/(sqrt(v_t)+eps), the ratio of the update's
  denominators (Algorithm 1 writes ||v_Tw/v_t||_inf; the denominators' ratio is finite where v_t = 0 and is
  the factor by which the frozen preconditioner shrinks the step);
- with weight decay (which the paper omits "for simplicity") the ratio only scales the adaptive part:
  r = r*q + (1-q), q = min(1, ||m/(sqrt(v)+eps)|| / ||u||);
- the clips run in the paper's order, threshold then [r_min, r_max], so r always ends within [r_min, r_max];
- a tensor whose weight or update norm is 0 takes coefficient 1 in the warmup (You et al.'s LAMB and
  DeepSpeed), and that 1 is not averaged into c_avg (it measures nothing);
- no bias correction, in either stage (Eq. (1) and DeepSpeed).

The momentum mask and the single-process behaviour are 1-bit Adam's (:mod:`birder_repro.optim.onebit_adam`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from birder_repro.optim.onebit_adam import (
    COMPRESSION,
    OneBitOptimizer,
    adam_moments_,
    freeze_step_from_config,
    preconditioned_update,
)


def momentum_scales(norms_per_numel: list[float]) -> list[float]:
    """Appendix A.5.2: each tensor's momentum scale, mean(s) / s_l with s_l = ||m_l|| / sqrt(numel_l).

    Tensors with zero momentum keep 1 and are left out of the mean (they have no magnitude to match).
    """
    nonzero = [s for s in norms_per_numel if s > 0]
    if not nonzero:
        return [1.0] * len(norms_per_numel)
    united = sum(nonzero) / len(nonzero)
    return [united / s if s > 0 else 1.0 for s in norms_per_numel]


def reconstruct_gradient(m: torch.Tensor, m_prev: torch.Tensor, beta1: float) -> torch.Tensor:
    """Algorithm 1, line 15: g = (m_t - beta1 * m_{t-1}) / (1 - beta1)."""
    return (m - beta1 * m_prev) / (1 - beta1)


# LAMB's scalars are 0-dim tensors on the parameter's device: a float() of a norm per tensor per step would make
# the host wait for the device several times per parameter per step.
def lamb_coefficient(
    weight_norm: torch.Tensor, update_norm: torch.Tensor, c_min: float, c_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (1): c = clip(||x|| / ||u||, c_min, c_max), and whether it measured anything: where a norm is 0 the
    ratio says nothing, and c is 1."""
    measured = (weight_norm > 0) & (update_norm > 0)
    return torch.where(measured, (weight_norm / update_norm).clamp(c_min, c_max), 1.0), measured


def scaling_ratio(frozen_denom: torch.Tensor, fresh_v: torch.Tensor, eps: float) -> torch.Tensor:
    """Algorithm 1, line 17, as DeepSpeed computes it: max((sqrt(v_Tw)+eps) / (sqrt(v_t)+eps))."""
    return (frozen_denom / (fresh_v.sqrt() + eps)).max()


def weight_decay_blend(r: torch.Tensor, adaptive_norm: torch.Tensor, update_norm: torch.Tensor) -> torch.Tensor:
    """Scale only the adaptive part of u = m/(sqrt(v)+eps) + wd*x: r*q + (1-q), q = min(1, ||m/..|| / ||u||)."""
    q = (adaptive_norm / update_norm).clamp(max=1.0)
    return torch.where(update_norm == 0, r, r * q + (1.0 - q))


def clip_ratio(r, r_prev, r_min: float, r_max: float, r_threshold: float) -> torch.Tensor:
    """Algorithm 1, lines 18-19: within (1 -+ r_threshold) r_prev, then within [r_min, r_max]."""
    r, r_prev = torch.as_tensor(r), torch.as_tensor(r_prev)
    within = torch.minimum(torch.maximum(r, (1 - r_threshold) * r_prev), (1 + r_threshold) * r_prev)
    return within.clamp(r_min, r_max)


class OneBitLamb(OneBitOptimizer):
    r"""1-bit LAMB (1-bit LAMB paper, Algorithm 1).

    Warmup, :math:`t \le T_w`, per tensor :math:`l`, :math:`g_t` averaged over processes (Eq. (1), line 2):

    .. math::
        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\quad
        u_t = \frac{m_t}{\sqrt{v_t}+\eta} + \lambda x_t,\quad
        c_t = \mathrm{clip}\left(\frac{\|x_t\|}{\|u_t\|}, c_{min}, c_{max}\right),

        c_{avg} = \beta_3 c_{avg} + (1-\beta_3) c_t,\quad x_{t+1} = x_t - \gamma c_t u_t

    Compression, :math:`t > T_w` (lines 5-21), with :math:`m_t` from the compressed all-reduce:

    .. math::
        \hat g_t = \frac{m_t - \beta_1 m_{t-1}}{1-\beta_1},\quad
        v_t = \beta_2 v_{t-1} + (1-\beta_2) \hat g_t^2 \;(v_{T_w} \text{ kept frozen}),\quad
        r_t = \max \frac{\sqrt{v_{T_w}}+\eta}{\sqrt{v_t}+\eta},

        r_t = \mathrm{clip}(\mathrm{clip}(r_t, (1-r_{thr}) r_{t-1}, (1+r_{thr}) r_{t-1}), r_{min}, r_{max}),\quad
        x_{t+1} = x_t - \gamma\, r_t c_{avg} \left(\frac{m_t}{\sqrt{v_{T_w}}+\eta} + \lambda x_t\right)

    Args:
        params: parameters or parameter groups (``exp_avg_mask`` per group as in OneBitAdam).
        lr: the learning rate gamma.
        betas: (beta1, beta2); (0.9, 0.999) in Section 6.
        eps: eta, added to sqrt(v).
        weight_decay: lambda, added to the update (0.01 for BERT in appendix A.1, for ResNet-50 in A.8).
        freeze_step: T_w, the number of warmup (LAMB, uncompressed) steps; >= 1, and >= 2 with the hook.
        c_min, c_max: the clip of LAMB's scaling coefficient in Eq. (1) (0.01, 0.3 in Section 6).
        beta3: decay of the coefficient's moving average c_avg (0.9).
        r_min, r_max, r_threshold: the clips of the scaling ratio (0.5, 4.0, 0.1).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        freeze_step: int = 100_000,
        c_min: float = 0.01,
        c_max: float = 0.3,
        beta3: float = 0.9,
        r_min: float = 0.5,
        r_max: float = 4.0,
        r_threshold: float = 0.1,
    ):
        if not 0.0 < c_min <= c_max:
            raise ValueError(f"OneBitLamb: need 0 < c_min <= c_max, got c_min={c_min}, c_max={c_max}")
        if not 0.0 <= beta3 < 1.0:
            raise ValueError(f"OneBitLamb: beta3 must be in [0, 1), got {beta3}")
        if not 0.0 < r_min <= 1.0 <= r_max:
            # r starts at 1 (Algorithm 1, line 1), so [r_min, r_max] must hold it
            raise ValueError(f"OneBitLamb: need 0 < r_min <= 1 <= r_max, got r_min={r_min}, r_max={r_max}")
        if not 0.0 <= r_threshold < 1.0:
            raise ValueError(f"OneBitLamb: r_threshold must be in [0, 1), got {r_threshold}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            c_min=c_min,
            c_max=c_max,
            beta3=beta3,
            r_min=r_min,
            r_max=r_max,
            r_threshold=r_threshold,
        )
        super().__init__(params, defaults, freeze_step, "OneBitLamb")

    def _init_state(self, p: torch.Tensor) -> None:
        super()._init_state(p)
        state = self.state[p]
        state.setdefault("c_avg", torch.zeros((), device=p.device))  # Algorithm 1, line 1
        if self.stage == COMPRESSION and "exp_avg_sq_fresh" not in state:  # a gradient first seen after the freeze
            state["exp_avg_sq_fresh"] = state["exp_avg_sq"].clone()
            state["ratio"] = torch.ones((), device=p.device)

    def _warmup_update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        beta1, beta2 = group["betas"]
        adam_moments_(state["exp_avg"], state["exp_avg_sq"], g, beta1, beta2)
        update = preconditioned_update(state["exp_avg"], state["exp_avg_sq"], group["eps"])
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        c, measured = lamb_coefficient(p.norm(), update.norm(), group["c_min"], group["c_max"])
        c_avg = state["c_avg"]
        state["c_avg"] = torch.where(measured, group["beta3"] * c_avg + (1 - group["beta3"]) * c, c_avg)  # line 2
        state["coefficient"] = c
        p.sub_(update.mul_(c * group["lr"]))

    def _freeze(self) -> None:
        """Line 3: the fresh variance starts from v_Tw, r from 1; and the momentum scales of A.5.2."""
        params = [p for g in self.param_groups for p in g["params"] if p in self.state]
        for p in params:
            state = self.state[p]
            state["exp_avg_sq_fresh"] = state["exp_avg_sq"].clone()
            state["ratio"] = torch.ones((), device=p.device)
        moments = torch.stack([self.state[p]["exp_avg"].norm() for p in params]).tolist() if params else []
        norms = [s / math.sqrt(max(p.numel(), 1)) for s, p in zip(moments, params)]  # one host read, once
        for p, s in zip(params, momentum_scales(norms)):
            self.state[p]["momentum_scale"] = s

    def _compression_scale(self, p: torch.Tensor) -> float:
        return float(self.state.get(p, {}).get("momentum_scale", 1.0))

    def _compression_update(self, p: torch.Tensor, m: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        beta1, beta2, eps = group["betas"][0], group["betas"][1], group["eps"]
        g = reconstruct_gradient(m, state["exp_avg"], beta1)  # line 15
        fresh = state["exp_avg_sq_fresh"]
        fresh.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # line 16
        state["exp_avg"].copy_(m)  # line 13
        denom = state["exp_avg_sq"].sqrt().add_(eps)
        adaptive = m / denom
        update = adaptive.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else adaptive
        r = scaling_ratio(denom, fresh, eps)  # line 17
        if group["weight_decay"]:
            r = weight_decay_blend(r, adaptive.norm(), update.norm())
        r = clip_ratio(r, state["ratio"], group["r_min"], group["r_max"], group["r_threshold"])  # lines 18-19
        state["ratio"] = r
        c = r * state["c_avg"]  # line 20
        state["coefficient"] = c
        p.sub_(update * (c * group["lr"]))  # line 21


def build_onebit_lamb(params: Iterable, cfg: Mapping[str, Any]) -> OneBitLamb:
    """The registry's builder: ``optim.freeze`` (fraction or steps) with ``optim.total_steps``."""
    return OneBitLamb(
        params,
        lr=cfg["lr"],
        betas=tuple(cfg.get("betas", (0.9, 0.999))),
        eps=cfg.get("eps", 1e-8),
        weight_decay=cfg.get("weight_decay", 0.0),
        freeze_step=freeze_step_from_config(cfg),
        c_min=cfg.get("c_min", 0.01),
        c_max=cfg.get("c_max", 0.3),
        beta3=cfg.get("beta3", 0.9),
        r_min=cfg.get("r_min", 0.5),
        r_max=cfg.get("r_max", 4.0),
        r_threshold=cfg.get("r_threshold", 0.1),
    )
