"""``make clean-failed``: the failed runs under the runs directory, listed, and removed only when asked.

    python -m birder_repro.report.clean_failed [--runs DIR]          # list them; nothing is removed
    python -m birder_repro.report.clean_failed [--runs DIR] --yes    # list them, then remove their directories

A failed run (``status: failed`` in its record: a run refused before it started, such as ``train.steps=ten``, or
one whose workers failed) is listed among the runs ``make tables`` leaves out, every time, until its directory
goes. A failed run with a complete checkpoint is kept and listed apart: ``train.resume=auto`` (or running its
command again in its directory) continues it. Only directories inside the runs directory are removed, never the
runs directory itself; a day's directory (``runs/<date>/``) left empty goes with its last run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from birder_repro.run.directory import RunDir
from birder_repro.run.record import find_records, read_record, runs_root

__all__ = ["FailedRun", "failed_runs", "remove", "main"]


@dataclass(frozen=True)
class FailedRun:
    run_dir: Path
    error: str
    resumable: bool  # a complete checkpoint: train.resume=auto continues it, so it is kept


def failed_runs(root: Path) -> list[FailedRun]:
    """Every run under ``root`` whose record says ``failed``, oldest directory name first."""
    root = Path(root).resolve()
    found = []
    for path in find_records(root):
        run_dir = path.parent.resolve()
        rec = read_record(run_dir)
        if not rec or rec.get("status") != "failed" or run_dir == root or root not in run_dir.parents:
            continue
        error = " ".join(str(rec.get("error") or "no error recorded").split())
        found.append(FailedRun(run_dir, error, RunDir(run_dir).newest_checkpoint() is not None))
    return found


def remove(runs: Sequence[FailedRun], root: Path) -> int:
    """Remove the directories of ``runs`` that are not resumable, and any parent left empty below ``root``;
    return how many run directories went."""
    root, removed = Path(root).resolve(), 0
    for run in runs:
        if run.resumable:
            continue
        shutil.rmtree(run.run_dir)
        removed += 1
        parent = run.run_dir.parent
        while parent != root and root in parent.parents and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return removed


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m birder_repro.report.clean_failed",
        description="List the failed runs under the runs directory (make tables lists them among the runs left "
        "out); --yes removes their directories. A failed run with a complete checkpoint is kept.",
    )
    parser.add_argument("--runs", metavar="DIR", help="the runs directory (default: $BIRDER_RUNS, else runs/)")
    parser.add_argument("--yes", action="store_true", help="remove the directories listed (default: list only)")
    args = parser.parse_args(argv)
    root = runs_root(args.runs)
    runs = failed_runs(root)
    gone, kept = [r for r in runs if not r.resumable], [r for r in runs if r.resumable]
    print(f"failed runs under {_shown(Path(root).resolve())}/: {len(gone)}")
    for run in gone:
        print(f"  {_shown(run.run_dir)}: {run.error}")
    if kept:
        print(f"kept, with a complete checkpoint (train.resume=auto continues them): {len(kept)}")
        for run in kept:
            print(f"  {_shown(run.run_dir)}: {run.error}")
    if not gone:
        return 0
    if not args.yes:
        print(f"nothing removed: `make clean-failed ARGS=--yes` removes the {len(gone)} directories above")
        return 0
    print(f"removed {remove(runs, root)} run directories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
