"""Evaluation: the task's metrics over every process's evaluation shard, reduced over processes."""

from __future__ import annotations

import itertools

import torch

from birder_repro.train.collectives import allreduce_sum

__all__ = ["evaluate"]


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
    with torch.no_grad():
        pairs = task.evaluate(module, loader, device)
    module.train(was_training)
    names = sorted(pairs)  # the same order on every rank: the all-reduce is positional
    totals = allreduce_sum([float(v) for name in names for v in pairs[name]], device)
    means = {
        name: totals[2 * i] / totals[2 * i + 1] if totals[2 * i + 1] else float("nan") for i, name in enumerate(names)
    }
    return dict(task.finalize(means))
