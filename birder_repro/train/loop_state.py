"""What the training loop (:mod:`birder_repro.train.loop`) is handed and what it keeps while it runs, shared
with the figures it reports at the end (:mod:`birder_repro.train.run_figures`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from birder_repro.train import breakdown
from birder_repro.train.checkpoint import RunIdentity
from birder_repro.train.logger import RunLogger
from birder_repro.train.precision import Precision
from birder_repro.train.progress import LogInterval, Progress
from birder_repro.train.settings import TrainSettings
from birder_repro.train.target import TimeToTarget

__all__ = ["LoopState", "LoopParts"]


@dataclass
class LoopState:
    """The loop's running state on this process."""

    step: int = 0
    samples: float = 0.0  # this process's samples since the start of training (resumes included)
    calibration: list = field(default_factory=list)  # (forward + backward, backward) of every calibration pass
    buckets: list = field(default_factory=list)  # the hook calls of every timed step (StepResult.buckets)
    stages: dict[str, breakdown.Totals] = field(default_factory=dict)
    tail: deque = field(default_factory=deque)  # (loss_sum, samples) of the last steps
    interval: LogInterval = field(default_factory=LogInterval)  # since the last log line
    epoch: int = 0
    target: TimeToTarget = field(default_factory=lambda: TimeToTarget(None, 1))  # birder_repro.train.target
    start: int = 0  # the step this attempt started from (a resumed run's checkpoint)
    loop_s: float = 0.0  # the training clock's seconds over this attempt's timed steps (loop_step_s)
    loop_steps: int = 0


@dataclass
class LoopParts:
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
    settings: TrainSettings
    precision: Precision
    logger: RunLogger
    progress: Progress
    identity: RunIdentity
