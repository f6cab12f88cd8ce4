"""What the integrations' settling pass (one forward and backward before a resume's load, so that DDP's buckets
are the saved run's) must leave as it found it. Framework-free: Lightning's, Accelerate's and the Trainer's
modules all use it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["buffers_kept"]


@contextlib.contextmanager
def buffers_kept(module: torch.nn.Module | None) -> Iterator[None]:
    """Put every buffer of ``module`` back as it was on exit: the settling forward runs in training mode, where
    batch norm updates its running mean and variance and counts the batch (``num_batches_tracked``). Where the
    model is loaded before the settle (Accelerate, the Trainer) those would be the saved run's statistics plus
    one batch; where it is loaded after it (Lightning restores the model first) the same. Either way an
    evaluation after a resume would see other statistics than the run left alone."""
    saved = [(b, b.detach().clone()) for b in module.buffers()] if module is not None else []
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
