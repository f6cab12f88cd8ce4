"""BertAdam: the optimizer BERT was trained and fine-tuned with, the baseline of the Birder paper's BERT rows.

Sources: google-research/bert ``optimization.py`` (``AdamWeightDecayOptimizer`` and ``create_optimizer``) and its
PyTorch port, Hugging Face pytorch-pretrained-bert ``optimization.py`` (``BertAdam``). Against torch's AdamW:

1. no bias correction of m and v ("the Adam m/v variables are initialized to zero, and we do not use bias
   correction": the BERT source says it on purpose);
2. eps = 1e-6 added to sqrt(v);
3. decoupled weight decay inside the update, so scaled by the learning rate: x = x - lr (m / (sqrt(v) + eps)
   + wd x), and not applied to biases and LayerNorm weights (BERT's ``exclude_from_weight_decay``);
4. the gradients clipped first to a global norm of 1.0 over all parameters
   (``tf.clip_by_global_norm(grads, clip_norm=1.0)`` in ``create_optimizer``).

Hugging Face's BertAdam clips each parameter's gradient separately (``clip_grad_norm_(p, ...)`` inside its loop);
we follow Google's global clipping, which is what BERT's results were produced with.

The warmup-linear learning-rate schedule is not in the optimizer: the training loop sets every group's ``lr``
before each step from :mod:`birder_repro.optim.schedule` (``warmup_linear``: linear warmup, then linear decay to 0,
BERT's ``polynomial_decay(power=1.0)`` after warmup). ``step`` uses the group's ``lr`` as it finds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from birder_repro.optim.common import closure_loss

__all__ = ["BertAdam", "bert_param_groups", "clip_coefficient", "bertadam_update_", "build_bertadam", "NO_DECAY_NAMES"]

# BERT's exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"] (google-research/bert optimization.py);
# Hugging Face's examples use ["bias", "LayerNorm.bias", "LayerNorm.weight"], the same parameters.
NO_DECAY_NAMES = ("bias", "LayerNorm", "layer_norm")


def bert_param_groups(
    params: Iterable, weight_decay: float, no_decay: Sequence[str] = NO_DECAY_NAMES
) -> list[dict[str, Any]]:
    """Split parameters into a group with ``weight_decay`` and one without, as BERT does.

    ``params`` may be ``model.named_parameters()``: a parameter whose name contains one of ``no_decay`` is not
    decayed. Given plain parameters (no names, as DDP's ``parameters()``), every tensor of one dimension is
    not decayed: in BERT the biases and the LayerNorm weights are exactly its 1-D parameters (timm's
    ``param_groups_weight_decay`` uses the same rule). Parameter groups (dicts) are returned as they are.
    """
    params = list(params)
    if not params or isinstance(params[0], dict):
        return params
    decay: list = []
    no_decay_params: list = []
    for item in params:
        if isinstance(item, tuple):
            name, p = item
            excluded = any(key in name for key in no_decay)
        else:
            p, excluded = item, item.ndim <= 1
        (no_decay_params if excluded else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay_params, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def clip_coefficient(grads: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The factor every gradient is multiplied by: clip_norm / max(global_norm, clip_norm).

    ``tf.clip_by_global_norm``'s formula (1 while the global L2 norm is within ``max_norm``), as a tensor so that
    no device synchronization is needed.
    """
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    return max_norm / torch.clamp(norm, min=max_norm)


def bertadam_update_(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One BertAdam step on one tensor, in place on p, m, v (AdamWeightDecayOptimizer.apply_gradients):

    m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  x = x - lr (m / (sqrt(v) + eps) + wd x).
    """
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = m / (v.sqrt() + eps)  # no bias correction, on purpose (see the module docstring)
    if weight_decay:
        update.add_(p, alpha=weight_decay)
    p.add_(update, alpha=-lr)


class BertAdam(torch.optim.Optimizer):
    r"""BERT's Adam (google-research/bert ``AdamWeightDecayOptimizer``; Hugging Face ``BertAdam``).

    .. math::
        \hat g_t = g_t \cdot \frac{c}{\max(\lVert g_t \rVert_2, c)},\quad
        m_t = \beta_1 m_{t-1} + (1-\beta_1)\hat g_t,\quad v_t = \beta_2 v_{t-1} + (1-\beta_2)\hat g_t^2,

        x_{t+1} = x_t - \alpha_t \left(\frac{m_t}{\sqrt{v_t} + \epsilon} + \lambda x_t\right)

    with the norm over all parameters of all groups, no bias correction and the group's ``lr`` as alpha_t (the
    schedule sets it).

    Args:
        params: parameters, ``named_parameters()`` or groups; use :func:`bert_param_groups` to leave biases and
            LayerNorm weights undecayed (:func:`build_bertadam` does).
        lr: the learning rate (the schedule's peak).
        betas: (beta1, beta2), BERT's (0.9, 0.999).
        eps: added to sqrt(v); BERT's 1e-6.
        weight_decay: lambda, BERT's 0.01.
        max_grad_norm: c, the global norm the gradients are clipped to; BERT's 1.0. None or 0: no clipping.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float | None = 1.0,
    ):
        if not lr >= 0.0:
            raise ValueError(f"BertAdam: lr must be >= 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"BertAdam: betas must be two values in [0, 1), got {betas}")
        if not eps > 0.0:
            raise ValueError(f"BertAdam: eps must be > 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"BertAdam: weight_decay must be >= 0, got {weight_decay}")
        if max_grad_norm is not None and not max_grad_norm >= 0.0:
            raise ValueError(f"BertAdam: max_grad_norm must be >= 0 or None, got {max_grad_norm}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        # One norm over every parameter of every group (BERT clips all trainable variables together), so the
        # bound belongs to the optimizer, not to a group.
        self.max_grad_norm = max_grad_norm

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return loss
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError("BertAdam does not support sparse gradients")
        scale = clip_coefficient([p.grad for p in params], self.max_grad_norm) if self.max_grad_norm else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                g = p.grad if scale is None else p.grad * scale.to(p.grad.dtype)
                bertadam_update_(
                    p,
                    g,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    group["lr"],
                    beta1,
                    beta2,
                    group["eps"],
                    group["weight_decay"],
                )
        return loss

    def state_dict(self):
        sd = super().state_dict()
        sd["max_grad_norm"] = self.max_grad_norm
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.max_grad_norm = state_dict.pop("max_grad_norm", self.max_grad_norm)
        super().load_state_dict(state_dict)


def build_bertadam(params: Iterable, cfg: Mapping[str, Any]) -> BertAdam:
    """From the ``optim`` node (conf/optim/bertadam.yaml): biases and 1-D weights undecayed, as BERT."""
    weight_decay = cfg.get("weight_decay", 0.01)
    groups = bert_param_groups(params, weight_decay, tuple(cfg.get("no_decay", NO_DECAY_NAMES)))
    return BertAdam(
        groups,
        lr=cfg["lr"],
        betas=tuple(cfg.get("betas", (0.9, 0.999))),
        eps=cfg.get("eps", 1e-6),
        weight_decay=weight_decay,
        max_grad_norm=cfg.get("max_grad_norm", 1.0),
    )
