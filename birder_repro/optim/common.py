"""Pieces every optimizer of this package shares."""

from __future__ import annotations

from typing import Callable, Optional

import torch


def closure_loss(closure: Optional[Callable[[], torch.Tensor]]):
    """The loss of ``step(closure)``: the closure re-evaluated with gradients on (``step`` runs under no_grad)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
