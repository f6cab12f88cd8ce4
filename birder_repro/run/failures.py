"""Failures in one line: what a failing worker leaves, how the CLI names the first failing rank, and how the
terminal is spared every rank's traceback and torchrun's error report.

A worker that fails (any exception) writes ``run_dir/failures/attempt-<a>-rank-<r>.json`` (its rank, the time,
the exception's type and message, its traceback, and whether it is a consequence of another rank's failure: a
collective that timed out or whose peer closed its connection), then prints :data:`MARK` and its one line,
followed by its traceback, to its stderr. That output reaches ``output.log`` in full; the launchers' copy to
the terminal (:class:`TerminalEcho`) stops at the first :data:`MARK` and resumes when restarted workers
announce themselves (:data:`RESTART_MARK`, ``train.max_restarts``), so that neither the other ranks' tracebacks
nor torchrun's error report reach it; it also stops at rank 0's line of a run a signal stopped
(:data:`STOP_MARK`): the CLI says the same, then how to resume (birder_repro.run.finish). A failed run's CLI then
ends with :func:`final_line`: the first failing rank, the cause (exception type and message) and where the full
output is; the record's ``error`` is that line and its ``traceback`` the rank's traceback.

The first failing rank: the earliest of the ranks whose failure is not a consequence of another's; else a
rank that died without a Python exception (a signal, as torchrun's report lists it: SIGKILL, out of memory);
else the earliest of the rest. A rank that failed without writing its own file (an exception before its run
began: the worker's ``main`` is torch elastic's ``@record``) is read from the error file torch elastic wrote for
it (``TORCHELASTIC_ERROR_FILE``, named in torchrun's report); torchrun's printed report itself is read only for
a rank that died without writing either.
"""

from __future__ import annotations

import codecs
import json
import re
import time
import traceback as tb
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "MARK",
    "RESTART_MARK",
    "STOP_MARK",
    "FAILURES_DIR",
    "Failure",
    "cause_of",
    "write_failure",
    "read_failures",
    "first_failure",
    "read_elastic_error",
    "elastic_failures",
    "signal_deaths",
    "write_signal_deaths",
    "final_line",
    "TerminalEcho",
]

MARK = "[birder-repro] failure: "  # a worker's failure line starts with it (the terminal copy stops there)
RESTART_MARK = "[birder-repro] restarted: "  # restarted workers say so (the terminal copy resumes)
STOP_MARK = "[birder-repro] stopped: "  # rank 0 after a stop signal (the terminal copy stops there too)
FAILURES_DIR = "failures"
MAX_MESSAGE = 1000  # characters of an exception's message kept in the one line (the rest: the traceback)


@dataclass(frozen=True)
class Failure:
    """One rank's failure, as it wrote it."""

    rank: int
    attempt: int
    time: float  # time.time() when it failed
    type: str
    message: str  # the first line of the exception's message (or the collective's explanation)
    traceback: str
    consequence: bool  # a collective failed because another rank hung or died

    @property
    def line(self) -> str:
        return (
            f"rank {self.rank} failed: {self.type}: {self.message}"
            if self.type
            else f"rank {self.rank} failed: {self.message}"
        )


def cause_of(exc: BaseException, explained: str = "") -> tuple[str, str]:
    """(type, message) of the one line: the exception's type and its message's first non-empty line, or, for a
    failed collective, the explanation worker.explain_collective_failure gave ("rank r: collective ...")."""
    if explained:
        return type(exc).__name__, explained.strip().split(": ", 1)[-1]
    lines = [s.strip() for s in str(exc).splitlines() if s.strip()]
    message = lines[0] if lines else "(no message)"
    return type(exc).__name__, message[:MAX_MESSAGE] + ("..." if len(message) > MAX_MESSAGE else "")


def _path(run_dir: Path, attempt: int, rank: int) -> Path:
    return Path(run_dir) / FAILURES_DIR / f"attempt-{attempt}-rank-{rank:05d}.json"


def write_failure(run_dir: Path, rank: int, attempt: int, exc: BaseException, explained: str = "") -> Failure:
    """Record this rank's failure in the run directory (best effort: the failure itself must still be told)."""
    kind, message = cause_of(exc, explained)
    text = explained + "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    failure = Failure(rank, attempt, time.time(), kind, message, text, bool(explained))
    _save(run_dir, failure)
    return failure


def _save(run_dir: Path, failure: Failure) -> None:
    """Write ``failure`` as its rank's file of its attempt (best effort: the failure itself must still be told)."""
    try:
        path = _path(run_dir, failure.attempt, failure.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(failure), indent=1) + "\n")
    except OSError:
        pass


def read_failures(run_dir: Path) -> list[Failure]:
    """The failures of the run's last attempt that had any."""
    found = []
    for path in sorted((Path(run_dir) / FAILURES_DIR).glob("attempt-*-rank-*.json")):
        try:
            found.append(Failure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    last = max((f.attempt for f in found), default=None)
    return [f for f in found if f.attempt == last]


def first_failure(failures: list[Failure]) -> Failure | None:
    """The earliest failure that is not a consequence of another rank's (ties: the lower rank); else the
    earliest of all; None without any."""
    if not failures:
        return None
    own = [f for f in failures if not f.consequence]
    return min(own or failures, key=lambda f: (f.time, f.rank))


# torchrun's report (torch.distributed.elastic ChildFailedError): one block per failed worker
_REPORT_BLOCK = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)[^\n]*\n"
    r"(?:\s*error_file\s*:\s*([^\n]*)\n)?(?:[^\n]*\n)*?\s*traceback\s*:\s*([^\n]*)"
)
NO_ERROR_FILE = "<N/A>"  # torchrun's report for a worker that wrote no error file


SIGTERM = 15  # how torchrun stops the other workers once one has failed: a consequence, never a cause


_FORCED = re.compile(r"Unable to shutdown process (\d+) via")  # torchrun's SIGKILL after its stop grace


def read_elastic_error(path: Path, rank: int, attempt: int = 0) -> Failure | None:
    """A worker's failure as torch elastic's ``@record`` wrote it to its ``TORCHELASTIC_ERROR_FILE``
    (torch.distributed.elastic.multiprocessing.errors.ErrorHandler.record_exception): ``{"message": {"message":
    "<type>: <message>", "extraInfo": {"py_callstack": <traceback>, "timestamp": "<epoch s>"}}}``, or a plain
    ``{"message": "<text>", "timestamp": <epoch s>}``. None where the file is missing or not in that format."""
    try:
        data = json.loads(Path(path).read_text())
        said = data["message"]
        if isinstance(said, dict):
            text, trace = str(said.get("message", "")), str(said.get("extraInfo", {}).get("py_callstack", ""))
            when = float(said.get("extraInfo", {}).get("timestamp", 0))
        else:
            text, trace, when = str(said), "", float(data.get("timestamp", 0))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    kind, _, message = text.partition(": ") if re.match(r"[A-Za-z_][\w.]*: ", text) else ("", "", text)
    lines = [s.strip() for s in message.splitlines() if s.strip()]
    first = (lines[0] if lines else "(no message)")[:MAX_MESSAGE]
    return Failure(rank, attempt, when, kind, first, trace, False)


def elastic_failures(log_text: str, attempt: int = 0) -> list[Failure]:
    """The failures of the workers that torchrun's report in ``log_text`` lists with an error file (a worker whose
    exception torch elastic's ``@record`` caught: birder_repro.train.worker's ``main``), read from those files."""
    found = {}
    for rank, _code, error_file, _what in _REPORT_BLOCK.findall(log_text):
        error_file = error_file.strip()
        if error_file and error_file != NO_ERROR_FILE:
            failure = read_elastic_error(Path(error_file), int(rank), attempt)
            if failure is not None:
                found[int(rank)] = failure
    return list(found.values())


def signal_deaths(log_text: str) -> dict[int, str]:
    """Ranks that torchrun reports dead by a signal in ``log_text``, {rank: its description}, less its own
    stops: the SIGTERM (or SIGINT) it sends the others once one has failed, and the SIGKILL after its
    ``--shutdown-timeout`` for a worker that did not stop in time (a hung one; train.stop_timeout_s). The
    fallback for a worker that died without a word: one that wrote an error file is read from it instead
    (:func:`elastic_failures`)."""
    forced = set(_FORCED.findall(log_text))
    deaths = {}
    for rank, code, _error_file, what in _REPORT_BLOCK.findall(log_text):
        pid = re.search(r"PID (\d+)", what)
        if int(code) < 0 and int(code) != -SIGTERM and not (pid and pid.group(1) in forced):
            deaths[int(rank)] = what.strip() or f"exit code {code}"
    return deaths


def write_signal_deaths(run_dir: Path, log_text: str, node: int) -> None:
    """A node other than 0 (multi-node torchrun): the ranks its torchrun reports dead by a signal, as failure
    files, so that node 0's CLI, which sees only its own torchrun's report, can name them (birder_repro.run.finish)."""
    known = {f.rank for f in read_failures(run_dir)}
    attempt = max((f.attempt for f in read_failures(run_dir)), default=0)
    for rank, what in signal_deaths(log_text).items():
        if rank in known:
            continue
        _save(run_dir, Failure(rank, attempt, time.time(), "", f"died: {what} (on node {node})", "", False))


def final_line(run_dir: Path, code: int, log_text: str = "") -> tuple[str, str | None]:
    """(the CLI's last line for a failed run, the traceback to record) from the failure files and torchrun's
    report in ``log_text`` (the end of output.log)."""
    where = f"full output: {Path(run_dir) / 'output.log'}"
    failures = read_failures(run_dir)
    own = {f.rank for f in failures}  # a rank's own failure file first, then torch elastic's error file
    attempt = max((f.attempt for f in failures), default=0)
    failures += [f for f in elastic_failures(log_text, attempt) if f.rank not in own]
    first = first_failure(failures)
    deaths = {r: d for r, d in signal_deaths(log_text).items() if r not in {f.rank for f in failures}}
    if deaths and (first is None or first.consequence):
        rank = min(deaths)
        return f"rank {rank} died: {deaths[rank]} ({where})", None
    if first is not None:
        return f"{first.line} ({where})", first.traceback
    said = [s.strip() for s in log_text.splitlines() if s.strip()]
    last = f"; the output's last line: {said[-1][:MAX_MESSAGE]!r}" if said else ""
    return f"the workers exited with code {code} and none reported an exception{last} ({where})", None


class TerminalEcho:
    """The terminal's copy of the workers' output: every line until a worker's failure (:data:`MARK`), none
    after it until restarted workers announce themselves (:data:`RESTART_MARK`). Lines are whole ones (a
    progress bar's carriage returns end lines too), so that a mark split between two reads is still seen."""

    def __init__(self, out: TextIO, shared: TerminalEcho | None = None):
        # ``shared``: another echo whose muting this one follows (the emulated cluster: one echo per node)
        self.out, self._state = out, (shared._state if shared is not None else {"muted": False})
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span reads
        self._partial = ""

    def write(self, chunk: bytes) -> None:
        text = self._partial + self._decoder.decode(chunk)
        pieces = text.splitlines(keepends=True)
        self._partial = pieces.pop() if pieces and not pieces[-1].endswith(("\n", "\r")) else ""
        self._emit(pieces)

    def close(self) -> None:
        self._emit([self._partial + self._decoder.decode(b"", final=True)])
        self._partial = ""

    @property
    def muted(self) -> bool:
        return self._state["muted"]

    def own_lines_only(self) -> None:
        """From now on (the CLI passed a stop signal on) only birder-repro's own lines, none of torchrun's."""
        self._state["own_only"] = True

    def _emit(self, pieces: list[str]) -> None:
        shown = []
        for piece in pieces:
            if MARK in piece or STOP_MARK in piece:
                self._state["muted"] = True
            elif RESTART_MARK in piece:
                self._state["muted"] = False
            if not self.muted and (not self._state.get("own_only") or "[birder-repro]" in piece):
                shown.append(piece)
        if shown:
            self.out.write("".join(shown))
            self.out.flush()
