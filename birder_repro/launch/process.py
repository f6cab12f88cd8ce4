"""A command to start (arguments and the environment it adds) and running it with its output streamed, with
Ctrl-C and SIGTERM passed on to it once (:class:`ForwardSignals`).

The output of the processes goes into the run directory's ``output.log`` in full, and to the terminal as it
comes until a worker fails: from there the terminal is spared the tracebacks (birder_repro.run.failures), and the
CLI ends with one line.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from birder_repro.run.failures import TerminalEcho

__all__ = ["Command", "run_streaming", "ForwardSignals", "signals_deferred"]


@dataclass(frozen=True)
class Command:
    """``argv`` to execute with ``env`` added to the caller's environment; ``note`` says where it runs."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def shell(self) -> str:
        """The command as one shell line: added variables first, then the quoted arguments."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        line = " ".join(prefix + [shlex.join(self.argv)])
        return f"{line}  # {self.note}" if self.note else line

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_streaming(command: Command, log_path: Path, stop_timeout_s: float = 30.0) -> int:
    """Run ``command``, copying its stdout and stderr to our stdout and to ``log_path``; return its exit code,
    or 128 + the number of the signal that stopped the run (130: Ctrl-C, 143: SIGTERM).

    torchrun runs in a session of its own, so that a signal reaches it exactly once, from here: Ctrl-C (the
    terminal's SIGINT to this process group) or a SIGTERM to this process is passed on to torchrun, whose agent
    passes it to its workers and SIGKILLs them after its ``--shutdown-timeout`` (``stop_timeout_s``; torch
    elastic's agent/server/api.py and multiprocessing/api.py). The workers stop after their current step,
    checkpoint and write the record; meanwhile this process keeps copying their output and waits.
    """
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command.argv,
            env=command.full_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        echo = TerminalEcho(sys.stdout)
        # once stopping, the terminal is spared torchrun's report of the signal: our own lines only
        with ForwardSignals(proc, stop_timeout_s, on_signal=echo.own_lines_only) as forward:
            try:
                _pump(proc.stdout.fileno(), log, echo)
                code = proc.wait()
            finally:
                proc.stdout.close()
    return 128 + forward.signum if forward.signum else code


class ForwardSignals:
    """While a launcher's child runs: the first SIGINT / SIGTERM / SIGHUP is passed on to it (SIGHUP as
    SIGTERM) and later ones are only acknowledged, so that this process lives to wait for the workers and to
    write and print the run's end. Should the child outlive its own grace by a minute, it is killed.
    Outside the main thread (where Python cannot take signals) it does nothing."""

    def __init__(self, proc: subprocess.Popen, grace_s: float, on_signal=None):
        self.proc, self.grace_s, self.signum, self.on_signal = proc, grace_s, 0, on_signal
        self._saved: dict = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> ForwardSignals:
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            print(
                f"[birder-repro] {name}: already stopping; the workers have {self.grace_s:g} s "
                "(train.stop_timeout_s) before torchrun kills them",
                file=sys.stderr,
                flush=True,
            )
            return
        self.signum = signum
        if self.on_signal is not None:
            self.on_signal()
        print(
            f"[birder-repro] {name}: the workers stop after their current step, save a checkpoint and write the "
            f"record (within train.stop_timeout_s={self.grace_s:g} s)",
            file=sys.stderr,
            flush=True,
        )
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
        self._timer = threading.Timer(self.grace_s + 60, self._kill)
        self._timer.daemon = True
        self._timer.start()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


@contextlib.contextmanager
def signals_deferred():
    """Ignore SIGINT / SIGTERM for the few moments a run's end is written and printed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS[:2]}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _pump(fd: int, log, echo: TerminalEcho) -> None:
    # Raw chunks to the log; the terminal gets whole lines up to a worker's failure (birder_repro.run.failures).
    while chunk := os.read(fd, 65536):
        log.write(chunk)
        log.flush()
        echo.write(chunk)
    echo.close()
