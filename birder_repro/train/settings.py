"""Every ``train.*`` setting, read once from the run's config into :class:`TrainSettings`, and the few numbers
derived from them once per run (:class:`RunPlan`: the global batch and the total steps).

The training loop, the worker and the record read these objects, never ``cfg.train`` itself. Keys a task adds
under ``train:`` for itself (``train.label_smoothing`` of ViT) are the task's to read and are ignored here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from birder_repro.config.settings import ConfigError
from birder_repro.optim.schedule import SCHEDULES

PRECISIONS = ("fp32", "bf16", "fp16")  # train.precision (birder_repro.train.precision)

__all__ = ["TrainSettings", "RunPlan", "total_steps"]


def total_steps(steps: int | None, epochs: float, train_size: int, global_batch: int) -> int:
    """``steps`` when given, else ``epochs`` passes over ``train_size`` samples at ``global_batch`` per step."""
    if steps is not None:
        if steps < 1:
            raise ValueError(f"train.steps must be >= 1, got {steps}")
        return int(steps)
    if train_size < 1 or global_batch < 1:
        raise ValueError(f"cannot count steps: train_size={train_size}, global batch={global_batch}")
    return max(1, math.ceil(epochs * math.ceil(train_size / global_batch)))


def _whole(key: str, value: Any, minimum: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        null = " or null" if allow_none else ""
        raise ConfigError(f"train.{key}={value!r}: use a whole number >= {minimum}{null}")
    return value


@dataclass(frozen=True)
class TrainSettings:
    """The ``train:`` node of conf/config.yaml (see the comments there), checked; defaults are that file's."""

    batch_size: int  # per process, per micro-batch
    accumulate: int = 1  # micro-batches per optimizer step (gradient accumulation; the hooks run once a step)
    steps: int | None = None  # None: ``epochs`` passes over the training set
    epochs: float = 1.0
    schedule: Mapping[str, Any] = field(default_factory=lambda: {"name": "constant"})  # birder_repro.optim.schedule
    grad_clip: float | None = None  # global norm the averaged gradients are clipped to (None: no clipping)
    timing_warmup_steps: int = 5  # left out of throughput, step time and bytes per step
    log_every: int = 10  # steps between log lines (metrics.jsonl, W&B, the progress line)
    eval: bool = True  # evaluate at the end of the run
    eval_every: int = 0  # also every this many steps (0: at the end only)
    stop_at_target: bool = False  # end the run at the first evaluation that reaches task.target
    eval_max_batches: int | None = None  # evaluation batches per process (None: all)
    compute_calibration_passes: int = 3  # forward + backward passes under no_sync() after the timing warm-up
    compute_calibration_every: int = 100  # one more every this many timed steps (0: never again)
    checkpoint_every: int = 0  # steps between checkpoints (0: none)
    checkpoint_on_stop: bool = True  # a checkpoint when a signal stops the run (train.stop)
    stop_timeout_s: int = 30  # torchrun's grace for the workers to stop on a signal before it kills them
    resume: str | None = None  # auto | a checkpoint directory (or a run directory) | None (train.checkpoint)
    keep_checkpoints: int = 2  # complete checkpoints kept in the run directory (older ones are removed)
    max_restarts: int = 0  # torchrun restarts the workers after a failure, at most this often
    resume_policy: str = "strict"  # strict | reset_errors (another layout: start the hook's error buffers afresh)
    timeout_s: float = 300.0  # collectives waiting longer than this on a peer fail (process group timeout)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (birder_repro.train.precision)
    diverge_after: int = 10  # consecutive non-finite steps that stop the run as diverged (0: never; train.divergence)

    @classmethod
    def from_config(cls, cfg) -> TrainSettings:
        """Read ``cfg.train`` (the run's whole config); a key left out takes the default above."""
        node = cfg.train
        raw = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        given = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__ and v is not None}
        if "batch_size" not in given:
            raise ConfigError("train.batch_size is missing: give the batch size per process")
        settings = cls(**given)
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse values the loop cannot use, naming the key; raises :class:`ConfigError`."""
        _whole("batch_size", self.batch_size, 1)
        _whole("accumulate", self.accumulate, 1)
        _whole("steps", self.steps, 1, allow_none=True)
        if self.steps is None and not (isinstance(self.epochs, (int, float)) and self.epochs > 0):
            raise ConfigError(f"train.epochs={self.epochs!r}: give a number of passes > 0 (or train.steps)")
        for key in ("timing_warmup_steps", "eval_every", "compute_calibration_every", "checkpoint_every"):
            _whole(key, getattr(self, key), 0)
        _whole("stop_timeout_s", self.stop_timeout_s, 1)
        if not isinstance(self.stop_at_target, bool):
            raise ConfigError(f"train.stop_at_target={self.stop_at_target!r}: use true or false")
        if not isinstance(self.checkpoint_on_stop, bool):
            raise ConfigError(f"train.checkpoint_on_stop={self.checkpoint_on_stop!r}: use true or false")
        for key in ("log_every", "compute_calibration_passes"):
            _whole(key, getattr(self, key), 1)
        _whole("eval_max_batches", self.eval_max_batches, 1, allow_none=True)
        _whole("keep_checkpoints", self.keep_checkpoints, 1)
        _whole("max_restarts", self.max_restarts, 0)
        _whole("diverge_after", self.diverge_after, 0)
        if self.resume_policy not in ("strict", "reset_errors"):
            raise ConfigError(f"train.resume_policy={self.resume_policy!r}: use strict or reset_errors")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ConfigError(f"train.timeout_s={self.timeout_s!r}: give the seconds (> 0) a collective may wait")
        if self.resume is not None and not isinstance(self.resume, str):
            raise ConfigError(f"train.resume={self.resume!r}: use auto, a checkpoint directory, or null")
        if self.grad_clip is not None and not (isinstance(self.grad_clip, (int, float)) and self.grad_clip >= 0):
            raise ConfigError(f"train.grad_clip={self.grad_clip!r}: give a gradient norm >= 0 (0 or null: no clipping)")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision={self.precision!r}: use one of {', '.join(PRECISIONS)}")
        name = self.schedule.get("name", "constant")
        if name not in SCHEDULES:
            raise ConfigError(f"train.schedule.name={name!r} is not one of: {', '.join(SCHEDULES)}")

    def global_batch(self, world_size: int) -> int:
        """Samples per optimizer step over all processes: the micro-batch x processes x micro-batches a step."""
        return self.batch_size * world_size * self.accumulate


@dataclass(frozen=True)
class RunPlan:
    """The settings and what follows from them for one run, computed once (by the worker) and passed on."""

    settings: TrainSettings
    world_size: int
    global_batch: int
    steps: int  # optimizer steps of the whole run (also the optimizer's ``total_steps``)

    @classmethod
    def build(cls, cfg, world_size: int, train_size: int) -> RunPlan:
        settings = TrainSettings.from_config(cfg)
        batch = settings.global_batch(world_size)
        return cls(
            settings=settings,
            world_size=world_size,
            global_batch=batch,
            steps=total_steps(settings.steps, float(settings.epochs), int(train_size), batch),
        )
