"""The training batches from a position in the run: epoch after epoch, from the step a resumed run starts at."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch

from birder_repro.train.rng import rng_state, set_rng_state

__all__ = ["batches", "steps_per_epoch"]


def batches(data, steps_per_epoch: int, start_step: int, device: torch.device) -> Iterator[tuple[int, Any]]:
    """(epoch, batch) for ever, epoch after epoch, from the position of ``start_step`` (resume).

    The sampler's epoch is set before each pass, so that shuffling differs per epoch and is the same on resume.
    """
    epoch, skip = divmod(start_step, steps_per_epoch)
    while True:
        if data.sampler is not None and hasattr(data.sampler, "set_epoch"):
            data.sampler.set_epoch(epoch)
        yielded = False
        for batch in _epoch_iterator(data, skip, device):
            yielded = True
            yield epoch, batch
        if not yielded and skip == 0:
            raise RuntimeError("the training data yielded no batch in a whole epoch")
        epoch, skip = epoch + 1, 0


def _epoch_iterator(data, skip: int, device: torch.device) -> Iterator:
    """An iterator over one epoch, past its first ``skip`` batches.

    Resuming mid-epoch re-creates the loader's iterator and re-loads the batches already trained on; both draw
    from the global RNG (the loader's base seed, augmentations in the main process), which the uninterrupted
    run did before its checkpoint. The RNG is put back afterwards so that training continues from the
    checkpoint's RNG state (exact with ``num_workers=0``; worker processes get a different base seed).
    """
    if not skip:
        return iter(data.train)
    state = rng_state(device)
    it = iter(data.train)
    for _ in itertools.islice(it, skip):
        pass
    set_rng_state(state, device)
    return it


def steps_per_epoch(data, train_size: int, global_batch: int) -> int:
    try:
        return max(1, len(data.train))
    except TypeError:  # an iterable without a length
        return max(1, math.ceil(train_size / global_batch))
