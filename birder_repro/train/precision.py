"""Mixed precision (``train.precision``): autocast around forward and loss, and fp16's loss scaling.

    fp32   the paper's setting: nothing changes;
    bf16   ``torch.autocast(dtype=bfloat16)`` around the forward pass and the loss (bf16 has fp32's exponent
           range: no loss scaling);
    fp16   ``torch.autocast(dtype=float16)`` and ``torch.amp.GradScaler``: the loss is multiplied by the scale S
           before backward, so small fp16 gradients do not flush to zero, and the gradients are divided by S
           before the optimizer applies them; a step whose gradients hold an Inf or NaN is skipped and S halves.

Parameters, gradients and DDP's buckets stay fp32 (autocast casts inside the operations), so the hooks and
Birder's state are fp32 in every precision. What fp16 needs from the compressed hooks (Birder, 1-bit Adam /
LAMB), and why one mechanism decides a skip:

    Step I    the hook receives S x the gradient and divides by S before any state update: its m, b, e and
              error buffers persist across steps while S changes, so they must hold true gradients;
    Step II   the hook multiplies its result (Birder's +-1, 1-bit Adam's averaged momentum) by S, because
              GradScaler divides whatever the buckets hold by S (exact: S is a power of two); a bucket whose
              agreed non-finite flag is set (some rank had an Inf or NaN: :mod:`birder_repro.comm.nonfinite`) is
              written as NaN instead, on every rank alike;
    Step III  GradScaler finds the Inf / NaN on every rank, skips ``optimizer.step()`` and halves S on every rank
              alike; the hook, whose step the optimizer did not close, restores its state (``settle``) and counts
              the step in ``nonfinite_steps``.

The baselines' DDP all-reduce averages the scaled gradients (identical on every rank), so GradScaler's skip is
the same on every rank too. torch's PowerSGD hook keeps an error and a Q per bucket that an overflow would poison
for the rest of the run: its state restores them where GradScaler skipped (``after_scaler_step``,
:mod:`birder_repro.comm.powersgd`).

A local-step method (DiLoCo and its kin: ``optim.local_steps``) averages the gradients only inside a node, so
each node's GradScaler would find its own Inf or NaN: a node that skips a step and one that does not reach the
outer all-reduce at different steps (gloo aborts, NCCL hangs). With ``agree_over`` (the world's process group)
the verdict is agreed before the step: GradScaler's found-inf flags (after its ``unscale_``) are all-reduced
with MAX over every rank, so every rank skips, and halves its scale, alike. One 1-element all-reduce a step, on
the device (GradScaler reads the flag on the host anyway).

CPU runs use the same code (bf16 and fp16 autocast and GradScaler run on the CPU), so the tests cover it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from birder_repro.train.settings import PRECISIONS  # defined there: the CLI checks train.* without torch

__all__ = ["PRECISIONS", "Precision", "agree_found_inf", "agrees_overflow"]


_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """``train.precision`` as the loop uses it, for one process's ``device`` and hook state ``comm``."""

    def __init__(self, name: str, device: torch.device, comm: Any = None, agree_over: Any = None):
        if name not in PRECISIONS:
            raise ValueError(f"train.precision={name!r}: use one of {', '.join(PRECISIONS)}")
        self.name, self.device, self.comm = name, torch.device(device), comm
        self.dtype = _DTYPES[name]
        self.scaler: torch.amp.GradScaler | None = torch.amp.GradScaler(self.device.type) if name == "fp16" else None
        # steps GradScaler skipped for an Inf or NaN gradient, counted on the scale's device (read at the end)
        self._skipped: torch.Tensor | None = None
        # the process group over which GradScaler's verdict is agreed (local-step methods: the world), or None
        self.agree_over = agree_over if self.scaler is not None else None
        track = getattr(comm, "track_loss_scale", None)  # torch's PowerSGD: restore its state on a skipped step
        if self.scaler is not None and track is not None:
            track()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Around the forward pass and the loss (not backward: autocast's casts are recorded in the graph)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
            return
        scaled = self.scaler.scale(loss)
        self._share_scale()
        scaled.backward()

    def unscale_(self, optimizer) -> None:
        """fp16: the gradients back to their true size (before clipping their norm); nothing otherwise."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        """The optimizer's step; fp16: GradScaler's (skipped on an Inf / NaN), its scale update, and the
        hook's state restored where GradScaler skipped a step that the hook had begun (Step III above)."""
        if self.scaler is None:
            optimizer.step()
            return
        scale = _scale_tensor(self.scaler)
        before = scale.clone()  # on the device: get_scale() would sync with the host, twice per step
        if self.agree_over is not None:
            agree_found_inf(self.scaler, optimizer, self.agree_over)
        self.scaler.step(optimizer)
        self.scaler.update()  # updates the scale in place
        backed_off = (scale < before).to(torch.int64)  # only after an Inf or NaN: a skipped step
        self._skipped = backed_off if self._skipped is None else self._skipped + backed_off
        settle = getattr(self.comm, "settle_step", None)
        if settle is not None:
            settle()
        after = getattr(self.comm, "after_scaler_step", None)
        if after is not None:
            after(before, scale)

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped (reads the device's count: call it at the end, not per step)."""
        return 0 if self._skipped is None else int(self._skipped)

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def _share_scale(self) -> None:
        """Hand the compressed hook GradScaler's scale tensor (on the device: reading it needs no sync). It is
        created by the first ``scale()`` and updated in place by ``update()``, so handing it once suffices."""
        if self.comm is not None and hasattr(self.comm, "loss_scale") and self.comm.loss_scale is None:
            self.comm.loss_scale = _scale_tensor(self.scaler)

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, sd: dict | None) -> None:
        if self.scaler is not None and sd:
            self.scaler.load_state_dict(sd)


def agree_found_inf(scaler: torch.amp.GradScaler, optimizer, group: Any) -> None:
    """GradScaler's found-inf flags for ``optimizer`` made the same on every rank of ``group`` (MAX): one
    verdict, so every rank skips the step (and halves its scale) where any rank found an Inf or NaN. Unscales
    first where the step has not (GradScaler finds the flags there); ``scaler.step`` then uses these flags."""
    import torch.distributed as dist
    from torch.amp.grad_scaler import OptState

    states = scaler._per_optimizer_states[id(optimizer)]  # not public; the same in torch 2.x
    if states["stage"] is OptState.READY:
        scaler.unscale_(optimizer)
    for flag in states["found_inf_per_device"].values():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)


def agrees_overflow(optim_cfg: Any, nodes: int) -> bool:
    """Whether GradScaler's verdict must be agreed over the world before each step: a local-step method
    (its config has ``local_steps``: DiLoCo and its kin average gradients only inside a node) on 2+ nodes."""
    return nodes > 1 and optim_cfg.get("local_steps") is not None


def _scale_tensor(scaler: torch.amp.GradScaler) -> torch.Tensor:
    """GradScaler's scale as the 1-element tensor it keeps on the device (``_scale``: not public, but what
    ``scale()`` multiplies by; stable across torch 2.x). ``get_scale()`` would copy it to the host."""
    scale = getattr(scaler, "_scale", None)
    if not isinstance(scale, torch.Tensor):
        raise RuntimeError(
            "torch.amp.GradScaler keeps no _scale tensor in this torch: fp16 with a compressed "
            "hook needs it (train.precision=bf16 needs none)"
        )
    return scale
