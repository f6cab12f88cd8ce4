"""``launcher=slurm``: the run as one SLURM batch job, one task per node, each running torchrun.

    birder-repro task=resnet50 optim=birder nodes=8 gpus_per_node=8 launcher=slurm launcher.partition=gpu
    birder-repro ... launcher=slurm dry_run=true      # writes <run dir>/job.sbatch, prints it, submits nothing

The batch script asks for N nodes with one task each; ``srun`` starts on every node the command that
``launcher=torchrun`` prints for a node: ``torchrun --nnodes=$SLURM_NNODES --nproc-per-node=M`` with the c10d
rendezvous on the job's first node and the job id as rendezvous id, so that the nodes find each other without
any per-node setting. torchrun numbers the nodes as they join; every worker reads the run directory's
resolved config, and rank 0 writes ``record.json`` there when the job ends: the run directory must be on a
file system that every node shares.

What an HPC user expects of a long job, each checked against ``man sbatch`` / ``man srun`` (SLURM 24.x):

- CPUs: ``launcher.cpus_per_task=auto`` asks for processes per node x (loader processes + 1) cores per node
  (:func:`cpus_per_task`): without ``--cpus-per-task`` SLURM "will just try to allocate one processor per
  task", and one task runs all of a node's workers. ``srun`` is given the value again (SLURM 22.05 to 23.02 did
  not pass sbatch's on).
- Time limit: ``--signal=B:USR1@<launcher.signal_s>`` tells the batch shell (only it) that the limit is near
  (SLURM may send it up to 60 s early); the shell sends SIGTERM to the srun step, which srun forwards to its
  tasks, torchrun to its workers, which stop at a step boundary and save a checkpoint
  (``train.checkpoint_on_stop``); torchrun waits ``train.stop_timeout_s`` for them (``--shutdown-timeout``),
  which must be shorter than ``launcher.signal_s``. The shell
  then prints the run's summary and, when a complete checkpoint newer than the attempt's start exists,
  ``scontrol requeue``: with ``--requeue`` the script starts again from its beginning with the same job id and
  ``SLURM_RESTART_COUNT`` > 0, and the workers resume from the run directory's newest complete checkpoint
  (birder_repro.train.resume_point.choose_resume). ``--open-mode=append`` keeps every attempt's output in the one
  ``slurm-<job id>.out``. SIGTERM to the shell (``scancel``; preemption) stops the workers the same way but
  does not requeue: a preempted job is requeued by SLURM itself where the cluster's PreemptMode says so.
- The summary: after srun the script runs ``python -m birder_repro.launch.job_end``, which prints what the
  CLI prints at the end of a local run, into the job's output file.
- Warnings at submit time (:func:`warnings`): a time limit the run is predicted to outlast with no checkpoint
  saved before it, and ``cluster=local``, whose record would say the nodes talk over loopback.

The script is written here rather than by submitit: what a dry run prints is exactly what runs, the default
install can write it (no extra package), and it is submitted with ``sbatch``, present wherever SLURM is.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from birder_repro.config import settings as layout
from birder_repro.launch import slurm_env
from birder_repro.launch.torchrun import WORKER, Rendezvous, max_restarts, stop_timeout, torchrun_argv
from birder_repro.run import record
from birder_repro.run.digest import LAUNCH_ENV

__all__ = [
    "SCRIPT_FILE",
    "JOB_ID_FILE",
    "check_config",
    "job_name",
    "cpus_per_task",
    "batch_script",
    "write_script",
    "warnings",
    "cluster_warning",
    "submit",
    "launch",
]

SCRIPT_FILE = "job.sbatch"
JOB_ID_FILE = "slurm_job_id"
# Options passed to sbatch as they are given: config key -> sbatch option.
OPTIONAL_DIRECTIVES = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "constraint": "--constraint",
    "mem": "--mem",
}
# data.num_workers=auto: the loader processes per training process that cpus_per_task=auto asks cores for
# (the default of pytorch/examples' ImageNet training, --workers 4); inside the job, auto then finds them.
AUTO_LOADERS = 4
SUMMARY = "birder_repro.launch.job_end"


# ------------------------------------------------------------------------------------------ the config
def check_config(cfg: DictConfig) -> None:
    """Settings a batch job cannot use; each error names its key."""
    lc = cfg.launcher
    if (lc.get("rdzv_backend") or "c10d") != "c10d":
        raise layout.ConfigError(
            f"launcher.rdzv_backend={lc.rdzv_backend}: a SLURM job runs the same "
            "command on every node, which needs the c10d rendezvous: set it to c10d"
        )
    if not str(lc.time or "").strip():
        raise layout.ConfigError("launcher.time is empty: give the job's wall-clock limit, e.g. 04:00:00")
    try:
        limit = slurm_env.time_limit_s(lc.time)
    except ValueError as err:
        raise layout.ConfigError(f"launcher.time={lc.time}: {err}") from None
    if int(cfg.nodes) < 1:
        raise layout.ConfigError(f"nodes={cfg.nodes}: a job needs at least one node")
    cpus = lc.get("cpus_per_task")
    if cpus not in (None, "auto") and not (str(cpus).isdigit() and int(cpus) >= 1):
        raise layout.ConfigError(
            f"launcher.cpus_per_task={cpus}: use auto, a whole number >= 1, or null "
            "(the cluster's default: one CPU for all of a node's workers)"
        )
    signal_s = lc.get("signal_s")
    if not (isinstance(signal_s, int) and 0 < signal_s <= 65535):
        raise layout.ConfigError(
            f"launcher.signal_s={signal_s}: use whole seconds from 1 to 65535 (sbatch --signal's range), e.g. 120"
        )
    if lc.get("requeue") and limit is not None and signal_s >= limit:
        raise layout.ConfigError(
            f"launcher.signal_s={signal_s} is not shorter than launcher.time={lc.time}: "
            "the job would be stopped as it starts; lower launcher.signal_s"
        )
    if lc.get("requeue") and signal_s <= stop_timeout(cfg):
        raise layout.ConfigError(
            f"launcher.signal_s={signal_s} is not longer than train.stop_timeout_s="
            f"{stop_timeout(cfg)}: the workers could still be saving their checkpoint at the "
            "time limit; raise launcher.signal_s or lower train.stop_timeout_s"
        )


def job_name(cfg: DictConfig) -> str:
    return f"birder-{cfg.task.name}-{cfg.optim.name}-n{cfg.nodes}"


def cpus_per_task(cfg: DictConfig) -> int | None:
    """CPU cores for each node's one task (all of that node's workers): ``launcher.cpus_per_task`` as given;
    ``auto``: processes per node x (loader processes per process + 1), ``data.num_workers=auto`` counting as
    :data:`AUTO_LOADERS`; null: none asked for (SLURM's default, one CPU per task)."""
    value = cfg.launcher.get("cpus_per_task")
    if value is None or value != "auto":
        return None if value is None else int(value)
    loaders = OmegaConf.select(cfg, "data.num_workers", default=0)
    loaders = AUTO_LOADERS if loaders == "auto" else int(loaders or 0)
    return int(cfg.gpus_per_node) * (loaders + 1)


# ------------------------------------------------------------------------------------------ the script
def _directives(cfg: DictConfig, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    out = [f"--job-name={job_name(cfg)}", f"--nodes={cfg.nodes}", "--ntasks-per-node=1"]
    if lc.gpus:
        out.append(f"--gpus-per-node={cfg.gpus_per_node}")
    out += [f"{option}={lc[key]}" for key, option in OPTIONAL_DIRECTIVES.items() if lc.get(key) is not None]
    cpus = cpus_per_task(cfg)
    if cpus is not None:
        out.append(f"--cpus-per-task={cpus}")
    # append: a requeued job (ours, an administrator's, after a node failure) keeps its earlier attempts' output
    out += [f"--time={lc.time}", f"--output={run_dir}/slurm-%j.out", "--open-mode=append"]
    if lc.requeue:
        out += [f"--signal=B:USR1@{int(lc.signal_s)}", "--requeue"]
    return out + [str(d) for d in lc.extra_directives]


def batch_script(cfg: DictConfig, run_dir: Path, command_line: str = "") -> str:
    """The sbatch script of the run in ``run_dir`` (``command_line``: the birder-repro command, as a comment)."""
    run_dir = Path(run_dir).resolve()
    lc = cfg.launcher
    python = lc.python or sys.executable
    lines = [
        "#!/bin/bash",
        f"# birder-repro, run directory {run_dir} (must be on a file system every node shares)",
        f"# {command_line}" if command_line else "#",
        f"# {cfg.nodes} nodes x {cfg.gpus_per_node} processes (gpus_per_node): one task per node runs torchrun "
        "for its processes; c10d rendezvous on the job's first node.",
    ]
    lines += [f"#SBATCH {d}" for d in _directives(cfg, run_dir)]
    lines += ["", "set -euo pipefail", *[str(s) for s in lc.setup]]
    lines += [
        f"RUN_DIR={shlex.quote(str(run_dir))}",
        f"PYTHON={shlex.quote(python)}",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f"MASTER_PORT={int(lc.master_port)}",
        "ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))",
        "# each attempt is one entry of the record's attempts (birder_repro.train.restarts)",
        f'export {LAUNCH_ENV}="slurm job $SLURM_JOB_ID, attempt $ATTEMPT"',
        "echo \"[birder-repro] job $SLURM_JOB_ID, attempt $ATTEMPT, on $SLURM_JOB_NODELIST, $(date -u '+%F %T UTC')\"",
        "# the newest complete checkpoint now (a requeue needs a newer one), and the time",
        f'read -r SINCE STARTED <<< "$("$PYTHON" -m {SUMMARY} "$RUN_DIR" --attempt-start)"',
        "",
        *_traps(cfg),
        "",
    ]
    # srun does not pass sbatch's --cpus-per-task on to its tasks (SLURM 22.05 to 23.02): say it again.
    lines += [
        'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1'
        + (' --cpus-per-task="$SLURM_CPUS_PER_TASK"' if cpus_per_task(cfg) is not None else "")
        + " \\",
        f"  {_torchrun_line(cfg, run_dir)} &",
        "SRUN_PID=$!",
    ]
    lines += _ending(cfg)
    return "\n".join(lines) + "\n"


def _traps(cfg: DictConfig) -> list[str]:
    """The shell's handlers: USR1 (``--signal``, the limit is near) and TERM (scancel, preemption) stop the
    workers through srun, which forwards SIGTERM to its tasks."""
    lines = [
        'SRUN_PID="" STOPPED=""',
        "stop_workers() {",
        "  STOPPED=$1",
        "  echo \"[birder-repro] SIG$1 at $(date -u '+%T UTC'): stopping the workers at a step boundary "
        '(they save a checkpoint)"',
        '  if [ -n "$SRUN_PID" ]; then kill -TERM "$SRUN_PID" 2>/dev/null || true; fi',
        "}",
        "trap 'stop_workers TERM' TERM",
    ]
    if cfg.launcher.requeue:
        lines.append("trap 'stop_workers USR1' USR1  # --signal=B:USR1: the time limit is near")
    return lines


def _ending(cfg: DictConfig) -> list[str]:
    """Wait for srun (a trapped signal ends ``wait`` early, srun still running: wait again), print the summary,
    requeue after USR1 when the summary says the run can resume (exit status 75)."""
    lines = [
        'CODE=0; wait "$SRUN_PID" || CODE=$?',
        "# a trapped signal ends wait early, srun still running: wait for srun itself",
        'while kill -0 "$SRUN_PID" 2>/dev/null; do CODE=0; wait "$SRUN_PID" || CODE=$?; done',
        "",
        "# the run's end as the CLI prints it; 75: stopped, with a checkpoint newer than the attempt's start",
        f'END=0; "$PYTHON" -m {SUMMARY} "$RUN_DIR" --exit-code "$CODE" --stopped "$STOPPED" '
        '--since-step "${SINCE:-0}" --started "${STARTED:-}" || END=$?',
    ]
    if cfg.launcher.requeue:
        lines += [
            'if [ "$STOPPED" = USR1 ] && [ "$END" = 75 ]; then',
            '  echo "[birder-repro] requeueing job $SLURM_JOB_ID: attempt $((ATTEMPT + 1)) resumes from the '
            'newest complete checkpoint in $RUN_DIR"',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "  exit 0",
            "fi",
        ]
    return lines + [
        'if [ "$END" = 75 ]; then exit 143; fi  # stopped by SIGTERM: scancel, or preemption',
        'exit "$END"',
    ]


def _torchrun_line(cfg: DictConfig, run_dir: Path) -> str:
    """Every node's torchrun (the command ``launcher=torchrun`` prints for a node), in SLURM's variables,
    wrapped before the rendezvous and the worker."""
    meet = Rendezvous("c10d", "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID")
    argv = torchrun_argv(
        run_dir,
        cfg.gpus_per_node,
        meet,
        nnodes="$SLURM_NNODES",
        python="$PYTHON",
        restarts=max_restarts(cfg),
        shutdown_timeout=stop_timeout(cfg),
    )
    words = [_shell_word(a) for a in argv]
    breaks = [words.index(_shell_word(f"--rdzv-backend={meet.backend}")), len(words) - len(WORKER) - 2]
    return " \\\n  ".join(
        " ".join(part) for part in (words[: breaks[0]], words[breaks[0] : breaks[1]], words[breaks[1] :])
    )


def _shell_word(arg: str) -> str:
    """``--key=$VAR`` as ``--key="$VAR"`` and ``$VAR`` as ``"$VAR"`` (expanded by the shell, kept as one word);
    anything else quoted."""
    if re.fullmatch(r"\$[A-Z_]+", arg):
        return f'"{arg}"'
    key, sep, value = arg.partition("=")
    if "$" in value and sep:
        return f'{key}="{value}"'
    return shlex.quote(arg)


def write_script(cfg: DictConfig, run_dir: Path) -> Path:
    path = Path(run_dir) / SCRIPT_FILE
    path.write_text(batch_script(cfg, run_dir, record.read_command(run_dir) or ""))
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------------------------------ the warnings
def warnings(cfg: DictConfig) -> list[str]:
    """What a user should hear before the job is queued, one line each ("warning: ..." or "note: ...");
    printed, never refused."""
    return [w for w in (_time_limit_advice(cfg), cluster_warning(cfg)) if w]


def cluster_warning(cfg: DictConfig) -> str | None:
    """``cluster=local`` for a run on SLURM's nodes: its record would say they talk over loopback."""
    if cfg.cluster.name != "local":
        return None
    return (
        "warning: cluster=local under SLURM: the record will say the nodes talk over loopback (interconnect: "
        f"{cfg.cluster.interconnect}); name the job's network: cluster=ethernet_10g or cluster=infiniband_200g "
        "(or a conf/cluster/<yours>.yaml)"
    )


def _time_limit_advice(cfg: DictConfig) -> str | None:
    """A warning where the run is likely to outlast the time limit with no checkpoint saved before it; a note
    on the requeues to expect where it will be stopped, checkpointed and requeued."""
    limit = slurm_env.time_limit_s(cfg.launcher.time)
    if limit is None:
        return None
    every = int(OmegaConf.select(cfg, "train.checkpoint_every", default=0) or 0)
    on_stop = bool(cfg.launcher.requeue) and bool(OmegaConf.select(cfg, "train.checkpoint_on_stop", default=False))
    predicted = predicted_run(cfg)
    if predicted is None:  # no prediction: a rule, any run that could outlast the limit
        if every or on_stop:
            return None
        return (
            f"warning: launcher.time={cfg.launcher.time} and no checkpoint is ever saved (train.checkpoint_every=0"
            f"{_stop_setting(cfg)}): if the run takes longer it is killed with nothing saved; set "
            "train.checkpoint_every=<steps>, or a launcher.time the run surely fits in"
        )
    seconds, step_s, basis = predicted
    if seconds <= limit:
        return None
    if on_stop:  # stopped before the limit, it saves a checkpoint and is requeued
        return (
            f"note: the run is predicted to take {_hours(seconds)} ({basis}), launcher.time={cfg.launcher.time}: "
            f"expect about {math.ceil(seconds / limit) - 1} requeue(s), each attempt resuming from the last one's "
            "checkpoint"
        )
    if every and every * step_s < limit - int(cfg.launcher.signal_s):
        return None
    suggest = max(1, int(0.5 * limit / step_s))
    return (
        f"warning: the run is predicted to take {_hours(seconds)} ({basis}) but launcher.time={cfg.launcher.time} "
        f"({_hours(limit)}), and no checkpoint would be saved before the limit (train.checkpoint_every={every}"
        f"{_stop_setting(cfg)}): it would be killed with nothing saved; set train.checkpoint_every={suggest} "
        "(half the limit), or a longer launcher.time"
    )


def _stop_setting(cfg: DictConfig) -> str:
    if not cfg.launcher.requeue:
        return ", launcher.requeue=false"
    return ", train.checkpoint_on_stop=false" if "checkpoint_on_stop" in cfg.train else ""


def predicted_run(cfg: DictConfig) -> tuple[float, float, str] | None:
    """(seconds, seconds a step, what the figure rests on) of the whole run by the performance model
    (birder_repro.perf.predict, ``predict.profile``, else the paper's profile of the task), or None where it
    has no profile for the task and batch or the steps are not known before the data are loaded."""
    steps = _planned_steps(cfg)
    if steps is None:
        return None
    from birder_repro.perf.predict import predict_record  # imports torch: here, not in the submitting CLI

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["predict"] = {**(plain.get("predict") or {})}
    plain["predict"]["profile"] = plain["predict"].get("profile") or "paper"
    try:
        rec = predict_record(plain)
    except Exception:  # noqa: BLE001 - no profile for this task or batch: no prediction, the rule applies
        return None
    step_s = rec["global_batch_size"] / rec["throughput_samples_per_s"]
    basis = (
        f"{steps} steps at {step_s * 1e3:.0f} ms by the performance model, profile "
        f"{plain['predict']['profile']}: {rec['profile'].get('device', '?')}"
    )
    return steps * step_s, step_s, basis


def _planned_steps(cfg: DictConfig) -> int | None:
    """``train.steps``, else ``train.epochs`` over ``data.synthetic_train_size`` (the task's training-set
    size), as birder_repro.train.settings.total_steps counts them (not imported: it would load torch here)."""
    if cfg.train.get("steps") is not None:
        return int(cfg.train.steps)
    size = OmegaConf.select(cfg, "data.synthetic_train_size", default=None)
    if not size:
        return None
    batch = layout.global_batch(cfg)
    return max(1, math.ceil(float(cfg.train.epochs) * math.ceil(int(size) / batch)))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


# ------------------------------------------------------------------------------------------ submitting
def submit(script: Path, run_dir: Path, env: Mapping[str, str] = os.environ) -> int:
    """``sbatch --parsable script``; the job id goes to ``run_dir/slurm_job_id``. Returns sbatch's exit code."""
    sbatch = shutil.which("sbatch", path=env.get("PATH"))
    if sbatch is None:
        return _refuse(
            run_dir,
            "launcher=slurm submits with sbatch, which is not on PATH: run birder-repro on the "
            f"cluster's login node, or submit {script} there yourself (sbatch {script})",
        )
    out = subprocess.run(
        [sbatch, "--parsable", str(script)], capture_output=True, text=True, env=dict(env), check=False
    )
    if out.returncode != 0:
        return _refuse(run_dir, f"sbatch failed (exit code {out.returncode}): {out.stderr.strip()}", out.returncode)
    job_id = re.split(r"[;\s]", out.stdout.strip())[0]  # --parsable: "<id>" or "<id>;<cluster>"
    (Path(run_dir) / JOB_ID_FILE).write_text(job_id + "\n")
    print(
        f"[birder-repro] submitted SLURM job {job_id} ({script}); its output and, at its end, the run's summary: "
        f"{run_dir}/slurm-{job_id}.out; rank 0 writes {run_dir / record.RECORD_FILE}",
        flush=True,
    )
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
    for line in warnings(cfg):
        print(f"[birder-repro] {line}", file=sys.stderr, flush=True)
    if cfg.dry_run:
        print(
            f"# dry run (launcher=slurm): the batch script, written to {script}; nothing was submitted "
            f"(submit it with: sbatch {script})",
            flush=True,
        )
        print(script.read_text(), end="", flush=True)
        return 0
    return submit(script, run_dir, env)
