"""1-bit Adam (1-bit Adam paper, Algorithm 1; its Adam without bias correction is Eq. (1)).

Two stages. Warmup, the first ``freeze_step`` steps: plain Adam on the fp32-averaged gradient,
m = beta1*m + (1-beta1)*g, v = beta2*v + (1-beta2)*g^2, x = x - lr * (m/(sqrt(v)+eps) + wd*x).
Compression, every step after: v is frozen (Algorithm 1, line 2); each process forms its local momentum
m_i = beta1*m + (1-beta1)*g_i (line 6) from the previous averaged momentum m (line 13 sets every worker's
momentum to it), the momenta go through the error-compensated 1-bit compressed all-reduce (lines 7-11), and the
update is the same preconditioned step with the averaged momentum: x = x - lr * (m/(sqrt(v)+eps) + wd*x).

Bias correction: none, in either stage. Eq. (1) disables it ("consistent with exact optimizer for training
BERT"), Algorithm 1 has none, and DeepSpeed's OnebitAdam accepts ``bias_correction`` but never applies it.
The two stages therefore use the same m and v with no step-dependent factor at the switch.

Weight decay is decoupled (added to the update, times lr), as DeepSpeed's implementation adds it.

Momentum mask: 1 bit cannot say 0, so an element whose momentum is exactly zero (a parameter whose gradient is
always zero, like the unused rows of BERT's position embeddings in DeepSpeed's ``exp_avg_mask`` comment)
picks up +-scale from the compression and, with v = 0, would move by lr*scale/eps. Here the mask is derived
from the frozen variance: elements with v == 0 after warmup never had a non-zero gradient; their averaged
momentum is forced to 0 and they move only by weight decay. A parameter group may narrow it further with an
``exp_avg_mask`` entry (a tensor per parameter, 1 keep / 0 drop), as in DeepSpeed.

Opt-in deviation, ``precondition_compression`` (``optim.compress_preconditioned``; off by default, the paper's
way): compress the preconditioned momentum m/(sqrt(v)+eps) instead of m, and divide it back after the
averaging. With v frozen and the same on every rank the average is unchanged; what changes is what 1 bit
costs. 1 bit cannot say "small": the compressor sends every element at its scale (the RMS of the whole
bucket, Algorithm 1 lines 7-8, or of its tensor with the hook's ``scale='tensor'``) and error feedback makes an
element with nothing to send oscillate by
that scale, step after step. Divided by a frozen sqrt(v) of 1e-10 (an element that saw almost no gradient
during the warmup: a rarely active ReLU unit), that is a step of scale/eps: 0.34 -> 93 in one step on the
reproduction in docs/optimizers.md ("1-bit Adam: the warmup"). The paper's bound (1-bit Adam paper, section 5,
Theorem 1) grows as the compression error squared over v_min, the smallest frozen variance: the same effect.
Compressed after preconditioning, the oscillation is at most the RMS of the update itself. The mechanism is
1-bit LAMB's (1-bit LAMB paper, appendix A.5.2: momentum scaled per tensor before compression, divided
after), here with the frozen preconditioner as the scale.

Without the communication hook (a single process), the compression stage has no communication to compress:
it is the frozen-variance momentum step of Algorithm 1 with one worker and exact momentum (the paper's
"1-bit Adam (32-bits)" of section 7.2; DeepSpeed also skips compression when its world size is 1).

With :func:`birder_repro.comm.attach_onebit`, the hook all-reduces the gradients in the warmup and, in the
compression stage, forms the local momentum from this optimizer's ``exp_avg``, compresses it and hands back
the averaged momentum as the gradient; ``step`` then stores it as ``exp_avg`` and applies the update.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch

from birder_repro.optim.common import ScaledStepGate, closure_loss, grad_of, scaled_step_skips
from birder_repro.optim.schedule import steps_of

WARMUP, COMPRESSION = "warmup", "compression"


def adam_moments_(m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta1: float, beta2: float) -> None:
    """Eq. (1), first two lines, in place: m = beta1*m + (1-beta1)*g, v = beta2*v + (1-beta2)*g^2."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)


def local_momentum_(m: torch.Tensor, g: torch.Tensor, beta1: float) -> torch.Tensor:
    """Algorithm 1, line 6, in place: m = beta1*m + (1-beta1)*g."""
    return m.mul_(beta1).add_(g, alpha=1 - beta1)


def preconditioned_update(m: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """m / (sqrt(v) + eps): Eq. (1)'s step direction, and Algorithm 1 line 13's with v frozen."""
    return m / (v.sqrt() + eps)


def compression_preconditioner(v: torch.Tensor, eps: float) -> torch.Tensor:
    """1/(sqrt(v)+eps): what the momentum is multiplied by before 1-bit compression (and divided by after)
    with ``precondition_compression``, so that the compressed quantity is the update direction itself."""
    return 1.0 / (v.sqrt() + eps)


def apply_update_(p: torch.Tensor, update: torch.Tensor, lr: float, weight_decay: float) -> None:
    """x = x - lr * (update + weight_decay * x)."""
    if weight_decay:
        update = update.add(p, alpha=weight_decay)
    p.add_(update, alpha=-lr)


def momentum_mask(frozen_v: torch.Tensor, user_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Elements whose compressed momentum may be non-zero: frozen variance > 0 (and the group's mask, if any)."""
    mask = frozen_v > 0
    if user_mask is not None:
        mask &= user_mask.to(device=mask.device).reshape(mask.shape) != 0
    return mask


def freeze_step_from_config(cfg: Mapping[str, Any]) -> int:
    """The warmup length in steps from the ``optim`` config node.

    ``freeze`` >= 1 is a number of steps; 0 < ``freeze`` < 1 a fraction of the run, which needs
    ``total_steps`` (the optimizer steps of the whole run; the worker fills it in), read by
    :func:`birder_repro.optim.schedule.steps_of`. The result is at least 2: the hook's per-bucket state needs DDP's
    bucket layout, which DDP rebuilds after the first iteration (torch's PowerSGD asks start_powerSGD_iter >= 2
    for the same reason).
    """
    freeze = cfg.get("freeze")
    if freeze is None or freeze <= 0:  # at least one warmup step: its variance is what gets frozen
        raise ValueError(
            f"optim.freeze must be a fraction of the run in (0, 1) or a number of steps >= 1, got {freeze}"
        )
    return max(2, steps_of(freeze, cfg.get("total_steps"), "optim.freeze"))


# The fraction of its steady value the frozen variance should at least hold: the 1-bit Adam paper's shortest
# warmup (SQuAD fine-tuning, 400 of 1848 steps, section 7.1) kept 1 - 0.999^400 = 33 %; DeepSpeed's tutorial
# advises 15-25 % of the run.
MIN_FROZEN_FRACTION = 0.3


def frozen_fraction(beta2: float, freeze_step: int) -> float:
    """1 - beta2^T: Adam's variance without bias correction (Eq. (1)) after T steps from zero, as a fraction
    of its steady value; 1-bit Adam freezes it there (Algorithm 1, line 2)."""
    return 1.0 - beta2**freeze_step


def short_warmup_warning(optimizer: OneBitOptimizer, preconditioned: bool = False) -> str | None:
    """One line for a run whose warmup leaves the frozen variance below :data:`MIN_FROZEN_FRACTION` of its
    steady value, or None. Not an error: the paper's behaviour, which short test runs use on purpose."""
    beta2 = optimizer.param_groups[0]["betas"][1]
    fraction = frozen_fraction(beta2, optimizer.freeze_step)
    if fraction >= MIN_FROZEN_FRACTION or preconditioned:
        return None
    return (
        f"warning: 1-bit warmup of {optimizer.freeze_step} steps (optim.freeze): the frozen variance is "
        f"1 - beta2^T = {fraction:.1%} of its steady value (the paper's shortest warmup kept 33 %), and "
        "elements that saw almost no gradient divide the 1-bit scale by a near-zero sqrt(v): compressed steps "
        "may blow up (docs/optimizers.md, '1-bit Adam: the warmup'). Lengthen optim.freeze, or set "
        "optim.compress_preconditioned=true (1-bit Adam)"
    )


class CompressionInputs(NamedTuple):
    """What the 1-bit hook reads once from the optimizer for a parameter (see :mod:`birder_repro.comm.onebit`)."""

    beta1: float
    mask: torch.Tensor  # bool: elements whose momentum may be non-zero
    scale: float  # multiply the momentum by this before compressing and divide after (1-bit LAMB, A.5.2)


class OneBitOptimizer(torch.optim.Optimizer):
    """What 1-bit Adam and 1-bit LAMB share: the two stages, the step count, and the hook's interface.

    Subclasses implement ``_warmup_update(p, g, group)``, ``_compression_update(p, m, group)`` (``m`` is the
    new averaged momentum, already masked; ``exp_avg`` still holds the previous one) and may extend
    ``_freeze()`` (called once, right after step ``freeze_step``).
    """

    comm_scale = "bucket"  # the hook's default 1-bit scale (attach_onebit, optim.comm.scale): one per bucket
    # GradScaler.step hands the step its scale and Inf verdict (birder_repro.optim.common, amp_handover)
    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable, defaults: dict, freeze_step: int, name: str):
        lr, (beta1, beta2) = defaults["lr"], defaults["betas"]
        if not lr >= 0.0:
            raise ValueError(f"{name}: lr must be >= 0, got {lr}")
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"{name}: betas must be in [0, 1), got {defaults['betas']}")
        if not defaults["eps"] > 0.0:
            raise ValueError(f"{name}: eps must be > 0, got {defaults['eps']}")
        if not defaults["weight_decay"] >= 0.0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {defaults['weight_decay']}")
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 1:
            # At least one Adam step: the frozen variance is what the compression stage preconditions with.
            raise ValueError(f"{name}: freeze_step must be an integer >= 1 (warmup steps), got {freeze_step!r}")
        super().__init__(params, defaults)
        self.freeze_step = freeze_step
        self.steps_done = 0  # optimizer steps taken; the same on every rank, so the stage switch is too
        # Set by birder_repro.comm.attach_onebit: in the compression stage the gradient is then the averaged
        # momentum from the hook, not a gradient.
        self.momentum_by_hook = False
        # the hook's state (attach_onebit): a step with a non-finite gradient is skipped
        self.hook_state: ScaledStepGate | None = None

    @property
    def stage(self) -> str:
        """The stage of the next step: ``warmup`` for steps 1..freeze_step, ``compression`` after."""
        return WARMUP if self.steps_done < self.freeze_step else COMPRESSION

    # ------------------------------------------------------------------------------- the hook's interface
    def momentum_of(self, p: torch.Tensor) -> torch.Tensor | None:
        """The averaged momentum m of the last step (None before the first step), read by the hook each step."""
        return self.state.get(p, {}).get("exp_avg")

    def compression_inputs(self, p: torch.Tensor) -> CompressionInputs:
        """beta1, mask and compression scale of ``p``: fixed in the compression stage, read once per bucket."""
        group = self._group_of(p)
        v = self.state.get(p, {}).get("exp_avg_sq")
        if v is None:  # no state: no gradient in the whole warmup, so v would be 0 everywhere
            return CompressionInputs(group["betas"][0], torch.zeros_like(p, dtype=torch.bool), 1.0)
        mask = momentum_mask(v, group.get("exp_avg_mask_by_param", {}).get(p))
        return CompressionInputs(group["betas"][0], mask, self._compression_scale(p))

    def _compression_scale(self, p: torch.Tensor) -> float:
        return 1.0

    def _group_of(self, p: torch.Tensor) -> dict:
        for group in self.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise KeyError("parameter is not optimized by this optimizer")

    # ------------------------------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        hook = self.hook_state if self.momentum_by_hook else None
        if scaled_step_skips(self, hook, "attach_onebit"):
            return loss  # some rank's gradient was non-finite: the hook undid its errors; nothing else moves
        compressing = self.stage == COMPRESSION
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                self._init_state(p)
                if compressing:
                    self._compression_update(p, self._new_momentum(p, group), group)
                else:
                    self._warmup_update(p, p.grad, group)
        self.steps_done += 1
        if self.steps_done == self.freeze_step:
            self._freeze()
        return loss

    def _init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _new_momentum(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        """This step's averaged momentum: the hook's (already masked), or the local one computed here."""
        if self.momentum_by_hook:
            return grad_of(p)
        state = self.state[p]
        m = local_momentum_(state["exp_avg"].clone(), grad_of(p), group["betas"][0])
        user_mask = group.get("exp_avg_mask_by_param", {}).get(p)
        return m.mul_(momentum_mask(state["exp_avg_sq"], user_mask))

    def _freeze(self) -> None:
        """End of warmup. 1-bit Adam keeps its v as is; it simply stops updating it."""

    def _warmup_update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        raise NotImplementedError

    def _compression_update(self, p: torch.Tensor, m: torch.Tensor, group: dict) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------- param groups
    def add_param_group(self, param_group: dict) -> None:
        # DeepSpeed's ``exp_avg_mask``: one tensor per parameter of the group, kept out of state_dict (a mask
        # belongs to the training script, as DeepSpeed's load_state_dict comment says).
        param_group = dict(param_group)
        masks = param_group.pop("exp_avg_mask", None)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if masks is not None:
            if isinstance(masks, torch.Tensor):
                masks = [masks]
            if len(masks) != len(group["params"]):
                raise ValueError("exp_avg_mask needs one tensor per parameter of its group")
            for p, mk in zip(group["params"], masks):
                if mk.numel() != p.numel():
                    raise ValueError(
                        f"exp_avg_mask of shape {tuple(mk.shape)} does not fit a parameter of shape {tuple(p.shape)}"
                    )
            group["exp_avg_mask_by_param"] = dict(zip(group["params"], masks))

    # ------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        sd = super().state_dict()
        for g in sd["param_groups"]:
            g.pop("exp_avg_mask_by_param", None)
        sd["onebit"] = {"steps_done": self.steps_done, "freeze_step": self.freeze_step}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop("onebit", None)
        masks = [g.get("exp_avg_mask_by_param") for g in self.param_groups]
        super().load_state_dict(state_dict)
        for g, mk in zip(self.param_groups, masks):
            if mk is not None:  # the script's masks, not the checkpoint's (which has none)
                g["exp_avg_mask_by_param"] = mk
        if extra is not None:
            self.steps_done = int(extra["steps_done"])


class OneBitAdam(OneBitOptimizer):
    r"""1-bit Adam (1-bit Adam paper, Algorithm 1).

    Warmup, steps :math:`t \le T_w` (Eq. (1), no bias correction), with :math:`g_t` averaged over processes:

    .. math::
        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\quad
        x_{t+1} = x_t - \gamma \left(\frac{m_t}{\sqrt{v_t}+\eta} + \lambda x_t\right)

    Compression, :math:`t > T_w`, on process i with its local gradient :math:`g^{(i)}_t` (lines 6-13):

    .. math::
        m^{(i)}_t = \beta_1 m_{t-1} + (1-\beta_1) g^{(i)}_t,\quad
        m_t = \mathrm{CompressedAllReduce}(m^{(i)}_t),\quad
        x_{t+1} = x_t - \gamma \left(\frac{m_t}{\sqrt{v_{T_w}}+\eta} + \lambda x_t\right)

    Args:
        params: parameters or parameter groups (a group may carry ``exp_avg_mask``, one 0/1 tensor per
            parameter, to keep elements out of the compressed momentum, as DeepSpeed's OnebitAdam).
        lr: the learning rate gamma.
        betas: (beta1, beta2); (0.9, 0.999) in the paper and in Birder paper, section 5.1.
        eps: eta, added to sqrt(v).
        weight_decay: decoupled weight decay lambda (1e-4 for ResNet-50 in Birder paper, section 5.1).
        freeze_step: T_w, the number of warmup (Adam, uncompressed) steps; >= 1, and >= 2 with the hook.
        precondition_compression: compress m/(sqrt(v)+eps) rather than m (module doc); False: the paper.
    """

    comm_scale = "tensor"  # the hook's default 1-bit scale (attach_onebit): per tensor, as DeepSpeed's OnebitAdam

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        freeze_step: int = 100_000,
        precondition_compression: bool = False,
    ):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, freeze_step, "OneBitAdam")
        self.precondition_compression = bool(precondition_compression)

    def _compression_scale(self, p: torch.Tensor):
        """1 (the paper), or 1/(sqrt(v)+eps) per element with ``precondition_compression`` (module doc)."""
        if not self.precondition_compression:
            return 1.0
        return compression_preconditioner(self.state[p]["exp_avg_sq"], self._group_of(p)["eps"]).reshape(-1)

    def _warmup_update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        beta1, beta2 = group["betas"]
        adam_moments_(state["exp_avg"], state["exp_avg_sq"], g, beta1, beta2)
        update = preconditioned_update(state["exp_avg"], state["exp_avg_sq"], group["eps"])
        apply_update_(p, update, group["lr"], group["weight_decay"])

    def _compression_update(self, p: torch.Tensor, m: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        state["exp_avg"].copy_(m)  # line 13: every worker's momentum is the averaged one
        update = preconditioned_update(state["exp_avg"], state["exp_avg_sq"], group["eps"])
        apply_update_(p, update, group["lr"], group["weight_decay"])


def build_onebit_adam(params: Iterable, cfg: Mapping[str, Any]) -> OneBitAdam:
    """The registry's builder: ``optim.freeze`` (fraction or steps) with ``optim.total_steps``."""
    return OneBitAdam(
        params,
        lr=cfg["lr"],
        betas=tuple(cfg.get("betas", (0.9, 0.999))),
        eps=cfg.get("eps", 1e-8),
        weight_decay=cfg.get("weight_decay", 0.0),
        freeze_step=freeze_step_from_config(cfg),
        precondition_compression=bool(cfg.get("compress_preconditioned", False)),
    )
