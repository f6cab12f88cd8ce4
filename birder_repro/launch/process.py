"""A command to start (arguments and the environment it adds) and running it with its output streamed.

The output of the processes goes into the run directory's ``output.log`` in full, and to the terminal as it
comes until a worker fails: from there the terminal is spared the tracebacks (birder_repro.failures), and the
CLI ends with one line.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from birder_repro.failures import TerminalEcho

__all__ = ["Command", "run_streaming", "log_tail"]


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

    def full_env(self, base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}


def run_streaming(command: Command, log_path: Path, stop_timeout_s: float = 30.0) -> int:
    """Run ``command``, copying its stdout and stderr to our stdout and to ``log_path``; return its exit code.

    On Ctrl-C torchrun gets the same SIGINT (same process group) and stops its workers; we wait for it to do
    so before returning 130, the shell's code for an interrupted command.
    """
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command.argv, env=command.full_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        try:
            _pump(proc.stdout.fileno(), log)
            return proc.wait()
        except KeyboardInterrupt:
            _stop(proc, stop_timeout_s)
            return 130
        finally:
            proc.stdout.close()


def _pump(fd: int, log) -> None:
    # Raw chunks to the log; the terminal gets whole lines up to a worker's failure (birder_repro.failures).
    echo = TerminalEcho(sys.stdout)
    while chunk := os.read(fd, 65536):
        log.write(chunk)
        log.flush()
        echo.write(chunk)
    echo.close()


def _stop(proc: subprocess.Popen, timeout_s: float) -> None:
    # torchrun stops its workers on SIGINT or SIGTERM; SIGKILL, the last resort, would leave them running.
    for signal_it in (None, proc.terminate, proc.kill):
        if signal_it is not None:
            signal_it()
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(log_path: Path, max_chars: int = 4000) -> str:
    """The end of what the processes printed (empty when nothing was)."""
    if not log_path.is_file():
        return ""
    with open(log_path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - max_chars))
        return f.read().decode("utf-8", errors="replace")
