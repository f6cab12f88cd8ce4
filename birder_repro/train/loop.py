"""The loop: steps with the lr schedule, logging, evaluation and checkpoints between them, then the record's figures
(:mod:`birder_repro.train.run_figures`).

The worker builds the task, data, DDP model, optimizer and communication hook, then calls :func:`train`.
Before every step the ranks agree whether a stop signal came (birder_repro.train.stop); if one did, they save a
checkpoint and raise :class:`~birder_repro.train.stop.Stopped`. A checkpoint carries what a resumed run needs to
count across its attempts (the time-to-target clock and the last steps' losses of ``final_loss``).

A local-step optimizer (DiLoCo: ``hasattr(optimizer, "synchronised")``, birder_repro.optim.common.LocalSteps) is
evaluated on the model a user would deploy, the last synchronised one (inside ``optimizer.synchronised()``),
never on the workers' own replicas between syncs; and the run ends on a sync: ``optimizer.finish()`` after the
last step (in that step's time), before the final evaluation and the final checkpoint.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import CommStats
from birder_repro.optim.schedule import lr_factor
from birder_repro.run import schema
from birder_repro.train import breakdown, stop
from birder_repro.train.checkpoint import (
    COMPLETE,
    RunIdentity,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
    settle_ddp_buckets,
    step_dir,
)
from birder_repro.train.data import batches, steps_per_epoch
from birder_repro.train.divergence import DivergenceWatch
from birder_repro.train.evaluate import deployed, evaluate
from birder_repro.train.logger import RunLogger
from birder_repro.train.loop_state import LoopParts, LoopState
from birder_repro.train.precision import Precision, agrees_overflow
from birder_repro.train.probes import start_probes, stop_probes
from birder_repro.train.profile import measured_profile
from birder_repro.train.progress import LogInterval, Progress, log_interval
from birder_repro.train.restarts import Attempts, inject_fault, restart_count
from birder_repro.train.resume_point import choose_resume
from birder_repro.train.run_figures import nonfinite_steps, outer_steps, run_figures
from birder_repro.train.settings import RunPlan
from birder_repro.train.target import TimeToTarget, target_from_config
from birder_repro.train.timing import (
    StepPlan,
    StepResult,
    calibrate_forward_backward,
    comm_counters,
    run_step,
    stage_of,
    synced_now,
)

__all__ = ["train"]

LOSS_TAIL = 0.10  # final_loss: the mean training loss over this fraction of the last steps


def train(
    cfg,
    *,
    task,
    data,
    model,
    optimizer,
    comm,
    topology,
    device,
    run_dir,
    probes: Sequence = (),
    plan: RunPlan | None = None,
) -> dict:
    """Train ``model`` for the configured steps and return the run's figures (record keys, birder_repro.run.schema).

    Collective: every process calls it with the same config. Only rank 0 prints, logs and writes the model.
    ``plan``: the settings and derived numbers the worker computed (built here from ``cfg`` when not given).
    ``probes`` measure over exactly the timed steps (birder_repro.train.probes).
    """
    plan = plan or RunPlan.build(cfg, topology.world_size, int(data.train_size))
    settings, steps = plan.settings, plan.steps
    device = torch.device(device)
    comm = comm if comm is not None else CommStats()
    is_main = topology.rank == 0
    base_lrs = [g["lr"] for g in optimizer.param_groups]  # the peak lr, before a checkpoint's lr replaces it

    run = LoopState()
    # a local-step method on 2+ nodes: GradScaler's verdict agreed over the world (train/precision.py)
    agree = dist.group.WORLD if agrees_overflow(cfg.optim, topology.nodes) else None
    precision = Precision(settings.precision, device, comm, agree_over=agree)
    identity = RunIdentity.from_config(cfg, comm, topology.world_size)
    attempts = Attempts(run_dir, enabled=is_main)
    start = choose_resume(settings.resume, run_dir, restart_count() > 0, device)
    carried: dict = {}
    if start is not None:
        settle_ddp_buckets(task, model, data, device)
        run.step, run.samples = load_checkpoint(
            start,
            model,
            optimizer,
            comm,
            topology.rank,
            topology.world_size,
            device,
            identity,
            settings.resume_policy,
            precision,
            carried,
        )
        if is_main:
            print(f"[birder-repro] resuming from {start}", flush=True)
    run.start = run.step
    attempts.started(run.step)
    run.target = TimeToTarget(
        target_from_config(cfg, schema.declared_metrics(task)), topology.world_size, run.step, settings.eval_every
    )
    run.target.load_state_dict(carried.get("target"))
    timing = StepPlan.build(settings, steps, start_step=run.step)
    run.tail = deque((tuple(t) for t in carried.get("tail") or ()), maxlen=max(1, math.ceil(LOSS_TAIL * steps)))
    if is_main:
        print(
            f"train: {steps} steps{f' from step {run.step}' if run.step else ''}, global batch "
            f"{plan.global_batch} ({topology.world_size} processes x {settings.batch_size}"
            f"{f' x {settings.accumulate} micro-batches' if settings.accumulate > 1 else ''}); data: "
            f"{data.description}; throughput and step times leave out the first {timing.warmup_steps} steps",
            flush=True,
        )
    logger = RunLogger(cfg, run_dir, enabled=is_main, clock=run.target.training_seconds)
    progress = Progress(steps, run.step, enabled=is_main)
    parts = LoopParts(
        cfg,
        task,
        data,
        model,
        optimizer,
        comm,
        topology,
        device,
        run_dir,
        settings,
        precision,
        logger,
        progress,
        identity,
    )
    exit_code = 1
    probing = False
    diverging = DivergenceWatch(
        settings.diverge_after,
        cfg.optim,
        device,  # train/divergence.py
        count_skips=precision.scaler is None,
    )
    try:
        model.train()
        # train.accumulate micro-batches a step: the stream counts micro-batches (a resume starts at step x K)
        k = settings.accumulate
        stream = batches(
            data, steps_per_epoch(data, int(data.train_size), plan.global_batch // k), run.step * k, device
        )
        stop.in_loop()
        logged_s = 0.0  # the last log line's seconds: the clock counts them with the next step
        while run.step < steps:
            # the training clock (train/target.py): the whole pass of the loop, the calibration passes, the
            # evaluation and the checkpoint after the step left out
            t_loop = time.perf_counter() - logged_s
            inject_fault(topology.rank, run.step + 1)  # tests only (BIRDER_TEST_FAULT)
            _stop_if_signalled(parts, run)  # collective: every rank stops after the same step
            t_data = time.perf_counter()
            micro = [next(stream) for _ in range(k)]  # (epoch, batch) each; the step's epoch is its last one's
            run.epoch, batch = micro[-1]
            accumulated = [b for _, b in micro[:-1]]
            data_wait = time.perf_counter() - t_data
            t_calibration = time.perf_counter()
            if timing.calibration_passes_at(run.step):
                run.calibration += calibrate_forward_backward(
                    task, model, batch, device, timing.calibration_passes_at(run.step), precision, accumulated
                )
            t_loop += time.perf_counter() - t_calibration
            lr = _set_lr(optimizer, base_lrs, run.step, steps, settings.schedule)
            stage = stage_of(comm, run.step)
            if not probing and timing.timed(run.step):
                start_probes(probes)
                probing = True
            result = run_step(task, model, optimizer, batch, device, comm, settings.grad_clip, precision, accumulated)
            _record_step(run, timing, result, stage, data_wait)
            if run.step == steps:
                _end_on_sync(parts, run, timing, stage)  # the run's last step: its model a synchronised one
            diverging.after_step(run.step, result.loss_sum, comm, lr, stage)
            progress.step()
            attempts.reached(run.step)
            passed = time.perf_counter() - t_loop
            run.target.step_done(passed, result.samples)
            if timing.timed(run.step - 1):  # the step just taken (its index)
                run.loop_s, run.loop_steps = run.loop_s + passed, run.loop_steps + 1
            t_log = time.perf_counter()
            _log_if_due(parts, run, timing, lr, stage)
            logged_s = time.perf_counter() - t_log
            _evaluate_if_due(parts, run, timing)
            # every rank: evaluations are global, so every rank saw the same hit (and once a step was timed and
            # compute calibrated, so that the record has its step times)
            stopping = settings.stop_at_target and run.target.hit is not None and run.stages and run.calibration
            if stopping and run.step < steps:  # (the last step did it already)
                _end_on_sync(parts, run, timing, stage)  # before this step's checkpoint and the final evaluation
            _checkpoint_if_due(parts, run)
            if stopping:
                break
        if hasattr(optimizer, "synchronised"):  # a no-op where the last step did it (every way out of the loop
            optimizer.finish()  # but a run resumed at its last step, from a checkpoint saved before finish() was)
        probed = stop_probes(probes, timed_steps=int(sum(t.steps for t in run.stages.values())))
        record, profile_inputs = run_figures(parts, run, timing, plan)
        record.update(probed)
        record.update(
            attempts.figures(),
            nonfinite_steps=nonfinite_steps(comm, precision),
            **outer_steps(optimizer),
            precision=precision.name,
            loss_scale=precision.loss_scale,
        )
        record["profile"] = measured_profile(cfg, record, **profile_inputs)
        logger.log(run.step, {f"final/{k}": v for k, v in record["metrics"].items()})
        logger.summary({"throughput_samples_per_s": record["throughput_samples_per_s"], **record["metrics"]})
        exit_code = 0
        return record
    finally:
        attempts.close()
        progress.close()
        logger.finish(exit_code=exit_code)


def _set_lr(optimizer, base_lrs: list[float], step: int, steps: int, schedule) -> float:
    factor = lr_factor(step, steps, schedule)
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base * factor
    return optimizer.param_groups[0]["lr"]


def _record_step(run: LoopState, timing: StepPlan, result: StepResult, stage: str | None, data_wait: float) -> None:
    if timing.timed(run.step):  # before counting the step: it is the index of the step just taken
        run.stages.setdefault(stage or "", breakdown.Totals()).add(result, data_wait)
        run.buckets.append(result.buckets)
    run.step += 1
    run.samples += result.samples
    if math.isfinite(result.loss_sum):  # a step skipped for a non-finite gradient (comm/nonfinite.py) is left out
        run.tail.append((result.loss_sum, result.samples))
    run.interval.add(result)


def _log_if_due(p: LoopParts, run: LoopState, timing: StepPlan, lr: float, stage: str | None) -> None:
    """The interval's log line when it comes round (collective on every rank)."""
    if run.step % p.settings.log_every == 0 or run.step == timing.steps:
        log_interval(run.step, run.epoch, run.interval, p.logger, p.progress, lr, stage, p.device)
        run.interval = LogInterval()


def _end_on_sync(p: LoopParts, run: LoopState, timing: StepPlan, stage: str | None) -> None:
    """A local-step optimizer's ``finish()``: an outer step over the inner steps since its last one, if any
    (collective); nothing for the others. Its bytes and seconds count as the last step's, as a regular outer
    step's do (inside ``optimizer.step()``), where that step was timed."""
    if not hasattr(p.optimizer, "synchronised"):
        return
    before, t0 = comm_counters(p.comm), synced_now(p.device)
    p.optimizer.finish()
    seconds, after = synced_now(p.device) - t0, comm_counters(p.comm)
    totals = run.stages.get(stage or "") if timing.timed(run.step - 1) else None
    if totals is None:
        return
    intra, inter, compress, collectives = (a - b for a, b in zip(after, before))
    totals.seconds += seconds
    totals.optimizer += max(0.0, seconds - compress - collectives)
    totals.compression += compress
    totals.collectives += collectives
    totals.intra_bytes += intra
    totals.inter_bytes += inter


def _evaluate_if_due(p: LoopParts, run: LoopState, timing: StepPlan) -> None:
    """Evaluate the deployable model when the interval comes round (collective on every rank)."""
    s = p.settings
    # train.eval=false turns off every evaluation, those during training too (a throughput run measures steps)
    if s.eval and s.eval_every and run.step % s.eval_every == 0 and run.step < timing.steps and p.data.eval is not None:
        with deployed(p.optimizer):
            metrics = evaluate(p.task, p.model, p.data, p.device, s.eval_max_batches)
        p.logger.log(run.step, {f"eval/{k}": v for k, v in metrics.items()})
        run.target.evaluated(run.step, metrics)


def _checkpoint_if_due(p: LoopParts, run: LoopState) -> None:
    """Checkpoint when the interval comes round (collective on every rank)."""
    if p.settings.checkpoint_every and run.step % p.settings.checkpoint_every == 0:
        _save(p, run)


def _save(p: LoopParts, run: LoopState):
    """This step's checkpoint, with what a resumed run carries on (collective)."""
    carry = {"target": run.target.state_dict(), "tail": [list(t) for t in run.tail]}
    return save_checkpoint(
        p.run_dir,
        run.step,
        run.samples,
        p.model,
        p.optimizer,
        p.comm,
        p.topology.rank,
        p.topology.world_size,
        p.device,
        p.identity,
        p.settings.keep_checkpoints,
        p.precision,
        carry,
    )


def _stop_if_signalled(p: LoopParts, run: LoopState) -> None:
    """Where the ranks agree a stop signal came: save this step's checkpoint (``train.checkpoint_on_stop``, or
    with ``train.checkpoint_every`` > 0; unless it exists or no step was trained) and raise ``Stopped``."""
    signum = stop.agreed(p.device)
    if not signum:
        return
    where = step_dir(p.run_dir, run.step)
    wanted = p.settings.checkpoint_on_stop or p.settings.checkpoint_every > 0
    if wanted and run.step > 0 and not (where / COMPLETE).is_file():
        _save(p, run)
    found = complete_checkpoints(where.parent)
    raise stop.Stopped(signum, run.step, found[-1][1] if found else None, run.start)
