"""Runs that gpu-check starts end whole, leaving no process behind on the GPU.

A run is the CLI, its torchrun and torchrun's workers, and none of them shares one process group: the CLI starts
torchrun in a session of its own (``birder_repro.launch.process``, so that a signal reaches it once), and
torchrun starts every worker in a session of its own (torch elastic's ``SubprocessHandler``). Killing the CLI
at a run's time limit left torchrun and its workers holding the GPU. So each process gpu-check starts carries a
tag in its environment, which torchrun and the workers inherit, and a run is ended in three steps:

    Step I    SIGTERM to the CLI, which passes it on to torchrun and the workers (they stop after their step);
    Step II   ``grace_s`` for them to go;
    Step III  SIGKILL to the CLI's process group and to every process whose environment has the run's tag,
              wherever its session (found in ``/proc/<pid>/environ``), and the CLI reaped.

gpu-check itself carries a session tag that every process it starts inherits (the hook section's spawned ranks
too): :func:`install_stop_handler` ends the live runs the same way on a SIGTERM, SIGINT or SIGHUP to gpu-check
(an outer time limit), and :func:`end_everything` kills whatever is left with the session's tag at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "RUN_ENV",
    "SESSION_ENV",
    "GRACE_S",
    "tagged",
    "start",
    "stop",
    "run_bounded",
    "install_stop_handler",
    "uninstall_stop_handler",
    "end_everything",
]

RUN_ENV = "BIRDER_GPUCHECK_RUN"
SESSION_ENV = "BIRDER_GPUCHECK_SESSION"
GRACE_S = 10.0  # Step II: the workers stop after their step and write the record (tiny models: a second or two)
_PROC = Path("/proc")
_LIVE: dict[str, subprocess.Popen] = {}  # run tag -> its CLI, while it runs
_LOCK = threading.Lock()


def tagged(name: str, value: str, proc_root: Path = _PROC) -> list[int]:
    """The processes (other than this one) whose environment has ``name=value``; [] where there is no /proc."""
    needle = f"{name}={value}".encode()
    found = []
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (no longer in /proc, or a zombie waiting for its parent to reap it)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until every one of ``pids`` has ended (a SIGKILL is delivered, not awaited, by ``kill``)."""
    deadline = time.monotonic() + timeout_s
    while any(not _gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def start(cmd: list[str], env: Mapping[str, str], log) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` in a session of its own with a fresh run tag (and the session's tag); returns it and the tag."""
    tag = uuid.uuid4().hex
    full = dict(env, **{RUN_ENV: tag})
    full.setdefault(SESSION_ENV, os.environ.get(SESSION_ENV, ""))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full, start_new_session=True)
    with _LOCK:
        _LIVE[tag] = proc
    return proc, tag


def stop(proc: subprocess.Popen, tag: str, grace_s: float = GRACE_S) -> None:
    """Steps I-III of the module docstring; also where the CLI has ended already (its workers may not have)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI's group (start_new_session: its pid)
    except (ProcessLookupError, PermissionError):
        pass
    left = tagged(RUN_ENV, tag)
    for pid in left:
        _kill(pid)
    proc.wait()
    _wait_gone(left)
    with _LOCK:
        _LIVE.pop(tag, None)


def run_bounded(cmd: list[str], env: Mapping[str, str], log, timeout_s: float, grace_s: float = GRACE_S) -> int | None:
    """Run ``cmd`` to its end, or at most ``timeout_s``, then end it whole; its exit code, None if it was stopped.
    Whatever it left behind (a worker outliving its CLI) is ended either way."""
    proc, tag = start(cmd, env, log)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc, tag, grace_s)
        return None
    stop(proc, tag, grace_s)  # the CLI has ended: only leftovers, if any
    return code


def end_everything(grace_s: float = 2.0) -> None:
    """Every live run ended (SIGTERM to each CLI, ``grace_s``, then SIGKILL to all it started), then every
    process left with this gpu-check's session tag killed."""
    with _LOCK:
        live = list(_LIVE.items())
    for _, proc in live:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for _, p in live) and time.monotonic() < deadline:
        time.sleep(0.1)
    for tag, proc in live:
        stop(proc, tag, grace_s=0)
    session = os.environ.get(SESSION_ENV)
    if session:
        left = tagged(SESSION_ENV, session)
        for pid in left:
            _kill(pid)
        _wait_gone(left)


def install_stop_handler() -> dict:
    """Give this process a session tag (inherited by all it starts) and end every run it started on SIGTERM,
    SIGINT or SIGHUP before it exits with 128 + the signal (main thread only). Returns what
    :func:`uninstall_stop_handler` puts back."""
    saved: dict = {"env": os.environ.get(SESSION_ENV), "handlers": {}}
    os.environ[SESSION_ENV] = uuid.uuid4().hex  # fresh: an inherited one could name the processes that started us

    def handle(signum, frame):
        print(f"gpu-check: {signal.Signals(signum).name}: ending the runs it started", file=sys.stderr, flush=True)
        end_everything()
        os._exit(128 + signum)  # not SystemExit: a pool's threads would keep waiting on their runs

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            saved["handlers"][sig] = signal.signal(sig, handle)
    return saved


def uninstall_stop_handler(saved: dict) -> None:
    """The handlers and the session variable as they were before :func:`install_stop_handler`."""
    for sig, handler in saved["handlers"].items():
        signal.signal(sig, handler)
    if saved["env"] is None:
        os.environ.pop(SESSION_ENV, None)
    else:
        os.environ[SESSION_ENV] = saved["env"]
