"""Restarts after a failure, counted for the record; the attempts of a run resumed in its own directory; and the
test-only fault injection that provokes them.

With ``train.max_restarts=N`` torchrun (``--max-restarts``) starts every worker again after one fails, at most
N times; it tells the new workers their attempt in ``TORCHELASTIC_RESTART_COUNT``. A restarted run resumes from
the newest complete checkpoint of its run directory (:func:`birder_repro.train.resume_point.choose_resume`), so
the steps after that checkpoint are trained again: ``steps_redone`` in the record. Rank 0 keeps the step it has
reached in ``run_dir/progress.json`` (rewritten after every step, a few bytes) and, on a restart, appends the
attempt to ``run_dir/restarts.json``.

Attempts: every launch of a run directory (the CLI's, ``BIRDER_LAUNCH``; torchrun's restarts within it are
one attempt) is one entry of the record's ``attempts``. Rank 0 takes the earlier entries from the record already
in the directory and adds its own when it writes the record (birder_repro.run.directory: ``previous_attempts``,
``attempt_entry``).

Fault injection (tests only): ``BIRDER_TEST_FAULT=kill:<rank>:<step>`` makes that rank SIGKILL itself before
step ``<step>`` (1-based) on the first attempt only; ``hang:<rank>:<step>`` makes it sleep instead (a hung
peer, for ``train.timeout_s``); ``raise:<rank>:<step>`` makes it raise :class:`InjectedFault` (any exception
inside training, for the one-line failure report of birder_repro.run.failures); ``wait:<rank>:<step>`` makes it
wait before that step until a stop signal comes (at most two minutes), so that a test stops the run there;
``slow:<rank>:<step>`` makes it sleep :data:`SLOW_S` there once (a straggler, for the training clock).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from birder_repro.run.digest import LAUNCH_ENV
from birder_repro.run.directory import PROGRESS, RunDir
from birder_repro.train.stop import requested

__all__ = [
    "RESTART_ENV",
    "FAULT_ENV",
    "LAUNCH_ENV",
    "restart_count",
    "Attempts",
    "inject_fault",
    "InjectedFault",
]

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"

FAULT_ENV = "BIRDER_TEST_FAULT"
RESTARTS = "restarts.json"


def restart_count(env: Mapping[str, str] = os.environ) -> int:
    """How many times torchrun has restarted this run's workers (0 on the first attempt)."""
    try:
        return int(env.get(RESTART_ENV, "0") or 0)
    except ValueError:
        return 0


class Attempts:
    """Rank 0's account of the run's attempts: the step reached, and what each restart trained again."""

    def __init__(self, run_dir, enabled: bool, env: Mapping[str, str] = os.environ):
        self.run_dir, self.enabled, self.attempt = Path(run_dir), enabled, restart_count(env)
        self.history: list[dict] = []
        if enabled and self.attempt and (self.run_dir / RESTARTS).is_file():
            self.history = json.loads((self.run_dir / RESTARTS).read_text()).get("attempts", [])
        self._fd: int | None = None

    def started(self, resumed_from: int) -> None:
        """At the start of an attempt: record what the previous one reached (a restart only)."""
        if not (self.enabled and self.attempt):
            return
        reached = self._reached()
        self.history.append(
            {
                "attempt": self.attempt,
                "reached": reached,
                "resumed_from": resumed_from,
                "steps_redone": max(0, reached - resumed_from),
            }
        )
        tmp = self.run_dir / (RESTARTS + ".tmp")
        tmp.write_text(json.dumps({"attempts": self.history}, indent=1))
        os.replace(tmp, self.run_dir / RESTARTS)

    def _reached(self) -> int:
        return RunDir(self.run_dir).reached_step() or 0

    def reached(self, step: int) -> None:
        """After every step (rank 0): the step reached, written in place (fixed width, no new file)."""
        if not self.enabled:
            return
        if self._fd is None:
            self._fd = os.open(self.run_dir / PROGRESS, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._fd, f'{{"step": {step:12d}}}\n'.encode(), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def figures(self) -> dict:
        """The record's ``restarts`` and ``steps_redone``."""
        return {"restarts": self.attempt, "steps_redone": sum(a["steps_redone"] for a in self.history)}


SLOW_S = 1.0  # BIRDER_TEST_FAULT=slow:<rank>:<step>: how long that rank sleeps before that step


def inject_fault(rank: int, next_step: int, env: Mapping[str, str] = os.environ) -> None:
    """Tests only (module doc): kill, hang or slow this rank before step ``next_step`` (1-based), first attempt
    only."""
    spec = env.get(FAULT_ENV)
    if not spec or restart_count(env):
        return
    kind, who, when = spec.split(":")
    if int(who) != rank or int(when) != next_step:
        return
    print(f"[birder-repro] {FAULT_ENV}: rank {rank} {kind} before step {next_step}", flush=True)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "raise":
        raise InjectedFault(f"{FAULT_ENV}={spec}: rank {rank} raised before step {next_step}")
    elif kind == "slow":  # a straggler: this rank's loop falls SLOW_S behind the others once
        time.sleep(SLOW_S)
    elif kind == "wait":
        for _ in range(2400):
            if requested():
                return
            time.sleep(0.05)
    else:
        raise ValueError(f"{FAULT_ENV}={spec!r}: use kill:, hang:, raise:, slow: or wait:<rank>:<step>")


class InjectedFault(RuntimeError):
    """The exception ``BIRDER_TEST_FAULT=raise:<rank>:<step>`` raises (tests only)."""
