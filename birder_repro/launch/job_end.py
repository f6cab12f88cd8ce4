"""The ends of a SLURM job's attempt: the run's summary into the job's output file, and whether to requeue.

    python -m birder_repro.launch.job_end RUN_DIR --attempt-start
    python -m birder_repro.launch.job_end RUN_DIR --exit-code N --since-step S --started T [--stopped USR1|TERM]

The batch script of ``launcher=slurm`` (birder_repro.launch.slurm) runs the first form before srun: it prints
the step of the run directory's newest complete checkpoint (0: none) and the time, which the second form gets
back after srun with srun's exit code and the signal that stopped the batch shell, if any. The second form ends
the attempt as the CLI ends a local run (birder_repro.run.finish.finish_run): a completed run's summary; an
interrupted one's record and the command that resumes it; a failed one's line, written into its record. It exits
with :data:`REQUEUE` where the shell was stopped, the run is interrupted, and a complete checkpoint newer than
the attempt's start exists: a requeued attempt would go on from there, not start where this one did.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from birder_repro.launch.ending import teller
from birder_repro.run import record
from birder_repro.run.directory import RunDir
from birder_repro.run.finish import finish_run

__all__ = ["REQUEUE", "newest_step", "end_of_attempt", "main"]

REQUEUE = 75  # sysexits.h EX_TEMPFAIL: stopped, and resumable
STOPPED_CODE = 143  # what the CLI reports for workers it stopped with SIGTERM (birder_repro.launch.process)


def newest_step(run_dir: Path) -> int:
    """The step of the run directory's newest complete checkpoint (0: none)."""
    return RunDir(run_dir).newest_step()


def end_of_attempt(run_dir: Path, code: int, started: str, stopped: str = "", since: int = 0) -> int:
    """Print the attempt's end as the CLI does; return :data:`REQUEUE`, or the CLI's exit code."""
    cfg = record.load_run_config(run_dir)
    code = finish_run(  # the one place a run's end is told, the CLI's too
        cfg,
        run_dir,
        STOPPED_CODE if stopped else code,
        started,
        teller(cfg),
        command_line=record.read_command(run_dir) or "",
    )
    if not stopped or (RunDir(run_dir).read() or {}).get("status") != "interrupted":
        return code  # it ended (completed, failed) before the stop reached it
    newest = newest_step(run_dir)
    if newest > since:
        return REQUEUE
    print(
        f"[birder-repro] not requeued: no complete checkpoint newer than this attempt's start (step {since}), "
        "so the next attempt would start where this one did; set train.checkpoint_on_stop=true or "
        "train.checkpoint_every=<steps>",
        file=sys.stderr,
        flush=True,
    )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.launch.job_end", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--attempt-start", action="store_true", help="print the newest complete checkpoint's step and the time"
    )
    parser.add_argument("--exit-code", type=int, default=0, help="srun's exit code")
    parser.add_argument("--stopped", default="", help="the signal that stopped the batch shell (USR1, TERM)")
    parser.add_argument("--since-step", type=int, default=0, help="the newest step when the attempt started")
    parser.add_argument("--started", default=None, help="when the attempt started (--attempt-start's time)")
    args = parser.parse_args(argv)
    if args.attempt_start:
        print(newest_step(args.run_dir), record.now())
        return 0
    return end_of_attempt(args.run_dir, args.exit_code, args.started or record.now(), args.stopped, args.since_step)


if __name__ == "__main__":
    sys.exit(main())
