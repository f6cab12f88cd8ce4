"""gpu-check ends a run whole: the CLI, and the torchrun and workers that live in sessions of their own
(birder_repro/gpucheck/procs.py), at a run's time limit and when gpu-check itself is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from birder_repro.gpucheck import procs

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")

# A stand-in for the CLI: like launch/process.py it starts its child (torchrun's place) in a session of its own,
# and the child ignores SIGTERM, as a worker stuck in a collective would. Both write their pids.
FAKE_CLI = """
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True,
)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended (its parent, init, reaps it)


def _pids(path: Path) -> list[int]:
    for _ in range(600):  # the stand-in writes them once started (at most a minute)
        if path.is_file() and path.read_text().strip():
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError("the stand-in CLI never started")


def test_a_run_past_its_limit_is_ended_with_everything_it_started(tmp_path):
    pids = tmp_path / "pids"
    with open(tmp_path / "log", "w") as log:
        # the limit must pass only after the stand-in wrote its pids: it waits for them below first
        proc, tag = procs.start([sys.executable, "-c", FAKE_CLI, str(pids)], dict(os.environ), log)
        cli, child = _pids(pids)
        assert procs.tagged(procs.RUN_ENV, tag) and _alive(child)
        procs.stop(proc, tag, grace_s=0.5)
    assert not _alive(cli) and not _alive(child), "the run's child outlived it"
    assert procs.tagged(procs.RUN_ENV, tag) == []


def test_run_bounded_says_a_stopped_run_stopped(tmp_path):
    with open(tmp_path / "log", "w") as log:
        assert (
            procs.run_bounded([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), log, 1.0, 0.5)
            is None
        )
        assert procs.run_bounded([sys.executable, "-c", "pass"], dict(os.environ), log, 60.0) == 0


# gpu-check's own stop: a process that installs the handler and starts the stand-in, then is sent SIGTERM.
GPU_CHECK = """
import os, sys, time
from birder_repro.gpucheck import procs
procs.install_stop_handler()
with open(sys.argv[2], "w") as log:
    procs.start([sys.executable, "-c", sys.argv[3], sys.argv[1]], dict(os.environ), log)
    time.sleep(600)
"""


def test_a_sigterm_to_gpu_check_ends_the_runs_it_started(tmp_path):
    pids = tmp_path / "pids"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    )
    check = subprocess.Popen(
        [sys.executable, "-c", GPU_CHECK, str(pids), str(tmp_path / "log"), FAKE_CLI], env=env, stderr=subprocess.PIPE
    )
    cli, child = _pids(pids)
    check.send_signal(signal.SIGTERM)
    _, err = check.communicate(timeout=120)
    assert check.returncode == 128 + signal.SIGTERM, err
    assert b"ending the runs it started" in err
    assert not _alive(cli) and not _alive(child), "gpu-check's run outlived it"


def test_the_stop_handler_is_put_back_as_it_was():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    env = os.environ.get(procs.SESSION_ENV)
    saved = procs.install_stop_handler()
    assert os.environ[procs.SESSION_ENV] and signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    procs.uninstall_stop_handler(saved)
    assert {s: signal.getsignal(s) for s in before} == before and os.environ.get(procs.SESSION_ENV) == env
