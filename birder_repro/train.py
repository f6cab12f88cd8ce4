"""The training loop every run goes through: steps, LR schedule, timing, bytes, evaluation, checkpoints, logs.

The worker builds the task, data, DDP model, optimizer and communication hook, then calls :func:`train`.

Step time (papers/birder.txt Figure 4: computation, communication, compression/decompression per iteration)
-----------------------------------------------------------------------------------------------------------
A *step* is timed from the moment its batch is in hand to the end of ``optimizer.step()`` (forward, backward
with DDP's hooks, optimizer); waiting for the data loader is measured apart (``data_wait_s_per_step``). On
CUDA the device is synchronized around every timing. Its parts, which sum to the step time:

- compression: the growth of the hook state's ``compress_seconds`` during the step (quantize, pack, unpack);
- compute: forward + backward as measured without any communication, plus the optimizer step. Forward +
  backward is calibrated by passes under ``model.no_sync()`` on the step's batch (no hook runs; gradients,
  buffers such as BatchNorm's running statistics and the RNG are restored afterwards, so training is exactly
  as without them): ``train.compute_calibration_passes`` (default 3) right after the timing warm-up, then one
  every ``train.compute_calibration_every`` steps (default 100; 0: never again), the median of all of them
  being the estimate. These passes are outside the timed steps. The optimizer step is timed at every step,
  less any compression or communication the scheme counts inside it;
- communication: the rest, ``max(0, step - compute - compression)`` on the means over the timed steps: the
  communication that computation does not hide. Where the rest would be negative (timing noise), compute
  absorbs it so the parts still sum. The split is made on means, not per step, so that noise in either
  direction averages out instead of being clipped at 0 step by step.

With a hook that overlaps the backward pass (``CommState.overlaps()``: Birder's and 1-bit Adam's
communication thread) compression and collectives run beside compute, so only what computation does not hide
is in the step: the exposed time ``step - compute``; compression is its part ``min(compression, exposed)``
and communication the rest of it (:func:`split_step_time`). ``step_time_s`` then also shows ``exposed``,
``collectives`` (seconds per step the hook spent in collectives, hidden or not) and ``compression_work``
(seconds per step of compression work, hidden or not); they are not parts of the sum.

Throughput is global samples per second over the timed steps: the first ``train.timing_warmup_steps`` of a run
(of a resumed run too: caches, DDP's bucket rebuild, allocation) are left out of it and of the step-time and
bytes-per-step figures. Where the hook state has stages (1-bit Adam / LAMB: ``warmup``, ``compression``), the
same figures are kept per stage. Times and bytes are means over processes; samples are summed over them.

Loss
----
``final_loss`` (and ``metrics["loss"]``) is the mean training loss over the last 10 % of the run's steps (at
least one), weighted by samples and averaged over all processes. If the task's evaluation reports its own
``loss``, that one is kept as ``eval_loss``.

Checkpoints (every ``train.checkpoint_every`` steps)
---------------------------------------------------
``run_dir/checkpoint.pt`` (rank 0): step and the model; ``run_dir/checkpoint_rank{r}.pt`` (every rank):
optimizer state, the hook state and the RNG states. The optimizer and the hook are saved per rank because
their state is: Birder's hook keeps the shards of m, b, e its rank owns, 1-bit Adam a per-process momentum.
The shards are written first and the rank-0 file last, after a barrier, so a ``checkpoint.pt`` is always
complete. ``train.resume`` (the ``checkpoint.pt`` path or its directory) needs the same number of processes.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from birder_repro.comm.accounting import CommStats, flat_allreduce_split
from birder_repro.comm.state import GRADIENT, CommState
from birder_repro.logger import RunLogger
from birder_repro.schedule import lr_factor

CHECKPOINT = "checkpoint.pt"
LOSS_TAIL = 0.10  # final_loss: the mean training loss over this fraction of the last steps
DEFAULT_CALIBRATION_PASSES = 3
DEFAULT_CALIBRATION_EVERY = 100
FP32_BYTES = 4

__all__ = ["train", "total_steps", "split_step_time", "fp32_allreduce_bytes", "stage_of", "CHECKPOINT"]


# ------------------------------------------------------------------------------------------ pure formulas
def total_steps(steps: Optional[int], epochs: float, train_size: int, global_batch: int) -> int:
    """``steps`` when given, else ``epochs`` passes over ``train_size`` samples at ``global_batch`` per step."""
    if steps is not None:
        if steps < 1:
            raise ValueError(f"train.steps must be >= 1, got {steps}")
        return int(steps)
    if train_size < 1 or global_batch < 1:
        raise ValueError(f"cannot count steps: train_size={train_size}, global batch={global_batch}")
    return max(1, int(math.ceil(epochs * math.ceil(train_size / global_batch))))


def split_step_time(step_s: float, compute_s: float, compress_s: float,
                    overlapped: bool = False) -> tuple[float, float, float]:
    """(compute, communication, compression) of a (mean) step, summing to ``step_s`` (module docstring).

    communication = max(0, step - compute - compression); compute takes what is left, so it absorbs any
    negative rest and the three parts always sum to the step. ``overlapped`` (the hook's work runs beside the
    backward pass): compression is the exposed part, min(compression, max(0, step - compute)), and
    communication the rest of the exposed time.
    """
    if overlapped:
        exposed = min(max(step_s - compute_s, 0.0), step_s)
        compression = min(max(compress_s, 0.0), exposed)
        return step_s - exposed, exposed - compression, compression
    compression = min(max(compress_s, 0.0), step_s)
    communication = max(0.0, step_s - compute_s - compression)
    return step_s - compression - communication, communication, compression


def fp32_allreduce_bytes(num_params: int, world_size: int, gpus_per_node: int) -> tuple[float, float, float]:
    """(total, intra-node, inter-node) bytes one process sends per step in DDP's fp32 ring all-reduce of
    ``num_params`` parameters: 2(N-1)/N x 4 bytes x P (birder_repro.comm.accounting, Thakur et al. 2005)."""
    intra, inter = flat_allreduce_split(FP32_BYTES * num_params, world_size, gpus_per_node)
    return intra + inter, intra, inter


# ------------------------------------------------------------------------------------------------ helpers
def _opt(node, key: str, default: Any) -> Any:
    """An optional config key: struct mode makes a missing key an error, so ask before reading."""
    return node[key] if node is not None and key in node and node[key] is not None else default


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _now(device: torch.device) -> float:
    """Wall time after the device's queued work: CUDA kernels are asynchronous."""
    _sync(device)
    return time.perf_counter()


def stage_of(comm: CommState, step: int) -> Optional[str]:
    """The hook's stage at ``step`` (:meth:`CommState.stage`); None: the scheme has one stage."""
    stage = comm.stage(step)
    return None if stage is None else str(stage)


def _counters(comm) -> tuple[float, float, float, float]:
    return (float(comm.intra_node_bytes), float(comm.inter_node_bytes), float(comm.compress_seconds),
            float(comm.collective_seconds))


def _collective_device(device: torch.device) -> torch.device:
    return device if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu")


def _allreduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum ``values`` element-wise over all processes (identity without a process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1) or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    dist.all_reduce(t)
    return t.tolist()


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _batches(data, steps_per_epoch: int, start_step: int, device: torch.device) -> Iterator[tuple[int, Any]]:
    """(epoch, batch) for ever, epoch after epoch, from the position of ``start_step`` (resume).

    The sampler's epoch is set before each pass, so that shuffling differs per epoch and is the same on resume.
    """
    epoch, skip = divmod(start_step, steps_per_epoch)
    while True:
        if data.sampler is not None and hasattr(data.sampler, "set_epoch"):
            data.sampler.set_epoch(epoch)
        yielded = False
        for batch in _epoch_iterator(data, skip, device):
            yielded = True
            yield epoch, batch
        if not yielded and skip == 0:
            raise RuntimeError("the training data yielded no batch in a whole epoch")
        epoch, skip = epoch + 1, 0


def _epoch_iterator(data, skip: int, device: torch.device) -> Iterator:
    """An iterator over one epoch, past its first ``skip`` batches.

    Resuming mid-epoch re-creates the loader's iterator and re-loads the batches already trained on; both draw
    from the global RNG (the loader's base seed, augmentations in the main process), which the uninterrupted
    run did before its checkpoint. The RNG is put back afterwards so that training continues from the
    checkpoint's RNG state (exact with ``num_workers=0``; worker processes get a different base seed).
    """
    if not skip:
        return iter(data.train)
    state = _rng_state(device)
    it = iter(data.train)
    for _ in itertools.islice(it, skip):
        pass
    _set_rng_state(state, device)
    return it


def _steps_per_epoch(data, train_size: int, global_batch: int) -> int:
    try:
        return max(1, len(data.train))
    except TypeError:  # an iterable without a length
        return max(1, math.ceil(train_size / global_batch))


# ------------------------------------------------------------------------------------------------ timing
@dataclass
class Totals:
    """Sums over the timed steps of one stage, on this process."""

    steps: float = 0.0
    seconds: float = 0.0
    optimizer: float = 0.0  # the optimizer step's own computation
    compression: float = 0.0
    collectives: float = 0.0  # seconds the hook spent in collectives (hidden by an overlapping hook or not)
    data_wait: float = 0.0
    samples: float = 0.0  # this process's samples
    intra_bytes: float = 0.0
    inter_bytes: float = 0.0

    FIELDS = ("steps", "seconds", "optimizer", "compression", "collectives", "data_wait", "samples",
              "intra_bytes", "inter_bytes")

    def add(self, r: "StepResult", data_wait: float) -> None:
        self.steps += 1
        self.seconds += r.seconds
        self.optimizer += r.optimizer
        self.compression += r.compression
        self.collectives += r.collectives
        self.data_wait += data_wait
        self.samples += r.samples
        self.intra_bytes += r.intra_bytes
        self.inter_bytes += r.inter_bytes

    def values(self) -> list[float]:
        return [getattr(self, f) for f in self.FIELDS]


@dataclass
class StepResult:
    loss_sum: float  # loss x samples, for sample-weighted means
    samples: int
    seconds: float
    optimizer: float  # optimizer.step() less the compression and communication counted inside it
    compression: float
    intra_bytes: float
    inter_bytes: float
    collectives: float = 0.0  # seconds in the hook's collectives during the step (hidden or not)


def grads_are_gradients(comm: CommState) -> bool:
    """Whether ``.grad`` holds averaged gradients after backward, so that clipping their norm means something.

    Not for Birder with its hook (the +-1 of u_bar: bounded by construction) nor for 1-bit Adam / LAMB in
    their compression stage (the averaged momentum the hook returns): :meth:`CommState.grad_holds`.
    """
    return comm.grad_holds() == GRADIENT


def run_step(task, model, optimizer, batch, device, comm, grad_clip: Optional[float] = None) -> StepResult:
    """One optimizer step, timed; the counters of ``comm`` read around it (module docstring).

    ``grad_clip``: the global norm the averaged gradients are clipped to before the step (AWD-LSTM's 0.25,
    torchvision's ViT recipe's 1.0), where they are gradients (:func:`grads_are_gradients`).
    """
    before = _counters(comm)
    t0 = _now(device)
    loss, n = task.loss(model, batch, device)
    loss.backward()  # DDP's hook communicates here; backward returns when every bucket is reduced
    if grad_clip and grads_are_gradients(comm):
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    t1 = _now(device)
    mid = _counters(comm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t2 = _now(device)
    after = _counters(comm)
    # Compression or communication that the scheme counts inside optimizer.step() is not computation.
    in_optimizer = (after[2] - mid[2]) + (after[3] - mid[3])
    return StepResult(loss_sum=float(loss.detach()) * n, samples=int(n), seconds=t2 - t0,
                      optimizer=max(0.0, (t2 - t1) - in_optimizer), compression=after[2] - before[2],
                      intra_bytes=after[0] - before[0], inter_bytes=after[1] - before[1],
                      collectives=after[3] - before[3])


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def calibrate_forward_backward(task, model, batch, device: torch.device, passes: int) -> list[float]:
    """Seconds of ``passes`` forward + backward passes without communication, leaving no trace on training.

    Under ``no_sync`` DDP runs no hook. Gradients are dropped, and buffers (BatchNorm's running statistics)
    and RNG states (dropout) restored, so the run continues exactly as if this had not happened.
    """
    module = getattr(model, "module", model)
    buffers = [b.detach().clone() for b in module.buffers()]
    rng = _rng_state(device)
    times = []
    with getattr(model, "no_sync", contextlib.nullcontext)():
        for _ in range(passes):
            t0 = _now(device)
            loss, _ = task.loss(model, batch, device)
            loss.backward()
            times.append(_now(device) - t0)
    for p in module.parameters():
        p.grad = None
    with torch.no_grad():
        for b, saved in zip(module.buffers(), buffers):
            b.copy_(saved)
    _set_rng_state(rng, device)
    return times


# ------------------------------------------------------------------------------------------- evaluation
def evaluate(task, model, data, train_cfg, device: torch.device) -> dict[str, float]:
    """The task's metrics over every process's evaluation shard: sums and counts summed, then finalized."""
    module = getattr(model, "module", model)
    loader = data.eval
    cap = _opt(train_cfg, "eval_max_batches", None)
    if cap is not None:
        loader = itertools.islice(loader, int(cap))
    was_training = module.training
    module.eval()
    with torch.no_grad():
        pairs = task.evaluate(module, loader, device)
    module.train(was_training)
    names = sorted(pairs)  # the same order on every rank: the all-reduce is positional
    totals = _allreduce_sum([float(v) for name in names for v in pairs[name]], device)
    means = {name: totals[2 * i] / totals[2 * i + 1] if totals[2 * i + 1] else float("nan")
             for i, name in enumerate(names)}
    return dict(task.finalize(means))


# ------------------------------------------------------------------------------------------- checkpoints
def _shard_path(main: Path, rank: int) -> Path:
    return main.with_name(f"checkpoint_rank{rank}.pt")


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a crash while writing never leaves a half checkpoint under the real name


def save_checkpoint(run_dir, step: int, samples: float, model, optimizer, comm, rank: int, world_size: int,
                    device: torch.device) -> Path:
    """Every rank writes its shard, then (after a barrier) rank 0 writes ``checkpoint.pt``. Collective."""
    main = Path(run_dir) / CHECKPOINT
    shard = {"step": step, "world_size": world_size, "samples": samples, "optimizer": optimizer.state_dict(),
             "comm": comm.state_dict() if hasattr(comm, "state_dict") else None, "rng": _rng_state(device)}
    _atomic_save(shard, _shard_path(main, rank))
    _barrier()
    if rank == 0:
        module = getattr(model, "module", model)
        _atomic_save({"step": step, "world_size": world_size, "model": module.state_dict()}, main)
    return main


def load_checkpoint(path, model, optimizer, comm, rank: int, world_size: int,
                    device: torch.device) -> tuple[int, float]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, this process's samples so far). Collective.

    Rank 0 reads the model and broadcasts it, so only the shards need to be on every node's disk.
    """
    main = Path(path)
    main = main / CHECKPOINT if main.is_dir() else main
    # Our own files (weights_only=False: they hold RNG states). On CUDA tensors go back where they were saved
    # (this rank's device); on CPU everything loads on the CPU.
    where = None if device.type == "cuda" else "cpu"
    shard = torch.load(_shard_path(main, rank), map_location=where, weights_only=False)
    if shard["world_size"] != world_size:
        raise ValueError(f"{main} was saved by {shard['world_size']} processes; this run has {world_size}: "
                         "the optimizer and hook states are sharded per process")
    module = getattr(model, "module", model)
    if rank == 0:
        saved = torch.load(main, map_location="cpu", weights_only=False)
        module.load_state_dict(saved["model"])
        step = saved["step"]
    else:
        step = shard["step"]
    if dist.is_initialized() and world_size > 1:
        step = int(_broadcast_from_rank0([float(step)], device)[0])
        for t in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(t.data, src=0)
    if shard["step"] != step:
        raise ValueError(f"{_shard_path(main, rank)} is of step {shard['step']}, {main} of step {step}")
    optimizer.load_state_dict(shard["optimizer"])
    if shard["comm"] is not None and hasattr(comm, "load_state_dict"):
        comm.load_state_dict(shard["comm"])
    _set_rng_state(shard["rng"], device)
    return int(step), float(shard["samples"])


def _broadcast_from_rank0(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    dist.broadcast(t, src=0)
    return t.tolist()


# --------------------------------------------------------------------------------------------- the loop
@dataclass
class _Window:
    """What rank 0 logs every ``log_every`` steps: means over the steps since the last log line."""

    loss_sum: float = 0.0
    samples: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    intra_bytes: float = 0.0
    inter_bytes: float = 0.0

    def add(self, r: StepResult) -> None:
        self.loss_sum += r.loss_sum
        self.samples += r.samples
        self.seconds += r.seconds
        self.steps += 1
        self.intra_bytes += r.intra_bytes
        self.inter_bytes += r.inter_bytes


@dataclass
class _Run:
    """The loop's running state on this process."""

    step: int = 0
    samples: float = 0.0  # this process's samples since the start of training (resumes included)
    calibration: list = field(default_factory=list)  # seconds of every forward + backward calibration pass
    stages: dict[str, Totals] = field(default_factory=dict)
    tail: deque = field(default_factory=deque)  # (loss_sum, samples) of the last steps
    window: _Window = field(default_factory=_Window)
    epoch: int = 0


def _set_lr(optimizer, base_lrs: list[float], step: int, steps: int, schedule_cfg) -> float:
    factor = lr_factor(step, steps, schedule_cfg)
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base * factor
    return optimizer.param_groups[0]["lr"]


def _log_window(run: _Run, logger: RunLogger, bar, lr: float, stage: Optional[str], device: torch.device) -> None:
    """Mean loss over all processes for the window (collective), then rank 0 writes a line."""
    w = run.window
    loss_sum, samples = _allreduce_sum([w.loss_sum, float(w.samples)], device)
    loss = loss_sum / samples if samples else float("nan")
    rate = samples / w.seconds if w.seconds else float("nan")  # global samples over rank-local seconds
    logger.log(run.step, {"epoch": run.epoch, "loss": loss, "lr": lr, "samples_per_s": rate,
                          "step_time_s": w.seconds / w.steps, "stage": stage,
                          "intra_node_bytes_per_step": w.intra_bytes / w.steps,
                          "inter_node_bytes_per_step": w.inter_bytes / w.steps})
    if bar is not None:
        bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate:.1f}", refresh=False)
    run.window = _Window()


def _stage_figures(stages: dict[str, Totals], world: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Per stage, over all processes: samples summed, times and bytes as means per process."""
    # In order of first appearance: every rank meets the same stages at the same steps, so the positional
    # all-reduce lines up, and the record lists them as they happened (warmup before compression).
    names = list(stages)
    flat = _allreduce_sum([v for name in names for v in stages[name].values()], device)
    out = {}
    width = len(Totals.FIELDS)
    for i, name in enumerate(names):
        sums = dict(zip(Totals.FIELDS, flat[i * width:(i + 1) * width]))
        per_process = {k: v / world for k, v in sums.items() if k != "samples"}
        out[name] = {**per_process, "samples": sums["samples"]}
    return out


def _summarize_timing(figures: dict[str, dict[str, float]], forward_backward_s: float,
                      overlapped: bool = False) -> dict[str, Any]:
    """Throughput, step-time parts and bytes per step, over the whole run and per stage."""
    def per_step(f, key):
        return f[key] / f["steps"] if f["steps"] else float("nan")

    def throughput(f):
        return f["samples"] / f["seconds"] if f["seconds"] else float("nan")

    def step_time(f):
        total = per_step(f, "seconds")
        compute, communication, compression = split_step_time(
            total, forward_backward_s + per_step(f, "optimizer"), per_step(f, "compression"), overlapped)
        return {"total": total, "compute": compute, "communication": communication, "compression": compression,
                "exposed": total - compute, "collectives": per_step(f, "collectives"),
                "compression_work": per_step(f, "compression")}

    total = {k: sum(f[k] for f in figures.values()) for k in Totals.FIELDS}
    staged = {name: f for name, f in figures.items() if name != ""}
    return {
        "throughput_samples_per_s": throughput(total),
        "throughput_by_stage": {name: throughput(f) for name, f in staged.items()},
        "step_time_s": step_time(total),
        "step_time_s_by_stage": {name: step_time(f) for name, f in staged.items()},
        "data_wait_s_per_step": per_step(total, "data_wait"),
        "intra_node_bytes_per_step": per_step(total, "intra_bytes"),
        "inter_node_bytes_per_step": per_step(total, "inter_bytes"),
        "intra_node_bytes_per_step_by_stage": {n: per_step(f, "intra_bytes") for n, f in staged.items()},
        "inter_node_bytes_per_step_by_stage": {n: per_step(f, "inter_bytes") for n, f in staged.items()},
        "timed_steps": int(round(total["steps"])),
    }


@dataclass(frozen=True)
class LoopSettings:
    """The ``train:`` settings the loop reads, the optional ones with their defaults."""

    steps: int
    start_step: int
    warmup_steps: int  # timed steps start after these (at least one step is timed, however short the run)
    log_every: int
    eval_every: int  # 0: evaluate at the end only
    checkpoint_every: int  # 0: never
    calibration_passes: int
    calibrate_every: int  # 0: calibrate compute once, after the warm-up

    @classmethod
    def from_config(cls, tc, steps: int, start_step: int) -> "LoopSettings":
        remaining = steps - start_step
        if remaining < 1:
            raise ValueError(f"nothing to train: the checkpoint is at step {start_step} of {steps}")
        return cls(steps=steps, start_step=start_step,
                   warmup_steps=min(int(tc.timing_warmup_steps), remaining - 1),
                   log_every=max(1, int(_opt(tc, "log_every", 10))),
                   eval_every=int(_opt(tc, "eval_every", 0)),
                   checkpoint_every=int(_opt(tc, "checkpoint_every", 0)),
                   calibration_passes=max(1, int(_opt(tc, "compute_calibration_passes",
                                                      DEFAULT_CALIBRATION_PASSES))),
                   calibrate_every=int(_opt(tc, "compute_calibration_every", DEFAULT_CALIBRATION_EVERY)))

    def calibration_passes_at(self, step: int) -> int:
        """Forward + backward calibration passes to run before ``step``: many first, then one now and then."""
        since = step - self.start_step - self.warmup_steps
        if since == 0:
            return self.calibration_passes
        return 1 if since > 0 and self.calibrate_every and since % self.calibrate_every == 0 else 0

    def timed(self, step: int) -> bool:
        return step - self.start_step >= self.warmup_steps


@dataclass
class _Parts:
    """What the worker hands :func:`train`, and the loop's outputs, passed around together."""

    cfg: Any
    task: Any
    data: Any
    model: Any
    optimizer: Any
    comm: Any
    topology: Any
    device: torch.device
    run_dir: Any
    logger: Optional[RunLogger] = None
    bar: Any = None


def train(cfg, *, task, data, model, optimizer, comm, topology, device, run_dir, probes=()) -> dict:
    """Train ``model`` for the configured steps and return the run's figures (module docstring).

    Collective: every process calls it with the same config. Only rank 0 prints, logs and writes the model.
    ``probes`` measure over exactly the timed steps (see :func:`_open_window`).
    """
    tc = cfg.train
    device = torch.device(device)
    comm = comm if comm is not None else CommStats()
    is_main = topology.rank == 0
    global_batch = int(tc.batch_size) * topology.world_size
    steps = total_steps(tc.steps, float(tc.epochs), int(data.train_size), global_batch)
    base_lrs = [g["lr"] for g in optimizer.param_groups]  # the peak lr, before a checkpoint's lr replaces it

    run = _Run()
    if tc.resume:
        run.step, run.samples = load_checkpoint(tc.resume, model, optimizer, comm, topology.rank,
                                                topology.world_size, device)
    settings = LoopSettings.from_config(tc, steps, start_step=run.step)
    run.tail = deque(maxlen=max(1, math.ceil(LOSS_TAIL * steps)))
    if is_main:
        print(f"train: {steps} steps{f' from step {run.step}' if run.step else ''}, global batch {global_batch} "
              f"({topology.world_size} processes x {tc.batch_size}); data: {data.description}; throughput and "
              f"step times leave out the first {settings.warmup_steps} steps", flush=True)
    logger = RunLogger(cfg, run_dir, enabled=is_main)
    bar = tqdm(total=steps, initial=run.step, desc="train", dynamic_ncols=True, mininterval=1.0) if is_main else None
    parts = _Parts(cfg, task, data, model, optimizer, comm, topology, device, run_dir, logger, bar)
    exit_code = 1
    window_open = False
    try:
        model.train()
        batches = _batches(data, _steps_per_epoch(data, int(data.train_size), global_batch), run.step, device)
        while run.step < steps:
            t_data = time.perf_counter()
            run.epoch, batch = next(batches)
            data_wait = time.perf_counter() - t_data
            if settings.calibration_passes_at(run.step):
                run.calibration += calibrate_forward_backward(task, model, batch, device,
                                                              settings.calibration_passes_at(run.step))
            lr = _set_lr(optimizer, base_lrs, run.step, steps, tc.schedule)
            stage = stage_of(comm, run.step)
            if not window_open and settings.timed(run.step):
                window_open = _open_window(probes)
            result = run_step(task, model, optimizer, batch, device, comm, cfg.train.get("grad_clip"))
            _record_step(run, settings, result, stage, data_wait)
            if bar is not None:
                bar.update(1)
            _between_steps(parts, run, settings, lr, stage)
        window = _close_window(probes, timed_steps=int(sum(t.steps for t in run.stages.values())))
        record = {**_finish(parts, run, settings, global_batch, base_lrs), **window}
        logger.log(run.step, {f"final/{k}": v for k, v in record["metrics"].items()})
        logger.summary({"throughput_samples_per_s": record["throughput_samples_per_s"], **record["metrics"]})
        exit_code = 0
        return record
    finally:
        if bar is not None:
            bar.close()
        logger.finish(exit_code=exit_code)


# ------------------------------------------------------------------- probes of the timed steps (issue 5)
def _open_window(probes) -> bool:
    """Start every probe right before the first timed step (after the timing warm-up and the compute
    calibration, which sends nothing). A probe has ``start()`` and ``stop(timed_steps) -> dict``: the emulated
    cluster's link counters (birder_repro.launch.emulated.LinkCounters) read the kernel's byte counts here."""
    for probe in probes:
        probe.start()
    return True


def _close_window(probes, timed_steps: int) -> dict:
    """Stop every probe right after the last step, before evaluation; their fields go into the record.
    Collective where a probe's ``stop`` is (every rank calls it at the same point)."""
    fields: dict = {}
    for probe in probes:
        fields.update(probe.stop(timed_steps))
    return fields


def _record_step(run: _Run, settings: LoopSettings, result: StepResult, stage: Optional[str],
                 data_wait: float) -> None:
    if settings.timed(run.step):  # before counting the step: it is the index of the step just taken
        run.stages.setdefault(stage or "", Totals()).add(result, data_wait)
    run.step += 1
    run.samples += result.samples
    run.tail.append((result.loss_sum, result.samples))
    run.window.add(result)


def _between_steps(p: _Parts, run: _Run, settings: LoopSettings, lr: float, stage: Optional[str]) -> None:
    """Log, evaluate and checkpoint when their intervals come round (all collective on every rank)."""
    if run.step % settings.log_every == 0 or run.step == settings.steps:
        _log_window(run, p.logger, p.bar, lr, stage, p.device)
    if (settings.eval_every and run.step % settings.eval_every == 0 and run.step < settings.steps
            and p.data.eval is not None):
        metrics = evaluate(p.task, p.model, p.data, p.cfg.train, p.device)
        p.logger.log(run.step, {f"eval/{k}": v for k, v in metrics.items()})
    if settings.checkpoint_every and run.step % settings.checkpoint_every == 0:
        save_checkpoint(p.run_dir, run.step, run.samples, p.model, p.optimizer, p.comm, p.topology.rank,
                        p.topology.world_size, p.device)


def _finish(p: _Parts, run: _Run, settings: LoopSettings, global_batch: int, base_lrs: list[float]) -> dict:
    """Evaluation, cross-process sums and the record (collective)."""
    world = p.topology.world_size
    tail_loss, tail_samples, samples, forward_backward = _allreduce_sum(
        [sum(l for l, _ in run.tail), float(sum(n for _, n in run.tail)), run.samples,
         statistics.median(run.calibration)], p.device)
    forward_backward /= world  # the mean over processes of each one's median
    final_loss = tail_loss / tail_samples if tail_samples else float("nan")
    metrics: dict[str, float] = {}
    if p.cfg.train.eval and p.data.eval is not None:
        metrics = evaluate(p.task, p.model, p.data, p.cfg.train, p.device)
        if "loss" in metrics:
            metrics["eval_loss"] = metrics.pop("loss")
    metrics["loss"] = final_loss
    num_params = sum(q.numel() for q in getattr(p.model, "module", p.model).parameters() if q.requires_grad)
    fp32_total, fp32_intra, fp32_inter = fp32_allreduce_bytes(num_params, world, p.topology.gpus_per_node)
    return {
        "steps": settings.steps,
        "resumed_from_step": settings.start_step or None,
        "samples": int(round(samples)),
        "epochs_trained": samples / p.data.train_size if p.data.train_size else None,
        "batch_size": int(p.cfg.train.batch_size),
        "global_batch_size": global_batch,
        "lr": base_lrs[0] if base_lrs else None,
        "data": p.data.description,
        "timing_warmup_steps": settings.warmup_steps,
        "forward_backward_s": forward_backward,
        "compute_calibration_passes": len(run.calibration),
        "comm_overlap": bool(getattr(p.comm, "overlaps", lambda: False)()),
        **_summarize_timing(_stage_figures(run.stages, world, p.device), forward_backward,
                            bool(getattr(p.comm, "overlaps", lambda: False)())),
        "parameters": num_params,
        "fp32_allreduce_bytes_per_step": fp32_total,
        "fp32_allreduce_intra_node_bytes_per_step": fp32_intra,
        "fp32_allreduce_inter_node_bytes_per_step": fp32_inter,
        "final_loss": final_loss,
        "loss_definition": f"mean training loss over the last {len(run.tail)} steps, all processes",
        "metrics": metrics,
    }
