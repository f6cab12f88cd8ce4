"""A sweep's verdict: the cells that failed or were refused, one line each at the end, and a non-zero exit.

Hydra's basic launcher runs the cells of ``birder-repro -m ...`` one after another in this process, and a
failed cell does not stop the others (each keeps its own record). :class:`SweepReport`, a Hydra callback
(registered in conf/config.yaml under ``hydra.callbacks``), notes every cell that ended with a non-zero code
together with the last line it wrote to stderr, which is the CLI's one-line error; when the sweep ends it lists
them and exits with :data:`FAILED_SWEEP`. Ctrl-C is no cell's failure: the CLI exits from inside the cell, which
stops the whole sweep at once. With a launcher that runs cells elsewhere (``hydra/launcher=submitit_slurm``)
the cells end in their own jobs, unseen here: their records say how each ended.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

__all__ = ["FAILED_SWEEP", "FailedCell", "SweepReport"]

FAILED_SWEEP = 1  # the exit code of a sweep in which any cell failed or was refused
PREFIX = "[birder-repro] "


@dataclass(frozen=True)
class FailedCell:
    number: int  # hydra.job.num: the run directory's prefix under the sweep's directory
    overrides: tuple[str, ...]
    code: int
    error: str

    def line(self) -> str:
        cell = " ".join(self.overrides) or "(no overrides)"
        return f"{PREFIX}  #{self.number} {cell}: {self.error} (exit code {self.code})"


class _LastLine:
    """A stream that writes through to ``stream`` and keeps the last non-blank line written to it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.last = stream, ""

    def write(self, text: str) -> int:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = lines[-1]
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding ...: the stream's own
        return getattr(self.stream, name)


class SweepReport(Callback):
    """Collects a sweep's failed cells; lists them at its end and exits non-zero (a single run: nothing)."""

    def __init__(self) -> None:
        self.failed: list[FailedCell] = []
        self.cells = 0
        self._sweeping = False
        self._stderr: _LastLine | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweeping = True

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self._sweeping:  # a cell: keep its last stderr line, its error line should it fail
            self._stderr = _LastLine(sys.stderr)
            sys.stderr = self._stderr

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        watched, self._stderr = self._stderr, None
        if watched is None:
            return
        sys.stderr = watched.stream
        self.cells += 1
        code = _exit_code(job_return)
        if code != 0:
            error = watched.last.removeprefix(PREFIX) or "(it printed no error)"
            number = int(config.hydra.job.get("num") or 0) if "hydra" in config else self.cells - 1
            self.failed.append(FailedCell(number, tuple(job_return.overrides or ()), code, error))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.failed:
            return
        print(f"{PREFIX}sweep: {len(self.failed)} of {self.cells} cells failed or were refused:", file=sys.stderr)
        for cell in self.failed:
            print(cell.line(), file=sys.stderr, flush=True)
        sys.exit(FAILED_SWEEP)


def _exit_code(job_return: JobReturn) -> int:
    """The cell's exit code: what the CLI's task function returned; 1 where it raised."""
    if job_return.status != JobStatus.COMPLETED:
        return 1
    value = job_return.return_value
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
