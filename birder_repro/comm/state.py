"""What the training loop reads from every communication hook's state: one small interface.

Every scheme's state (:mod:`~birder_repro.comm.allreduce`, :mod:`~birder_repro.comm.powersgd`,
:mod:`~birder_repro.comm.birder`, :mod:`~birder_repro.comm.onebit`) subclasses :class:`CommState`:

- the counters: payload bytes this rank sent within its node and across nodes, seconds of compression work and
  of waiting on collectives, bucket calls (all only grow; the loop reads their differences per step);
- ``stage(step)``: the name of the stage the step about to run is in (``warmup`` / ``compression`` for the
  schemes with two stages, for throughput per stage in the run record), None for single-stage schemes;
- ``grad_holds()``: what the parameters' ``.grad`` hold once this step's hook has run and before
  ``optimizer.step()``: :data:`GRADIENT` (averaged gradients, which clipping may rescale), or something the
  hook computed instead (:data:`UPDATE`: Birder's +-1; :data:`MOMENTUM`: 1-bit Adam's averaged momentum).

The loop asks these of the hook state and never of the optimizer (``birder_repro.train``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

__all__ = ["CommState", "GRADIENT", "UPDATE", "MOMENTUM"]

GRADIENT = "gradient"  # the average of the processes' gradients (exact, or approximated as by fp16 or PowerSGD)
UPDATE = "update"  # the update itself, e.g. Birder's u_bar in {-1, +1}
MOMENTUM = "momentum"  # an averaged momentum, e.g. 1-bit Adam's in its compression stage


class CommState:
    """Counters, stage and the meaning of ``.grad``: what every scheme's state has, on each rank.

    ``intra_node_bytes`` / ``inter_node_bytes`` count what this rank sent in collectives within its node and
    across nodes; ``compress_seconds`` the time in quantize / pack / unpack work, ``comm_seconds`` the time
    waiting for collectives. Subclasses override :meth:`stage` and :meth:`grad_holds` where they differ from a
    plain all-reduce (one stage, gradients).
    """

    __slots__ = ("intra_node_bytes", "inter_node_bytes", "compress_seconds", "comm_seconds", "calls")
    COUNTERS = __slots__

    def __init__(self) -> None:
        self.intra_node_bytes = 0.0
        self.inter_node_bytes = 0.0
        self.compress_seconds = 0.0
        self.comm_seconds = 0.0
        self.calls = 0

    # ------------------------------------------------------------------------------------ the interface
    def stage(self, step: int) -> Optional[str]:
        """The stage of step ``step`` (0-based, about to run); None: the scheme has a single stage."""
        return None

    def grad_holds(self) -> str:
        """What ``.grad`` holds after this step's hook: :data:`GRADIENT`, :data:`UPDATE` or :data:`MOMENTUM`."""
        return GRADIENT

    # ------------------------------------------------------------------------------------- the counters
    def snapshot(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in CommState.COUNTERS}

    def load_counters(self, snapshot: dict[str, float]) -> None:
        """Continue from a :meth:`snapshot` (a checkpoint's), keeping each counter's type."""
        for key, value in snapshot.items():
            setattr(self, key, type(getattr(self, key))(value))

    def add_bytes(self, intra: float, inter: float) -> None:
        self.intra_node_bytes += intra
        self.inter_node_bytes += inter

    @contextmanager
    def timing(self, what: str, sync_device=None) -> Iterator[None]:
        """Add the wall time of the block to ``compress_seconds`` or ``comm_seconds``.

        On a GPU the block's kernels are asynchronous: pass the device to synchronize it on both sides, so
        that the time is the kernels' and not their launch (this costs overlap; timing is opt-in there).
        """
        if what not in ("compress", "comm"):
            raise ValueError(f"unknown timing kind {what!r}")
        if sync_device is not None:
            _sync(sync_device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if sync_device is not None:
                _sync(sync_device)
            dt = time.perf_counter() - t0
            if what == "compress":
                self.compress_seconds += dt
            else:
                self.comm_seconds += dt


def _sync(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)
