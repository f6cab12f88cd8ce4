"""Optimizers by name: each registered with how it communicates and how it is built from its config.

``optim=<name>`` on the command line picks an entry here and its file ``conf/optim/<name>.yaml``; the task's
recipe (``conf/recipe/<task>/<name>.yaml``) sets the paper's hyperparameters for that pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from birder_repro.optim.birder import Birder

__all__ = ["Birder", "OneBitAdam", "OneBitLamb", "BertAdam", "SoftSignSGD", "OptimInfo", "register",
           "get_optim_info", "list_optimizers", "build_optimizer"]


@dataclass(frozen=True)
class OptimInfo:
    """A registered optimizer.

    ``build(params, cfg)`` makes the torch optimizer from the ``optim`` config node; ``comm`` names the
    communication scheme in :mod:`birder_repro.comm` (``allreduce`` is DDP's fp32 all-reduce, counted).
    """

    name: str
    build: Callable[[Iterable[torch.nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer]
    comm: str
    description: str


_REGISTRY: dict[str, OptimInfo] = {}


def register(info: OptimInfo) -> OptimInfo:
    if info.name in _REGISTRY:
        raise ValueError(f"optimizer {info.name!r} is registered twice")
    _REGISTRY[info.name] = info
    return info


def get_optim_info(name: str) -> OptimInfo:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"optimizer {name!r} is not registered; known: {', '.join(sorted(_REGISTRY))}") from None


def list_optimizers() -> list[str]:
    return sorted(_REGISTRY)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    return get_optim_info(cfg["name"]).build(params, cfg)


def _birder(params, cfg):
    return Birder(params, lr=cfg["lr"], beta=cfg["beta"], weight_decay=cfg.get("weight_decay", 0.0),
                  eps=cfg.get("eps", 1e-8), amsgrad_after=cfg.get("amsgrad_after"), seed=cfg.get("seed", 0))


register(OptimInfo("birder", _birder, "birder", "Birder with the Hierarchical-1-bit-All-Reduce hook"))

# Optimizers that register themselves at import: imported once the registry above exists (each module calls
# register() from here, which a top-of-file import would find undefined).
from birder_repro.optim.onebit_adam import OneBitAdam  # noqa: E402
from birder_repro.optim.onebit_lamb import OneBitLamb  # noqa: E402
from birder_repro.optim.bertadam import BertAdam  # noqa: E402
from birder_repro.optim.softsignsgd import SoftSignSGD  # noqa: E402
from birder_repro.optim import torch_optims  # noqa: E402,F401  (sgd, sgdm, adamw and their PowerSGD / fp16 peers)
