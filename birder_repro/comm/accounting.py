"""Bytes a process sends in each collective, and the step-time statistics every hook keeps.

Per-process payload bytes of the standard algorithms (Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005): a ring all-reduce of B bytes over g processes
sends 2(g-1)/g * B, a ring reduce-scatter or all-gather (g-1)/g of its output, an all-to-all (g-1)/g of its
input. Headers and padding of the transport are not counted here; the emulated cluster's kernel counters
see them.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


def allreduce_bytes(nbytes: int, group_size: int) -> float:
    return 2.0 * (group_size - 1) / group_size * nbytes if group_size > 1 else 0.0


def reduce_scatter_bytes(input_nbytes: int, group_size: int) -> float:
    return (group_size - 1) / group_size * input_nbytes if group_size > 1 else 0.0


def all_gather_bytes(input_nbytes: int, group_size: int) -> float:
    """Bytes sent for an all-gather whose per-process contribution is ``input_nbytes``."""
    return (group_size - 1) * input_nbytes if group_size > 1 else 0.0


def all_to_all_bytes(input_nbytes: int, group_size: int) -> float:
    return (group_size - 1) / group_size * input_nbytes if group_size > 1 else 0.0


def flat_allreduce_split(nbytes: int, world_size: int, gpus_per_node: int) -> tuple[float, float]:
    """(intra-node, inter-node) bytes per process of one flat ring all-reduce over the whole world.

    A ring ordered by rank leaves each node over one link, so of the 2(N-1)/N * B bytes every process sends,
    a node sends that amount once across nodes; averaged over its m processes, 1/m of each process's bytes
    cross nodes. With one node nothing does.
    """
    total = allreduce_bytes(nbytes, world_size)
    nodes = world_size // gpus_per_node
    if nodes <= 1:
        return total, 0.0
    inter = total / gpus_per_node
    return total - inter, inter


class CommStats:
    """Counters every communication scheme keeps on each rank: payload bytes sent and seconds spent.

    ``intra_node_bytes`` / ``inter_node_bytes`` count what this rank sent in collectives within its node and
    across nodes; ``compress_seconds`` the time in quantize / pack / unpack work, ``comm_seconds`` the time
    waiting for collectives. All four only grow; the training loop reads differences per step.
    """

    __slots__ = ("intra_node_bytes", "inter_node_bytes", "compress_seconds", "comm_seconds", "calls")

    def __init__(self) -> None:
        self.intra_node_bytes = 0.0
        self.inter_node_bytes = 0.0
        self.compress_seconds = 0.0
        self.comm_seconds = 0.0
        self.calls = 0

    def snapshot(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in CommStats.__slots__}

    @contextmanager
    def timing(self, what: str, sync_device=None) -> Iterator[None]:
        """Add the wall time of the block to ``compress_seconds`` or ``comm_seconds``.

        On a GPU the block's kernels are asynchronous: pass the device to synchronize it on both sides, so
        that the time is the kernels' and not their launch (this costs overlap; timing is opt-in there).
        """
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
            elif what == "comm":
                self.comm_seconds += dt
            else:
                raise ValueError(f"unknown timing kind {what!r}")


def _sync(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(device)
