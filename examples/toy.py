"""The tiny model, data and optimizers every example shares, so that their results can be compared bit for bit.

Each example (plain DDP, FSDP2, Lightning, Accelerate, the Hugging Face Trainer) trains :func:`make_model` on
:func:`make_dataset` in the order :func:`make_sampler` gives, with :func:`make_optimizer`, for :data:`STEPS`
optimizer steps, and prints :func:`fingerprint` of the parameters at the end: equal fingerprints mean equal
parameters, bit for bit.

Two processes on one machine are two nodes of one process each (``GPUS_PER_NODE = 1``), so that Birder's and 1-bit
Adam's compressed exchanges really run between them.
"""

from __future__ import annotations

import hashlib
import os

import torch
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

SEED = 0
STEPS = 8  # optimizer steps
BATCH = 8  # samples per process and step
FEATURES, CLASSES, SAMPLES = 16, 4, 256
GPUS_PER_NODE = 1  # processes per node: every process its own node
FREEZE_STEP = 3  # 1-bit Adam's warmup (fp32 Adam steps) before it compresses


def make_model() -> nn.Module:
    """A small MLP, initialised from :data:`SEED` (the same weights in every process). With the environment's
    ``TOY_BATCH_NORM=1`` a batch norm follows the first layer: its running statistics (buffers) must then
    resume too (tests/test_examples*.py)."""
    torch.manual_seed(SEED)
    norm = [nn.BatchNorm1d(32)] if os.environ.get("TOY_BATCH_NORM") == "1" else []
    return nn.Sequential(nn.Linear(FEATURES, 32), *norm, nn.ReLU(), nn.Linear(32, CLASSES))


def make_dataset() -> TensorDataset:
    """A fixed classification set: the labels are a linear function of the inputs, so the loss can fall."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, CLASSES, generator=gen)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def make_sampler(dataset, rank: int, world_size: int) -> DistributedSampler:
    """Each process's share of every epoch, shuffled from :data:`SEED` (the same order in every example)."""
    return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED, drop_last=True)


def make_optimizer(name: str, params):
    """``birder`` or ``onebit_adam``, with the settings every example uses."""
    from birder_repro.optim import Birder, OneBitAdam

    if name == "birder":
        return Birder(params, lr=1e-2, beta=0.9, weight_decay=1e-4, seed=SEED)
    if name == "onebit_adam":
        return OneBitAdam(params, lr=1e-2, freeze_step=FREEZE_STEP)
    raise ValueError(f"optimizer {name!r}: use birder or onebit_adam")


def fingerprint(model: nn.Module) -> str:
    """A short hash of every parameter's bytes, then every buffer's (batch norm's statistics), in order: equal
    fingerprints, equal parameters and buffers."""
    digest = hashlib.sha256()
    for p in [*model.parameters(), *model.buffers()]:
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
