"""Builders of torch's own optimizers from the ``optim`` config node (listed in :data:`birder_repro.optim.OPTIMIZERS`
with the communication they run with).

- ``sgd`` / ``sgdm``: torch's SGD without and with momentum (Birder paper, appendix B: "Vanilla SGD" is SGDM
  with momentum 0); ``adamw``: torch's AdamW (Loshchilov and Hutter, ICLR 2019). All with DDP's fp32
  all-reduce, counted.
- Peers for the benchmarks, the same optimizers over torch's compressing hooks: ``sgdm_powersgd`` and
  ``adamw_powersgd`` (torch's PowerSGD hook with its own warm start, :mod:`birder_repro.comm.powersgd`) and
  ``sgdm_fp16`` (torch's fp16 compression hook, :mod:`birder_repro.comm.allreduce`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

__all__ = ["build_sgd", "build_plain_sgd", "build_sgdm", "build_adamw"]


def build_sgd(default_momentum: float) -> Callable[[Iterable, Mapping[str, Any]], torch.optim.SGD]:
    """torch's SGD from the ``optim`` node; ``momentum`` there overrides the registered default."""

    def build(params: Iterable, cfg: Mapping[str, Any]) -> torch.optim.SGD:
        return torch.optim.SGD(
            params,
            lr=cfg["lr"],
            momentum=cfg.get("momentum", default_momentum),
            weight_decay=cfg.get("weight_decay", 0.0),
            nesterov=cfg.get("nesterov", False),
        )

    return build


build_plain_sgd = build_sgd(0.0)  # optim=sgd: "Vanilla SGD" (no momentum)
build_sgdm = build_sgd(0.9)  # optim=sgdm and SGDM over the compressing hooks


def build_adamw(params: Iterable, cfg: Mapping[str, Any]) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params,
        lr=cfg["lr"],
        betas=tuple(cfg.get("betas", (0.9, 0.999))),
        eps=cfg.get("eps", 1e-8),
        weight_decay=cfg.get("weight_decay", 0.01),
    )
