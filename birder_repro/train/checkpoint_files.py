"""A checkpoint's files: the error every checkpoint problem raises, a rank's shard name, and loading one file.

Below both :mod:`birder_repro.train.checkpoint` (saving, choosing, loading a checkpoint) and
:mod:`birder_repro.train.relayout` (moving one onto another layout), which the first calls: neither imports the
other's caller. ``birder_repro.train.checkpoint`` re-exports all three.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "shard_name", "load_file"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, found, read or used by this run; the message says which and why."""


def shard_name(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def load_file(path: Path, device: torch.device, mmap: bool = False) -> Any:
    """``torch.load`` of one checkpoint file as data only (weights_only), onto ``device``; clear errors.
    ``mmap``: the tensors stay in the file, memory-mapped, until read (with ``device`` the CPU: take a part)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        return torch.load(path, map_location=device, weights_only=True, **({"mmap": True} if mmap else {}))
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path} is not a plain checkpoint: it holds something other than tensors and "
            f"plain values, which is refused (weights_only loading; {first})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - corrupt bytes fail the unpickler in any way (IndexError, KeyError, ...)
        raise CheckpointError(
            f"{path} cannot be read: truncated or corrupt ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
