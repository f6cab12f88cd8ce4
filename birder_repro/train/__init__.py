"""The training loop every run goes through: steps, LR schedule, timing, bytes, evaluation, checkpoints, logs.

The worker builds the task, data, DDP model, optimizer and communication hook, then calls :func:`train`.
One job a module:

- ``settings``: every ``train.*`` key, read once (:class:`TrainSettings`), and the numbers derived from them
  once per run (:class:`RunPlan`: global batch, total steps);
- ``loop``: :func:`train`, the steps and what happens between them, and the record's figures;
- ``timing``: one timed step, which steps are timed, the compute calibration;
- ``breakdown``: the split of step time into compute, communication and compression, per stage;
- ``evaluate``: the task's metrics over every process's shard;
- ``checkpoint``, ``relayout``, ``rng``, ``data``: crash-safe checkpoints with the RNG states, resuming on
  another layout, and the data position of a resume; ``restarts``: torchrun's restarts, counted;
- ``progress``: what rank 0 logs every ``train.log_every`` steps, and the progress bar or line;
- ``collectives``: the loop's own sums, barrier and broadcast.

Step time (Birder paper, Figure 4: computation, communication, compression/decompression per iteration)
------------------------------------------------------------------------------------------------------------
A *step* is timed from the moment its batch is in hand to the end of ``optimizer.step()`` (forward, backward
with DDP's hooks, optimizer); waiting for the data loader is measured apart (``data_wait_s_per_step``). Its
parts sum to the step time (``breakdown``). Compute is calibrated by passes under ``model.no_sync()`` on the
step's batch: ``train.compute_calibration_passes`` right after the timing warm-up, then one every
``train.compute_calibration_every`` steps, the median of all of them being the estimate; they leave training
exactly as without them and are outside the timed steps.

Throughput is global samples per second over the timed steps: the first ``train.timing_warmup_steps`` of a run
(of a resumed run too: caches, DDP's bucket rebuild, allocation) are left out of it and of the step-time and
bytes-per-step figures. Where the hook state has stages (1-bit Adam / LAMB: ``warmup``, ``compression``), the
same figures are kept per stage.

Loss
----
``final_loss`` (and ``metrics["loss"]``) is the mean training loss over the last 10 % of the run's steps (at
least one), weighted by samples and averaged over all processes. If the task's evaluation reports its own
``loss``, that one is kept as ``eval_loss``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from birder_repro.registry import lazy_attributes

if TYPE_CHECKING:
    from birder_repro.train.breakdown import split_step_time
    from birder_repro.train.checkpoint import CHECKPOINTS
    from birder_repro.train.loop import train
    from birder_repro.train.parallel import build_parallel
    from birder_repro.train.run_figures import fp32_allreduce_bytes
    from birder_repro.train.settings import RunPlan, TrainSettings, total_steps
    from birder_repro.train.timing import grads_are_gradients, run_step, stage_of

# name -> its module, imported on first use: the CLI's config checks import torch-free modules of this package
# (train.target) without the loop's torch (birder_repro.tasks says why).
_LAZY = {
    "split_step_time": "breakdown",
    "CHECKPOINTS": "checkpoint",
    "fp32_allreduce_bytes": "run_figures",
    "train": "loop",
    "build_parallel": "parallel",
    "RunPlan": "settings",
    "TrainSettings": "settings",
    "total_steps": "settings",
    "grads_are_gradients": "timing",
    "run_step": "timing",
    "stage_of": "timing",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "train",
    "build_parallel",
    "TrainSettings",
    "RunPlan",
    "total_steps",
    "split_step_time",
    "fp32_allreduce_bytes",
    "stage_of",
    "grads_are_gradients",
    "run_step",
    "CHECKPOINTS",
]
