"""The birder-repro command: dry runs, Hydra's flags, launcher choices, the worker, and the record of a failure.

Subprocess tests run ``python -m birder_repro.cli`` as a user would; the rest call :func:`birder_repro.cli.run`
and the launcher and worker functions directly.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml

from birder_repro import cli
from birder_repro.launch import choose_launcher, local, slurm_env, torchrun
from birder_repro.run import record
from birder_repro.run.directory import RunDir
from birder_repro.train import worker

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


def birder_repro(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``birder-repro ARGS`` in a fresh interpreter (the BIRDER_RUNS of the test's environment applies)."""
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def run_dirs(runs: Path) -> list[Path]:
    return sorted(p.parent for p in runs.rglob("config.yaml") if p.parent.name != ".hydra")


# The CLI launches; only its workers need torch. Where the machine has no GPU to count, checking a config,
# a dry run and a config error import no torch (about 3 s of every launch and every node's CLI otherwise).
# Nor does the check of a real dataset (tasks.data_files): each node's CLI of an emulated or torchrun cluster
# runs it. (What still does: parallel=fsdp's check imports the FSDP code.)
NO_TORCH = """
import atexit, runpy, sys
atexit.register(lambda: print("torch imported" if "torch" in sys.modules else "no torch", file=sys.stderr))
sys.argv = ["birder-repro", *sys.argv[1:]]
runpy.run_module("birder_repro.cli", run_name="__main__")
"""


@pytest.mark.skipif(
    not __import__("birder_repro.cuda_env", fromlist=["x"]).no_gpu_here(),
    reason="a machine with a GPU imports torch to count it",
)
@pytest.mark.parametrize(
    "args",
    [
        ["task=digits", "optim=birder", "nodes=2", "dry_run=true"],  # a real dataset's check, the target's
        ["task=resnet50", "optim=onebit_adam", "data.source=synthetic", "launcher=torchrun", "dry_run=true"],
        ["task=fashion_mnist", "data.source=synthetic", "optim=diloco", "nodes=2", "dry_run=true"],
        ["task=fashion_mnist", "optim=birder", "nodes=2", "dry_run=true"],  # real data: found or not, no torch
        ["task=resnet50", "data.root=/nonexistent", "optim=sgdm", "dry_run=true"],  # a missing dataset's error
        ["optim.lr=abc"],  # a config error
    ],
)
def test_checking_a_config_and_a_dry_run_import_no_torch(runs_dir, args):
    out = subprocess.run([sys.executable, "-c", NO_TORCH, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stderr.strip().splitlines()[-1] == "no torch", out.stdout[-2000:] + out.stderr[-2000:]


# ------------------------------------------------------------------------------------ as a user runs it
def test_dry_run_prints_one_torchrun_per_node_and_starts_nothing(runs_dir):
    out = birder_repro(
        "task=resnet50", "optim=birder", "nodes=8", "gpus_per_node=8", "launcher=torchrun", "dry_run=true"
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "torch.distributed.run" in line]
    assert len(lines) == 8
    assert all("--nnodes=8" in line and "--nproc-per-node=8" in line for line in lines)
    assert all("--rdzv-backend=c10d" in line and "--rdzv-endpoint=" in line for line in lines)
    assert [int(re.search(r"# node (\d+) of 8", line).group(1)) for line in lines] == list(range(8))
    assert len({re.search(r"--rdzv-id=(\S+)", line).group(1) for line in lines}) == 1
    (run_dir,) = run_dirs(runs_dir)
    assert f"--run-dir {run_dir}" in lines[0]
    # the run directory every node derives from the rendezvous id; Hydra's timestamped one is gone
    assert run_dir == runs_dir / re.search(r"--rdzv-id=(\S+)", lines[0]).group(1)
    assert [p.name for p in runs_dir.iterdir()] == [run_dir.name]
    # Nothing started: no record, no output log, just the files a node needs to start its workers.
    assert not (run_dir / record.RECORD_FILE).exists() and not (run_dir / "output.log").exists()
    assert (run_dir / "command.txt").read_text().startswith("birder-repro task=resnet50 optim=birder nodes=8")


def test_help_lists_the_config_groups():
    out = birder_repro("--help")
    assert out.returncode == 0, out.stderr
    assert "Configuration groups" in out.stdout
    assert re.search(r"optim: .*birder.*sgdm", out.stdout) and "launcher: " in out.stdout


def test_cfg_job_prints_the_config_and_runs_nothing(runs_dir):
    out = birder_repro("--cfg", "job", "optim=sgdm", "nodes=3")
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    assert printed["optim"]["name"] == "sgdm" and printed["nodes"] == 3
    assert not runs_dir.exists()


def test_a_typo_names_the_key():
    out = birder_repro("train.stepz=3")
    assert out.returncode != 0
    assert "train.stepz" in out.stderr


def test_a_failed_cell_of_a_sweep_does_not_stop_the_others(runs_dir):
    # Both cells are refused (more processes than allowed here): each must still get its failed record.
    out = birder_repro("-m", "launcher=local", "launcher.max_local_processes=1", "gpus_per_node=1", "nodes=2,3")
    assert out.returncode == 1, out.stderr  # the sweep as a whole failed (its cells' lines end the output)
    records = [record.read_record(d) for d in run_dirs(runs_dir)]
    assert [r["cluster"]["nodes"] for r in records] == [2, 3]
    assert all(r["status"] == "failed" and "max_local_processes" in r["error"] for r in records)
    assert all(d.parent.parent.name == "multirun" for d in run_dirs(runs_dir))


# slow: 14 s; a missing dataset through the CLI stays by default: test_bad_input.py (its table row, the record, no
# worker)
@pytest.mark.slow
def test_a_missing_dataset_is_one_line_before_anything_starts(runs_dir):
    out = birder_repro("task=resnet50", "logger=none", f"data.root={runs_dir / 'no-imagenet'}")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout and "torch.distributed.run" not in out.stdout
    message = f"ImageNet train images (<data.root>/train/<class>/*.JPEG) not found at '{runs_dir / 'no-imagenet'}"
    assert (
        out.stderr.splitlines()[0] == f"[birder-repro] {message}/train'. Point data.root=<dir> at a copy, "
        "or run on synthetic data with data.source=synthetic."
    )
    (run_dir,) = run_dirs(runs_dir)
    rec = record.read_record(run_dir)
    assert rec["status"] == "failed" and rec["error"].startswith(message)
    assert not (run_dir / record.LOG_FILE).exists()  # no worker was started


def test_a_dry_run_only_warns_of_a_missing_dataset(runs_dir):
    out = birder_repro("task=lstm_ptb", "logger=none", f"data.root={runs_dir / 'no-ptb'}", "dry_run=true")
    assert out.returncode == 0, out.stderr
    assert "warning" in out.stderr and "ptb.train.txt" in out.stderr and "torch.distributed.run" in out.stdout


def test_a_value_of_the_wrong_type_is_a_config_error_line_not_a_traceback(runs_dir):
    out = birder_repro("optim.lr=abc", "logger=none")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[0].startswith("[birder-repro] config error: optim.lr='abc': use a number")
    (path,) = runs_dir.rglob(record.RECORD_FILE)
    assert "optim.lr='abc'" in record.read_record(path.parent)["error"]


# ------------------------------------------------------------------------------------ run() in-process
def test_local_layout_too_large_is_refused_with_what_to_do(compose, capsys):
    cfg = compose(["nodes=8", "gpus_per_node=8", "launcher=local", "launcher.max_local_processes=8"])
    code = cli.run(cfg)
    assert code != 0
    err = capsys.readouterr().err
    assert "64 processes" in err and "launcher=torchrun" in err and "launcher.max_local_processes" in err
    (run_dir,) = run_dirs(Path(os.environ["BIRDER_RUNS"]))
    rec = record.read_record(run_dir)
    assert rec["status"] == "failed" and "launcher=torchrun" in rec["error"]


def test_dry_run_refusal_writes_no_record(compose, runs_dir):
    cfg = compose(["optim.lr=-1", "dry_run=true"])
    assert cli.run(cfg) == 2
    assert not list(runs_dir.rglob(record.RECORD_FILE))


def test_a_dry_run_prints_a_layout_too_large_for_this_machine(compose, runs_dir, capsys):
    cfg = compose(["nodes=8", "gpus_per_node=8", "launcher=local", "launcher.max_local_processes=8", "dry_run=true"])
    assert cli.run(cfg) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "torch.distributed.run" in line]
    assert "--nproc-per-node=64" in line and "launcher.max_local_processes=8" in line
    assert not list(runs_dir.rglob(record.RECORD_FILE))


def test_workers_that_die_without_a_record_get_a_failed_one(compose, monkeypatch, tmp_path):
    def dying_launch(cfg, run_dir):
        (run_dir / "output.log").write_text("Killed: out of memory\n")
        return 137

    monkeypatch.setattr("birder_repro.launch.launch", dying_launch)
    cfg = compose(TINY, hydra_config=True)
    assert cli.run(cfg, run_dir=tmp_path / "run") == 137
    rec = record.read_record(tmp_path / "run")
    assert rec["status"] == "failed" and "code 137" in rec["error"] and "out of memory" in rec["error"]
    assert rec["command"] == "birder-repro " + " ".join(TINY)
    assert rec["world_size"] == 2 and rec["lr"] == pytest.approx(0.005)


def test_a_stopped_run_whose_workers_wrote_no_record_gets_an_interrupted_one_and_its_resume_command(
    compose, monkeypatch, tmp_path, capsys
):
    def stopped_launch(cfg, run_dir):  # the workers were killed after torchrun's grace, at step 7
        (run_dir / "progress.json").write_text('{"step": 7}')
        return 130

    monkeypatch.setattr("birder_repro.launch.launch", stopped_launch)
    cfg = compose(TINY, hydra_config=True)
    assert cli.run(cfg, run_dir=tmp_path / "run") == 130
    rec = record.read_record(tmp_path / "run")
    assert rec["status"] == "interrupted" and rec["stopped_at_step"] == 7 and rec["checkpoint"] is None
    assert rec["resume_command"] == "birder-repro " + " ".join(TINY) + f" hydra.run.dir={(tmp_path / 'run').resolve()}"
    assert [a["status"] for a in rec["attempts"]] == ["interrupted"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"[birder-repro] resume: {rec['resume_command']}"


@pytest.mark.parametrize("code,signal", [(143, "SIGTERM"), (130, "SIGINT"), (129, "SIGHUP")])
def test_a_stop_whose_workers_wrote_no_record_names_the_signal_the_cli_passed_on(
    compose, monkeypatch, tmp_path, code, signal
):
    monkeypatch.setattr("birder_repro.launch.launch", lambda cfg, run_dir: code)
    assert cli.run(compose(TINY, hydra_config=True), run_dir=tmp_path / "run") == code
    rec = record.read_record(tmp_path / "run")
    assert rec["status"] == "interrupted" and rec["error"].startswith(f"interrupted by {signal} ")


def test_a_node_of_an_emulated_cluster_leaves_the_summary_to_the_users_cli(compose, monkeypatch, tmp_path, capsys):
    """The user's CLI relays each node's lines prefixed ("[node 0] ...") and then tells the run's end itself: the
    summary is said once, by it."""
    from birder_repro.launch import emulated_nodes
    from birder_repro.launch.ending import teller
    from birder_repro.run import finish, schema

    cfg = cli.layout.resolve(compose(TINY), gpu_count=0)
    rec = {**schema.empty_record(), "status": "completed", "task": "resnet20", "optim": "birder", "steps": 3}
    rec["ended"] = "2099-01-01T00:00:00+00:00"
    RunDir(tmp_path).write(rec)
    started = "2026-01-01T00:00:00+00:00"
    monkeypatch.setenv(emulated_nodes.NODE_ENV, "0")
    assert finish.finish_run(cfg, tmp_path, 0, started, teller(cfg)) == 0
    assert "run:        resnet20 with birder" not in capsys.readouterr().out
    monkeypatch.delenv(emulated_nodes.NODE_ENV)
    assert finish.finish_run(cfg, tmp_path, 0, started, teller(cfg)) == 0
    assert capsys.readouterr().out.count("run:        resnet20 with birder") == 1


def test_write_failed_record_has_every_key_and_is_atomic(compose, tmp_path):
    cfg = compose(["nodes=2", "gpus_per_node=1"])
    rec = RunDir(tmp_path).write_failed(cfg, "Traceback: boom")
    on_disk = json.loads((tmp_path / record.RECORD_FILE).read_text())
    assert on_disk == json.loads(json.dumps(rec))
    for key in (
        "status",
        "error",
        "task",
        "optim",
        "cluster",
        "world_size",
        "batch_size",
        "global_batch_size",
        "steps",
        "throughput_samples_per_s",
        "throughput_by_stage",
        "step_time_s",
        "intra_node_bytes_per_step",
        "inter_node_bytes_per_step",
        "fp32_allreduce_bytes_per_step",
        "link_bytes_per_step",
        "metrics",
        "versions",
        "device",
        "git_sha",
        "started",
        "ended",
        "lr",
        "command",
        "config",
    ):
        assert key in on_disk, key
    assert on_disk["status"] == "failed" and on_disk["error"] == "Traceback: boom"
    assert set(on_disk["cluster"]) == {"name", "nodes", "gpus_per_node", "interconnect", "link_mbit"}
    assert on_disk["versions"]["torch"] and on_disk["config"]["nodes"] == 2
    assert [p.name for p in tmp_path.iterdir()] == [record.RECORD_FILE]  # no temporary file left behind


# ------------------------------------------------------------------------------------ launchers
def test_local_command_runs_the_whole_layout_with_shared_out_threads(compose, tmp_path):
    cfg = _resolved(compose, ["nodes=2", "gpus_per_node=2", "launcher=local"])
    cmd = local.command(cfg, tmp_path, env={})
    assert cmd.argv[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=4" in cmd.argv and cmd.argv[-2:] == ["--run-dir", str(tmp_path.resolve())]
    assert cmd.env["OMP_NUM_THREADS"] == str(max(1, local.layout.cpu_count() // 4))
    assert "OMP_NUM_THREADS" not in local.command(cfg, tmp_path, env={"OMP_NUM_THREADS": "3"}).env


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "3",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_NODELIST": "gpu[07-09,12]",
}


def test_auto_is_torchrun_inside_a_multi_node_slurm_step_and_local_elsewhere(compose):
    cfg = compose(["launcher=auto", "nodes=4"])
    assert choose_launcher(cfg, env={}) == "local"
    assert choose_launcher(cfg, env=SLURM) == "torchrun"
    assert choose_launcher(cfg, env={**SLURM, "SLURM_STEP_NUM_NODES": "1"}) == "local"
    assert choose_launcher(compose(["launcher=torchrun"]), env={}) == "torchrun"


def test_torchrun_takes_node_rank_and_rendezvous_from_slurm(compose, tmp_path):
    cfg = _resolved(compose, ["launcher=torchrun", "nodes=4", "gpus_per_node=8"])
    assert torchrun.node_rank(cfg, SLURM) == 3
    assert torchrun.master_addr(cfg, SLURM) == "gpu07"
    argv = torchrun.node_command(cfg, tmp_path, 3, SLURM).argv
    assert "--rdzv-endpoint=gpu07:29500" in argv and "--rdzv-id=slurm-4242.0" in argv
    assert not any(a.startswith("--node-rank") for a in argv)  # c10d ignores it (torch/distributed/run.py)
    assert torchrun.master_addr(cfg, {**SLURM, "MASTER_ADDR": "10.0.0.1"}) == "10.0.0.1"
    with pytest.raises(torchrun.layout.ConfigError, match="nodes=2"):
        torchrun.check_slurm_layout(_resolved(compose, ["launcher=torchrun", "nodes=2"]), SLURM)


def test_settings_win_over_slurm_and_static_rendezvous_passes_the_node_rank(compose, tmp_path):
    cfg = _resolved(
        compose,
        [
            "launcher=torchrun",
            "nodes=4",
            "gpus_per_node=2",
            "launcher.node_rank=1",
            "launcher.master_addr=head",
            "launcher.rdzv_backend=static",
            "launcher.master_port=1234",
        ],
    )
    assert torchrun.node_rank(cfg, SLURM) == 1
    argv = torchrun.node_command(cfg, tmp_path, 2, SLURM).argv
    assert "--node-rank=2" in argv and "--rdzv-endpoint=head:1234" in argv
    with pytest.raises(torchrun.layout.ConfigError, match="launcher.node_rank=5"):
        torchrun.node_rank(_resolved(compose, ["launcher=torchrun", "nodes=4", "launcher.node_rank=5"]), {})


@pytest.mark.parametrize(
    "hostlist,hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[9-11],b", ["a9", "a10", "a11", "b"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-a,gpu-b", ["gpu-a", "gpu-b"]),
    ],
)
def test_slurm_host_lists_expand(hostlist, hosts):
    assert slurm_env.expand_hostlist(hostlist) == hosts


# ------------------------------------------------------------------------------------ the worker
def test_worker_writes_a_completed_record_from_the_training_result(compose, tmp_path, monkeypatch):
    run_dir = _run_dir(compose, tmp_path, ["nodes=1", "gpus_per_node=1"])
    seen = {}

    def fake_train(cfg, *, task, data, model, optimizer, comm, topology, device, run_dir, **_):
        seen.update(lr=optimizer.param_groups[0]["lr"], world=topology.world_size, ddp=type(model).__name__)
        return {
            "steps": 3,
            "samples": 24,
            "throughput_samples_per_s": 10.0,
            "throughput_by_stage": {},
            "step_time_s": {"total": 1.0, "compute": 0.5, "communication": 0.3, "compression": 0.2},
            "intra_node_bytes_per_step": 0.0,
            "inter_node_bytes_per_step": 0.0,
            "fp32_allreduce_bytes_per_step": 0.0,
            "metrics": {"top1": 1.0},
            "final_loss": 4.6,
            "timing_warmup_steps": 1,
        }

    monkeypatch.setattr("birder_repro.train.train", fake_train)
    assert worker.run_worker(run_dir, _lone_process()) == 0
    assert not dist.is_initialized()  # the process group is destroyed at the end
    rec = record.read_record(run_dir)
    assert rec["status"] == "completed" and rec["steps"] == 3 and rec["metrics"] == {"top1": 1.0}
    assert rec["device"] == "cpu" and rec["backend"] == "gloo" and rec["started"] and rec["ended"]
    assert seen == {"lr": pytest.approx(0.005), "world": 1, "ddp": "DistributedDataParallel"}


def test_worker_failure_writes_the_traceback_and_exits_non_zero(compose, tmp_path, monkeypatch):
    run_dir = _run_dir(
        compose,
        tmp_path,
        ["nodes=1", "gpus_per_node=1", "data.source=real", f"data.root={tmp_path / 'no-such-dataset'}"],
    )
    assert worker.run_worker(run_dir, _lone_process()) == 1
    assert not dist.is_initialized()
    rec = record.read_record(run_dir)
    assert rec["status"] == "failed" and rec["error"].startswith("rank 0 failed: DatasetNotFound: ")
    assert "data.root" in rec["error"] and "\n" not in rec["error"]  # one line; the traceback kept apart
    assert "Traceback (most recent call last)" in rec["traceback"] and "build_and_train" in rec["traceback"]


def test_worker_refuses_a_world_that_is_not_the_layout(compose, tmp_path):
    run_dir = _run_dir(compose, tmp_path, ["nodes=2", "gpus_per_node=2"])
    # Rank 0 on a machine that runs 3 processes: nodes of 2 would straddle machines.
    split_node = worker.DistEnv(rank=0, world_size=4, local_rank=0, local_world_size=3, rendezvous=False)
    assert worker.run_worker(run_dir, split_node) == 1
    assert "splits nodes" in record.read_record(run_dir)["error"]
    wrong_world = worker.DistEnv(rank=0, world_size=2, local_rank=0, local_world_size=2, rendezvous=False)
    assert worker.run_worker(run_dir, wrong_world) == 1
    assert "torchrun started 2" in record.read_record(run_dir)["error"]


# ------------------------------------------------------------------------------------ end to end
def test_a_tiny_run_through_the_cli_completes_and_summarises(runs_dir):
    out = birder_repro(*TINY, "train.steps=3", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "SYNTHETIC" in out.stdout  # synthetic data is always said
    (run_dir,) = run_dirs(runs_dir)
    rec = record.read_record(run_dir)
    assert rec["status"] == "completed" and rec["steps"] == 3 and rec["world_size"] == 2
    assert rec["global_batch_size"] == 16 and rec["inter_node_bytes_per_step"] > 0
    assert str(run_dir / record.RECORD_FILE) in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_two_torchrun_agents_form_one_run_of_two_nodes(compose, tmp_path, rdzv):
    """The multi-node path on one machine: the per-node commands a dry run prints, started side by side."""
    port = _free_port()
    cfg = _resolved(
        compose,
        TINY
        + [
            "train.steps=3",
            "launcher=torchrun",
            "gpus_per_node=2",
            f"launcher.rdzv_backend={rdzv}",
            f"launcher.master_port={port}",
        ],
    )
    run_dir = tmp_path / "run"
    record.write_run_files(run_dir, cfg, "birder-repro (test)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(c.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for c in torchrun.commands(cfg, run_dir, env={})
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    rec = record.read_record(run_dir)
    assert rec["status"] == "completed" and rec["world_size"] == 4
    assert rec["intra_node_bytes_per_step"] > 0 and rec["inter_node_bytes_per_step"] > 0


# ------------------------------------------------------------------------------------ helpers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolved(compose, overrides):
    return cli.layout.resolve(compose(overrides), gpu_count=0)


def _run_dir(compose, tmp_path, overrides) -> Path:
    """A run directory as the CLI leaves it for the workers (tiny synthetic smoke run plus ``overrides``)."""
    run_dir = tmp_path / "run"
    record.write_run_files(run_dir, _resolved(compose, TINY + overrides), "birder-repro (test)")
    return run_dir


def _lone_process() -> worker.DistEnv:
    return worker.DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, rendezvous=False)


# ------------------------------------------------------------------------------------ strict keys, honest sweeps
def last_line(text: str) -> str:
    return text.rstrip().splitlines()[-1]


@pytest.mark.parametrize(
    "override,line",
    [
        ("optim=adamz", "optim=adamz: no such choice; did you mean optim=adamw? the choices: adamw, adamw_powersgd,"),
        ("task=mnist", "task=mnist: no such choice; the choices: bert_pretrain, bert_squad, digits, fashion_mnist,"),
        ("resume=/x", "resume: no such setting; did you mean train.resume?"),
    ],
)
def test_an_unknown_choice_or_a_setting_without_its_section_is_one_line(override, line):
    """Hydra's own refusal is twenty lines (its exception carries the group's options): one line, exit 2."""
    out = birder_repro(override, "logger=none")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [out.stderr.strip()] and out.stderr.startswith(
        f"[birder-repro] config error: {line}"
    )


def test_a_choice_refused_in_a_sweeps_cell_is_the_same_one_line(runs_dir):
    out = birder_repro("-m", "optim=sgdm,birdr", "dry_run=true")
    assert out.returncode == 2 and last_line(out.stderr).startswith(
        "[birder-repro] config error: optim=birdr: no such choice; did you mean optim=birder?"
    )


def test_hydras_missing_config_exception_is_read_through_its_public_fields():
    from hydra.errors import MissingConfigException

    exc = MissingConfigException("twenty lines", missing_cfg_file="cluster/ethernet", options=["local", "ethernet_10g"])
    assert cli.override_error_line(exc) == (
        "cluster=ethernet: no such choice; did you mean cluster=ethernet_10g? the choices: ethernet_10g, local"
    )
    assert cli.override_error_line(MissingConfigException("no primary config", missing_cfg_file="config")) is None


def test_an_added_key_no_config_declares_ends_in_one_line_naming_the_closest(runs_dir):
    out = birder_repro("+train.stepz=3", "logger=none")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert last_line(out.stderr).startswith(
        "[birder-repro] config error: train.stepz: no such setting; did you mean train.steps?"
    )
    assert "torch.distributed.run" not in out.stdout


def test_a_sweep_with_a_failed_cell_exits_non_zero_and_lists_it(runs_dir):
    out = birder_repro("-m", "optim.lr=0.1,abc", "task=digits", "logger=none", "dry_run=true")
    assert out.returncode == 1, out.stderr
    assert out.stdout.count("torch.distributed.run") == 1  # the good cell still ran (a dry run: printed)
    head, cell = out.stderr.rstrip().splitlines()[-2:]
    assert head == "[birder-repro] sweep: 1 of 2 cells failed or were refused:"
    assert cell.startswith("[birder-repro]   #1 optim.lr=abc task=digits logger=none dry_run=")
    assert ": config error: optim.lr='abc': use a number" in cell and cell.endswith("(exit code 2)")


def test_a_sweep_whose_cells_all_pass_exits_zero_and_lists_nothing(runs_dir):
    """Hydra's own settings (hydra.*) are no unknown keys."""
    out = birder_repro(
        "-m",
        "optim.lr=0.1,0.2",
        "task=digits",
        "logger=none",
        "dry_run=true",
        f"hydra.sweep.dir={runs_dir / 'mine'}",
        "+hydra.job.env_set.BIRDER_TEST=1",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("torch.distributed.run") == 2 and "sweep:" not in out.stderr
    assert [d.parent for d in run_dirs(runs_dir)] == [runs_dir / "mine"] * 2


@pytest.mark.slow  # 16 s (12 Hydra jobs); the sweep's own tests (a failed cell, all passing) stay by default
def test_the_table3_dry_run_prints_all_twelve_cells(runs_dir):
    out = birder_repro("-m", "experiment=table3", "optim=sgdm,onebit_adam,birder", "nodes=1,2,4,8", "dry_run=true")
    assert out.returncode == 0, out.stderr[-3000:]
    commands = [line for line in out.stdout.splitlines() if "torch.distributed.run" in line]
    assert len(commands) == 12 and "config error" not in out.stderr
    assert sum("--nproc-per-node=64" in c and "launcher.max_local_processes" in c for c in commands) == 3


def test_ctrl_c_in_a_cell_stops_the_whole_sweep(runs_dir):
    """A cell interrupted (the CLI's run returns 130) ends the sweep at once, with 130, and no report."""
    code = (
        "import sys; from birder_repro import cli; "
        "cli.run = lambda cfg, run_dir=None: print('cell', flush=True) or cli.INTERRUPTED; "
        "sys.argv = ['birder-repro', '-m', 'nodes=1,2', 'logger=none']; cli.main()"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == cli.INTERRUPTED and out.stdout.count("cell") == 1
    assert "sweep:" not in out.stderr


def test_a_pair_without_a_paper_recipe_says_so_at_start(runs_dir):
    out = birder_repro("task=resnet50", "optim=adamw", "logger=none", "dry_run=true")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0] == (
        "[birder-repro] no paper recipe for task=resnet50 optim=adamw (no conf/recipe/resnet50/adamw.yaml): the "
        "generic settings of conf/optim/adamw.yaml apply: lr=0.001, lr_batch_scaling=null, betas=[0.9, 0.999], "
        "eps=1e-08, weight_decay=0.01"
    )


@pytest.mark.parametrize(
    "overrides",
    [["task=resnet50", "optim=sgdm"], ["task=digits", "optim=birder"], ["mode=probe", "task=resnet50", "optim=adamw"]],
)
def test_a_pair_with_a_recipe_or_a_probe_says_nothing_of_one(overrides):
    from conftest import compose_config

    assert cli.missing_recipe_line(compose_config(overrides, hydra_config=True)) is None


def test_a_group_of_the_users_own_config_dir_adds_its_keys(runs_dir, tmp_path):
    """--config-dir adds a directory of the user's: its ``+group=option`` may add keys; a bare ``+key=`` may not."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "fast.yaml").write_text("# @package _global_\ntrain:\n  steps: 2\nnote: mine\n")
    common = ["--config-dir", str(tmp_path), "task=digits", "logger=none", "dry_run=true"]
    out = birder_repro(*common, "+mine=fast")
    assert out.returncode == 0, out.stderr
    (run_dir,) = run_dirs(runs_dir)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["note"] == "mine" and resolved["train"]["steps"] == 2
    refused = birder_repro(*common, "+note=mine")
    assert refused.returncode == 2 and "note: no such setting" in last_line(refused.stderr)


def test_the_config_dir_example_of_the_docs_works_as_copied_and_a_misplaced_directive_is_refused(runs_dir, tmp_path):
    """docs/configuration.md's own example, copied as written (its YAML block and its command), sets what it says;
    the same file with a comment above ``# @package _global_`` is refused in one line instead of running with the
    settings under ``mine.``."""
    page = (REPO / "docs" / "configuration.md").read_text()
    section = page[page.index("### Your own config directory") :]
    example = re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1)
    command = re.search(r"^    (birder-repro --config-dir DIR .*)$", section, flags=re.M).group(1).split()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "fast.yaml").write_text(example)
    args = [str(tmp_path) if a == "DIR" else a for a in command[1:]]
    out = birder_repro(*args, "logger=none", "dry_run=true")
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = run_dirs(runs_dir)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["train"]["steps"] == 200 and resolved["data"]["source"] == "synthetic" and "mine" not in resolved
    (tmp_path / "mine" / "fast.yaml").write_text("# DIR/mine/fast.yaml\n" + example)
    refused = birder_repro(*args, "logger=none", "dry_run=true")
    assert refused.returncode == 2
    assert "mine.data, mine.train: settings under 'mine.'" in last_line(refused.stderr), refused.stderr[-2000:]
    assert "# @package _global_" in last_line(refused.stderr)


def test_a_cell_that_crashes_or_raises_is_a_failed_cell_with_its_last_line(monkeypatch, capsys):
    """The sweep's verdict for cells that fail at run time, not at config time: a cell whose run returned 1 and
    one that raised are both listed with their last stderr line, and the sweep exits 1; a cell returning 0
    (or True, which is no exit code) is not a failure."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from birder_repro import sweep

    def cell(num: int, status: JobStatus, value, said: str) -> None:
        cfg = OmegaConf.create({"hydra": {"job": {"num": num}}})
        report.on_job_start(cfg)
        print(said, file=sys.stderr)
        job = JobReturn(overrides=[f"optim=x{num}"], status=status)
        job._return_value = value
        report.on_job_end(cfg, job)

    report = sweep.SweepReport()
    report.on_multirun_start(OmegaConf.create({}))
    cell(0, JobStatus.COMPLETED, 0, "fine")
    cell(1, JobStatus.COMPLETED, 1, "[birder-repro] rank 1 died: Signal 9 (SIGKILL)")
    cell(2, JobStatus.FAILED, RuntimeError("boom"), "RuntimeError: boom")
    cell(3, JobStatus.COMPLETED, True, "a task function returning True")
    with pytest.raises(SystemExit) as ended:
        report.on_multirun_end(OmegaConf.create({}))
    assert ended.value.code == sweep.FAILED_SWEEP
    err = capsys.readouterr().err
    assert "sweep: 2 of 4 cells failed or were refused:" in err
    assert "#1 optim=x1: rank 1 died: Signal 9 (SIGKILL) (exit code 1)" in err
    assert "#2 optim=x2: RuntimeError: boom (exit code 1)" in err
    assert "#0 " not in err and "#3 " not in err
