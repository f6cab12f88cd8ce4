"""Evaluation: the task's metrics over every process's evaluation shard, reduced over processes.

The counts of the ranks' shards are summed as if one model had scored them, so every rank must hold the same
model: the one a user would deploy. Its parameters: the loop sees to them for a local-step optimizer (DiLoCo:
inside ``optimizer.synchronised()``, birder_repro.train.loop); the others' are the same on every rank. Its
buffers: rank 0's, as a checkpoint's model file holds them, on every rank (:func:`rank0_buffers`). The DDP model
broadcasts no buffers before its forward passes (birder_repro.train.parallel), so each rank's copy of BatchNorm's
running statistics follows its own batches; they reach no gradient, only an evaluation. (Inside DiLoCo's
``synchronised()`` every rank already holds the same, those of the last sync.)
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
import torch.distributed as dist

from birder_repro.train.collectives import allreduce_sum

__all__ = ["evaluate", "rank0_buffers"]


def evaluate(task, model, data, device: torch.device, max_batches: int | None = None) -> dict[str, float]:
    """Per metric, the (sum, count) pairs of ``task.evaluate`` summed over processes, divided, then finalized.

    ``max_batches`` (``train.eval_max_batches``) caps the batches each process evaluates. Collective.
    """
    # parallel=fsdp: a plain copy with the whole parameters (birder_repro.train.parallel)
    module = model.eval_module() if hasattr(model, "eval_module") else getattr(model, "module", model)
    loader = data.eval
    if max_batches is not None:
        loader = itertools.islice(loader, int(max_batches))
    was_training = module.training
    module.eval()
    with rank0_buffers(module), torch.no_grad():
        pairs = task.evaluate(module, loader, device)
    module.train(was_training)
    names = sorted(pairs)  # the same order on every rank: the all-reduce is positional
    totals = allreduce_sum([float(v) for name in names for v in pairs[name]], device)
    means = {
        name: totals[2 * i] / totals[2 * i + 1] if totals[2 * i + 1] else float("nan") for i, name in enumerate(names)
    }
    return dict(task.finalize(means))


@contextlib.contextmanager
def rank0_buffers(module: torch.nn.Module) -> Iterator[None]:
    """Inside: ``module``'s buffers are rank 0's on every rank; each rank's own are restored on exit. Collective
    on the default process group (one broadcast per buffer dtype); nothing on one process."""
    buffers = list(module.buffers())
    if not buffers or not dist.is_initialized() or dist.get_world_size() <= 1:
        yield
        return
    own = [b.detach().clone() for b in buffers]
    with torch.no_grad():
        for dtype in sorted({b.dtype for b in buffers}, key=str):  # the same order on every rank
            same = [b for b in buffers if b.dtype == dtype]
            flat = torch.cat([b.reshape(-1) for b in same])
            dist.broadcast(flat, src=0)
            offset = 0
            for b in same:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
    try:
        yield
    finally:
        with torch.no_grad():
            for b, mine in zip(buffers, own):
                b.copy_(mine)


def deployed(optimizer) -> contextlib.AbstractContextManager:
    """Where the model holds what a user would deploy: a local-step optimizer's last synchronised model
    (``optimizer.synchronised()``, birder_repro.optim.common.LocalSteps); the model as it is for the others."""
    return optimizer.synchronised() if hasattr(optimizer, "synchronised") else contextlib.nullcontext()
