"""Which checkpoint a run starts from (``train.resume``): the newest complete one of its own run directory that
every rank has, or the one a path names; :class:`CheckpointError` for a path that names none.

The rules (:func:`choose_resume`):

    ``train.resume=null``     a fresh run; but a worker torchrun restarted (``train.max_restarts``), or one of a
                              requeued SLURM job (``SLURM_RESTART_COUNT`` > 0), takes the newest complete
                              checkpoint of its own run directory, if any;
    ``train.resume=auto``     the newest complete checkpoint of this run directory (a fresh start if none);
    ``train.resume=<path>``   a step directory (``.../checkpoints/step-000040``), or a run directory or its
                              ``checkpoints/`` (its newest complete one); after a restart, this run's own newer
                              checkpoints come first.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from birder_repro.run.checkpoint_dirs import CHECKPOINTS, COMPLETE, MANIFEST, complete_checkpoints, step_dir
from birder_repro.run.checkpoint_dirs import STEP_DIR as _STEP_DIR
from birder_repro.run.checkpoint_dirs import is_complete as _is_complete
from birder_repro.run.directory import RunDir
from birder_repro.train.checkpoint_files import CheckpointError

__all__ = ["resolve_path", "choose_resume"]


def _newest_in(path: Path) -> Path | None:
    for root in (path, path / CHECKPOINTS):
        found = complete_checkpoints(root)
        if found:
            return found[-1][1]
    return None


def resolve_path(spec: str) -> Path:
    """The complete checkpoint directory ``train.resume=<spec>`` names; :class:`CheckpointError` otherwise."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise CheckpointError(f"train.resume={spec}: no such file or directory")
    if path.is_file() or (path / MANIFEST).exists() or _STEP_DIR.match(path.name):
        step = path if path.is_dir() else path.parent
        if not _is_complete(step):
            raise CheckpointError(
                f"train.resume={spec}: {step} is not a complete checkpoint (no {COMPLETE} "
                f"marker or {MANIFEST}: its writing was interrupted, or it is not one)"
            )
        return step
    newest = _newest_in(path)
    if newest is None:
        raise CheckpointError(
            f"train.resume={spec}: no complete checkpoint (checkpoints/step-*/ with {COMPLETE}) in this directory"
        )
    return newest


def _agreed_newest(run_dir, device: torch.device) -> Path | None:
    """The newest complete checkpoint of this run directory that every rank has (each may have its own disk)."""
    found = RunDir(run_dir).complete_checkpoints()
    mine = found[-1][0] if found else -1
    step = mine
    if dist.is_initialized() and dist.get_world_size() > 1:
        device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([mine], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        step = int(t.item())
    if step < 0:
        return None
    where = step_dir(run_dir, step)
    if not _is_complete(where):
        raise CheckpointError(
            f"the ranks' newest common checkpoint is of step {step}, but {where} is not complete on this machine"
        )
    return where


def choose_resume(spec: str | None, run_dir, restarted: bool, device: torch.device) -> Path | None:
    """The checkpoint directory this run starts from, or None for a fresh start (rules in the module doc).
    Collective when the run's own directory is searched."""
    spec = None if spec in (None, "", "null") else str(spec)
    restarted = restarted or os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")  # a requeued SLURM job
    if restarted or spec == "auto":
        own = _agreed_newest(run_dir, device)
        if own is not None:
            return own
    if spec is None or spec == "auto":
        return None
    return resolve_path(spec)
