"""Tasks by name. ``task=<name>`` selects one; each lives in its own module of the same shape (tasks/base.py)."""

from __future__ import annotations

import importlib

from birder_repro.tasks.base import DatasetNotFound, Task, TaskData

__all__ = ["Task", "TaskData", "DatasetNotFound", "get_task", "list_tasks"]

# name -> module under birder_repro.tasks; modules are imported on demand (a task's heavy imports, such as
# transformers, are paid only by runs of that task).
_MODULES = {
    "resnet20": "resnet20",
    "resnet50": "resnet50",
    "digits": "digits",
    "bert_squad": "bert_squad",
    "bert_pretrain": "bert_pretrain",
    "lstm_ptb": "lstm_ptb",
    "vit": "vit",
}


def list_tasks() -> list[str]:
    return sorted(_MODULES)


def get_task(name: str) -> Task:
    if name not in _MODULES:
        raise KeyError(f"task {name!r} is not registered; known: {', '.join(list_tasks())}")
    module = importlib.import_module(f"birder_repro.tasks.{_MODULES[name]}")
    return module.TASK
