"""gpu-check's quick plan (``--quick``; ``make gpu-check-lent``): the most telling checks in at most
:data:`BUDGET_S` on one GPU, for a lent machine whose whole session has 15 minutes of device time.

Sections in the order of what they tell (a cut run has done the most telling first, and the table is written as
each row completes):

    hooks    every hook across 2 ranks against its reference (staged on 1 GPU, NCCL 2 x 1 with 2+), DDP and
             FSDP2 in fp32, bf16 and fp16; no CSAN spawn (the full check has it);
    stress   the stream-ordering stress and the host-sync check (:mod:`.stress`);
    runs     a reduced set through the runner on one GPU, :data:`RUN_TIMEOUT_S` each, ``--jobs`` from the cores
             with ``OMP_NUM_THREADS`` their share: Birder (fp32, overlap, ``b_hat``), 1-bit Adam (bf16), and
             fp16 with an overflow injected at step 3 for Birder and for torch's PowerSGD (compressing from
             step 2), whose records must show one skipped step and the scale halved once; on Fashion-MNIST
             (tiny, synthetic: its task imports nothing beyond torch, where digits needs scikit-learn);
    kernels  Birder's Triton kernels against the CPU reference at one size (:data:`KERNEL_SIZE`), and timed.

This module imports no torch: ``--dry-run`` prints the plan and its predicted time from it alone. The times are
estimates from the first lent H200's (docs/gpus.md), a process start with torch and Triton about 20 s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from birder_repro.gpucheck.runs import RunSpec

__all__ = ["BUDGET_S", "RUN_TIMEOUT_S", "KERNEL_SIZE", "TASK", "Item", "jobs_for", "quick_runs", "plan", "describe"]

BUDGET_S = 360
RUN_TIMEOUT_S = 120
KERNEL_SIZE = 25_557_032  # ResNet-50's parameters: one bucket of the full check's two
TASK = "fashion_mnist"
SECTIONS = ("hooks", "stress", "runs", "kernels")
# predicted seconds (estimates, see the module docstring)
HOOKS_SPAWN_S = 90  # 2 processes: CUDA and Triton start-up, then the scenarios (17 CPU-s interpreted here)
STRESS_S = 45  # one process: start-up, a few steps per case
RUN_ROUND_S = 50  # one round of runs side by side: CLI, torchrun, a worker's imports and compiles, 12 steps
KERNELS_S = 30  # 8 comparisons against the CPU at 25.6M elements, and the timings


@dataclass(frozen=True)
class Item:
    section: str
    name: str
    predicted_s: float


def jobs_for(runs: int, cores: int | None = None) -> int:
    """Runs side by side: one per 4 cores (a run's CLI, torchrun and worker), at most ``runs``, at least 1."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(runs, cores // 4))


def quick_runs():
    """The reduced set of runs (:class:`birder_repro.gpucheck.runs.RunSpec`, omegaconf-only: no torch)."""
    return [
        RunSpec(TASK, "birder", "fp32"),
        RunSpec(TASK, "onebit_adam", "bf16"),
        RunSpec(TASK, "birder", "fp16", overflow=True),
        RunSpec(TASK, "sgdm_powersgd", "fp16", ("optim.comm.start_iter=2",), overflow=True),
    ]


def plan(gpus: int = 1, cores: int | None = None, only: tuple[str, ...] = SECTIONS) -> list[Item]:
    """What the quick check runs on ``gpus`` GPUs and ``cores`` cores, in order, with predicted seconds."""
    items = []
    if "hooks" in only:
        where = "NCCL 2x1" if gpus >= 2 else "staged 2x1 on 1 GPU"
        items.append(Item("hooks", f"{where}: every hook and Birder / 1-bit Adam under DDP and FSDP2", HOOKS_SPAWN_S))
    if "stress" in only:
        items.append(Item("stress", "stream ordering (training stream slowed) and host syncs in backward", STRESS_S))
    if "runs" in only:
        specs = quick_runs()
        jobs = jobs_for(len(specs), cores)
        rounds = math.ceil(len(specs) / jobs)
        names = ", ".join(s.label for s in specs)
        items.append(Item("runs", f"{len(specs)} runs, {jobs} at a time: {names}", rounds * RUN_ROUND_S))
    if "kernels" in only:
        items.append(Item("kernels", f"Triton against the CPU, {KERNEL_SIZE / 1e6:.1f}M elements", KERNELS_S))
    return items


def describe(items: list[Item]) -> str:
    """The plan as lines, and the predicted total against the budget."""
    lines = [f"  {i.section:8s} ~{i.predicted_s:4.0f} s  {i.name}" for i in items]
    total = sum(i.predicted_s for i in items)
    lines.append(f"  predicted {total:.0f} s in all (the quick plan's budget: {BUDGET_S} s on one GPU)")
    return "\n".join(lines)
