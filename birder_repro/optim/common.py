"""Pieces every optimizer of this package shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


def closure_loss(closure: Callable[[], torch.Tensor] | None):
    """The loss of ``step(closure)``: the closure re-evaluated with gradients on (``step`` runs under no_grad)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class StepGate(Protocol):
    """What an optimizer asks of the hook that compressed its step (the hook's state, ``birder_repro.comm``):
    ``end_step()`` closes the step and says whether it is to be skipped (some rank's gradient was non-finite)."""

    def end_step(self) -> bool: ...


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``, for a parameter the step has already found to have one."""
    if p.grad is None:
        raise RuntimeError("a parameter without a gradient reached the update")
    return p.grad
