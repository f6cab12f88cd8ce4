"""The end of a SLURM job's attempt: the run's summary into the job's output file, and whether to requeue.

    python -m birder_repro.launch.summary_cli RUN_DIR --newest-step
    python -m birder_repro.launch.summary_cli RUN_DIR --exit-code N [--stopped USR1|TERM] [--since-step S]

The batch script of ``launcher=slurm`` (birder_repro.launch.slurm) runs the first form before srun (the step of
the run directory's newest complete checkpoint, 0 for none) and the second after it, with srun's exit code and
the signal the batch shell was stopped by, if any. A run that ended prints what the CLI prints at the end of a
local run (its summary; or, failed, its one line, written into its record as the CLI does). A run stopped by
the signal prints where it stopped and exits with :data:`REQUEUE` when a complete checkpoint newer than the
attempt's start exists (``--since-step``), so that the next attempt would not start where this one did.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from birder_repro import record

__all__ = ["REQUEUE", "newest_step", "end_of_attempt", "main"]

REQUEUE = 75  # sysexits.h EX_TEMPFAIL: stopped, and resumable


def newest_step(run_dir: Path) -> int:
    """The step of the run directory's newest complete checkpoint (0: none)."""
    from birder_repro.train.checkpoint import CHECKPOINTS, complete_checkpoints

    found = complete_checkpoints(Path(run_dir) / CHECKPOINTS)
    return found[-1][0] if found else 0


def end_of_attempt(run_dir: Path, code: int, stopped: str = "", since: int = 0) -> int:
    """Print the attempt's end; return 0 (completed), :data:`REQUEUE` (stopped, resumable) or the failure's code."""
    rec = record.read_record(run_dir) or {}
    status = rec.get("status")
    if stopped and status in (None, "interrupted"):
        return _stopped(run_dir, rec, stopped, since)
    if status == "interrupted":  # stopped by a signal that did not reach this shell (SLURM at the time limit)
        print(f"[birder-repro] {rec.get('error') or 'the run was interrupted'}", flush=True)
        return code or 1
    return _finish(run_dir, rec, code)


def _stopped(run_dir: Path, rec: dict, stopped: str, since: int) -> int:
    newest = newest_step(run_dir)
    where = f"record: {run_dir / record.RECORD_FILE}" if rec else f"no {record.RECORD_FILE} (the workers were killed)"
    print(f"[birder-repro] stopped by SIG{stopped}; newest complete checkpoint: "
          f"{f'step {newest}' if newest else 'none'}; {where}", flush=True)
    if newest > since:
        return REQUEUE
    print(f"[birder-repro] no complete checkpoint newer than this attempt's start (step {since}): not requeued, it "
          "would start where this attempt did; set train.checkpoint_every=<steps> (or train.checkpoint_on_stop=true)",
          flush=True)
    return 1


def _finish(run_dir: Path, rec: dict, code: int) -> int:
    """What the CLI does after a local run's workers (birder_repro.cli): the summary, or the failure's line."""
    from birder_repro.cli import _finish as finish_like_the_cli

    cfg = record.load_run_config(run_dir)
    return finish_like_the_cli(cfg, run_dir, code, rec.get("started") or record.now())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.launch.summary_cli", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--newest-step", action="store_true", help="print the newest complete checkpoint's step")
    parser.add_argument("--exit-code", type=int, default=0, help="srun's exit code")
    parser.add_argument("--stopped", default="", help="the signal that stopped the batch shell (USR1, TERM)")
    parser.add_argument("--since-step", type=int, default=0, help="the newest step when the attempt started")
    args = parser.parse_args(argv)
    if args.newest_step:
        print(newest_step(args.run_dir))
        return 0
    return end_of_attempt(args.run_dir, args.exit_code, args.stopped, args.since_step)


if __name__ == "__main__":
    sys.exit(main())
