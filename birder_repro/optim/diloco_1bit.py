"""DiLoCo with a 1-bit outer exchange: :class:`~birder_repro.optim.diloco.DiLoCo` (Douillard et al. 2023,
Algorithm 1: H inner AdamW steps, then an outer Nesterov step on the nodes' average pseudo-gradient) whose
average over the nodes goes through Birder's Hierarchical-1-bit-All-Reduce with a scale and error feedback
(:mod:`birder_repro.comm.diloco_onebit`, attached by ``optim=diloco_1bit``).

The optimizer itself is DiLoCo's: only the hook state it is handed differs, and ``seed`` keys the quantizer's
counter-based draws. Without a hook (one process) it is DiLoCo with one worker, nothing compressed.

The evaluation rule of the local-step methods is DiLoCo's own (:meth:`DiLoCo.synchronised`: the outer parameters
and the buffers of the last sync, the same on every rank; :meth:`DiLoCo.finish`: the run ends on an outer step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from birder_repro.optim.diloco import DiLoCo

__all__ = ["DiLoCo1bit", "build_diloco_1bit", "synchronised_parameters"]


@contextlib.contextmanager
def synchronised_parameters(params: list[torch.Tensor], outer: list[torch.Tensor] | None) -> Iterator[None]:
    """Inside, ``params`` hold ``outer`` (the outer model; None: the parameters are it already); restored after."""
    if outer is None:
        yield
        return
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        for p, o in zip(params, outer):
            p.copy_(o)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


class DiLoCo1bit(DiLoCo):
    """DiLoCo (its arguments) and ``seed``, the key of the 1-bit exchange's draws."""

    def __init__(self, params: Iterable, *args: Any, seed: int = 0, **kwargs: Any):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"DiLoCo1bit: seed must be a non-negative int, got {seed!r}")
        super().__init__(params, *args, **kwargs)
        self.seed = seed


def build_diloco_1bit(params: Iterable, cfg: Mapping[str, Any]) -> DiLoCo1bit:
    """The registry's builder, from the ``optim`` node (conf/optim/diloco_1bit.yaml)."""
    return DiLoCo1bit(
        params,
        lr=cfg["lr"],
        betas=tuple(cfg.get("betas", (0.9, 0.999))),
        eps=cfg.get("eps", 1e-8),
        weight_decay=cfg.get("weight_decay", 0.01),
        local_steps=int(cfg.get("local_steps", 10)),
        outer_lr=cfg.get("outer_lr", 0.7),
        outer_momentum=cfg.get("outer_momentum", 0.9),
        seed=int(cfg.get("seed", 0)),
    )
