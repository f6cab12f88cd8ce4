"""launcher=slurm: the batch script a dry run writes, what it runs on each node (with stand-ins for srun and
scontrol), its submission through sbatch (a stand-in too), and the refusals."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from birder_repro import cli, record
from birder_repro import config as layout
from birder_repro.launch import slurm

REPO = Path(__file__).resolve().parent.parent
LAYOUT_8x8 = ["task=resnet50", "optim=birder", "nodes=8", "gpus_per_node=8", "launcher=slurm"]
TINY = ["experiment=quickstart", "logger=none", "model.size=tiny", "train.batch_size=8",
        "data.synthetic_train_size=64", "data.synthetic_eval_size=16", "train.eval_max_batches=1"]


def birder_repro(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "birder_repro.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def run_dir_of(runs: Path) -> Path:
    (path,) = [p.parent for p in runs.rglob("config.yaml") if p.parent.name != ".hydra"]
    return path


def shim(bin_dir: Path, name: str, body: str) -> None:
    """An executable stand-in for a SLURM command."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def job_env(bin_dir: Path, nodes: int, job_id: str = "777", first: str = "gpu001", cpus: int = 2) -> dict:
    """What SLURM sets for a batch script (SLURM_CPUS_PER_TASK: sbatch --cpus-per-task), and a PATH whose srun
    and scontrol are stand-ins."""
    shim(bin_dir, "scontrol", f"""\
        [ "$1 $2" = "show hostnames" ] || exit 2
        echo {first}; for i in $(seq 2 {nodes}); do printf 'gpu%03d\\n' $i; done
    """)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": job_id, "SLURM_NNODES": str(nodes),
            "SLURM_JOB_NODELIST": f"gpu[001-{nodes:03d}]", "SLURM_CPUS_PER_TASK": str(cpus)}


# ------------------------------------------------------------------------------------------ dry run
def test_dry_run_writes_and_prints_the_batch_script_for_8_nodes_of_8_gpus(runs_dir):
    out = birder_repro(*LAYOUT_8x8, "launcher.partition=gpu", "launcher.account=proj", "launcher.time=02:30:00",
                       "dry_run=true")
    assert out.returncode == 0, out.stderr
    run_dir = run_dir_of(runs_dir)
    script = (run_dir / slurm.SCRIPT_FILE).read_text()
    assert script in out.stdout and "nothing was submitted" in out.stdout
    directives = re.findall(r"^#SBATCH (\S+)$", script, flags=re.M)
    for d in ("--nodes=8", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu", "--account=proj",
              "--time=02:30:00", f"--output={run_dir.resolve()}/slurm-%j.out", "--job-name=birder-resnet50-birder-n8",
              "--cpus-per-task=40", "--signal=B:USR1@120", "--requeue", "--open-mode=append"):
        assert d in directives, d
    command = " ".join(line.rstrip("\\").strip() for line in script.splitlines() if not line.startswith("#")
                       and ("srun" in line or line.startswith("  ")))
    assert command.count("srun ") == 1 and command.count("torch.distributed.run") == 1  # one per node task
    for arg in ('--nnodes="$SLURM_NNODES"', "--nproc-per-node=8", "--rdzv-backend=c10d",
                '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"', "--ntasks-per-node=1",
                f"-m birder_repro.worker --run-dir {run_dir.resolve()}"):
        assert arg in command, arg
    assert subprocess.run(["bash", "-n", str(run_dir / slurm.SCRIPT_FILE)]).returncode == 0
    assert not (run_dir / record.RECORD_FILE).exists()  # nothing ran, nothing recorded


def test_the_script_runs_one_torchrun_per_node_at_the_first_node(compose, tmp_path):
    """Executed as SLURM would (srun: a stand-in that prints each node's command): 8 nodes, 8 commands, all
    with the job's first node as rendezvous and the job id as rendezvous id."""
    cfg = layout.resolve(compose(LAYOUT_8x8), gpu_count=0)
    record.write_run_files(tmp_path, cfg, "birder-repro (test)")
    script = slurm.write_script(cfg, tmp_path)
    bin_dir = tmp_path / "bin"
    env = job_env(bin_dir, nodes=8, job_id="4242", first="gpu001")
    shim(bin_dir, "srun", """\
        while [[ "$1" == --* ]]; do shift; done   # srun's own options
        for node in $(seq 0 $((SLURM_NNODES - 1))); do echo "node $node: $*"; done
    """)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("node ")]
    assert len(lines) == 8 and [line.split(":")[0] for line in lines] == [f"node {k}" for k in range(8)]
    for line in lines:
        for arg in ("-m torch.distributed.run", "--nnodes=8", "--nproc-per-node=8", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=gpu001:29500", "--rdzv-id=4242", f"--run-dir {tmp_path.resolve()}"):
            assert arg in line, arg


@pytest.mark.slow
def test_the_script_trains_two_nodes_on_this_machine(compose, tmp_path):
    """srun as a stand-in that starts each node's task here: the two torchruns meet and the run completes."""
    cfg = layout.resolve(compose(TINY + ["launcher=slurm", "nodes=2", "gpus_per_node=1", "train.steps=3",
                                         "launcher.gpus=false", f"launcher.master_port={_free_port()}"]), gpu_count=0)
    record.write_run_files(tmp_path, cfg, "birder-repro (test)")
    script = slurm.write_script(cfg, tmp_path)
    bin_dir = tmp_path / "bin"
    env = job_env(bin_dir, nodes=2, first="127.0.0.1")
    shim(bin_dir, "srun", """\
        while [[ "$1" == --* ]]; do shift; done
        for node in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$node "$@" & done
        wait
    """)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **env, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    rec = record.read_record(tmp_path)
    assert rec["status"] == "completed" and rec["world_size"] == 2 and rec["inter_node_bytes_per_step"] > 0


# ------------------------------------------------------------------------------------------ submission
def test_submission_through_sbatch_records_the_job_and_returns(runs_dir, tmp_path):
    bin_dir = tmp_path / "bin"
    shim(bin_dir, "sbatch", f"""\
        [ "$1" = --parsable ] && [ -f "$2" ] || exit 2
        echo "$2" > {tmp_path / 'submitted'}; echo "31337;cluster-a"
    """)
    out = birder_repro(*LAYOUT_8x8, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    run_dir = run_dir_of(runs_dir)
    assert (tmp_path / "submitted").read_text().strip() == str(run_dir / slurm.SCRIPT_FILE)
    assert (run_dir / slurm.JOB_ID_FILE).read_text().strip() == "31337"
    assert "submitted SLURM job 31337" in out.stdout and "workers finished" not in out.stdout
    assert not (run_dir / record.RECORD_FILE).exists()  # the job's rank 0 writes it when it runs


def test_without_sbatch_the_run_fails_with_what_to_do(runs_dir):
    out = birder_repro(*LAYOUT_8x8, env={"PATH": "/nonexistent"})
    assert out.returncode != 0
    assert "sbatch, which is not on PATH" in out.stderr
    rec = record.read_record(run_dir_of(runs_dir))
    assert rec["status"] == "failed" and "sbatch" in rec["error"]


def test_static_rendezvous_is_refused(compose, tmp_path):
    cfg = compose(LAYOUT_8x8 + ["launcher.rdzv_backend=static", "dry_run=true"], hydra_config=True)
    assert cli.run(cfg, run_dir=tmp_path / "run") == 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
