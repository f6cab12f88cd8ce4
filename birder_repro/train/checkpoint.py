"""Checkpoints (every ``train.checkpoint_every`` steps) and resuming from one (``train.resume``).

``run_dir/checkpoint.pt`` (rank 0): step and the model; ``run_dir/checkpoint_rank{r}.pt`` (every rank):
optimizer state, the hook state and the RNG states. The optimizer and the hook are saved per rank because
their state is: Birder's hook keeps the shards of m, b, e its rank owns, 1-bit Adam a per-process momentum.
The shards are written first and the rank-0 file last, after a barrier, so a ``checkpoint.pt`` is always
complete. A resumed run needs the same number of processes; its data position follows from the step
(:mod:`birder_repro.train.data`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.train.collectives import barrier, broadcast_from_rank0
from birder_repro.train.rng import rng_state, set_rng_state

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint"]

CHECKPOINT = "checkpoint.pt"


def _shard_path(main: Path, rank: int) -> Path:
    return main.with_name(f"checkpoint_rank{rank}.pt")


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a crash while writing never leaves a half checkpoint under the real name


def save_checkpoint(run_dir, step: int, samples: float, model, optimizer, comm, rank: int, world_size: int,
                    device: torch.device) -> Path:
    """Every rank writes its shard, then (after a barrier) rank 0 writes ``checkpoint.pt``. Collective."""
    main = Path(run_dir) / CHECKPOINT
    shard = {"step": step, "world_size": world_size, "samples": samples, "optimizer": optimizer.state_dict(),
             "comm": comm.state_dict() if hasattr(comm, "state_dict") else None, "rng": rng_state(device)}
    _atomic_save(shard, _shard_path(main, rank))
    barrier()
    if rank == 0:
        module = getattr(model, "module", model)
        _atomic_save({"step": step, "world_size": world_size, "model": module.state_dict()}, main)
    return main


def load_checkpoint(path, model, optimizer, comm, rank: int, world_size: int,
                    device: torch.device) -> tuple[int, float]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, this process's samples so far). Collective.

    Rank 0 reads the model and broadcasts it, so only the shards need to be on every node's disk.
    """
    main = Path(path)
    main = main / CHECKPOINT if main.is_dir() else main
    # Our own files (weights_only=False: they hold RNG states). On CUDA tensors go back where they were saved
    # (this rank's device); on CPU everything loads on the CPU.
    where = None if device.type == "cuda" else "cpu"
    shard = torch.load(_shard_path(main, rank), map_location=where, weights_only=False)
    if shard["world_size"] != world_size:
        raise ValueError(f"{main} was saved by {shard['world_size']} processes; this run has {world_size}: "
                         "the optimizer and hook states are sharded per process")
    module = getattr(model, "module", model)
    if rank == 0:
        saved = torch.load(main, map_location="cpu", weights_only=False)
        module.load_state_dict(saved["model"])
        step = saved["step"]
    else:
        step = shard["step"]
    if dist.is_initialized() and world_size > 1:
        step = int(broadcast_from_rank0([float(step)], device)[0])
        for t in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(t.data, src=0)
    if shard["step"] != step:
        raise ValueError(f"{_shard_path(main, rank)} is of step {shard['step']}, {main} of step {step}")
    optimizer.load_state_dict(shard["optimizer"])
    if shard["comm"] is not None and hasattr(comm, "load_state_dict"):
        comm.load_state_dict(shard["comm"])
    set_rng_state(shard["rng"], device)
    return int(step), float(shard["samples"])
