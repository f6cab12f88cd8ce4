"""One run, one directory, however it is launched; stopped runs that say so and resume with one command.

The end-to-end test starts the CLI twice, as node 0 and node 1 of one run (``launcher=torchrun``, the same
command but ``launcher.node_rank``, both from the same working directory as on a cluster's shared home), stops
both with SIGINT as Ctrl-C on two terminals would, and resumes with the command the run printed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from birder_repro import cli
from birder_repro.launch import torchrun
from birder_repro.run import directory, record
from birder_repro.run.digest import cell_digest
from birder_repro.train.checkpoint import COMPLETE, MANIFEST, step_dir
from birder_repro.train.shared_dir import check_shared

REPO = Path(__file__).resolve().parent.parent
DIGITS = [
    "task=digits",
    "optim=birder",
    "logger=none",
    "model.size=tiny",
    "nodes=2",
    "gpus_per_node=1",
    "train.batch_size=8",
    "train.steps=16",
    "train.log_every=4",
    "task.target.value=1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(runs: Path, **extra: str) -> dict:
    return {**os.environ, "BIRDER_RUNS": str(runs), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def _start(args: list[str], env: dict, out: Path) -> subprocess.Popen:
    """A CLI in a session of its own, as in a terminal of its own (SIGINT to its group is Ctrl-C there)."""
    with open(out, "w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "birder_repro.cli", *args],
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _wait_for(runs: Path, text: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in p.read_text(errors="replace") for p in runs.glob("*/output*.log")):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {runs}")


def _two_nodes(args: list[str], runs: Path, tmp: Path, name: str, **env: str) -> list[subprocess.Popen]:
    return [_start([*args, f"launcher.node_rank={k}"], _env(runs, **env), tmp / f"{name}{k}.out") for k in (0, 1)]


def test_two_node_run_is_one_directory_stops_on_sigint_and_resumes_bit_exactly(tmp_path):
    """Node 0 and node 1 of one run share one directory (every rank's checkpoint file, one record); SIGINT to
    both stops every rank after step 9 (rank 0 waits there for it, BIRDER_TEST_FAULT) with a checkpoint and an
    interrupted record; the printed command, run on both nodes, ends the run bit-equal to an uninterrupted one."""
    plain = subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *DIGITS, "launcher=local"],
        cwd=REPO,
        env=_env(tmp_path / "plain"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    [(plain_rec)] = [record.read_record(p.parent) for p in (tmp_path / "plain").rglob(record.RECORD_FILE)]

    runs = tmp_path / "runs"
    args = [*DIGITS, "launcher=torchrun", "launcher.master_addr=127.0.0.1", f"launcher.master_port={_free_port()}"]
    nodes = _two_nodes(args, runs, tmp_path, "stop", BIRDER_TEST_FAULT="wait:0:10")
    _wait_for(runs, "rank 0 wait before step 10")
    for p in nodes:
        os.killpg(p.pid, signal.SIGINT)
    assert [p.wait(timeout=120) for p in nodes] == [130, 130]
    out = [(tmp_path / f"stop{k}.out").read_text() for k in (0, 1)]
    [run_dir] = [p.parent for p in runs.rglob(record.CONFIG_FILE) if p.parent.name != ".hydra"]
    assert [p.parent for p in runs.rglob(record.RECORD_FILE)] == [run_dir]  # one record, node 1 wrote none
    rec = record.read_record(run_dir)
    assert rec["status"] == "interrupted" and rec["stopped_at_step"] == 9, out[0][-3000:]
    ckpt = step_dir(run_dir, 9)
    assert {"rank00000.pt", "rank00001.pt", "model.pt", COMPLETE} <= {p.name for p in ckpt.iterdir()}
    assert rec["checkpoint"] == str(ckpt) and f"hydra.run.dir={run_dir.resolve()}" in rec["resume_command"]
    assert (
        f"node 1: interrupted by SIGINT after step 9; checkpoint {ckpt}; the run's record (rank 0 writes it): "
        f"{run_dir / record.RECORD_FILE}" in out[1]
    )
    assert "Traceback" not in out[0] + out[1]  # torchrun's report of the signal stays in the output logs
    commands = [o.strip().splitlines()[-1] for o in out]
    assert commands[0] == f"[birder-repro] resume: {rec['resume_command']}"
    assert commands[1].startswith("[birder-repro] resume (this node): birder-repro ")

    resumed = [
        _start(shlex.split(c.split(": ", 1)[1])[1:], _env(runs), tmp_path / f"resume{k}.out")
        for k, c in enumerate(commands)
    ]
    codes = [p.wait(timeout=300) for p in resumed]
    assert codes == [0, 0], (tmp_path / "resume0.out").read_text()[-3000:]
    done = record.read_record(run_dir)
    assert done["status"] == "completed" and [a["status"] for a in done["attempts"]] == ["interrupted", "completed"]
    assert done["resumed_from_step"] == 9 and done["steps"] == plain_rec["steps"] == 16
    assert done["final_loss"] == plain_rec["final_loss"] and done["metrics"] == plain_rec["metrics"]
    assert done["samples"] == plain_rec["samples"]
    # time to target (reached at the final evaluation) counts across the attempts, as the plain run's
    reached = ("reached", "step", "samples", "evaluations", "clock_from_step")
    assert [done["time_to_target"][k] for k in reached] == [plain_rec["time_to_target"][k] for k in reached]
    assert done["time_to_target"]["samples"] == done["samples"] == 16 * 16
    assert len(list(runs.rglob(record.RECORD_FILE))) == 1
    assert [p.name for p in runs.iterdir()] == [run_dir.name]  # Hydra's timestamped directories are gone


def test_time_to_target_counts_across_attempts():
    """A checkpoint carries the clock, samples, evaluations and a hit; the resumed attempt goes on counting."""
    from birder_repro.train.target import Target, TimeToTarget

    target = Target("top1", 50.0, "higher")
    first = TimeToTarget(target, world_size=2)
    for _ in range(3):
        first.step_done(0.5, 8)
    first.evaluated(3, {"top1": 10.0})
    second = TimeToTarget(target, world_size=2, start_step=3)
    second.load_state_dict(first.state_dict())
    for _ in range(2):
        second.step_done(0.5, 8)
    second.evaluated(5, {"top1": 60.0})
    t = second.figures()["time_to_target"]
    assert (t["step"], t["samples"], t["evaluations"], t["clock_from_step"]) == (5, 5 * 8 * 2, 2, 0)
    assert t["seconds"] == pytest.approx(2.5)  # five steps of 0.5 s (no one-time first-step work here)
    third = TimeToTarget(target, world_size=2, start_step=5)  # a hit of an earlier attempt is kept as it was
    third.load_state_dict(second.state_dict())
    third.step_done(0.5, 8)
    assert third.figures()["time_to_target"]["seconds"] == pytest.approx(2.5)


# ------------------------------------------------------------------------------------ the directory
def test_every_node_derives_the_same_run_directory_and_other_configs_another(compose):
    def rdzv(*extra):
        return torchrun.rdzv_id(cli.layout.resolve(compose([*DIGITS, "launcher=torchrun", *extra]), gpu_count=0), {})

    assert rdzv("launcher.node_rank=0") == rdzv("launcher.node_rank=1") == rdzv("dry_run=true")
    assert rdzv("seed=1") != rdzv() and rdzv("train.steps=17") != rdzv()
    assert rdzv("launcher.rdzv_id=mine") == "mine"


def test_the_cell_digest_survives_the_config_file_and_leaves_out_what_cannot_change_results(compose, tmp_path):
    cfg = cli.layout.resolve(compose(DIGITS), gpu_count=0)
    record.write_run_files(tmp_path, cfg, "birder-repro")
    assert cell_digest(record.load_run_config(tmp_path)) == cell_digest(cfg)
    same = cli.layout.resolve(
        compose(
            [
                *DIGITS,
                "logger=wandb",
                "train.checkpoint_every=5",
                "train.resume=auto",
                "launcher=torchrun",
                "launcher.master_port=1",
            ]
        ),
        gpu_count=0,
    )
    assert cell_digest(same) == cell_digest(cfg)
    assert cell_digest(cli.layout.resolve(compose([*DIGITS, "seed=3"]), gpu_count=0)) != cell_digest(cfg)


def test_the_shared_file_system_check_fails_in_one_line_when_a_node_marker_is_missing(tmp_path):
    # rank 0 of a 2-node run, alone: node 1's first process never wrote its marker where rank 0 looks
    with pytest.raises(directory.RunDirNotShared) as err:
        check_shared(tmp_path, rank=0, local_rank=0, local_world=1, world=2, device=torch.device("cpu"))
    line = str(err.value)
    assert "\n" not in line and str(tmp_path.resolve()) in line and "node(s) 1" in line
    assert "BIRDER_RUNS or hydra.run.dir must be on a file system every node shares" in line
    check_shared(tmp_path, rank=0, local_rank=0, local_world=2, world=2, device=torch.device("cpu"))


def _fake_run(root: Path, name: str, status: str, digest: str, ended: str, checkpoint: bool = True) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / record.RECORD_FILE).write_text(json.dumps({"status": status, "config_digest": digest, "ended": ended}))
    if checkpoint:
        where = step_dir(run, 4)
        where.mkdir(parents=True)
        (where / MANIFEST).write_text(json.dumps({"step": 4}))
        (where / COMPLETE).write_text("{}")
    return run


def test_resume_auto_picks_the_newest_stopped_run_of_the_same_config_with_a_checkpoint(tmp_path):
    _fake_run(tmp_path, "a", "interrupted", "cell", "2026-01-01T10:00:00+00:00")
    newest = _fake_run(tmp_path, "b", "failed", "cell", "2026-01-01T11:00:00+00:00")
    _fake_run(tmp_path, "c", "interrupted", "cell", "2026-01-01T12:00:00+00:00", checkpoint=False)
    _fake_run(tmp_path, "d", "interrupted", "other", "2026-01-01T13:00:00+00:00")
    _fake_run(tmp_path, "e", "completed", "cell", "2026-01-01T14:00:00+00:00")
    assert directory.find_resumable(tmp_path, "cell") == newest
    assert directory.find_resumable(tmp_path, "nothing") is None


def test_resume_auto_says_in_one_line_when_it_starts_afresh(compose, runs_dir, capsys):
    cfg = cli.layout.resolve(compose([*DIGITS, "train.resume=auto"]), gpu_count=0)
    assert directory.chosen_dir(cfg, cli._torchrun_id) is None  # launcher=local: Hydra's fresh directory
    line = capsys.readouterr().out.strip()
    assert line.startswith("[birder-repro] train.resume=auto: no interrupted or failed run of this configuration")
    assert line.endswith("starting afresh") and "\n" not in line
    run = _fake_run(runs_dir, "old", "interrupted", cell_digest(cfg), "2026-01-01T10:00:00+00:00")
    assert directory.chosen_dir(cfg, cli._torchrun_id) == run


def test_a_directory_holding_a_completed_run_or_another_config_is_never_rerun(tmp_path):
    done = _fake_run(tmp_path, "done", "completed", "cell", "2026-01-01T10:00:00+00:00")
    decision = directory.RunDir(done).decide("cell")
    assert decision.action == "stop" and "launcher.rdzv_id" in decision.line
    stopped = _fake_run(tmp_path, "stopped", "interrupted", "cell", "2026-01-01T10:00:00+00:00")
    assert directory.RunDir(stopped).decide("cell").action == "resume"
    assert directory.RunDir(stopped).decide("another").action == "stop"
    assert directory.RunDir(tmp_path / "new").decide("cell").action == "start"
    # a failed run with nothing to continue from (refused before it started) is simply run again
    refused = _fake_run(tmp_path, "refused", "failed", "composed", "2026-01-01T10:00:00+00:00", checkpoint=False)
    assert directory.RunDir(refused).decide("cell").action == "start"


def test_a_checkpoint_missing_a_rank_file_is_never_marked_complete(tmp_path):
    from birder_repro.train.checkpoint import CheckpointError, complete_checkpoints, save_checkpoint

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # rank 0 of 2, alone: rank 1's file never reaches the directory rank 0 sees
    with pytest.raises(CheckpointError, match="rank00001.pt is missing"):
        save_checkpoint(tmp_path, 3, 12.0, model, opt, None, 0, 2, torch.device("cpu"))
    assert not (step_dir(tmp_path, 3) / COMPLETE).exists() and complete_checkpoints(tmp_path / "checkpoints") == []


REPORT = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_01:08:38
  host      : node1
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 26432)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26432
"""


def test_a_rank_killed_on_another_node_reaches_node_0s_failure_line(tmp_path):
    """Node 1's CLI hands the death its torchrun saw to node 0's CLI, whose own report shows only rank 0's
    consequence (a closed connection)."""
    from birder_repro.run.failures import final_line, signal_deaths, write_signal_deaths

    write_signal_deaths(tmp_path, REPORT, node=1)
    line, _ = final_line(tmp_path, 1, "")
    assert line.startswith("rank 1 failed: died: Signal 9 (SIGKILL) received by PID 26432 (on node 1)"), line
    # ... but a SIGKILL torchrun sent after its stop grace (a hung rank) is its own doing, not a cause
    forced = "Unable to shutdown process 26432 via 15, forcefully exiting via 9\n" + REPORT
    assert signal_deaths(REPORT) == {1: "Signal 9 (SIGKILL) received by PID 26432"} and signal_deaths(forced) == {}
