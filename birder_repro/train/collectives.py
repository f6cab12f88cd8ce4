"""The few collectives the loop itself makes (sums of its figures, a barrier, a broadcast); each is the
identity without a process group, so that the loop also runs as one plain process."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["allreduce_sum", "barrier", "broadcast_from_rank0"]


def _collective_device(device: torch.device) -> torch.device:
    return device if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu")


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def allreduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum ``values`` element-wise over all processes (positional: every rank passes the same layout)."""
    if not _distributed() or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if _distributed():
        dist.barrier()


def broadcast_from_rank0(values: list[float], device: torch.device) -> list[float]:
    if not _distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    dist.broadcast(t, src=0)
    return t.tolist()
