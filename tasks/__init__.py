"""Tasks by name: ``task=<name>`` selects one; each lives in its own module of the same shape (tasks/base.py).

:data:`TASKS` is the whole registry, written out: a task module registers nothing when it is imported. Each entry
also says what the CLI checks before it launches anything (the metrics a target may name, whether the task looks
for a real dataset), so that those checks import no task module, nor torch: a config error, a dry run or a
launch costs the CLI no torch import (tests/test_tasks_registry.py holds every entry to its class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from birder_repro.registry import import_from, lazy_attributes
from birder_repro.tasks.data_files import CHECKS, DatasetNotFound  # torch-free; below this registry

if TYPE_CHECKING:  # imported on first use (__getattr__ below): tasks.base imports torch
    from birder_repro.tasks.base import Task, TaskData

__all__ = [
    "Task",
    "TaskData",
    "DatasetNotFound",
    "UnknownTask",
    "TaskEntry",
    "TASKS",
    "get_task",
    "list_tasks",
    "declared_metrics_of",
    "check_data",
]


@dataclass(frozen=True)
class TaskEntry:
    """One task of the registry: where its class is, and what the CLI's checks need to know of it."""

    module: str  # the module under birder_repro.tasks
    cls: str  # its Task class
    metrics: tuple[str, ...]  # the class's declared metrics, headline first (schema.declared_metrics)
    checks_data: bool  # whether the class looks for a real dataset (overrides Task.check_data)


# Modules are imported on demand, so that a task's heavy imports (torchvision, transformers) are paid only by
# the workers of a run of that task.
TASKS: dict[str, TaskEntry] = {
    "resnet20": TaskEntry("resnet20", "ResNet20Task", ("top1", "top5"), checks_data=True),
    "resnet50": TaskEntry("resnet50", "ResNet50Task", ("top1", "top5"), checks_data=True),
    "digits": TaskEntry("digits", "DigitsTask", ("top1",), checks_data=False),
    "fashion_mnist": TaskEntry("fashion_mnist", "FashionMNISTTask", ("top1",), checks_data=True),
    "bert_squad": TaskEntry("bert_squad", "BertSquadTask", ("f1", "exact_match"), checks_data=True),
    "bert_pretrain": TaskEntry(
        "bert_pretrain", "BertPretrainTask", ("mlm_accuracy", "mlm_loss", "nsp_accuracy"), checks_data=True
    ),
    "lstm_ptb": TaskEntry("lstm_ptb", "LSTMPTBTask", ("perplexity", "val_perplexity"), checks_data=True),
    "vit": TaskEntry("vit", "ViTTask", ("top1", "top5"), checks_data=True),
}


__getattr__ = lazy_attributes(__name__, {"Task": "base", "TaskData": "base"})


class UnknownTask(ValueError):
    """No task has this name; the message lists the names there are."""


def list_tasks() -> list[str]:
    return sorted(TASKS)


def _entry(name: str) -> TaskEntry:
    if name not in TASKS:
        raise UnknownTask(f"task={name!r} is not a task; the tasks: {', '.join(list_tasks())}")
    return TASKS[name]


def get_task(name: str) -> Task:
    """A new instance of the task called ``name``."""
    entry = _entry(name)
    return import_from(__name__, entry.module, entry.cls)()


def declared_metrics_of(name: str) -> tuple[str, ...]:
    """The metrics task ``name`` declares, headline first, read from the registry (no task module imported)."""
    return _entry(name).metrics


def check_data(cfg) -> None:
    """Raise :class:`DatasetNotFound` when the run reads a real dataset that is not there (synthetic data is
    made, never missing). No task module is imported: the checks are in :mod:`birder_repro.tasks.data_files`,
    which imports no torch (every node's CLI runs this before it launches its workers)."""
    if cfg.data.get("source") == "real" and TASKS[cfg.task.name].checks_data:
        CHECKS[cfg.task.name](cfg)
