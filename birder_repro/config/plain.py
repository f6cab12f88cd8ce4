"""A config as plain Python data: the one conversion every layer uses (the record's config, the digests, the
config checks, W&B's config, a prediction's input). It sits below every layer that converts a config
(docs/architecture.md) and imports only omegaconf, when called."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["HYDRA_NODE", "plain_config"]

HYDRA_NODE = "hydra"  # Hydra's own node of a job's config: never part of a run's config as recorded


def plain_config(cfg: Any, *, lenient: bool = False) -> Any:
    """``cfg`` (an OmegaConf config or a mapping) as plain dicts and lists, a copy, with Hydra's own node (the
    top-level ``hydra``) left out. Interpolations resolve key by key, so that Hydra's node, whose fields resolve
    only inside a job, is never resolved. Where one cannot be resolved: the error, or with ``lenient`` the
    whole config as written, unresolved (a failed run's record and W&B's config are written anyway)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        if isinstance(cfg, Mapping):
            return {key: copy.deepcopy(value) for key, value in cfg.items() if key != HYDRA_NODE}
        return copy.deepcopy(cfg)
    try:
        if OmegaConf.is_list(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
        return {key: _resolved(cfg[key]) for key in cfg if key != HYDRA_NODE}
    except Exception:  # a resolver may raise anything (Hydra's, outside a job: ValueError)
        if not lenient:
            raise
    data = OmegaConf.to_container(cfg, resolve=False)
    if isinstance(data, dict):
        data.pop(HYDRA_NODE, None)
    return data


def _resolved(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
