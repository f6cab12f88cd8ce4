"""The checks of the config sections that layers above :mod:`birder_repro.config.settings` own, in one table.

``config.validate`` checks the keys of its own layer (the layout, the batch, the learning rate, the choices)
and imports nothing above it. The sections below belong to higher layers, whose functions check them; this
module lists them and hands the table to ``config`` when it is imported (:func:`install`). The CLI imports it
before it resolves a config, so every run is checked by all of them, in this order:

    optim.name    an optimizer of that name has code behind it (birder_repro.optim; configs may come before code)
    task.name     a task of that name has code behind it (birder_repro.tasks)
    task.target   a metric of the task and a direction (birder_repro.train.target)
    parallel      ``parallel=fsdp`` only with a scheme that has an FSDP path (birder_repro.train.parallel)
    train         every ``train.*`` value the loop reads (birder_repro.train.settings), before any worker starts
    probe         ``mode=probe``'s sizes and layout (birder_repro.perf.probe)

The owners that import torch (train.parallel, perf.probe) are imported when their check runs, so that the CLI,
which imports this module, stays without torch. It sits in ``train``, above every owner it lists.
"""

from __future__ import annotations

from typing import Any

from birder_repro.config import settings as config
from birder_repro.config.settings import ConfigError
from birder_repro.optim import get_optim_info, list_optimizers
from birder_repro.tasks import list_tasks
from birder_repro.train.settings import TrainSettings
from birder_repro.train.target import check_target as owner

__all__ = ["SECTION_CHECKS", "install"]


def check_task_name(cfg: Any) -> None:
    if cfg.task.name not in list_tasks():
        raise ConfigError(
            f"task={cfg.task.name!r} has a config but no registered task; registered: {', '.join(list_tasks())}"
        )


def check_optim_name(cfg: Any) -> None:
    if cfg.optim.name not in list_optimizers():
        raise ConfigError(
            f"optim={cfg.optim.name!r} has a config but no registered optimizer; "
            f"registered: {', '.join(list_optimizers())}"
        )


def check_target(cfg: Any) -> None:
    owner(cfg)


def check_parallel(cfg: Any) -> None:
    if cfg.get("parallel", "ddp") == "ddp":  # nothing to check (the owner returns at once): no torch import
        return
    from birder_repro.train.parallel import check_parallel as owner  # imports torch: only for parallel=fsdp

    try:
        owner(cfg, get_optim_info(cfg.optim.name).comm)
    except ValueError as exc:  # the owner's one line, as the config error it is
        raise ConfigError(str(exc)) from None


def check_train(cfg: Any) -> None:
    TrainSettings.from_config(cfg)  # the loop's own reading of train.*: a bad value fails here, not in every worker


def check_probe(cfg: Any) -> None:
    if cfg.get("mode") == "probe":
        from birder_repro.perf.probe import check_settings  # imports torch: only for mode=probe

        check_settings(cfg)


# The names first: the later checks look the task and the optimizer up.
SECTION_CHECKS = (
    ("optim.name", check_optim_name),
    ("task.name", check_task_name),
    ("task.target", check_target),
    ("parallel", check_parallel),
    ("train", check_train),
    ("probe", check_probe),
)


def install() -> None:
    """Hand :data:`SECTION_CHECKS` to ``config.validate`` (done when this module is imported)."""
    config.install_section_checks(SECTION_CHECKS)


install()
