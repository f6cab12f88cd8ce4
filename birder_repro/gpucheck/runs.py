"""1-process DDP runs on the GPU through the real runner, and what their records must say.

For every task, Birder, 1-bit Adam and the task's baseline (``task.baseline``) run as a user runs them:
``birder-repro task=<t> optim=<o> nodes=1 gpus_per_node=1 launcher=local device=cuda model.size=tiny
data.source=synthetic train.precision=<p>`` (the CLI in a subprocess, torchrun, the worker, NCCL, the hooks with
overlap on: their side stream, events and futures). Birder turns Algorithm 1's line 6 on mid-run
(``optim.amsgrad_after``) so that its ``b_hat`` kernel runs too; 1-bit Adam passes its freeze step. Each
record is read back and checked:

- the run completed, on CUDA;
- the step-time parts (compute + communication + compression + data wait) sum to the step total;
- the step total times the timed steps is the wall-clock of those steps, from the times ``metrics.jsonl``
  logged after the last warm-up step and after the last step (``train.log_every`` = the warm-up): at most that
  wall time (the steps are inside it) and at least COVERAGE of it (what the loop does between steps is small
  beside a step). A step timed without waiting for the GPU's queued kernels would fall far below it;
- the compressed optimizers' hooks overlapped the backward pass, and 1-bit Adam reached its compression stage;
- the record's config says the precision asked for (and an fp16 run's record has GradScaler's final scale).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from birder_repro.config.resources import conf_dir
from birder_repro.gpucheck import overflow, procs
from birder_repro.gpucheck.table import FAIL, Check, verdict
from birder_repro.train.restarts import FAULT_ENV

COMPRESSED = ("birder", "onebit_adam")
STEPS, TIMING_WARMUP = 12, 4  # STEPS a multiple of TIMING_WARMUP: both ends of the timed steps are logged
COVERAGE = 0.5
PARTS = ("compute", "communication", "compression", "data_wait")
LOADER_TASKS = ("resnet20", "resnet50", "vit", "bert_squad", "bert_pretrain")  # tasks with data.num_workers


@dataclass(frozen=True)
class RunSpec:
    task: str
    optim: str
    precision: str
    extra: tuple[str, ...] = ()  # more overrides
    overflow: bool = False  # the process's loss overflows fp16 once (OVERFLOW_1GPU): one skipped step, scale 2^15

    @property
    def name(self) -> str:
        return f"{self.task}_{self.optim}_{self.precision}" + ("_overflow" if self.overflow else "")

    @property
    def label(self) -> str:
        return f"{self.task} {self.optim} {self.precision}" + (", overflow at step 3" if self.overflow else "")


OVERFLOW_1GPU = "0:3"  # the one process's third step overflows fp16 (birder_repro.gpucheck.overflow)


def baseline(task: str) -> str:
    """The task's baseline optimizer, as its config file names it (``task.baseline``)."""
    return str(OmegaConf.load(_conf() / "task" / f"{task}.yaml").task.baseline)


def has_precision_setting() -> bool:
    """Whether this version of the runner has ``train.precision`` (a run with it would be a config error)."""
    return "precision" in OmegaConf.load(_conf() / "config.yaml").train


def _conf() -> Path:
    """The config tree, from a checkout or an installed wheel (which has no conf/ beside the package)."""
    found = conf_dir()
    if found is None:
        raise FileNotFoundError("birder_repro's config tree: neither a checkout's conf/ nor birder_repro.conf")
    return found


def plan(tasks: list[str], precisions: list[str], fp16_tasks: tuple[str, ...] = ()) -> list[RunSpec]:
    """Birder, 1-bit Adam and the baseline of every task, in every precision; and in fp16 (GradScaler) for
    ``fp16_tasks`` too, where fp16 is not among ``precisions`` (one small task keeps the default check short)."""
    extra = [(t, "fp16") for t in fp16_tasks if t in tasks and "fp16" not in precisions]
    cells = [(t, p) for t in tasks for p in precisions] + extra
    return [RunSpec(t, o, p) for t, p in cells for o in dict.fromkeys((*COMPRESSED, baseline(t)))]


def overrides(
    spec: RunSpec, run_dir: Path, steps: int = STEPS, with_precision: bool = True, device: str = "cuda"
) -> list[str]:
    args = [
        f"task={spec.task}",
        f"optim={spec.optim}",
        "model.size=tiny",
        "data.source=synthetic",
        "nodes=1",
        "gpus_per_node=1",
        "launcher=local",
        f"device={device}",
        "logger=none",
        f"train.steps={steps}",
        f"train.timing_warmup_steps={TIMING_WARMUP}",
        f"train.log_every={TIMING_WARMUP}",
        "train.eval=false",
        f"hydra.run.dir={run_dir}",
    ]
    if with_precision:
        args.append(f"train.precision={spec.precision}")
    if spec.optim in COMPRESSED:
        args.append("optim.comm.overlap=true")
    if spec.optim == "birder":
        args.append(f"optim.amsgrad_after={steps // 2}")  # the b_hat variant from mid-run on
    if spec.task in LOADER_TASKS:
        args.append("data.num_workers=0")  # synthetic tensors: loader processes would only cost start-up time
    return args + list(spec.extra)


def overflow_env(env: dict, runs_root: Path, spec: str) -> dict:
    """``env`` with the overflow ``spec`` (rank:call) installed in the run's workers (gpucheck/overflow.py)."""
    site = overflow.site_dir(runs_root / "overflow-site")
    path = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))
    return {**env, overflow.ENV: spec, "PYTHONPATH": path}


def launch(
    spec: RunSpec,
    runs_root: Path,
    steps: int = STEPS,
    device: str = "cuda",
    timeout_s: float = 300,
    threads: int | None = None,
) -> Path:
    """One run through the CLI, as ``birder-repro`` would; returns its run directory (the record is checked
    apart). Its output goes to ``gpu-check.log`` in the run directory. ``threads``: its ``OMP_NUM_THREADS``
    (runs side by side share the cores)."""
    run_dir = runs_root / spec.name
    run_dir.mkdir(parents=True, exist_ok=True)
    supported = has_precision_setting()
    if spec.precision != "fp32" and not supported:
        (run_dir / "gpu-check.log").write_text("train.precision is not a setting of this version: not run\n")
        return run_dir
    cmd = [sys.executable, "-m", "birder_repro.cli", *overrides(spec, run_dir, steps, supported, device)]
    env = dict(os.environ, BIRDER_RUNS=str(runs_root), WANDB_MODE="disabled")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if spec.overflow:
        env = overflow_env(env, runs_root, OVERFLOW_1GPU)
    with open(run_dir / "gpu-check.log", "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        # the CLI, torchrun and the workers ended whole at the limit (procs.py: they are in separate sessions)
        if procs.run_bounded(cmd, env, log, timeout_s) is None:
            log.write(f"\ngpu-check: the run took more than {timeout_s:.0f} s and was stopped\n")
    return run_dir


def step_wall_seconds(metrics_path: Path, last_step: int, timed_steps: int) -> float | None:
    """Wall-clock of the last ``timed_steps`` steps: the time logged after the last step less the time logged
    after the step before them (``metrics.jsonl`` logs ``time_s`` every ``train.log_every`` steps)."""
    times = {}
    if not metrics_path.is_file():
        return None
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        if "loss" in row and "time_s" in row:
            times[int(row["step"])] = float(row["time_s"])
    first = last_step - timed_steps
    if last_step not in times or first not in times:
        return None
    return times[last_step] - times[first]


def check_record(spec: RunSpec, run_dir: Path, device: str = "cuda") -> Check:
    """One row for one run: every check of the module docstring; the first that fails is the detail."""
    label = spec.label
    path = run_dir / "record.json"
    if not path.is_file():
        log_file = run_dir / "gpu-check.log"
        log = log_file.read_text().strip().splitlines() if log_file.is_file() else []
        return Check("runs", label, FAIL, detail=f"no record.json in {run_dir}: {log[-1] if log else 'no output'}")
    rec = json.loads(path.read_text())
    if rec.get("status") != "completed":
        error = str(rec.get("error") or "").strip().splitlines()
        return Check(
            "runs",
            label,
            FAIL,
            measured=str(rec.get("status")),
            detail=f"{error[-1] if error else 'no error recorded'} (record: {path})",
        )
    problems = []
    if not str(rec.get("device", "")).startswith(device):
        problems.append(f"ran on {rec.get('device')!r}, not {device}")
    st = rec.get("step_time_s") or {}
    total = float(st.get("total", float("nan")))
    parts = sum(float(st.get(k, 0.0)) for k in PARTS)
    if not abs(parts - total) <= 1e-9 + 1e-6 * abs(total):
        problems.append(f"parts sum to {parts * 1e3:.3f} ms, the step total is {total * 1e3:.3f} ms")
    timed = int(rec.get("timed_steps") or 0)
    wall = step_wall_seconds(run_dir / "metrics.jsonl", int(rec.get("steps") or 0), timed)
    coverage = total * timed / wall if wall else float("nan")
    if wall is None:
        problems.append("metrics.jsonl lacks the timed steps' times")
    elif not COVERAGE <= coverage <= 1.0 + 1e-3:
        problems.append(
            f"step total x {timed} steps = {total * timed * 1e3:.1f} ms against {wall * 1e3:.1f} ms of "
            f"wall-clock ({coverage:.2f}; expected {COVERAGE}-1)"
        )
    if spec.optim in COMPRESSED and not (rec.get("overlap_s") or {}).get("overlapped"):
        problems.append("the hook did not overlap backward (optim.comm.overlap=true was asked)")
    if spec.optim == "onebit_adam" and "compression" not in (rec.get("throughput_by_stage") or {}):
        problems.append("1-bit Adam never reached its compression stage")
    precision = ((rec.get("config") or {}).get("train") or {}).get("precision", "fp32")
    if precision != spec.precision:
        problems.append(f"the record's train.precision is {precision!r}")
    if spec.precision == "fp16" and not (rec.get("loss_scale") or 0) > 0:
        problems.append(f"an fp16 run whose record has no loss scale ({rec.get('loss_scale')!r})")
    if spec.overflow and (rec.get("nonfinite_steps"), rec.get("loss_scale")) != (1, 2.0**15):
        problems.append(
            f"{rec.get('nonfinite_steps')} steps skipped and loss scale {rec.get('loss_scale')} (expected 1 and "
            "2^15: the overflowing step skipped, the later ones trained, GradScaler's 2^16 halved once)"
        )
    return Check(
        "runs",
        label,
        verdict(not problems),
        measured=f"step {total * 1e3:.2f} ms = "
        + " + ".join(f"{k} {float(st.get(k, 0)) * 1e3:.2f}" for k in PARTS)
        + f"; {coverage:.2f} of the timed steps' wall-clock",
        expected=f"completed on {device}; parts = total; {COVERAGE}-1 of wall",
        detail="; ".join(problems) or f"{rec.get('throughput_samples_per_s', 0):.0f} samples/s, {path}",
        numbers={
            "step_time_s": st,
            "timed_steps": timed,
            "wall_s": wall,
            "coverage": coverage,
            "throughput_samples_per_s": rec.get("throughput_samples_per_s"),
        },
    )


def check_runs(
    specs: list[RunSpec],
    runs_root: Path,
    jobs: int = 4,
    steps: int = STEPS,
    device: str = "cuda",
    timeout_s: float = 300,
    on_row=None,
) -> list[Check]:
    """Launch the runs, ``jobs`` at a time (separate processes on the one GPU: each its own process group, each
    ``OMP_NUM_THREADS`` its share of the cores), and check each record as its run ends (``on_row(check)``: the
    table is written row by row, so a section stopped from outside still leaves its rows). In ``specs``' order."""
    finished = itertools.count(1)
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))

    def one(spec: RunSpec) -> Check:
        start = time.monotonic()
        run_dir = launch(spec, runs_root, steps, device, timeout_s, threads)
        row = check_record(spec, run_dir, device)
        # a line as each run ends: a section stopped from outside (a job's time limit) still shows how far it got
        took = time.monotonic() - start
        print(f"gpu-check: run {next(finished)}/{len(specs)} {spec.name}: {row.status} ({took:.0f} s)", flush=True)
        if on_row is not None:
            on_row(row)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, specs))


# ----------------------------------------------------------------------------- 2-process runs (2+ GPUs)
PAIR_STEPS, PAIR_STOP = 12, 6  # the SIGTERM comes while rank 0 waits before step PAIR_STOP
PAIR_OVERFLOW = "1:3"  # rank 1's third step overflows fp16 (birder_repro.gpucheck.overflow)


@dataclass(frozen=True)
class PairSpec:
    """A run of Birder on digits as 2 processes (2 nodes x 1 GPU: the inter-node path) through the CLI, in a
    setting that only real NCCL between two GPUs shows right: an fp16 overflow on one rank (every rank must skip
    that step), gradient accumulation (DDP's no_sync, the hook once a step), a SIGTERM and a resume."""

    name: str
    extra: tuple[str, ...] = ()
    overflow: bool = False
    stop: bool = False
    optim: str = "birder"


# fp16 with an overflow on one rank for the two methods whose state or step an overflow used to break (review 4):
# torch's PowerSGD (an Inf in its error feedback skipped every later step) and DiLoCo on 2 nodes (a node-local
# verdict: the nodes' outer steps fell apart). PowerSGD compresses from step 2, DiLoCo syncs every 4 steps.
LOCAL_OVERFLOW_RUNS = (
    ("sgdm_powersgd", ("optim.comm.start_iter=2",)),
    ("diloco", ("optim.local_steps=4",)),
)


def pair_specs() -> list[PairSpec]:
    fp16 = ("train.precision=fp16",)
    return [
        PairSpec("2 processes, fp16, rank 1 overflows at step 3", fp16, overflow=True),
        PairSpec("2 processes, train.accumulate=2", ("train.accumulate=2",)),
        PairSpec(f"2 processes, SIGTERM before step {PAIR_STOP}, then resume", stop=True),
        *(
            PairSpec(f"2 nodes, {optim}, fp16, rank 1 overflows at step 3", (*fp16, *extra), overflow=True, optim=optim)
            for optim, extra in LOCAL_OVERFLOW_RUNS
        ),
    ]


def pair_overrides(spec: PairSpec, run_dir: Path, device: str = "cuda") -> list[str]:
    return [
        "task=digits",
        f"optim={spec.optim}",
        "model.size=tiny",
        "data.source=synthetic",
        "nodes=2",
        "gpus_per_node=1",
        "launcher=local",
        f"device={device}",
        "logger=none",
        f"train.steps={PAIR_STEPS}",
        "train.eval=false",
        *(["optim.comm.overlap=true"] if spec.optim in COMPRESSED else []),
        f"hydra.run.dir={run_dir}",
        *spec.extra,
    ]


def _progress(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text() or "{}").get("step", 0))
    except (OSError, ValueError):
        return 0


def launch_pair(spec: PairSpec, runs_root: Path, device: str = "cuda", timeout_s: float = 300) -> tuple[Path, list]:
    """Run ``spec`` through the CLI; returns its run directory and the CLI's exit codes (two for a stop and a
    resume: the SIGTERM'd one, 143, then the resumed one). Output goes to ``gpu-check.log`` there."""
    run_dir = runs_root / spec.name.replace(" ", "_").replace(",", "").replace("=", "")
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "birder_repro.cli", *pair_overrides(spec, run_dir, device)]
    env = dict(os.environ, BIRDER_RUNS=str(runs_root), WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    if spec.overflow:
        env = overflow_env(env, runs_root, PAIR_OVERFLOW)
    if spec.stop:
        env[FAULT_ENV] = f"wait:0:{PAIR_STOP}"  # rank 0 waits there for the stop (train/restarts.py)
    codes = []
    with open(run_dir / "gpu-check.log", "w") as log:
        for attempt in range(2 if spec.stop else 1):
            log.write(" ".join(cmd) + "\n")
            log.flush()
            proc, tag = procs.start(cmd, env, log)
            try:
                if spec.stop and attempt == 0:
                    deadline = time.monotonic() + timeout_s  # a run that never gets there is stopped all the same
                    while proc.poll() is None and _progress(run_dir) < PAIR_STOP - 1 and time.monotonic() < deadline:
                        time.sleep(0.2)
                    proc.send_signal(signal.SIGTERM)
                codes.append(proc.wait(timeout=timeout_s))
            except subprocess.TimeoutExpired:
                log.write(f"\ngpu-check: the run took more than {timeout_s:.0f} s and was stopped\n")
                codes.append(None)
                break
            finally:
                procs.stop(proc, tag)  # the whole run, whatever its sessions (a no-op for one that ended whole)
            env.pop(FAULT_ENV, None)  # the resume runs to the end
    return run_dir, codes


def check_pair(spec: PairSpec, run_dir: Path, codes: list, device: str = "cuda") -> Check:
    """The run completed on ``device`` (after its stop and resume), and what its setting must leave behind."""
    path = run_dir / "record.json"
    if not path.is_file():
        log_file = run_dir / "gpu-check.log"
        log = log_file.read_text().strip().splitlines() if log_file.is_file() else []
        return Check("runs", spec.name, FAIL, detail=f"no record.json in {run_dir}: {log[-1] if log else 'no output'}")
    rec = json.loads(path.read_text())
    problems = []
    if rec.get("status") != "completed" or rec.get("steps") != PAIR_STEPS:
        error = str(rec.get("error") or "").strip().splitlines()
        problems.append(f"{rec.get('status')} at {rec.get('steps')} steps: {error[-1] if error else 'no error'}")
    if not str(rec.get("device", "")).startswith(device):
        problems.append(f"ran on {rec.get('device')!r}, not {device}")
    if spec.overflow and (rec.get("nonfinite_steps"), rec.get("loss_scale")) != (1, 2.0**15):
        problems.append(
            f"{rec.get('nonfinite_steps')} steps skipped and loss scale {rec.get('loss_scale')} (expected 1 and "
            "2^15: the overflowing step skipped on every rank, GradScaler's 2^16 halved once)"
        )
    if spec.stop:
        attempts = [(a.get("status"), a.get("to_step")) for a in rec.get("attempts") or []]
        want = [("interrupted", PAIR_STOP - 1), ("completed", PAIR_STEPS)]
        if codes[:1] != [143] or attempts != want:
            problems.append(f"exit codes {codes}, attempts {attempts} (expected 143 then 0; {want})")
    if [c for c in codes if c not in (0, 143)] or codes[-1:] != [0]:
        problems.append(f"the CLI exited {codes}")
    return Check(
        "runs",
        spec.name,
        verdict(not problems),
        measured=f"{rec.get('status')}, {rec.get('steps')} steps, {rec.get('nonfinite_steps')} skipped",
        expected=f"completed, {PAIR_STEPS} steps on {device}",
        detail="; ".join(problems) or str(path),
    )


def check_pairs(specs: list[PairSpec], runs_root: Path, device: str = "cuda", on_row=None) -> list[Check]:
    """The 2-process runs one after another (each takes both GPUs); ``on_row(check)`` as each ends."""
    rows = []
    for s in specs:
        rows.append(check_pair(s, *launch_pair(s, runs_root, device), device))
        if on_row is not None:
            on_row(rows[-1])
    return rows
