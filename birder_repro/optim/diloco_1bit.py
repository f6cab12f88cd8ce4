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

from collections.abc import Iterable, Mapping
from typing import Any

from birder_repro.optim.diloco import DiLoCo, diloco_arguments

__all__ = ["DiLoCo1bit", "build_diloco_1bit"]


class DiLoCo1bit(DiLoCo):
    """DiLoCo (its arguments) and ``seed``, the key of the 1-bit exchange's draws."""

    def __init__(self, params: Iterable, *args: Any, seed: int = 0, **kwargs: Any):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"DiLoCo1bit: seed must be a non-negative int, got {seed!r}")
        super().__init__(params, *args, **kwargs)
        self.seed = seed


def build_diloco_1bit(params: Iterable, cfg: Mapping[str, Any]) -> DiLoCo1bit:
    """The registry's builder, from the ``optim`` node (conf/optim/diloco_1bit.yaml)."""
    return DiLoCo1bit(params, **diloco_arguments(cfg), seed=int(cfg.get("seed", 0)))
