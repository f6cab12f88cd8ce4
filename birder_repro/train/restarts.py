"""Restarts after a failure, counted for the record, and the test-only fault injection that provokes them.

With ``train.max_restarts=N`` torchrun (``--max-restarts``) starts every worker again after one fails, at most
N times; it tells the new workers their attempt in ``TORCHELASTIC_RESTART_COUNT``. A restarted run resumes from
the newest complete checkpoint of its run directory (:func:`birder_repro.train.checkpoint.choose_resume`), so
the steps after that checkpoint are trained again: ``steps_redone`` in the record. Rank 0 keeps the step it has
reached in ``run_dir/progress.json`` (rewritten after every step, a few bytes) and, on a restart, appends the
attempt to ``run_dir/restarts.json``.

Fault injection (tests only): ``BIRDER_TEST_FAULT=kill:<rank>:<step>`` makes that rank SIGKILL itself before
step ``<step>`` (1-based) on the first attempt only; ``hang:<rank>:<step>`` makes it sleep instead (a hung
peer, for ``train.timeout_s``); ``raise:<rank>:<step>`` makes it raise :class:`InjectedFault` (any exception
inside training, for the one-line failure report of birder_repro.failures).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["RESTART_ENV", "FAULT_ENV", "restart_count", "Attempts", "inject_fault", "InjectedFault"]

RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
FAULT_ENV = "BIRDER_TEST_FAULT"
PROGRESS = "progress.json"
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
        self._fd: Optional[int] = None

    def started(self, resumed_from: int) -> None:
        """At the start of an attempt: record what the previous one reached (a restart only)."""
        if not (self.enabled and self.attempt):
            return
        reached = self._reached()
        self.history.append({"attempt": self.attempt, "reached": reached, "resumed_from": resumed_from,
                             "steps_redone": max(0, reached - resumed_from)})
        tmp = self.run_dir / (RESTARTS + ".tmp")
        tmp.write_text(json.dumps({"attempts": self.history}, indent=1))
        os.replace(tmp, self.run_dir / RESTARTS)

    def _reached(self) -> int:
        try:
            return int(json.loads((self.run_dir / PROGRESS).read_text())["step"])
        except (OSError, ValueError, KeyError):
            return 0

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


def inject_fault(rank: int, next_step: int, env: Mapping[str, str] = os.environ) -> None:
    """Tests only (module doc): kill or hang this rank before step ``next_step`` (1-based), first attempt only."""
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
    else:
        raise ValueError(f"{FAULT_ENV}={spec!r}: use kill:<rank>:<step>, hang:<rank>:<step> or raise:<rank>:<step>")


class InjectedFault(RuntimeError):
    """The exception ``BIRDER_TEST_FAULT=raise:<rank>:<step>`` raises (tests only)."""
