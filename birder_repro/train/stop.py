"""Stopping on SIGINT or SIGTERM at a step boundary, every rank after the same step.

Ctrl-C reaches the CLI, which passes it on to torchrun; torchrun's agent passes SIGINT / SIGTERM on to its
workers (each in a session of its own) and SIGKILLs them after its ``--shutdown-timeout``
(``train.stop_timeout_s``). Here a worker only notes the signal (:func:`install`). The loop asks
:func:`agreed` before every step: one 2-element all-reduce, so that a rank signalled a moment later than
another still stops after the same step, none left waiting in a collective. The loop then saves a checkpoint
(``train.checkpoint_on_stop``, or where ``train.checkpoint_every`` > 0) and raises :class:`Stopped`, which the
worker turns into a record with ``status: interrupted`` and the command that resumes the run.

A worker that has not stopped ``train.stop_timeout_s`` after its first signal exits by itself (a watchdog thread:
a rank hung outside any collective never reaches a boundary). torchrun kills it then on a signal anyway, but
after another rank fails it waits its own 30 s, whatever ``--shutdown-timeout`` says (its agent's
``_stop_workers`` calls ``_shutdown()`` with the default), so that a failed run with a hung peer ended 30 s late.

Before the loop (start-up, rendezvous) there is no step to finish: a signal then raises :class:`Stopped` at
once. After the last step it is ignored: the run is finishing its evaluation and record.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["Stopped", "install", "agreed", "in_loop", "requested", "signal_name"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """The run stopped on a signal after ``step`` steps (None: before training); ``checkpoint`` is the newest
    complete checkpoint it has (None: none); ``from_step``: the step this attempt started from."""

    def __init__(
        self, signum: int, step: int | None = None, checkpoint: Path | None = None, from_step: int | None = None
    ):
        self.signum, self.step, self.checkpoint, self.from_step = signum, step, checkpoint, from_step
        when = "before training started" if step is None else f"after step {step}"
        super().__init__(f"stopped by {signal_name(signum)} {when}")


class _State:
    signum = 0  # the first stop signal this process received (0: none)
    looping = False  # inside the training loop: stop at the next step boundary instead of at once
    pid = 0  # the worker's: its forked data-loader processes inherit the handler and ignore the signal, so
    #          that they live on until the worker stops (a killed one would fail the worker's next batch)
    grace_s: float | None = None  # train.stop_timeout_s: the watchdog's delay (None: no watchdog)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handle(signum: int, frame) -> None:
    if os.getpid() != _State.pid:
        return
    if not _State.signum:
        _State.signum = signum
        if _State.grace_s is not None:
            watchdog = threading.Timer(_State.grace_s, _exit_late, (signum, _State.grace_s))
            watchdog.daemon = True
            watchdog.start()
    if not _State.looping:
        raise Stopped(signum)


def _exit_late(signum: int, grace_s: float) -> None:
    print(
        f"[birder-repro] not stopped {grace_s:g} s after {signal_name(signum)} (train.stop_timeout_s): exiting",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)


def install(grace_s: float | None = None) -> None:
    """The worker's handlers for SIGINT and SIGTERM (instead of KeyboardInterrupt and death); with ``grace_s``
    (``train.stop_timeout_s``), the process exits that long after its first signal if it has not stopped."""
    _State.signum, _State.looping, _State.pid, _State.grace_s = 0, False, os.getpid(), grace_s
    for s in SIGNALS:
        signal.signal(s, _handle)


def in_loop() -> None:
    """From here on a signal stops the run at the next step boundary (:func:`agreed`)."""
    _State.looping = True


def agreed(device) -> int:
    """The stop signal every rank agrees on (SIGINT before SIGTERM where ranks got different ones), or 0 to go on.
    Collective: every rank calls it before the same step."""
    from birder_repro.train.collectives import allreduce_sum  # imports torch; stop and restarts stay without

    got_int, got_term = allreduce_sum(
        [float(_State.signum == signal.SIGINT), float(_State.signum not in (0, signal.SIGINT))], device
    )
    return signal.SIGINT if got_int else signal.SIGTERM if got_term else 0


def requested() -> int:
    """This process's stop signal so far (0: none); not agreed with the other ranks."""
    return _State.signum
