"""What rank 0 reports every ``train.log_every`` steps: a line in metrics.jsonl (and W&B), and progress.

Progress goes to a terminal as a tqdm bar; where the output is not a terminal (the launchers copy it into the
run directory's ``output.log``) a bar would be carriage-return redraws, so one plain line per logging
interval is printed instead.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import IO

import torch
from tqdm import tqdm

from birder_repro.train.collectives import allreduce_sum
from birder_repro.train.logger import RunLogger
from birder_repro.train.timing import StepResult

__all__ = ["LogInterval", "Progress", "log_interval"]


@dataclass
class LogInterval:
    """Sums over the steps since the last log line, on this process."""

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


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal, else one plain line per logging interval.

    ``interactive`` defaults to whether stderr (tqdm's stream) is a terminal. Disabled on other ranks.
    """

    def __init__(
        self, steps: int, start_step: int, enabled: bool, interactive: bool | None = None, stream: IO[str] | None = None
    ) -> None:
        self.steps, self.enabled = steps, enabled
        self.stream = stream
        self._t0 = time.perf_counter()
        interactive = sys.stderr.isatty() if interactive is None else interactive
        self.bar = (
            tqdm(total=steps, initial=start_step, desc="train", dynamic_ncols=True, mininterval=1.0)
            if enabled and interactive
            else None
        )

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def interval(self, step: int, epoch: int, loss: float, rate: float, lr: float, stage: str | None) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate:.1f}", refresh=False)
        elif self.enabled:
            line = (
                f"train: step {step}/{self.steps} ({100 * step / self.steps:.0f}%), epoch {epoch}, "
                f"loss {loss:.4f}, {rate:.1f} samples/s, lr {lr:.4g}"
                f"{f', stage {stage}' if stage else ''}, {time.perf_counter() - self._t0:.0f} s"
            )
            print(line, file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def log_interval(
    step: int,
    epoch: int,
    interval: LogInterval,
    logger: RunLogger,
    progress: Progress,
    lr: float,
    stage: str | None,
    device: torch.device,
) -> None:
    """Mean loss over all processes for the interval (collective), then rank 0 writes a line."""
    loss_sum, samples = allreduce_sum([interval.loss_sum, float(interval.samples)], device)
    loss = loss_sum / samples if samples else float("nan")
    rate = samples / interval.seconds if interval.seconds else float("nan")  # global samples, rank-local seconds
    logger.log(
        step,
        {
            "epoch": epoch,
            "loss": loss,
            "lr": lr,
            "samples_per_s": rate,
            "step_time_s": interval.seconds / interval.steps,
            "stage": stage,
            "intra_node_bytes_per_step": interval.intra_bytes / interval.steps,
            "inter_node_bytes_per_step": interval.inter_bytes / interval.steps,
        },
    )
    progress.interval(step, epoch, loss, rate, lr, stage)
