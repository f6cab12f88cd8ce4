"""Stopping at a step boundary (birder_repro.train.stop): every rank agrees on the signal one of them got, across
gloo processes; the record names the signal that stopped the run."""

from __future__ import annotations

import signal

import torch
from dist_utils import run_distributed


def _agree(rank: int, world: int, got: dict) -> list[int]:
    from birder_repro.train import stop

    out = []
    for case in got:
        stop._State.signum = case.get(rank, 0)  # only some ranks were signalled
        out.append(int(stop.agreed(torch.device("cpu"))))
    return out


def test_every_rank_agrees_on_the_signal_only_some_ranks_got():
    """The agreeing all-reduce runs when one rank holds the signal and the others do not yet (torchrun signals
    its workers one by one): all stop, with SIGINT where ranks got different ones."""
    cases = [{1: signal.SIGTERM}, {0: signal.SIGINT, 1: signal.SIGTERM}, {}, {0: signal.SIGINT}]
    results = run_distributed(_agree, 2, cases)
    assert results[0] == results[1] == [signal.SIGTERM, signal.SIGINT, 0, signal.SIGINT]


def test_the_stop_names_the_signal_it_was():
    from birder_repro.train.stop import Stopped, signal_name

    assert signal_name(signal.SIGTERM) == "SIGTERM" and signal_name(signal.SIGINT) == "SIGINT"
    assert "stopped by SIGTERM" in str(Stopped(signal.SIGTERM))


def test_a_run_stopped_by_sigterm_has_a_record_and_a_last_line_that_say_sigterm(tmp_path, capsys):
    """What the worker writes when the agreed signal is SIGTERM (a scheduler's, SLURM's preemption): the record
    and rank 0's last line name SIGTERM, not Ctrl-C's SIGINT."""
    from conftest import compose_config

    from birder_repro.run import record
    from birder_repro.train.stop import Stopped
    from birder_repro.train.worker import DistEnv, _Attempt

    cfg = compose_config(["logger=none"])
    attempt = _Attempt(tmp_path, cfg, DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1))
    attempt.interrupted(Stopped(signal.SIGTERM, 3, None, 0), {})
    rec = record.read_record(tmp_path)
    assert rec["status"] == "interrupted" and rec["stopped_at_step"] == 3
    assert rec["error"].startswith("interrupted by SIGTERM after step 3; no checkpoint"), rec["error"]
    assert "stopped: interrupted by SIGTERM after step 3" in capsys.readouterr().out


HUNG = """
import os, signal, sys, time
from birder_repro.train import stop
stop.install(grace_s=float(sys.argv[1]))
stop.in_loop()  # inside the loop a signal only asks for a stop at the next step boundary...
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)  # ...which a hung rank never reaches
print("still here")
"""


def test_a_worker_that_does_not_stop_within_stop_timeout_s_exits_by_itself():
    """torchrun waits 30 s for the other workers after one fails, whatever its --shutdown-timeout: the worker's
    watchdog ends a rank that the stop signal cannot reach (a hung one) after train.stop_timeout_s."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HUNG, "0.5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM and "still here" not in done.stdout  # ended inside the sleep
    assert "not stopped 0.5 s after SIGTERM (train.stop_timeout_s): exiting" in done.stderr
