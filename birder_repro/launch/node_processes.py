"""Several commands run at once as one job (the emulated cluster's nodes): their output streamed, each line
prefixed with its command's index, the first failure's code returned, the others stopped, and SIGINT / SIGTERM
turned into an exception that unwinds the caller (so that it can remove what it built: the namespaces).

Beside :func:`birder_repro.launch.process.run_streaming` (one command, signals passed on to it, the caller waits):
here the caller is interrupted, and every node's CLI is stopped once (SIGTERM, which it passes on to its torchrun,
then SIGKILL ``stop_timeout_s`` later).
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from birder_repro.launch.process import Command
from birder_repro.run.failures import TerminalEcho

__all__ = ["STOP_GRACE_S", "STOP_TIMEOUT_S", "SIGNAL_CODES", "run_nodes", "signals_raise", "Interrupted"]

STOP_GRACE_S = 20.0  # after one node fails, how long the others get to notice before they are stopped
STOP_TIMEOUT_S = 30.0  # SIGTERM to SIGKILL of a node's CLI, beyond the workers' grace (train.stop_timeout_s)
SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's codes for a command stopped by them


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwind to the fabric's removal (BaseException: no handler swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalGuard:
    """While armed, the first SIGINT or SIGTERM raises :class:`Interrupted`; any other is ignored."""

    def __init__(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def handler(self, signum, _frame) -> None:
        if self.armed:
            self.armed = False
            raise Interrupted(signum)


@contextmanager
def signals_raise() -> Iterator[_SignalGuard]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` (Python's default for SIGTERM is to die on the
    spot, which would leave the namespaces behind); the previous handlers come back afterwards."""
    guard = _SignalGuard()
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield guard
        return
    previous = {sig: signal.signal(sig, guard.handler) for sig in SIGNAL_CODES}
    try:
        yield guard
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_nodes(
    cmds: Sequence[Command], log_path: Path, grace_s: float = STOP_GRACE_S, stop_timeout_s: float = STOP_TIMEOUT_S
) -> int:
    """Start every node's command at once, stream their output (prefixed by node) to stdout and ``log_path``.

    Returns 0, or the exit code of the first node that failed. When one fails the others may wait on it for
    ever (gloo's timeout is 30 minutes): they get ``grace_s`` to end, then are stopped. On an exception
    (an interruption) every node is stopped before it propagates.
    """
    # each node in a session of its own: a Ctrl-C at the terminal reaches this launcher only, which stops each
    # node once, through its CLI
    procs = [
        subprocess.Popen(
            c.argv,
            env=c.full_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        for c in cmds
    ]
    lock = threading.Lock()
    first = TerminalEcho(sys.stdout)  # one a node, muted together: a failure on any node spares the terminal
    echoes = [first] + [TerminalEcho(sys.stdout, shared=first) for _ in procs[1:]]
    with open(log_path, "ab") as log:
        pumps = [
            threading.Thread(target=_pump, args=(p.stdout, log, f"[node {k}] ".encode(), lock, echoes[k]), daemon=True)
            for k, p in enumerate(procs)
        ]
        for t in pumps:
            t.start()
        try:
            first_failure = _wait_all(procs, grace_s, stop_timeout_s)
        except BaseException:
            _stop_all(procs, stop_timeout_s)
            raise
        finally:
            for t in pumps:
                t.join(timeout=5)
    return first_failure


def _wait_all(procs: Sequence[subprocess.Popen], grace_s: float, stop_timeout_s: float) -> int:
    first_failure, failed_at = 0, None
    while None in [p.poll() for p in procs]:  # a list, not any(): every process must be polled
        for p in procs:
            if p.returncode not in (None, 0) and failed_at is None:
                first_failure, failed_at = p.returncode, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            _stop_all(procs, stop_timeout_s)
        time.sleep(0.1)
    failures = [p.returncode for p in procs if p.returncode != 0]
    return first_failure or (failures[0] if failures else 0)


def _stop_all(procs: Sequence[subprocess.Popen], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to every node's CLI, which passes it on to its torchrun and waits for the workers (they stop after
    their step and checkpoint, birder_repro.launch.process); SIGKILL to a CLI still running ``timeout_s`` later."""
    for stop in ("terminate", "kill"):
        running = [p for p in procs if p.poll() is None]
        for p in running:
            getattr(p, stop)()
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.1)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG (1): should this launcher die without cleaning up (SIGKILL), the kernel sends each
    # node's CLI SIGTERM, which it passes on to its torchrun, so no worker outlives it; the next run then
    # removes the stale namespaces.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _pump(stream, log, prefix: bytes, lock: threading.Lock, echo: TerminalEcho) -> None:
    """Copy one node's output, prefixing every line (progress bars redraw with \\r: those are lines too), to
    the log, and to the terminal through ``echo`` (whole lines, up to a worker's failure)."""
    at_line_start = True
    while chunk := stream.read1(65536):
        out = bytearray()
        for piece in chunk.splitlines(keepends=True):
            if at_line_start and piece not in (b"\r", b"\n", b"\r\n"):  # no prefix before a bare line end
                out += prefix
            out += piece
            at_line_start = piece.endswith((b"\n", b"\r"))
        with lock:
            log.write(out)
            log.flush()
            echo.write(bytes(out))
    with lock:
        echo.close()
