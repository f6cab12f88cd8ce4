"""Which multi-process rows ``make gpu-check`` runs on a machine with this many GPUs, and which it skips.

One GPU can hold several ranks only through the staged backend (:mod:`.staged`: NCCL refuses two ranks on one
GPU), which completes every collective on the host before it returns. So it shows wrong arithmetic, layouts and
a stream that reads before the copy back, but not what needs a collective still running on NCCL's own stream:
a missing wait, an input reused before NCCL read it, or two communicators waiting on each other (DESIGN.md,
"Users' own scripts and GPUs: review 3"). Those need real NCCL, a GPU a process: with 2 or more GPUs the hooks
run on NCCL as 2 nodes x 1 GPU (the inter-node path on its own) and as 1 node x 2 GPUs (the intra-node
communicator), and with 3 or more also in the largest layout the runner would pick (:func:`layout`). Two-process
runs of the runner (:mod:`.runs`, :func:`birder_repro.gpucheck.runs.pair_specs`) need 2 GPUs too.

On 1 GPU those rows are in the table as ``skipped: needs 2 GPUs``; the staged run stands in for the NCCL ones.
The hooks run once more under CSAN (``TORCH_CUDA_SANITIZER=1``: unsynchronised cross-stream accesses), without
the training scenarios: on NCCL 2 x 1 with 2+ GPUs, staged on 1 GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from birder_repro.gpucheck.scenarios import layout
from birder_repro.gpucheck.table import SKIP, Check

__all__ = ["HookRun", "hook_runs", "needs", "skipped", "NEEDS_2"]

NEEDS_2 = 2  # GPUs that the NCCL rows and the runner's 2-process runs need


@dataclass(frozen=True)
class HookRun:
    """One spawn of the hook scenarios: ``world`` processes, ``gpus_per_node`` a node, on ``backend``."""

    label: str
    world: int
    gpus_per_node: int
    backend: str
    training: bool = True  # also Birder and 1-bit Adam under DDP and FSDP2 in every precision (.training)
    sanitizer: bool = False
    gpus: int = 1  # the GPUs it needs: below that, a skipped row

    def runs_on(self, gpus: int) -> bool:
        return gpus >= self.gpus


def hook_runs(gpus: int) -> list[HookRun]:
    """The hook section's spawns for a machine with ``gpus`` GPUs, those it cannot run included (see
    :func:`skipped`); none without a GPU."""
    if gpus < 1:
        return []
    runs = [HookRun("staged 2x1 on 1 GPU", 2, 1, "staged:cuda")] if gpus == 1 else []
    runs += [
        HookRun("NCCL 2x1", 2, 1, "nccl", gpus=NEEDS_2),
        HookRun("NCCL 1x2", 2, 2, "nccl", gpus=NEEDS_2),
    ]
    if gpus >= 3:
        nodes, m = layout(gpus)
        runs.append(HookRun(f"NCCL {nodes}x{m}", gpus, m, "nccl", gpus=gpus))
    sanitized = ("NCCL 2x1", "nccl") if gpus >= NEEDS_2 else ("staged 2x1 on 1 GPU", "staged:cuda")
    runs.append(HookRun(f"CSAN, {sanitized[0]}", 2, 1, sanitized[1], training=False, sanitizer=True))
    return runs


def needs(gpus: int) -> str:
    return f"skipped: needs {gpus} GPUs"


def skipped(section: str, label: str, gpus: int) -> Check:
    """The row of a check this machine has too few GPUs for."""
    return Check(section, label, SKIP, detail=needs(gpus))
