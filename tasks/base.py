"""The shape every task module has. A reader who knows one task knows them all.

A task module (``tasks/<name>.py``, installed as ``birder_repro.tasks.<name>``) defines a subclass of
:class:`Task`, which the table in ``tasks/__init__.py`` names. The training loop only talks to this interface.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class TaskData:
    """What ``build_data`` returns for one process.

    ``train`` is re-iterated every epoch (a DataLoader with a DistributedSampler whose epoch the loop sets via
    ``set_epoch`` when present); ``eval`` is this process's shard of the evaluation set; ``train_size`` the
    number of training samples in one epoch over all processes; ``description`` says what the data is, real or
    synthetic, and is printed at the start of every run.
    """

    train: Iterable
    eval: Iterable | None
    train_size: int
    description: str
    sampler: Any = None  # the train sampler, for set_epoch


def small_eval_note(keys: str) -> str:
    """What every synthetic data line says of its evaluation set: small by default, unlike the real one's."""
    return f"small evaluation set by default: {keys}; the real dataset's is evaluated in full"


class Task:
    """Model, data, loss and metric of one experiment of the paper."""

    name: str = ""
    baseline: str = "sgdm"  # the optimizer every table compares against
    metrics: tuple[str, ...] = ()  # what the evaluation reports: the record's and the tables' columns
    headline_metric: str = ""  # the one the paper reports first (summaries show it); "": the first of metrics

    def build_model(self, cfg) -> nn.Module:
        raise NotImplementedError

    def build_data(self, cfg, rank: int, world_size: int) -> TaskData:
        raise NotImplementedError

    def check_data(self, cfg) -> None:
        """Raise :class:`DatasetNotFound` when the real dataset ``cfg`` names is not there (it only looks; it
        reads nothing). The CLI calls it for ``data.source=real`` before it launches anything, so that a missing
        dataset is one line rather than a traceback from every worker. Nothing to check by default."""

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules ``parallel=fsdp`` shards as FSDP units, each with its own all-gather, reduce-scatter
        and hook call (the root takes whatever parameters they leave): the model's repeated blocks."""
        raise NotImplementedError(f"task {self.name!r} declares no FSDP units: parallel=fsdp needs them")

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        """Training loss of one batch and the number of samples it holds."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, tuple[float, float]]:
        """Per metric, (sum, count) over this process's shard; the loop sums them over processes."""
        raise NotImplementedError

    def finalize(self, means: dict[str, float]) -> dict[str, float]:
        """Turn the averaged sums into the reported metrics (perplexity = exp(mean loss), percentages)."""
        return means
