"""Timing one step, and the compute calibration (the module docstring of :mod:`birder_repro.train`).

A step is timed from the moment its batch is in hand to the end of ``optimizer.step()`` (the loop adds the
wait for the batch, measured apart, to count throughput over the whole step); the counters of the hook state
are read around it, and the calls of the hook are timed from the start of the backward pass (when each bucket
became ready, birder_repro.comm.readiness). Forward + backward alone is measured by calibration passes under
``model.no_sync()`` that leave no trace on training. On CUDA the device is synchronized around every timing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from birder_repro.comm.readiness import bucket_clock
from birder_repro.comm.state import GRADIENT, CommState
from birder_repro.train.precision import Precision
from birder_repro.train.rng import rng_state, set_rng_state
from birder_repro.train.settings import TrainSettings

__all__ = [
    "StepResult",
    "StepPlan",
    "run_step",
    "accumulating",
    "calibrate_forward_backward",
    "stage_of",
    "grads_are_gradients",
    "comm_counters",
    "synced_now",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synced_now(device: torch.device) -> float:
    """Wall time after the device's queued work: CUDA kernels are asynchronous."""
    _sync(device)
    return time.perf_counter()


# ------------------------------------------------------------------------------ the hook state, read
def stage_of(comm: CommState, step: int) -> str | None:
    """The hook's stage at ``step`` (:meth:`CommState.stage`); None: the scheme has one stage."""
    stage = comm.stage(step)
    return None if stage is None else str(stage)


def comm_counters(comm) -> tuple[float, float, float, float]:
    """The hook state's cumulative (intra-node bytes, inter-node bytes, compression s, collective s)."""
    return (
        float(comm.intra_node_bytes),
        float(comm.inter_node_bytes),
        float(comm.compress_seconds),
        float(comm.collective_seconds),
    )


def grads_are_gradients(comm: CommState) -> bool:
    """Whether ``.grad`` holds averaged gradients after backward, so that clipping their norm means something.

    Not for Birder with its hook (the +-1 of u_bar: bounded by construction) nor for 1-bit Adam / LAMB in
    their compression stage (the averaged momentum the hook returns): :meth:`CommState.grad_holds`.
    """
    return comm.grad_holds() == GRADIENT


# ---------------------------------------------------------------------------------------- one step
@dataclass
class StepResult:
    loss_sum: float  # loss x samples, for sample-weighted means
    samples: int
    seconds: float
    optimizer: float  # optimizer.step() less the compression and communication counted inside it
    compression: float
    intra_bytes: float
    inter_bytes: float
    buckets: tuple = ()  # (index, elements, seconds from the start of backward) of each hook call, in order
    collectives: float = 0.0  # seconds in the hook's collectives during the step (hidden by overlap or not)


def accumulating(model) -> contextlib.AbstractContextManager:
    """Backward without the gradient exchange, its gradients kept to add up with the next backward's: DDP's
    ``no_sync()``, FSDP2's gradient-sync switch (``model.accumulating``, train/parallel.py; FSDP's ``no_sync``
    there drops the gradients, as the compute calibration wants). No hook runs inside it."""
    maker = getattr(model, "accumulating", None) or getattr(model, "no_sync", None)
    return maker() if maker is not None else contextlib.nullcontext()


def _accumulate(
    task, model, micro_batches, device, precision: Precision, share: float
) -> tuple[torch.Tensor | float, int]:
    """Forward and backward of the step's first micro-batches, without communication: each one's loss is
    scaled by ``share`` (1 / train.accumulate), so that the summed gradients are those of one batch K times
    as large. Returns their (loss x samples, samples), the first on the device, in float64 (the arithmetic of
    Python floats): read once with the step's own loss, not once per micro-batch (on a GPU each read waits for
    the micro-batch's kernels, so the next one's are not queued behind them)."""
    loss_sum: torch.Tensor | float = 0.0
    samples = 0
    for batch in micro_batches:
        with accumulating(model):
            with precision.autocast():
                loss, n = task.loss(model, batch, device)
            precision.backward(loss * share)
        loss_sum, samples = loss_sum + loss.detach().double() * n, samples + int(n)
    return loss_sum, samples


def run_step(
    task,
    model,
    optimizer,
    batch,
    device,
    comm,
    grad_clip: float | None = None,
    precision: Precision | None = None,
    accumulated: Sequence = (),
) -> StepResult:
    """One optimizer step, timed; the counters of ``comm`` read around it.

    ``grad_clip``: the global norm the averaged gradients are clipped to before the step (AWD-LSTM's 0.25,
    torchvision's ViT recipe's 1.0), where they are gradients (:func:`grads_are_gradients`). ``precision``:
    ``train.precision`` (:mod:`birder_repro.train.precision`; fp32 when not given). ``accumulated``: the
    step's micro-batches before ``batch`` (``train.accumulate`` - 1 of them): their gradients add up locally,
    and the exchange (the hook, once) runs in ``batch``'s backward, on the sum; every loss is divided by the
    number of micro-batches, as one batch that many times larger would average it.
    """
    precision = precision or Precision("fp32", device)
    share = 1.0 / (len(accumulated) + 1)
    before = comm_counters(comm)
    t0 = synced_now(device)
    early_loss, early_samples = _accumulate(task, model, accumulated, device, precision, share)
    with precision.autocast():
        loss, n = task.loss(model, batch, device)
    clock = bucket_clock(model)
    if clock is not None:
        clock.start(device)
    # DDP's hook communicates here, once a step (on the micro-batches' sum); backward returns when every bucket
    # is reduced
    precision.backward(loss * share if accumulated else loss)
    precision.unscale_(optimizer)  # fp16: true gradients before their norm is clipped
    if grad_clip and grads_are_gradients(comm):
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    t1 = synced_now(device)
    mid = comm_counters(comm)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    t2 = synced_now(device)
    after = comm_counters(comm)
    # Compression or communication that the scheme counts inside optimizer.step() is not computation.
    in_optimizer = (after[2] - mid[2]) + (after[3] - mid[3])
    return StepResult(
        loss_sum=float(early_loss + loss.detach().double() * n),
        samples=early_samples + int(n),
        seconds=t2 - t0,
        optimizer=max(0.0, (t2 - t1) - in_optimizer),
        compression=after[2] - before[2],
        intra_bytes=after[0] - before[0],
        inter_bytes=after[1] - before[1],
        collectives=after[3] - before[3],
        buckets=tuple(clock.take()) if clock is not None else (),
    )


# ------------------------------------------------------------------------- which steps, calibration
@dataclass(frozen=True)
class StepPlan:
    """Which steps of this (possibly resumed) run are timed, and when compute is calibrated."""

    steps: int
    start_step: int
    warmup_steps: int  # timed steps start after these (at least one step is timed, however short the run)
    calibration_passes: int
    calibrate_every: int  # 0: calibrate compute once, after the warm-up

    @classmethod
    def build(cls, settings: TrainSettings, steps: int, start_step: int) -> StepPlan:
        remaining = steps - start_step
        if remaining < 1:
            raise ValueError(f"nothing to train: the checkpoint is at step {start_step} of {steps}")
        return cls(
            steps=steps,
            start_step=start_step,
            warmup_steps=min(settings.timing_warmup_steps, remaining - 1),
            calibration_passes=settings.compute_calibration_passes,
            calibrate_every=settings.compute_calibration_every,
        )

    def calibration_passes_at(self, step: int) -> int:
        """Forward + backward calibration passes to run before ``step``: many first, then one now and then."""
        since = step - self.start_step - self.warmup_steps
        if since == 0:
            return self.calibration_passes
        return 1 if since > 0 and self.calibrate_every and since % self.calibrate_every == 0 else 0

    def timed(self, step: int) -> bool:
        return step - self.start_step >= self.warmup_steps


def calibrate_forward_backward(
    task,
    model,
    batch,
    device: torch.device,
    passes: int,
    precision: Precision | None = None,
    accumulated: Sequence = (),
) -> list[tuple[float, float]]:
    """(forward + backward, backward) seconds of ``passes`` passes without communication, leaving no trace on
    training. Each pass covers the whole step: the ``accumulated`` micro-batches and ``batch``.

    Under ``no_sync`` DDP runs no hook. Gradients are dropped, and buffers (BatchNorm's running statistics)
    and RNG states (dropout) restored, so the run continues exactly as if this had not happened.
    """
    module = getattr(model, "module", model)
    buffers = [b.detach().clone() for b in module.buffers()]
    rng = rng_state(device)
    times = []
    with getattr(model, "no_sync", contextlib.nullcontext)():
        for _ in range(passes):
            total = backward = 0.0
            for micro in (*accumulated, batch):
                t0 = synced_now(device)
                with (precision or Precision("fp32", device)).autocast():  # as the training step computes
                    loss, _ = task.loss(model, micro, device)
                t1 = synced_now(device)
                loss.backward()
                t2 = synced_now(device)
                total, backward = total + (t2 - t0), backward + (t2 - t1)
            times.append((total, backward))
    for p in module.parameters():
        p.grad = None
    with torch.no_grad():
        for b, saved in zip(module.buffers(), buffers):
            b.copy_(saved)
    set_rng_state(rng, device)
    return times
