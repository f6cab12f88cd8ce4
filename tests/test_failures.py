"""Failures in one line (birder_repro.run.failures): the first failing rank, the terminal spared the tracebacks,
and through the CLI, an exception raised inside training on one rank."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from birder_repro.run import failures, record
from birder_repro.run.failures import MARK, RESTART_MARK, Failure, TerminalEcho

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "experiment=smoke",
    "logger=none",
    "model.size=tiny",
    "train.batch_size=8",
    "data.synthetic_train_size=64",
    "data.synthetic_eval_size=16",
    "train.eval_max_batches=1",
]

# torchrun's report of a run where rank 1 was SIGKILLed and rank 0 stopped by torchrun (its format:
# torch.distributed.elastic.multiprocessing.errors.ChildFailedError)
REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
birder_repro.train.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_01:08:38
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 26431)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 26431
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_01:08:38
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 26432)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26432
============================================================
"""


def _failure(rank, t, consequence=False, attempt=0):
    return Failure(rank, attempt, t, "RuntimeError", f"boom on {rank}", "Traceback ...", consequence)


def test_the_first_failure_is_the_earliest_that_is_not_a_consequence():
    fs = [_failure(0, 1.0, consequence=True), _failure(3, 2.0), _failure(2, 3.0)]
    assert failures.first_failure(fs).rank == 3
    assert failures.first_failure([_failure(1, 5.0, True), _failure(0, 4.0, True)]).rank == 0
    assert failures.first_failure([]) is None


def test_failure_files_of_the_last_attempt_are_read(tmp_path):
    for f in (_failure(0, 1.0, attempt=0), _failure(1, 9.0, attempt=1)):
        (tmp_path / "failures").mkdir(exist_ok=True)
        (tmp_path / "failures" / f"attempt-{f.attempt}-rank-{f.rank:05d}.json").write_text(json.dumps(f.__dict__))
    assert [f.rank for f in failures.read_failures(tmp_path)] == [1]


def test_a_signal_death_in_torchruns_report_names_the_rank_but_its_sigterm_does_not(tmp_path):
    assert failures.signal_deaths(REPORT) == {1: "Signal 9 (SIGKILL) received by PID 26432"}
    line, trace = failures.final_line(tmp_path, 1, REPORT)
    assert line.startswith("rank 1 died: Signal 9 (SIGKILL)") and "output.log" in line and trace is None


def _report_with_error_file(error_file: str) -> str:
    """torchrun's report of rank 2 failing with an exception that torch elastic's @record wrote to its error file,
    and rank 3 SIGKILLed (no error file)."""
    return REPORT.replace("rank      : 1 (local_rank: 1)", "rank      : 3 (local_rank: 1)") + (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_01:08:37\n  host      : localhost\n"
        "  rank      : 2 (local_rank: 0)\n  exitcode  : 1 (pid: 26433)\n"
        f"  error_file: {error_file}\n  traceback : Traceback (most recent call last):\n    ...\n"
    )


def test_a_worker_without_its_own_failure_file_is_read_from_torch_elastics_error_file(tmp_path):
    """torch elastic's format (errors/error_handler.py, ErrorHandler.record_exception): the exception's type and
    message, its traceback and a timestamp; read before torchrun's printed report, which stays the fallback for
    the rank that wrote nothing (the SIGKILLed one)."""
    error_file = tmp_path / "torchelastic" / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    callstack = "Traceback (most recent call last):\n  File \"worker.py\", line 1\nKeyError: 'optim'\n"
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "KeyError: 'optim'\nmore",
                    "extraInfo": {"py_callstack": callstack, "timestamp": "1764032917"},
                }
            }
        )
    )
    report = _report_with_error_file(str(error_file))
    [failure] = failures.elastic_failures(report)
    assert (failure.rank, failure.type, failure.message, failure.time) == (2, "KeyError", "'optim'", 1764032917.0)
    assert failure.traceback == callstack
    line, trace = failures.final_line(tmp_path, 1, report)
    assert line.startswith("rank 2 failed: KeyError: 'optim' (") and trace == callstack
    assert failures.signal_deaths(report) == {3: "Signal 9 (SIGKILL) received by PID 26432"}

    # the plain form ({"message": text, "timestamp": ...}); a rank's own failure file comes first
    error_file.write_text(json.dumps({"message": "the worker gave up", "timestamp": 1764032917}))
    assert failures.read_elastic_error(error_file, 2) == Failure(
        2, 0, 1764032917.0, "", "the worker gave up", "", False
    )
    (tmp_path / "failures").mkdir()
    own = _failure(2, 1.0)
    (tmp_path / "failures" / "attempt-0-rank-00002.json").write_text(json.dumps(own.__dict__))
    assert failures.final_line(tmp_path, 1, report)[0].startswith("rank 2 failed: RuntimeError: boom on 2 (")

    # no error file written (or gone): the printed report's signal death names the rank
    (tmp_path / "failures" / "attempt-0-rank-00002.json").unlink()
    error_file.unlink()
    assert failures.elastic_failures(report) == []
    assert failures.final_line(tmp_path, 1, report)[0].startswith("rank 3 died: Signal 9 (SIGKILL)")


def test_the_terminal_copy_stops_at_a_failure_and_resumes_on_a_restart():
    out = io.StringIO()
    echo = TerminalEcho(out)
    text = (
        f"train: step 1\r progress\n{MARK}rank 1 failed: X: y\nTraceback (most recent call last):\n  ...\n"
        f"torchrun's report\n[birder-repro] {RESTART_MARK[15:]}attempt 2\ntrain: step 3\n"
    ).encode()
    for i in range(0, len(text), 7):  # marks split between reads are still seen
        echo.write(text[i : i + 7])
    echo.close()
    shown = out.getvalue()
    assert shown.startswith("train: step 1\r progress\n")
    assert "Traceback" not in shown and "rank 1 failed" not in shown and "torchrun" not in shown
    assert shown.endswith("attempt 2\ntrain: step 3\n")


def tiny_two_node_run(runs: Path, fault: str) -> subprocess.CompletedProcess:
    """The CLI's tiny 2-node, 6-step run into ``runs`` with ``BIRDER_TEST_FAULT=fault``."""
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *TINY, "nodes=2", "gpus_per_node=1", "train.steps=6"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BIRDER_RUNS": str(runs), "OMP_NUM_THREADS": "1", "BIRDER_TEST_FAULT": fault},
    )


def test_an_exception_inside_training_on_one_rank_ends_in_one_line(tmp_path):
    out = tiny_two_node_run(tmp_path, "raise:1:3")
    assert out.returncode == 1
    said = out.stdout + out.stderr
    [path] = list(tmp_path.rglob(record.RECORD_FILE))
    rec = record.read_record(path.parent)
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"[birder-repro] {rec['error']}"
    assert last.startswith(
        "[birder-repro] rank 1 failed: InjectedFault: BIRDER_TEST_FAULT=raise:1:3: rank 1 "
        "raised before step 3 (full output: "
    ) and last.endswith("output.log)")
    assert "Traceback" not in said and "ChildFailedError" not in said  # neither a rank's nor torchrun's
    assert rec["status"] == "failed" and "InjectedFault" in rec["traceback"] and "inject_fault" in rec["traceback"]
    log = (path.parent / record.LOG_FILE).read_text()
    assert "Traceback (most recent call last)" in log and "ChildFailedError" in log  # the full output is kept


# slow: one real torchrun, about 12 s; the made-up error file above stays by default
@pytest.mark.slow
def test_torchruns_report_of_a_worker_that_failed_before_its_run_is_read_from_its_error_file(tmp_path):
    """A worker whose run directory holds no config fails before it can write its own failure file: torch
    elastic's @record on its main writes the error file, which torchrun's report names."""
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", f"--log-dir={tmp_path / 'elastic'}"]
        + ["-m", "birder_repro.train.worker", "--run-dir", str(tmp_path / "no-run")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode != 0
    [failure] = failures.elastic_failures(out.stdout + out.stderr)
    assert (failure.rank, failure.type) == (0, "FileNotFoundError") and "config.yaml is missing" in failure.message
    line, trace = failures.final_line(tmp_path, out.returncode, out.stdout + out.stderr)
    assert line.startswith("rank 0 failed: FileNotFoundError: ") and "load_run_config" in trace
