"""``launcher=slurm``: the run as one SLURM batch job, one task per node, each running torchrun.

    birder-repro task=resnet50 optim=birder nodes=8 gpus_per_node=8 launcher=slurm launcher.partition=gpu
    birder-repro ... launcher=slurm dry_run=true      # writes <run dir>/job.sbatch, prints it, submits nothing

The batch script asks for N nodes with one task each; ``srun`` starts on every node the command that
``launcher=torchrun`` prints for a node: ``torchrun --nnodes=$SLURM_NNODES --nproc-per-node=M`` with the c10d
rendezvous on the job's first node and the job id as rendezvous id, so that the nodes find each other without
any per-node setting. torchrun numbers the nodes as they join; every worker reads the run directory's
resolved config, and rank 0 writes ``record.json`` there when the job ends: the run directory must be on a
file system that every node shares.

The script is written here rather than by submitit: what a dry run prints is exactly what runs, the default
install can write it (no extra package), and it is submitted with ``sbatch``, present wherever SLURM is.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from omegaconf import DictConfig

from birder_repro import config as layout
from birder_repro import record
from birder_repro.launch.torchrun import WORKER, Rendezvous, max_restarts, torchrun_argv

__all__ = ["SCRIPT_FILE", "JOB_ID_FILE", "check_config", "job_name", "batch_script", "write_script", "submit",
           "launch"]

SCRIPT_FILE = "job.sbatch"
JOB_ID_FILE = "slurm_job_id"
# Options passed to sbatch as they are given: config key -> sbatch option.
OPTIONAL_DIRECTIVES = {"partition": "--partition", "account": "--account", "qos": "--qos",
                       "constraint": "--constraint", "mem": "--mem", "cpus_per_task": "--cpus-per-task"}


def check_config(cfg: DictConfig) -> None:
    """Settings a batch job cannot use; each error names its key."""
    if (cfg.launcher.get("rdzv_backend") or "c10d") != "c10d":
        raise layout.ConfigError(f"launcher.rdzv_backend={cfg.launcher.rdzv_backend}: a SLURM job runs the same "
                                 "command on every node, which needs the c10d rendezvous: set it to c10d")
    if not str(cfg.launcher.time or "").strip():
        raise layout.ConfigError("launcher.time is empty: give the job's wall-clock limit, e.g. 04:00:00")
    if int(cfg.nodes) < 1:
        raise layout.ConfigError(f"nodes={cfg.nodes}: a job needs at least one node")


def job_name(cfg: DictConfig) -> str:
    return f"birder-{cfg.task.name}-{cfg.optim.name}-n{cfg.nodes}"


def _directives(cfg: DictConfig, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    out = [f"--job-name={job_name(cfg)}", f"--nodes={cfg.nodes}", "--ntasks-per-node=1"]
    if lc.gpus:
        out.append(f"--gpus-per-node={cfg.gpus_per_node}")
    out += [f"{option}={lc[key]}" for key, option in OPTIONAL_DIRECTIVES.items() if lc.get(key) is not None]
    out += [f"--time={lc.time}", f"--output={run_dir}/slurm-%j.out"]
    return out + [str(d) for d in lc.extra_directives]


def batch_script(cfg: DictConfig, run_dir: Path, command_line: str = "") -> str:
    """The sbatch script of the run in ``run_dir`` (``command_line``: the birder-repro command, as a comment)."""
    run_dir = Path(run_dir).resolve()
    lc = cfg.launcher
    lines = ["#!/bin/bash",
             f"# birder-repro, run directory {run_dir} (must be on a file system every node shares)",
             f"# {command_line}" if command_line else "#",
             f"# {cfg.nodes} nodes x {cfg.gpus_per_node} processes (gpus_per_node): one task per node runs torchrun "
             "for its processes; c10d rendezvous on the job's first node."]
    lines += [f"#SBATCH {d}" for d in _directives(cfg, run_dir)]
    lines += ["", "set -euo pipefail", *[str(s) for s in lc.setup]]
    lines += ['MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
              f"MASTER_PORT={int(lc.master_port)}",
              # srun does not pass sbatch's --cpus-per-task on to its tasks (SLURM >= 22.05): say it again.
              'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1'
              + (' --cpus-per-task="$SLURM_CPUS_PER_TASK"' if lc.get("cpus_per_task") is not None else "") + " \\",
              f"  {_torchrun_line(cfg, run_dir)}", ""]
    return "\n".join(lines)


def _torchrun_line(cfg: DictConfig, run_dir: Path) -> str:
    """Every node's torchrun (the command ``launcher=torchrun`` prints for a node), in SLURM's variables,
    wrapped before the rendezvous and the worker."""
    meet = Rendezvous("c10d", "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID")
    argv = torchrun_argv(run_dir, cfg.gpus_per_node, meet, nnodes="$SLURM_NNODES",
                         python=cfg.launcher.python or sys.executable, restarts=max_restarts(cfg))
    words = [_shell_word(a) for a in argv]
    breaks = [words.index(_shell_word(f"--rdzv-backend={meet.backend}")), len(words) - len(WORKER) - 2]
    return " \\\n  ".join(" ".join(part) for part in (words[:breaks[0]], words[breaks[0]:breaks[1]],
                                                          words[breaks[1]:]))


def _shell_word(arg: str) -> str:
    """``--key=$VAR`` as ``--key="$VAR"`` (expanded by the shell, kept as one word); anything else quoted."""
    key, sep, value = arg.partition("=")
    if "$" in value and sep:
        return f'{key}="{value}"'
    return shlex.quote(arg)


def write_script(cfg: DictConfig, run_dir: Path) -> Path:
    path = Path(run_dir) / SCRIPT_FILE
    path.write_text(batch_script(cfg, run_dir, record.read_command(run_dir) or ""))
    path.chmod(0o755)
    return path


def submit(script: Path, run_dir: Path, env: Mapping[str, str] = os.environ) -> int:
    """``sbatch --parsable script``; the job id goes to ``run_dir/slurm_job_id``. Returns sbatch's exit code."""
    sbatch = shutil.which("sbatch", path=env.get("PATH"))
    if sbatch is None:
        return _refuse(run_dir, "launcher=slurm submits with sbatch, which is not on PATH: run birder-repro on the "
                                f"cluster's login node, or submit {script} there yourself (sbatch {script})")
    out = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, env=dict(env),
                         check=False)
    if out.returncode != 0:
        return _refuse(run_dir, f"sbatch failed (exit code {out.returncode}): {out.stderr.strip()}",
                       out.returncode)
    job_id = re.split(r"[;\s]", out.stdout.strip())[0]  # --parsable: "<id>" or "<id>;<cluster>"
    (Path(run_dir) / JOB_ID_FILE).write_text(job_id + "\n")
    print(f"[birder-repro] submitted SLURM job {job_id} ({script}); its output: {run_dir}/slurm-{job_id}.out; "
          f"when it ends, rank 0 writes {run_dir / record.RECORD_FILE}", flush=True)
    return 0


def _refuse(run_dir: Path, message: str, code: int = 127) -> int:
    # Into output.log as well: the CLI quotes its end in the failed run's record.
    with open(Path(run_dir) / record.LOG_FILE, "a") as log:
        log.write(message + "\n")
    print(f"[birder-repro] {message}", file=sys.stderr, flush=True)
    return code


def launch(cfg: DictConfig, run_dir: Path, env: Mapping[str, str] = os.environ) -> int:
    """Write the batch script; print it (dry run) or submit it. Returns 0 once the job is queued."""
    check_config(cfg)
    script = write_script(cfg, run_dir)
    if cfg.dry_run:
        print(f"# dry run (launcher=slurm): the batch script, written to {script}; nothing was submitted "
              f"(submit it with: sbatch {script})", flush=True)
        print(script.read_text(), end="", flush=True)
        return 0
    return submit(script, run_dir, env)
