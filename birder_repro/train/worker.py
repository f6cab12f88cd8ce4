"""One worker process of a run: ``python -m birder_repro.train.worker --run-dir DIR``, started by torchrun.

It reads the resolved config the CLI wrote into the run directory (it never composes one: Hydra runs once, in
the CLI), joins the process group, checks that every node sees the run directory (birder_repro.train.shared_dir), builds
the topology, task, DDP model, optimizer and communication hook, trains, and on rank 0 writes ``record.json``:
completed, failed, diverged, or interrupted (a stop signal, birder_repro.train.stop). Only rank 0 prints and
writes the record, the one record of the run, whichever node rank 0 runs on.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.distributed.elastic.multiprocessing.errors import record as elastic_record

from birder_repro import comm, tasks, train
from birder_repro.config import settings as layout
from birder_repro.optim.onebit_adam import OneBitOptimizer, short_warmup_warning
from birder_repro.perf.probe import probe_worker
from birder_repro.run import failures, record
from birder_repro.run.digest import cell_digest
from birder_repro.run.directory import RunDir, attempt_entry
from birder_repro.train import probes, stop
from birder_repro.train.divergence import Diverged
from birder_repro.train.restarts import restart_count
from birder_repro.train.settings import TrainSettings
from birder_repro.train.shared_dir import check_shared
from birder_repro.train.stop import signal_name

__all__ = [
    "DistEnv",
    "read_dist_env",
    "check_world_matches_layout",
    "init_process_group",
    "seed_everything",
    "optim_config",
    "build_and_train",
    "main",
]


@dataclass(frozen=True)
class DistEnv:
    """The distributed environment torchrun gives this process, read once (torchrun sets every variable)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    rendezvous: bool = True  # MASTER_ADDR / MASTER_PORT set: join through env:// (torchrun always sets them)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_dist_env(env=os.environ) -> DistEnv:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; a lone process (started without torchrun) is rank 0 of 1."""
    world = int(env.get("WORLD_SIZE", 1))
    return DistEnv(
        rank=int(env.get("RANK", 0)),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
        rendezvous="MASTER_ADDR" in env,
    )


def check_world_matches_layout(cfg: DictConfig, env: DistEnv) -> None:
    """The processes torchrun started must be the layout's, with every node's ranks on one machine.

    The topology takes node = rank // gpus_per_node; that is a real node only if each machine's processes
    (one torchrun agent, contiguous ranks) hold whole nodes.
    """
    m, world = int(cfg.gpus_per_node), layout.world_size(cfg)
    if env.world_size != world:
        raise RuntimeError(
            f"the run's layout is nodes={cfg.nodes} x gpus_per_node={m} = {world} processes, "
            f"but torchrun started {env.world_size}: start workers with birder-repro"
        )
    base = env.rank - env.local_rank  # this machine's first rank
    if env.local_world_size % m or base % m:
        raise RuntimeError(
            f"this machine runs ranks {base}..{base + env.local_world_size - 1}, which splits "
            f"nodes of {m} processes across machines: use --nproc-per-node={m} on every node"
        )


def collective_timeout(cfg: DictConfig) -> datetime.timedelta:
    """``train.timeout_s``: how long a collective waits on a hung peer before the run fails (torch's default
    is 30 minutes for gloo, 10 for NCCL; a restart, ``train.max_restarts``, then takes over)."""
    return datetime.timedelta(seconds=float(cfg.get("train", {}).get("timeout_s") or 300))


def init_process_group(
    backend: str, env: DistEnv, device: torch.device, timeout: datetime.timedelta | None = None
) -> None:
    """Join the default group (torchrun's env:// rendezvous; an in-memory store for a lone process)."""
    kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if env.rendezvous:
        # The agent's store outlives a restart (train.max_restarts) and keeps the keys of the failed attempt's
        # group (each process's address): a fresh prefix per attempt, or the new ranks read the dead ones'.

        store, _, _ = next(
            dist.rendezvous(
                "env://",
                rank=env.rank,
                world_size=env.world_size,
                **({"timeout": timeout} if timeout is not None else {}),
            )
        )
        store = dist.PrefixStore(f"birder-attempt-{restart_count()}", store)
        dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, **kwargs)
    elif env.world_size == 1:  # started by hand, without torchrun: a world of one needs no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    else:
        raise RuntimeError(
            f"WORLD_SIZE={env.world_size} without MASTER_ADDR: start workers with torchrun (birder-repro does)"
        )


def pick_device(cfg: DictConfig, env: DistEnv) -> torch.device:
    """This process's device: its own GPU (LOCAL_RANK) when every local process can have one, else the CPU."""
    if layout.resolve_device(cfg, env.local_world_size) == "cuda":
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def optim_config(cfg: DictConfig, total_steps: int | None = None) -> DictConfig:
    """The ``optim`` node with the learning rate the optimizer gets (scaled by the global batch, if set) and,
    for optimizers whose schedule is a fraction of the run (1-bit Adam's freeze step), the run's steps."""
    node = OmegaConf.create(OmegaConf.to_container(cfg.optim, resolve=True))
    node.lr = record.effective_lr(cfg)
    if "total_steps" in node and total_steps is not None:
        node.total_steps = total_steps
    return node


def build_and_train(cfg: DictConfig, env: DistEnv, device: torch.device, run_dir: Path) -> dict:
    """Topology, task, data, DDP model, optimizer and hook, then the training loop; returns its figures."""
    if cfg.get("mode") == "probe":  # birder-repro mode=probe: collectives timed instead (birder_repro.perf.probe)
        return probe_worker(cfg, env.rank, device, run_dir)
    # Imported here: a worker whose layout check fails reports it without loading models and hooks.

    topology = comm.build_topology(int(cfg.gpus_per_node))
    task = tasks.get_task(cfg.task.name)
    data = task.build_data(cfg, env.rank, env.world_size)
    # The train.* settings, the global batch and the run's steps, once: the optimizer and the loop share them.
    plan = train.RunPlan.build(cfg, topology.world_size, int(data.train_size))
    seed_everything(int(cfg.seed))  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = task.build_model(cfg).to(device)
    seed_everything(int(cfg.seed) + env.rank)  # from here on, randomness (augmentation, dropout) differs per rank
    ocfg = optim_config(cfg, plan.steps)
    # parallel=ddp: DDP (optim.comm.bucket_cap_mb) and the scheme's hook; parallel=fsdp: FSDP2 and its hooks
    # (birder_repro.train.parallel)
    ddp, opt, hook = train.build_parallel(cfg, task, model, device, topology, ocfg, is_main=env.is_main)
    _warn_short_onebit_warmup(opt, env)
    # Emulated clusters: each node's kernel link counters over the timed steps (birder_repro.train.probes).
    result = train.train(
        cfg,
        task=task,
        data=data,
        model=ddp,
        optimizer=opt,
        comm=hook,
        topology=topology,
        device=device,
        run_dir=run_dir,
        probes=probes.probes_for(topology),
        plan=plan,
    )
    return {**result, "memory": train.parallel.memory_report(ddp, opt, hook, device)}


def precision_of(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "train.precision", default="fp32"))


def start_line(env: DistEnv, fields: dict) -> str:
    """What this run resolved, in one line: the device, backend and precision, and the versions they run on."""
    v = fields["versions"]
    stack = ", ".join(
        f"{name} {v[key]}"
        for name, key in (("torch", "torch"), ("CUDA", "cuda"), ("NCCL", "nccl"), ("Triton", "triton"))
        if v.get(key)
    )
    return (
        f"[birder-repro] {env.world_size} process{'es' if env.world_size > 1 else ''} on {fields['device']}, "
        f"backend {fields['backend']}, precision {fields['precision']}; {stack}"
    )


def _warn_short_onebit_warmup(opt, env: DistEnv) -> None:
    """Before training: 1-bit Adam / LAMB with a warmup too short for their frozen variance (one line)."""
    if env.is_main and isinstance(opt, OneBitOptimizer) and opt.momentum_by_hook:
        line = short_warmup_warning(opt, getattr(opt, "precondition_compression", False))
        if line:
            print(f"[birder-repro] {line}", flush=True)


def describe_device(device: torch.device) -> str:
    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"


def run_worker(run_dir: Path, env: DistEnv | None = None) -> int:
    """The whole life of one worker; rank 0 writes the record. Returns the process's exit code."""
    env = env or read_dist_env()
    cfg = record.load_run_config(run_dir)
    attempt = _Attempt(run_dir, cfg, env)
    fields: dict[str, Any] = {"started": attempt.first_started, "config_digest": cell_digest(cfg)}
    joined = False
    if restart_count() and env.is_main:  # the launchers' terminal copy resumes here (birder_repro.run.failures)
        print(f"{failures.RESTART_MARK}attempt {restart_count() + 1} (train.max_restarts)", flush=True)
    if env.rendezvous:  # started by torchrun: a signal stops the run at a step boundary (train/stop.py)
        stop.install(grace_s=float(cfg.train.get("stop_timeout_s") or TrainSettings.stop_timeout_s))
    try:
        check_world_matches_layout(cfg, env)
        device = pick_device(cfg, env)
        with open_dict(cfg):
            cfg.device = device.type  # resolved once, here: every part of the run reads the same answer
        fields.update(
            device=describe_device(device),
            backend=layout.resolve_backend(cfg, device.type),
            precision=precision_of(cfg),
            versions={**record.versions(), **record.accelerator_versions(device.type)},
        )
        init_process_group(fields["backend"], env, device, collective_timeout(cfg))
        joined = True
        check_shared(run_dir, env.rank, env.local_rank, env.local_world_size, env.world_size, device)
        if env.is_main:
            print(start_line(env, fields), flush=True)
        result = build_and_train(cfg, env, device, run_dir)
        if env.is_main:
            attempts = attempt.history("completed", result.get("resumed_from_step") or 0, result.get("steps"))
            done = record.completed_record(cfg, run_dir, result, ended=record.now(), attempts=attempts, **fields)
            RunDir(run_dir).write(done)
        return 0
    except Diverged as halt:  # every rank stops at the same step (train/divergence.py): not a failure to restart
        if env.is_main:
            RunDir(run_dir).write(
                record.diverged_record(
                    cfg,
                    run_dir,
                    halt.step,
                    halt.line,
                    restarts=restart_count(),
                    attempts=attempt.history("diverged", None, halt.step),
                    **fields,
                ),
            )
        return 0
    except stop.Stopped as halt:  # every rank after the same step, checkpointed: not a failure to restart either
        if env.is_main:
            attempt.interrupted(halt, fields)
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure ends in a record, then a non-zero exit
        failure = failures.write_failure(
            run_dir, env.rank, restart_count(), exc, explain_collective_failure(exc, env.rank, cfg)
        )
        # One line, then the traceback: output.log keeps both, the terminal stops at the line (failures.py).
        print(f"{failures.MARK}{failure.line}\n{failure.traceback}", file=sys.stderr, flush=True)
        if env.is_main:
            RunDir(run_dir).write_failed(
                cfg,
                failure.line,
                traceback=failure.traceback,
                restarts=restart_count(),
                attempts=attempt.history("failed", None),
                **fields,
            )
        return 1
    finally:
        if joined and dist.is_initialized():
            dist.destroy_process_group()


class _Attempt:
    """Rank 0's account of this attempt for the record: the run's earlier attempts (a run resumed in its own
    directory keeps one record), read before anything of this attempt is written, and this one's entry."""

    def __init__(self, run_dir: Path, cfg: DictConfig, env: DistEnv):
        self.run, self.cfg, self.started = RunDir(run_dir), cfg, record.now()
        self.earlier = self.run.previous_attempts() if env.is_main else []
        self.first_started = (self.earlier[0].get("started") if self.earlier else None) or self.started

    def history(self, status: str, from_step: int | None, to_step: int | None = None) -> list[dict]:
        """The record's ``attempts``: the earlier ones, then this one ending with ``status``."""
        to_step = to_step if to_step is not None else self.run.reached_step()
        return [*self.earlier, attempt_entry(status, self.started, record.now(), from_step, to_step, restart_count())]

    def interrupted(self, halt, fields: dict) -> None:
        """Write the interrupted record and say so, last, in the workers' output (birder_repro.run.failures)."""
        checkpoint = halt.checkpoint or self.run.newest_checkpoint()
        rec = record.interrupted_record(
            self.cfg,
            self.run.path,
            halt.step,
            signal_name(halt.signum),
            checkpoint,
            restarts=restart_count(),
            attempts=self.history("interrupted", halt.from_step, halt.step),
            **fields,
        )
        self.run.write(rec)
        print(f"{failures.STOP_MARK}{rec['error'].split('; resume: ')[0]}", flush=True)


def explain_collective_failure(exc: BaseException, rank: int, cfg: DictConfig) -> str:
    """One line before the traceback when a collective failed: which rank, which collective, and why (a peer
    that hung past ``train.timeout_s``, or one that died); empty for other failures."""
    text = str(exc)
    timed_out = "timed out" in text.lower() or "timeout" in text.lower()
    closed = any(s in text for s in ("Connection closed", "Connection reset", "Broken pipe", "NCCL communicator"))
    if not (timed_out or closed) or not isinstance(exc, (RuntimeError, dist.DistError)):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    c10d = [f.name for f in frames if f.filename.endswith("distributed_c10d.py") and not f.name.startswith("_")]
    if c10d:
        collective = c10d[-1]
    else:  # a collective inside DDP or a hook, called from autograd: say where the Python side was
        inner = frames[-1] if frames else None
        collective = f"in {inner.name} ({Path(inner.filename).name}:{inner.lineno})" if inner else "(unknown)"
    if timed_out:
        why = (
            f"a peer did not answer within train.timeout_s={collective_timeout(cfg).total_seconds():g} s (hung or gone)"
        )
    else:
        why = "a peer closed its connection (it died or was killed)"
    return f"rank {rank}: collective {collective} failed: {why}\n"


# An exception that escapes run_worker (one before its run began, which writes no failure file) is written by
# torch elastic to the worker's TORCHELASTIC_ERROR_FILE; the CLI reads it from there (birder_repro.run.failures).
@elastic_record
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m birder_repro.train.worker",
        description="One worker of a birder-repro run (started by torchrun).",
    )
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory holding config.yaml")
    args = parser.parse_args(argv)
    return run_worker(args.run_dir)


def _leave(code: int) -> None:
    """End the worker process with ``code`` once its work is done and written.

    Why not a normal interpreter exit: tearing down native thread pools there (OpenMP's, numba's, gloo's)
    occasionally aborted a run that had completed and written its record ("terminate called without an active
    exception", SIGABRT, about once in ten quickstart runs on this project's machines), which torchrun then
    reports as a failed run. By now the record, checkpoints and metrics are written and closed, W&B finished
    and the process group destroyed (run_worker), so the process flushes its output and leaves directly."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main())
