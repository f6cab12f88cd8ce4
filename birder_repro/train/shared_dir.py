"""The check that every node sees the run directory: collective, at each worker's start.

The shared file system is a fact to check, not to assume. The first process of every node writes a marker into
``nodes/`` (birder_repro.run.directory.RunDir.write_marker); after a barrier rank 0 must see all of them, else
every rank raises :class:`~birder_repro.run.directory.RunDirNotShared` with the same line. A fresh token per
start, so that markers of an earlier attempt never count.
"""

from __future__ import annotations

import random
from pathlib import Path

from birder_repro.run.directory import RunDir, RunDirNotShared
from birder_repro.train.collectives import allreduce_sum, barrier, broadcast_from_rank0

__all__ = ["check_shared"]


def check_shared(run_dir: Path, rank: int, local_rank: int, local_world: int, world: int, device) -> None:
    """Every node's first process writes a marker; rank 0 must see them all, else every rank raises
    :class:`RunDirNotShared` with the same line (module docstring)."""
    run = RunDir(run_dir)
    nodes = max(1, world // max(1, local_world))
    token = int(broadcast_from_rank0([float(random.getrandbits(48)) if rank == 0 else 0.0], device)[0])
    if local_rank == 0:
        run.write_marker(token, rank // max(1, local_world))
    barrier()
    missing = run.missing_nodes(token, nodes) if rank == 0 else []
    flags = allreduce_sum([1.0 if k in missing else 0.0 for k in range(nodes)], device)
    missing = [k for k, flag in enumerate(flags) if flag]
    if missing:
        raise RunDirNotShared(run.not_shared_line(missing, token))
    if rank == 0:  # seen: the markers have done their job
        run.remove_markers(token, nodes)
