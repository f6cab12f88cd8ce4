"""launcher=slurm: the batch script a dry run writes, what it runs on each node (with stand-ins for srun and
scontrol), its submission through sbatch (a stand-in too), and the refusals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from birder_repro import cli
from birder_repro.config import settings as layout
from birder_repro.launch import slurm
from birder_repro.run import record

REPO = Path(__file__).resolve().parent.parent
LAYOUT_8x8 = ["task=resnet50", "optim=birder", "nodes=8", "gpus_per_node=8", "launcher=slurm"]
TINY = [
    "experiment=smoke",
    "logger=none",
    "model.size=tiny",
    "train.batch_size=8",
    "data.synthetic_train_size=64",
    "data.synthetic_eval_size=16",
    "train.eval_max_batches=1",
]


def birder_repro(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


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
    shim(
        bin_dir,
        "scontrol",
        f"""\
        if [ "$1" = requeue ]; then echo "$2" >> {bin_dir / "requeued"}; exit 0; fi
        [ "$1 $2" = "show hostnames" ] || exit 2
        echo {first}; for i in $(seq 2 {nodes}); do printf 'gpu%03d\\n' $i; done
    """,
    )
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": job_id,
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": f"gpu[001-{nodes:03d}]",
        "SLURM_CPUS_PER_TASK": str(cpus),
    }


# ------------------------------------------------------------------------------------------ dry run
def test_dry_run_writes_and_prints_the_batch_script_for_8_nodes_of_8_gpus(runs_dir):
    out = birder_repro(
        *LAYOUT_8x8, "launcher.partition=gpu", "launcher.account=proj", "launcher.time=02:30:00", "dry_run=true"
    )
    assert out.returncode == 0, out.stderr
    run_dir = run_dir_of(runs_dir)
    script = (run_dir / slurm.SCRIPT_FILE).read_text()
    assert script in out.stdout and "nothing was submitted" in out.stdout
    directives = re.findall(r"^#SBATCH (\S+)$", script, flags=re.M)
    for d in (
        "--nodes=8",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=proj",
        "--time=02:30:00",
        f"--output={run_dir.resolve()}/slurm-%j.out",
        "--job-name=birder-resnet50-birder-n8",
        "--cpus-per-task=40",
        "--signal=B:USR1@120",
        "--requeue",
        "--open-mode=append",
    ):
        assert d in directives, d
    command = " ".join(
        line.rstrip("\\").strip()
        for line in script.splitlines()
        if not line.startswith("#") and ("srun" in line or line.startswith("  "))
    )
    assert command.count("srun ") == 1 and command.count("torch.distributed.run") == 1  # one per node task
    for arg in (
        '--nnodes="$SLURM_NNODES"',
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
        "--ntasks-per-node=1",
        f"-m birder_repro.train.worker --run-dir {run_dir.resolve()}",
    ):
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
    shim(
        bin_dir,
        "srun",
        """\
        while [[ "$1" == --* ]]; do shift; done   # srun's own options
        for node in $(seq 0 $((SLURM_NNODES - 1))); do echo "node $node: $*"; done
    """,
    )
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("node ")]
    assert len(lines) == 8 and [line.split(":")[0] for line in lines] == [f"node {k}" for k in range(8)]
    for line in lines:
        for arg in (
            "-m torch.distributed.run",
            "--nnodes=8",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=gpu001:29500",
            "--rdzv-id=4242",
            f"--run-dir {tmp_path.resolve()}",
        ):
            assert arg in line, arg


@pytest.mark.slow
def test_the_script_trains_two_nodes_on_this_machine(compose, tmp_path):
    """srun as a stand-in that starts each node's task here: the two torchruns meet and the run completes."""
    cfg = layout.resolve(
        compose(
            TINY
            + [
                "launcher=slurm",
                "nodes=2",
                "gpus_per_node=1",
                "train.steps=3",
                "launcher.gpus=false",
                f"launcher.master_port={_free_port()}",
            ]
        ),
        gpu_count=0,
    )
    record.write_run_files(tmp_path, cfg, "birder-repro (test)")
    script = slurm.write_script(cfg, tmp_path)
    bin_dir = tmp_path / "bin"
    env = job_env(bin_dir, nodes=2, first="127.0.0.1")
    shim(
        bin_dir,
        "srun",
        """\
        while [[ "$1" == --* ]]; do shift; done
        for node in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$node "$@" & done
        wait
    """,
    )
    out = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rec = record.read_record(tmp_path)
    assert rec["status"] == "completed" and rec["world_size"] == 2 and rec["inter_node_bytes_per_step"] > 0


# ------------------------------------------------------------------------------------------ directives
def slurm_cfg(compose, *overrides: str, layout_args=LAYOUT_8x8):
    return layout.resolve(compose([*layout_args, *overrides]), gpu_count=0)


def directives(cfg, run_dir: Path) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", slurm.batch_script(cfg, run_dir), flags=re.M)


DIGITS_1x2 = ["task=digits", "optim=sgdm", "nodes=1", "gpus_per_node=2", "launcher=slurm", "launcher.gpus=false"]


def test_cpus_per_task_auto_asks_for_every_process_and_its_loaders(compose, tmp_path):
    """resnet50 loads with data.num_workers=auto (counted as AUTO_LOADERS), digits with none."""
    assert slurm.cpus_per_task(slurm_cfg(compose)) == 8 * (slurm.AUTO_LOADERS + 1)
    assert slurm.cpus_per_task(slurm_cfg(compose, "data.num_workers=2")) == 8 * 3
    assert slurm.cpus_per_task(slurm_cfg(compose, layout_args=DIGITS_1x2)) == 2
    given = slurm_cfg(compose, "launcher.cpus_per_task=64")
    assert "--cpus-per-task=64" in directives(given, tmp_path)
    srun = (
        'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task="$SLURM_CPUS_PER_TASK"'
    )
    assert srun in slurm.batch_script(given, tmp_path)  # srun is told again (SLURM 22.05-23.02 did not pass it on)
    default = slurm.batch_script(slurm_cfg(compose, "launcher.cpus_per_task=null"), tmp_path)
    assert "--cpus-per-task" not in default


def test_requeue_directives_and_the_shells_traps(compose, tmp_path):
    script = slurm.batch_script(slurm_cfg(compose, "launcher.signal_s=300"), tmp_path)
    found = re.findall(r"^#SBATCH (\S+)$", script, flags=re.M)
    assert {"--signal=B:USR1@300", "--requeue", "--open-mode=append"} <= set(found)
    for line in (
        "trap 'stop_workers USR1' USR1",
        "trap 'stop_workers TERM' TERM",
        'scontrol requeue "$SLURM_JOB_ID"',
        "--shutdown-timeout=30",
        "-m birder_repro.launch.job_end",
    ):
        assert line in script, line
    off = slurm.batch_script(slurm_cfg(compose, "launcher.requeue=false"), tmp_path)
    assert "--signal" not in off and "--requeue" not in off and "scontrol requeue" not in off
    assert "USR1" not in off and "trap 'stop_workers TERM' TERM" in off and "--open-mode=append" in off


@pytest.mark.parametrize(
    "override,key",
    [
        ("launcher.time=1h", "launcher.time"),
        ("launcher.signal_s=0", "launcher.signal_s"),
        ("launcher.time=2", "launcher.signal_s=120 is not shorter"),
        ("train.stop_timeout_s=200", "train.stop_timeout_s=200"),
        ("launcher.cpus_per_task=0", "launcher.cpus_per_task"),
    ],
)
def test_bad_job_settings_are_refused_naming_the_key(compose, override, key):
    with pytest.raises(layout.ConfigError, match=re.escape(key)):
        slurm.check_config(slurm_cfg(compose, override))


def test_slurm_time_limits_in_every_form_of_man_sbatch():
    from birder_repro.launch.slurm_env import time_limit_s

    forms = {
        "90": 5400,
        "90:30": 5430,
        "01:00:00": 3600,
        "2-12": 216000,
        "2-12:30": 217800,
        "1-00:00:01": 86401,
        "0": None,
        "UNLIMITED": None,
    }
    assert {text: time_limit_s(text) for text in forms} == forms
    for bad in ("1h", "1:2:3:4", "-5", "x-1"):
        with pytest.raises(ValueError, match="not a SLURM time"):
            time_limit_s(bad)


# ------------------------------------------------------------------------------------------ warnings
def test_a_time_limit_the_run_outlasts_without_a_checkpoint_is_warned_of(compose):
    """ResNet-50 on 8 x 8 for 100 epochs: 62,600 steps, 1.4 h by the performance model (the paper's profile)."""
    stops = ["launcher.requeue=false"]  # no checkpoint at the stop either
    (warning,) = [w for w in slurm.warnings(slurm_cfg(compose, *stops, "cluster=ethernet_10g"))]
    assert warning.startswith("warning: the run is predicted to take 1.") and "62600 steps" in warning
    assert "launcher.time=01:00:00" in warning and "train.checkpoint_every=" in warning
    assert slurm.warnings(slurm_cfg(compose, *stops, "cluster=ethernet_10g", "launcher.time=04:00:00")) == []
    assert slurm.warnings(slurm_cfg(compose, *stops, "cluster=ethernet_10g", "train.checkpoint_every=1000")) == []
    # a checkpoint interval the limit does not reach saves nothing either
    assert slurm.warnings(slurm_cfg(compose, *stops, "cluster=ethernet_10g", "train.checkpoint_every=60000"))


def test_a_run_that_checkpoints_when_stopped_is_told_the_requeues_to_expect(compose):
    """The defaults: requeue on the limit, a checkpoint on the stop (train.checkpoint_on_stop): a note, no warning;
    without the stop's checkpoint, the warning names the setting."""
    (note,) = slurm.warnings(slurm_cfg(compose, "cluster=ethernet_10g"))
    assert note.startswith("note: the run is predicted to take 1.") and "expect about 1 requeue(s)" in note
    (warning,) = slurm.warnings(slurm_cfg(compose, "cluster=ethernet_10g", "train.checkpoint_on_stop=false"))
    assert warning.startswith("warning: ") and "train.checkpoint_on_stop=false" in warning


def test_without_a_prediction_a_job_that_never_checkpoints_is_warned_of(compose):
    """digits has no paper profile: the rule, no checkpoint ever saved."""
    (warning,) = slurm.warnings(
        slurm_cfg(compose, "launcher.requeue=false", "cluster=ethernet_10g", layout_args=DIGITS_1x2)
    )
    assert "no checkpoint is ever saved" in warning and "train.checkpoint_every=<steps>" in warning
    assert (
        slurm.warnings(
            slurm_cfg(
                compose,
                "launcher.requeue=false",
                "cluster=ethernet_10g",
                "train.checkpoint_every=50",
                layout_args=DIGITS_1x2,
            )
        )
        == []
    )


def test_cluster_local_under_slurm_is_warned_of(compose, runs_dir):
    warned = [w for w in slurm.warnings(slurm_cfg(compose, "launcher.time=04:00:00")) if "cluster=local" in w]
    assert warned and "cluster=ethernet_10g" in warned[0] and "infiniband_200g" in warned[0]
    assert not [w for w in slurm.warnings(slurm_cfg(compose, "cluster=infiniband_200g")) if "cluster=" in w]
    out = birder_repro(*LAYOUT_8x8, "dry_run=true")
    assert "[birder-repro] warning: cluster=local under SLURM" in out.stderr


def test_cluster_local_is_warned_of_by_node_0_of_a_torchrun_run_inside_an_allocation(compose, tmp_path, capsys):
    """A user's own sbatch script with srun birder-repro ...: launcher=auto is torchrun on each node."""
    from birder_repro.launch import launch

    inside = {"SLURM_JOB_ID": "9", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    for cluster, node, warned in (("local", "0", True), ("local", "1", False), ("ethernet_10g", "0", False)):
        cfg = layout.resolve(compose(["nodes=2", "gpus_per_node=1", f"cluster={cluster}", "dry_run=true"]), gpu_count=0)
        assert launch(cfg, tmp_path, env={**inside, "SLURM_NODEID": node}) == 0
        assert ("warning: cluster=local under SLURM" in capsys.readouterr().err) == warned, (cluster, node)


# ------------------------------------------------------------------------------------------ stop and requeue
FAKE_STEP = textwrap.dedent("""
    import pathlib, signal, sys, time
    run, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
    def stop(*_):  # on SIGTERM the workers stop, with a checkpoint (or none), and no record: the CLI's end writes it
        if mode == "checkpoint":
            step = run / "checkpoints" / "step-000007"
            step.mkdir(parents=True)
            (step / "manifest.json").write_text("{}")
            (step / "COMPLETE").write_text("")
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    (run / "step-running").touch()
    while True:
        time.sleep(0.05)
""")


@pytest.mark.parametrize(
    "sig,mode,requeued,code",
    [
        (signal.SIGUSR1, "checkpoint", True, 0),
        (signal.SIGUSR1, "none", False, 143),
        (signal.SIGTERM, "checkpoint", False, 143),
    ],
)
def test_the_batch_shell_stops_the_step_and_requeues_only_after_usr1_with_a_newer_checkpoint(
    compose, tmp_path, sig, mode, requeued, code
):
    """srun: a stand-in step that checkpoints on SIGTERM (or not). USR1 (the limit is near) with a new checkpoint:
    requeued; without one: not (the next attempt would start where this one did); TERM (scancel): never."""
    cfg = slurm_cfg(compose, layout_args=DIGITS_1x2)
    run_dir = tmp_path / "run"
    record.write_run_files(run_dir, cfg, "birder-repro (test)")
    script = slurm.write_script(cfg, run_dir)
    bin_dir = tmp_path / "bin"
    env = job_env(bin_dir, nodes=1, first="127.0.0.1")
    (tmp_path / "step.py").write_text(FAKE_STEP)
    shim(bin_dir, "srun", f"exec {sys.executable} {tmp_path / 'step.py'} {run_dir} {mode}\n")
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env}
    )
    while not (run_dir / "step-running").exists():  # the traps are set once srun runs
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert (bin_dir / "requeued").exists() == requeued, out
    assert f"[birder-repro] {sig.name} at " in out and "[birder-repro] resume: " in out, out
    assert record.read_record(run_dir)["status"] == "interrupted"
    if requeued:
        assert (bin_dir / "requeued").read_text().split() == ["777"] and "requeueing job 777" in out
    elif sig == signal.SIGUSR1:
        assert "not requeued" in out


# ------------------------------------------------------------------------------------------ a whole job
JOB_RUNNER = textwrap.dedent("""
    # sbatch's stand-in, in the background: runs the batch script as SLURM would, its output appended to the job's
    # --output file; on the first attempt delivers USR1 to the batch shell once rank 0 holds before step STOP (the
    # fake time limit is near); runs the script again, with SLURM_RESTART_COUNT, while scontrol requeue was called.
    import json, os, pathlib, re, signal, subprocess, sys, time
    script, job_id, stop_at = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    text = script.read_text()
    output = re.search(r"^#SBATCH --output=(\\S+)$", text, re.M).group(1).replace("%j", job_id)
    cpus = re.search(r"^#SBATCH --cpus-per-task=(\\d+)$", text, re.M).group(1)
    run_dir = pathlib.Path(output).parent
    requeued, attempt, code = pathlib.Path(os.environ["REQUEUED_FILE"]), 0, None
    while code is None or requeued.exists():
        requeued.unlink(missing_ok=True)
        env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost",
               "SLURM_CPUS_PER_TASK": cpus}
        if attempt:
            env["SLURM_RESTART_COUNT"] = str(attempt)
            env.pop("BIRDER_TEST_FAULT", None)  # the time limit came once
        with open(output, "a") as out:
            shell = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT, env=env)
            while attempt == 0 and shell.poll() is None:
                try:
                    reached = json.loads((run_dir / "progress.json").read_text())["step"]
                except (OSError, ValueError, KeyError):
                    reached = 0
                if reached >= stop_at - 1:
                    shell.send_signal(signal.SIGUSR1)
                    break
                time.sleep(0.1)
            code = shell.wait()
        attempt += 1
    (run_dir / "job-done").write_text(f"{code} {attempt}")
""")


def test_a_job_signalled_before_its_time_limit_saves_is_requeued_resumes_and_completes(runs_dir, tmp_path):
    """The whole path through stand-ins for sbatch, srun and scontrol: submitted by the CLI; USR1 when rank 0
    holds before step 6 (BIRDER_TEST_FAULT=wait); the batch shell stops the step, the workers checkpoint step 5
    (train.checkpoint_every=0: the stop's own checkpoint), the shell requeues; attempt 2 (SLURM_RESTART_COUNT=1)
    resumes from step 5 and completes; both attempts and the summary are in the job's output file."""
    bin_dir = tmp_path / "bin"
    (tmp_path / "runner.py").write_text(JOB_RUNNER)
    shim(
        bin_dir,
        "sbatch",
        f"""\
        [ "$1" = --parsable ] || exit 2
        {sys.executable} {tmp_path / "runner.py"} "$2" 4242 6 > {tmp_path / "runner.log"} 2>&1 &
        echo 4242
    """,
    )
    shim(
        bin_dir,
        "srun",
        """\
        while [[ "$1" == --* ]]; do shift; done   # srun's own options; one node: its task here, signals forwarded
        SLURM_NODEID=0 "$@" & task=$!
        trap 'kill -TERM $task' TERM
        wait $task; code=$?
        while kill -0 $task 2>/dev/null; do wait $task; code=$?; done
        exit $code
    """,
    )
    shim(
        bin_dir,
        "scontrol",
        f"""\
        if [ "$1" = requeue ]; then echo "$2" >> {tmp_path / "requeued"}; exit 0; fi
        [ "$1 $2" = "show hostnames" ] && echo localhost
    """,
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "REQUEUED_FILE": str(tmp_path / "requeued"),
        "BIRDER_TEST_FAULT": "wait:0:6",
        "OMP_NUM_THREADS": "1",
    }
    out = birder_repro(
        "task=digits",
        "optim=sgdm",
        "nodes=1",
        "gpus_per_node=2",
        "launcher=slurm",
        "logger=none",
        "launcher.gpus=false",
        "cluster=ethernet_10g",
        "model.size=tiny",
        "train.steps=12",
        "train.batch_size=8",
        "train.eval_max_batches=1",
        f"launcher.master_port={_free_port()}",
        env=env,
    )
    assert out.returncode == 0 and "submitted SLURM job 4242" in out.stdout, out.stderr
    run_dir = run_dir_of(runs_dir)
    while not (run_dir / "job-done").exists():  # no deadline: pytest's timeout ends a hang
        time.sleep(0.5)
    job_out = (run_dir / "slurm-4242.out").read_text()
    assert (run_dir / "job-done").read_text().split() == ["0", "2"], job_out + (tmp_path / "runner.log").read_text()
    first, second = job_out.split("attempt 2,")
    assert "SIGUSR1 at" in first and "requeueing job 4242" in first and "resume: " in first
    assert "status:     completed, 12 steps" in second, second[-3000:]
    rec = record.read_record(run_dir)
    assert rec["status"] == "completed" and rec["steps"] == 12
    attempts = [(a["status"], a["from_step"], a["to_step"]) for a in rec["attempts"]]
    assert attempts == [("interrupted", 0, 5), ("completed", 5, 12)], rec["attempts"]


# ------------------------------------------------------------------------------------------ submission
def test_submission_through_sbatch_records_the_job_and_returns(runs_dir, tmp_path):
    bin_dir = tmp_path / "bin"
    shim(
        bin_dir,
        "sbatch",
        f"""\
        [ "$1" = --parsable ] && [ -f "$2" ] || exit 2
        echo "$2" > {tmp_path / "submitted"}; echo "31337;cluster-a"
    """,
    )
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
