"""The record's figures at a training run's end (:mod:`birder_repro.train.loop` calls :func:`run_figures` after
its last step): the final evaluation and training loss, sums over the processes, the step-time breakdown, DDP's
fp32 all-reduce volume for comparison, and what the run's profile is measured from (birder_repro.train.profile).
"""

from __future__ import annotations

import statistics

import torch

from birder_repro.comm.accounting import flat_allreduce_split
from birder_repro.run import schema
from birder_repro.train import breakdown
from birder_repro.train.collectives import allreduce_sum
from birder_repro.train.evaluate import deployed, evaluate
from birder_repro.train.loop_state import LoopParts, LoopState
from birder_repro.train.precision import Precision
from birder_repro.train.profile import parameter_matrices
from birder_repro.train.settings import RunPlan
from birder_repro.train.timing import StepPlan

__all__ = ["fp32_allreduce_bytes", "run_figures", "final_metrics", "outer_steps", "nonfinite_steps", "device_name"]

FP32_BYTES = 4


def fp32_allreduce_bytes(num_params: int, world_size: int, gpus_per_node: int) -> tuple[float, float, float]:
    """(total, intra-node, inter-node) bytes one process sends per step in DDP's fp32 ring all-reduce of
    ``num_params`` parameters: 2(N-1)/N x 4 bytes x P (birder_repro.comm.accounting, Thakur et al. 2005)."""
    intra, inter = flat_allreduce_split(FP32_BYTES * num_params, world_size, gpus_per_node)
    return intra + inter, intra, inter


def final_metrics(p: LoopParts, final_loss: float) -> dict[str, float]:
    """The task's metrics at the end (its own ``loss`` kept as ``eval_loss``) and the training loss."""
    metrics: dict[str, float] = {}
    if p.settings.eval and p.data.eval is not None:
        with deployed(p.optimizer):  # after the loop's finish(): a local-step optimizer's final sync
            metrics = evaluate(p.task, p.model, p.data, p.device, p.settings.eval_max_batches)
        if "loss" in metrics:
            metrics["eval_loss"] = metrics.pop("loss")
    metrics["loss"] = final_loss
    return schema.ordered_metrics(metrics, schema.declared_metrics(p.task))


def run_figures(p: LoopParts, run: LoopState, timing: StepPlan, plan: RunPlan) -> tuple[dict, dict]:
    """Evaluation, cross-process sums and the record's figures (collective); and what the run's profile is
    measured from besides them (birder_repro.train.profile)."""
    world = p.topology.world_size
    tail_loss, tail_samples, samples, forward_backward, backward = allreduce_sum(
        [
            sum(loss for loss, _ in run.tail),
            float(sum(n for _, n in run.tail)),
            run.samples,
            statistics.median(t for t, _ in run.calibration),
            statistics.median(b for _, b in run.calibration),
        ],
        p.device,
    )
    forward_backward /= world  # the mean over processes of each one's median
    backward /= world
    final_loss = tail_loss / tail_samples if tail_samples else float("nan")
    metrics = final_metrics(p, final_loss)
    if p.settings.eval and p.data.eval is not None:  # the final evaluation counts for time to target too
        run.target.evaluated(run.step, metrics)
    num_params = sum(q.numel() for q in getattr(p.model, "module", p.model).parameters() if q.requires_grad)
    fp32_total, fp32_intra, fp32_inter = fp32_allreduce_bytes(num_params, world, p.topology.gpus_per_node)
    figures = breakdown.stage_figures(run.stages, world, p.device)
    main = figures.get("compression") or _summed(figures)  # 1-bit Adam / LAMB: the compression stage's
    profile_inputs = {
        "bucket_steps": run.buckets,
        "backward_s": backward,
        "optimizer_s": _per_step(_summed(figures), "optimizer"),
        "compress_s": _per_step(main, "compression"),
        "nodes": p.topology.world_size // p.topology.gpus_per_node,
        "gpus_per_node": p.topology.gpus_per_node,
        "device": device_name(p.device),
        "torch_device": p.device,
        "threads": torch.get_num_threads(),
        "matrices": parameter_matrices(getattr(p.model, "module", p.model).parameters()),
    }
    return {
        "steps": run.step,
        "planned_steps": timing.steps,  # the run's length; less than that with train.stop_at_target
        "stopped_at_target": run.step < timing.steps,
        "resumed_from_step": timing.start_step or None,
        "samples": round(samples),
        "epochs_trained": samples / p.data.train_size if p.data.train_size else None,
        "batch_size": p.settings.batch_size,
        "accumulate": p.settings.accumulate,
        "global_batch_size": plan.global_batch,
        "data": p.data.description,
        "timing_warmup_steps": timing.warmup_steps,
        "loop_step_s": run.loop_s / run.loop_steps if run.loop_steps else None,
        "forward_backward_s": forward_backward,
        "compute_calibration_passes": len(run.calibration),
        **breakdown.summarize_timing(figures, forward_backward, bool(getattr(p.comm, "overlaps", lambda: False)())),
        "parameters": num_params,
        "fp32_allreduce_bytes_per_step": fp32_total,
        "fp32_allreduce_intra_node_bytes_per_step": fp32_intra,
        "fp32_allreduce_inter_node_bytes_per_step": fp32_inter,
        "final_loss": final_loss,
        "loss_definition": f"mean training loss over the last {len(run.tail)} steps, all processes",
        "headline_metric": schema.headline_metric(p.task),
        "metrics": metrics,
        **run.target.figures(),
    }, profile_inputs


def outer_steps(optimizer) -> dict:
    """DiLoCo's outer steps and their mean seconds (birder_repro.optim.DiLoCo); null for the others."""
    steps = getattr(optimizer, "outer_steps", None)
    seconds = getattr(optimizer, "outer_seconds", None)
    return {"outer_steps": steps, "outer_step_s": seconds / steps if steps and seconds is not None else None}


def nonfinite_steps(comm, precision: Precision) -> int:
    """Steps skipped for a NaN or Inf gradient: the compressed hooks count their own (fp16's GradScaler skips the
    same steps: train/precision.py), the baselines' only skips are GradScaler's."""
    if hasattr(comm, "nonfinite_steps"):
        return int(comm.nonfinite_steps)
    return precision.skipped_steps


def _summed(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    return {k: sum(f[k] for f in figures.values()) for k in breakdown.Totals.FIELDS}


def _per_step(f: dict[str, float], key: str) -> float:
    return f[key] / f["steps"] if f.get("steps") else 0.0


def device_name(device: torch.device) -> str:
    return f"cuda ({torch.cuda.getdevice_name(device)})" if device.type == "cuda" else "cpu"
