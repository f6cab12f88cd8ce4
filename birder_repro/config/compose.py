"""The config tree composed outside the Hydra app: where Hydra finds ``conf/`` (a checkout's, or the packaged
copy), a run's group choices and command-line overrides, and the reference configs that the type and key checks
(birder_repro.config.settings) compare a run's config with."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

__all__ = ["CONF_DIR", "CONF_PACKAGE", "GROUPS", "config_path", "reference_configs"]

# conf/ sits beside the package in the repository (installed editable, or run from a checkout); a wheel ships it
# as the package birder_repro.conf (pyproject.toml's package-dir and package-data), read as pkg://.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONF_PACKAGE = "birder_repro.conf"
GROUPS = ("task", "optim", "cluster", "launcher", "logger", "experiment")  # conf/'s groups a user picks


def config_path() -> str | None:
    """Where Hydra finds the config tree: the checkout's conf/, else a packaged copy, else None."""
    if (CONF_DIR / "config.yaml").is_file():
        return str(CONF_DIR)
    try:
        if importlib.util.find_spec(CONF_PACKAGE) is not None:
            return f"pkg://{CONF_PACKAGE}"
    except ModuleNotFoundError:
        pass
    return None


def reference_configs(cfg: DictConfig) -> list[DictConfig]:
    """What the YAML files say each key holds, for :func:`birder_repro.config.settings.check_types`, and which keys
    exist, for :func:`birder_repro.config.settings.check_known_keys`: the config of the same group choices without
    the command line's ``key=value`` overrides, and of the task alone (so that a top-level default an experiment
    replaces, such as ``gpus_per_node: auto``, still counts)."""
    choices = _group_choices(cfg)
    picked = [f"{group}={choices[group]}" for group in GROUPS if choices.get(group)]
    task = [f"task={choices['task']}"] if choices.get("task") else []
    return [_compose(picked + _added_groups(cfg, choices)), _compose(task)]


def _added_groups(cfg: DictConfig, choices: dict) -> list[str]:
    """The command line's picks of other config groups (``+mygroup=x`` from a ``--config-dir`` of the user's),
    as written: the keys they add are known keys too."""
    picks = []
    for override in _task_overrides(cfg):
        group = override.split("=", 1)[0].lstrip("+~")
        if group in choices and group not in (*GROUPS, "recipe") and not group.startswith("hydra"):
            picks.append(override)
    return picks


def _task_overrides(cfg: DictConfig) -> list[str]:
    """This job's command-line overrides (a sweep's cell alone); none for a config composed elsewhere."""
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    if "hydra" in cfg:  # composed with return_hydra_config=True (tests)
        return list(cfg.hydra.overrides.task)
    return []


def _group_choices(cfg: DictConfig) -> dict:
    """The option of every config group this run was composed with."""
    if HydraConfig.initialized():
        return dict(HydraConfig.get().runtime.choices)
    if "hydra" in cfg:  # composed with return_hydra_config=True (tests)
        return dict(cfg.hydra.runtime.choices)
    # Composed elsewhere: every option file is named after its name: key (tests check it); the experiment,
    # which has none, is unknown.
    return {group: cfg[group].name for group in GROUPS if group in cfg and "name" in cfg[group]}


def _compose(overrides: list[str]) -> DictConfig:
    """Compose conf/ with ``overrides``, inside the Hydra app (which has initialised Hydra) or outside it."""
    with _hydra_initialized():
        return hydra.compose(config_name="config", overrides=overrides)


@contextlib.contextmanager
def _hydra_initialized() -> Iterator[None]:
    """Hydra as the app initialised it (its search path: conf/ and any --config-dir), or on conf/ alone."""
    if GlobalHydra.instance().is_initialized():
        yield
        return
    path = config_path()
    init = (
        hydra.initialize_config_module(config_module=path.removeprefix("pkg://"), version_base="1.3")
        if path.startswith("pkg://")
        else hydra.initialize_config_dir(config_dir=path, version_base="1.3")
    )
    with init:
        yield
