"""Tasks by name: ``task=<name>`` selects one; each lives in its own module of the same shape (tasks/base.py).

:data:`TASKS` is the whole registry, written out: a task module registers nothing when it is imported.
"""

from __future__ import annotations

import importlib

from birder_repro.tasks.base import DatasetNotFound, Task, TaskData

__all__ = ["Task", "TaskData", "DatasetNotFound", "UnknownTask", "TASKS", "get_task", "list_tasks", "check_data"]

# name -> (module under birder_repro.tasks, its Task class). Modules are imported on demand, so that a task's
# heavy imports (transformers for the BERT tasks) are paid only by runs of that task.
TASKS: dict[str, tuple[str, str]] = {
    "resnet20": ("resnet20", "ResNet20Task"),
    "resnet50": ("resnet50", "ResNet50Task"),
    "digits": ("digits", "DigitsTask"),
    "fashion_mnist": ("fashion_mnist", "FashionMNISTTask"),
    "bert_squad": ("bert_squad", "BertSquadTask"),
    "bert_pretrain": ("bert_pretrain", "BertPretrainTask"),
    "lstm_ptb": ("lstm_ptb", "LSTMPTBTask"),
    "vit": ("vit", "ViTTask"),
}


class UnknownTask(ValueError):
    """No task has this name; the message lists the names there are."""


def list_tasks() -> list[str]:
    return sorted(TASKS)


def get_task(name: str) -> Task:
    """A new instance of the task called ``name``."""
    if name not in TASKS:
        raise UnknownTask(f"task={name!r} is not a task; the tasks: {', '.join(list_tasks())}")
    module, cls = TASKS[name]
    return getattr(importlib.import_module(f"birder_repro.tasks.{module}"), cls)()


def check_data(cfg) -> None:
    """Raise :class:`DatasetNotFound` when the run reads a real dataset that is not there (synthetic data is
    made, never missing)."""
    if cfg.data.get("source") == "real":
        get_task(cfg.task.name).check_data(cfg)
