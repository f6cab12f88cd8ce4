"""A run directory's checkpoints by name: where each step's lives and which are complete, without torch.

``run_dir/checkpoints/step-000040/`` holds one checkpointed step; it is complete once ``COMPLETE`` and
``manifest.json`` are both there (birder_repro.train.checkpoint writes them last). The run directory
(birder_repro.run.directory), the report's ``make clean-failed`` and the checkpoint writer all ask this module,
so that which checkpoint is "the newest complete one" is answered one way, and the CLI need not import torch to
answer it.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["CHECKPOINTS", "COMPLETE", "MANIFEST", "STEP_DIR", "step_dir", "is_complete", "complete_checkpoints"]

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(run_dir, step: int) -> Path:
    """Where step ``step``'s checkpoint of ``run_dir`` lives."""
    return Path(run_dir) / CHECKPOINTS / f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    """Whether the step directory ``path`` is a complete checkpoint (its marker and manifest written)."""
    return (path / COMPLETE).is_file() and (path / MANIFEST).is_file()


def complete_checkpoints(root) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``root`` (a ``checkpoints/`` dir), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)
