"""Runs that survive a killed worker: torchrun restarts every worker (train.max_restarts), which resume from the
newest complete checkpoint; since resume is exact, the run ends as if nothing had happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from birder_repro.launch import torchrun
from birder_repro.launch.torchrun import torchrun_argv
from birder_repro.run import record

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


def birder_repro(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})},
    )


def only_run(runs: Path) -> tuple[Path, dict]:
    [path] = list(runs.rglob(record.RECORD_FILE))
    return path.parent, record.read_record(path.parent)


def final_state(run_dir: Path, step: int, world: int) -> dict:
    where = run_dir / "checkpoints" / f"step-{step:06d}"
    out = {"model": torch.load(where / "model.pt", weights_only=True)["model"]}
    for r in range(world):
        out[r] = torch.load(where / f"rank{r:05d}.pt", weights_only=True)["comm"]["buckets"]["buckets"]
    return out


def assert_same(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    else:
        assert a == b, path


def test_torchrun_argv_passes_max_restarts():
    assert "--max-restarts=3" in torchrun_argv("run", 2, restarts=3)
    assert not any(a.startswith("--max-restarts") for a in torchrun_argv("run", 2))


def test_shutdown_timeout_is_passed_only_to_a_torchrun_that_takes_it(monkeypatch, capsys):
    """torch 2.11's torchrun stops every run with "unrecognized arguments: --shutdown-timeout=30" (seen on the
    first GPU machine): the option goes only where torchrun's own parser has it, and an older torchrun's fixed
    30 s is said once where train.stop_timeout_s asks for another."""
    torchrun._say_once.cache_clear()  # said once a process: another test in this worker may have said it
    assert torchrun.torchrun_has_option("--shutdown-timeout")  # this environment's torch (2.14) has it
    with pytest.raises(ValueError, match="no known first torch version"):
        torchrun.torchrun_has_option("--no-such-option")
    assert "--shutdown-timeout=45" in torchrun_argv("run", 2, shutdown_timeout=45)
    monkeypatch.setattr(torchrun, "torchrun_has_option", lambda option: False)
    assert not any(a.startswith("--shutdown") for a in torchrun_argv("run", 2, shutdown_timeout=30))
    assert capsys.readouterr().err == ""
    assert not any(a.startswith("--shutdown") for a in torchrun_argv("run", 2, shutdown_timeout=45))
    said = capsys.readouterr().err
    assert "its fixed 30 s" in said and "not train.stop_timeout_s=45" in said


def test_the_shutdown_timeout_is_decided_by_the_torch_version_from_its_metadata(monkeypatch):
    """torch 2.11's torchrun refuses --shutdown-timeout, 2.12 and later take it; the version is read from the
    distribution's metadata (no torch import), local and pre-release tails ignored."""
    assert torchrun.release_of("2.14.1+cu128") == (2, 14)
    assert torchrun.release_of("2.12.0.dev20260401") == (2, 12)
    with pytest.raises(ValueError, match="cannot read a torch version"):
        torchrun.release_of("nightly")
    for version, has in [
        ("2.11.0", False),
        ("2.11.9+cu130", False),
        ("2.12.0", True),
        ("2.14.1", True),
        ("3.0.0", True),
        ("1.13.1", False),
    ]:
        monkeypatch.setattr(torchrun.importlib.metadata, "version", lambda name, v=version: v)
        torchrun.torchrun_has_option.cache_clear()
        assert torchrun.torchrun_has_option("--shutdown-timeout") is has, version

    def not_installed(name):
        raise torchrun.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(torchrun.importlib.metadata, "version", not_installed)
    torchrun.torchrun_has_option.cache_clear()
    assert not torchrun.torchrun_has_option("--shutdown-timeout")
    torchrun.torchrun_has_option.cache_clear()


# slow: 37 s; a killed worker's failed record (below) and the interrupt-and-resume (test_multinode.py) stay by default
@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_uninterrupted(tmp_path):
    """Birder on 2 nodes: rank 1 SIGKILLs itself before step 7 on the first attempt; torchrun restarts both
    workers, which resume from step 4 and redo steps 5-6. Loss, metrics, the final model and every rank's
    Birder state (m, b, e, e_bar) are bit-identical to the run left alone (CPU, data.num_workers=0)."""
    common = [
        *TINY,
        "optim=birder",
        "nodes=2",
        "gpus_per_node=1",
        "train.steps=12",
        "train.checkpoint_every=4",
        "train.keep_checkpoints=5",
    ]
    plain = birder_repro(*common, env={"BIRDER_RUNS": str(tmp_path / "plain")})
    assert plain.returncode == 0, plain.stderr[-3000:]
    killed = birder_repro(
        *common, "train.max_restarts=2", env={"BIRDER_RUNS": str(tmp_path / "killed"), "BIRDER_TEST_FAULT": "kill:1:7"}
    )
    assert killed.returncode == 0, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "rank 1 kill before step 7" in killed.stdout
    plain_dir, a = only_run(tmp_path / "plain")
    killed_dir, b = only_run(tmp_path / "killed")
    assert b["status"] == "completed" and b["restarts"] == 1 and b["steps_redone"] == 2
    assert a["restarts"] == 0 and a["steps_redone"] == 0
    assert b["final_loss"] == a["final_loss"] and b["metrics"] == a["metrics"] and b["samples"] == a["samples"]
    assert_same(final_state(plain_dir, 12, 2), final_state(killed_dir, 12, 2))


def test_without_max_restarts_a_killed_worker_fails_the_run_with_a_record(tmp_path):
    out = birder_repro(
        *TINY,
        "nodes=2",
        "gpus_per_node=1",
        "train.steps=6",
        "train.checkpoint_every=2",
        env={"BIRDER_RUNS": str(tmp_path), "BIRDER_TEST_FAULT": "kill:1:4"},
    )
    assert out.returncode != 0
    run_dir, rec = only_run(tmp_path)
    assert rec["status"] == "failed" and rec["restarts"] == 0
    # the cause, not its consequence on rank 0 (a closed connection) nor torchrun's SIGTERM of the others
    assert rec["error"].startswith("rank 1 died: Signal 9 (SIGKILL)"), rec["error"]
    assert out.stderr.strip().splitlines()[-1] == f"[birder-repro] {rec['error']}"
    assert (run_dir / "checkpoints" / "step-000002" / "COMPLETE").is_file()  # the earlier checkpoint is kept


def test_a_hung_peer_ends_the_run_after_train_timeout_s_naming_rank_and_collective(tmp_path):
    # train.stop_timeout_s: how long torchrun lets the hung rank (which waits for a step boundary) stop
    out = birder_repro(
        *TINY,
        "nodes=2",
        "gpus_per_node=1",
        "train.steps=6",
        "train.checkpoint_every=2",
        "train.timeout_s=5",
        "train.stop_timeout_s=3",
        env={"BIRDER_RUNS": str(tmp_path), "BIRDER_TEST_FAULT": "hang:1:4"},
    )
    assert out.returncode != 0
    _, rec = only_run(tmp_path)
    assert rec["status"] == "failed"
    assert rec["error"].startswith("rank 0 failed: ") and "collective" in rec["error"], rec["error"]
    assert "train.timeout_s=5" in rec["error"] and "\n" not in rec["error"]


@pytest.mark.slow  # 45 s; the hung peer's timeout line stays in the default run (the test above)
def test_a_hung_peer_is_restarted_with_max_restarts(tmp_path):
    out = birder_repro(
        *TINY,
        "nodes=2",
        "gpus_per_node=1",
        "train.steps=6",
        "train.checkpoint_every=2",
        "train.timeout_s=5",
        "train.max_restarts=1",
        "train.stop_timeout_s=3",
        env={"BIRDER_RUNS": str(tmp_path), "BIRDER_TEST_FAULT": "hang:1:4"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _, rec = only_run(tmp_path)
    assert rec["status"] == "completed" and rec["restarts"] == 1 and rec["steps_redone"] == 1
