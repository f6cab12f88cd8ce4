"""Collectives under the names the installed torch prefers, and the future of a hook that is already done.

torch 2.14 renamed ``all_gather_into_tensor`` to ``all_gather_single`` and ``reduce_scatter_tensor`` to
``reduce_scatter_single`` (same arguments) and warns on the old names; older releases only have the old ones.
"""

from collections.abc import Iterable

import torch
import torch.distributed as dist

all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def wait_all(works: Iterable[dist.Work | None]) -> None:
    """Wait for the collectives launched with ``async_op=True`` (torch types their handles as optional)."""
    for work in works:
        if work is None:
            raise RuntimeError("an asynchronous collective returned no handle to wait on")
        work.wait()


def completed_future(result: torch.Tensor) -> torch.futures.Future:
    """What a DDP hook that ran its collectives synchronously returns: a future already holding ``result``."""
    fut: torch.futures.Future = torch.futures.Future(devices=[result.device] if result.is_cuda else None)
    fut.set_result(result)
    return fut
