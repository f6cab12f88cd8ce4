"""The split of step time into compute, communication and compression, and the run's figures per stage
(Birder paper, Figure 4: computation, communication and compression/decompression per iteration).

- compression: the growth of the hook state's ``compress_seconds`` during the step (quantize, pack, unpack);
- compute: forward + backward as calibrated without any communication (:mod:`birder_repro.train.timing`),
  plus the optimizer step, less any compression or communication the scheme counts inside it;
- communication: the rest, ``max(0, step - compute - compression)`` on the means over the timed steps: the
  communication that computation does not hide. Where the rest would be negative (timing noise), compute
  absorbs it so the parts still sum. The split is made on means, not per step, so that noise in either
  direction averages out instead of being clipped at 0 step by step.

- data wait: the wait for the data loader's batch before the step (``data_wait_s_per_step``).

Throughput counts the whole step, data wait included (as the paper's samples per second do: a run that waits
for its input is slower, and a data-bound run must show as one): ``step_time_s.total`` is the sum of all four
parts, and throughput is samples over the timed steps' seconds with their waits.

With a hook that overlaps the backward pass (``CommState.overlaps()``: Birder's and 1-bit Adam's
communication thread, :mod:`birder_repro.comm.overlap`) compression and collectives run beside compute, so
only what computation does not hide is in the step: the exposed time ``step - compute``; compression is its
part ``min(compression, exposed)`` and communication the rest of it (:func:`split_step_time`). The record's
``overlap_s`` shows, beside that exposed time, the seconds per step the hook spent in collectives and in
compression work, hidden or not (they are not parts of the sum).

Times and bytes are means over processes; samples are summed over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from birder_repro.run import schema
from birder_repro.train.collectives import allreduce_sum
from birder_repro.train.timing import StepResult

__all__ = ["split_step_time", "Totals", "stage_figures", "summarize_timing"]


def split_step_time(
    step_s: float, compute_s: float, compress_s: float, overlapped: bool = False
) -> tuple[float, float, float]:
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

    FIELDS = (
        "steps",
        "seconds",
        "optimizer",
        "compression",
        "collectives",
        "data_wait",
        "samples",
        "intra_bytes",
        "inter_bytes",
    )

    def add(self, r: StepResult, data_wait: float) -> None:
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


def stage_figures(stages: dict[str, Totals], world: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Per stage, over all processes: samples summed, times and bytes as means per process (collective)."""
    # In order of first appearance: every rank meets the same stages at the same steps, so the positional
    # all-reduce lines up, and the record lists them as they happened (warmup before compression).
    names = list(stages)
    flat = allreduce_sum([v for name in names for v in stages[name].values()], device)
    out = {}
    width = len(Totals.FIELDS)
    for i, name in enumerate(names):
        sums = dict(zip(Totals.FIELDS, flat[i * width : (i + 1) * width]))
        per_process = {k: v / world for k, v in sums.items() if k != "samples"}
        out[name] = {**per_process, "samples": sums["samples"]}
    return out


def summarize_timing(
    figures: dict[str, dict[str, float]], forward_backward_s: float, overlapped: bool = False
) -> dict[str, Any]:
    """Throughput, step-time parts and bytes per step, over the whole run and per stage (record keys)."""

    def per_step(f, key):
        return f[key] / f["steps"] if f["steps"] else float("nan")

    def throughput(f):
        whole = f["seconds"] + f["data_wait"]  # the whole step, the wait for its batch included
        return f["samples"] / whole if whole else float("nan")

    def step_time(f):
        step = per_step(f, "seconds")
        wait = per_step(f, "data_wait")
        parts = split_step_time(
            step, forward_backward_s + per_step(f, "optimizer"), per_step(f, "compression"), overlapped
        )
        return dict(zip(schema.STEP_TIME_PARTS, (step + wait, *parts, wait)))

    def overlap(f):
        st = step_time(f)
        exposed = st["total"] - st["data_wait"] - st["compute"]  # the step's, not the loader's
        return dict(
            zip(schema.OVERLAP_PARTS, (overlapped, exposed, per_step(f, "collectives"), per_step(f, "compression")))
        )

    total = {k: sum(f[k] for f in figures.values()) for k in Totals.FIELDS}
    staged = {name: f for name, f in figures.items() if name != ""}
    return {
        "throughput_samples_per_s": throughput(total),
        "throughput_by_stage": {name: throughput(f) for name, f in staged.items()},
        "step_time_s": step_time(total),
        "step_time_s_by_stage": {name: step_time(f) for name, f in staged.items()},
        "overlap_s": overlap(total),
        "data_wait_s_per_step": per_step(total, "data_wait"),
        "intra_node_bytes_per_step": per_step(total, "intra_bytes"),
        "inter_node_bytes_per_step": per_step(total, "inter_bytes"),
        "intra_node_bytes_per_step_by_stage": {n: per_step(f, "intra_bytes") for n, f in staged.items()},
        "inter_node_bytes_per_step_by_stage": {n: per_step(f, "inter_bytes") for n, f in staged.items()},
        "timed_steps": round(total["steps"]),
    }
