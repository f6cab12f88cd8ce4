"""Time to accuracy: the first evaluation whose metric reaches the task's target (``task.target``), on a
training clock that starts at the first training step.

Time to a fixed accuracy on a held-out set is the end-to-end metric of DAWNBench and MLPerf Training: it joins
the two halves of the Birder paper's claim (the same accuracy, in less time; its Figure 2, time-wise). Here:

- the target: ``task.target`` names a metric the task's evaluation reports (its headline one), a value and a
  direction (``higher`` or ``lower`` is better: perplexity and losses are lower-better);
- when: every evaluation counts, the periodic ones (``train.eval_every`` steps) and the final one, so the time
  is as fine as the evaluation cadence (the record keeps ``eval_every`` and the number of evaluations);
- the clock (``seconds``; the record's ``training_clock`` is :data:`CLOCK`, ``loop``): the wall time of every
  pass of the training loop from the start of the first to the end of the step the reaching evaluation
  followed: the step, its wait for data, and the loop's own per-step work around it (the ranks' agreement on a
  stop signal, the divergence check, the log line), all collective, so that every rank's clock is the same.
  Left out: the evaluations, the checkpoints and the compute-calibration passes, which measure the run rather
  than train it, and the first step's one-time work (JIT compilation or numba's cache load, DDP's first
  iteration, the communication thread's start), ``compile_s`` = the first step less the median step (of each attempt,
  summed, for a resumed run), reported apart, as MLPerf Training leaves system and model initialization out of its
  timed region. Records written before ``training_clock`` existed summed rank 0's step times only: a rank that
  finished its step first then waited in the next collective outside them, so that clock ran 2-27 % slow (measured on
  the Fashion-MNIST field against its logs' wall time; report.clock re-reads those logs on the loop clock);
- ``wall_s``: the plain wall-clock from the start of the first step to the end of that evaluation, everything
  included (DAWNBench's end-to-end view);
- start-up (the worker process's start to its first step: imports, process group, data, model, DDP) is
  ``startup_s``, apart from both.

Every rank evaluates the same all-reduced metrics and so finds the same step; rank 0's clock is recorded.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from birder_repro.config.settings import ConfigError
from birder_repro.tasks import declared_metrics_of

__all__ = ["CLOCK", "DIRECTIONS", "Target", "target_from_config", "check_target", "TimeToTarget", "process_age_s"]

DIRECTIONS = ("higher", "lower")  # which way is better
CLOCK = "loop"  # the record's training_clock: what ``seconds`` and metrics.jsonl's train_s count (module doc)


@dataclass(frozen=True)
class Target:
    """``metric`` reaching ``value``: at least it (``higher`` is better) or at most it (``lower``)."""

    metric: str
    value: float
    direction: str

    def reached_by(self, x: Any) -> bool:
        """Whether ``x`` reaches the target; a missing or non-finite value never does."""
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return False
        return x >= self.value if self.direction == "higher" else x <= self.value


def _node(cfg) -> Mapping[str, Any] | None:
    node = OmegaConf.select(cfg, "task.target", default=None)
    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def target_from_config(cfg, task_metrics: tuple[str, ...] = ()) -> Target | None:
    """The run's target from ``task.target`` (metric, value, direction); None where the task has none or its
    value is null. ``task_metrics``: the metrics the task's evaluation reports, which the metric must be one of.
    Raises :class:`ConfigError` naming the key."""
    node = _node(cfg)
    if node is None or node.get("value") is None:
        return None
    value, direction, metric = node.get("value"), node.get("direction"), node.get("metric")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"task.target.value={value!r}: give the metric's target as a number (null: no target)")
    if direction not in DIRECTIONS:
        raise ConfigError(f"task.target.direction={direction!r}: use higher or lower (which way is better)")
    if not isinstance(metric, str) or (task_metrics and metric not in task_metrics):
        raise ConfigError(
            f"task.target.metric={metric!r} is not a metric of task {cfg.task.name!r}: use one of "
            f"{', '.join(task_metrics)}"
        )
    ladder = node.get("ladder") or []
    if not isinstance(ladder, (list, tuple)) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in ladder
    ):
        raise ConfigError(
            f"task.target.ladder={ladder!r}: give a list of numbers, further levels the tables report the time "
            "to (e.g. [86, 87.5, 88]; [] for none)"
        )
    return Target(metric=metric, value=float(value), direction=direction)


def check_target(cfg) -> None:
    """Refuse a target the run could never meet, before anything starts (the CLI's config checks)."""
    target_from_config(cfg, declared_metrics_of(cfg.task.name))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/uptime less the process's start in /proc/self/stat,
    to 10 ms); None where /proc is not there."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime; fields after ")" start at 3
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class TimeToTarget:
    """The training clock of one process and the first evaluation that reaches the target (module docstring).

    The loop calls :meth:`step_done` after every step and :meth:`evaluated` after every evaluation (the
    final one included); :meth:`figures` gives the record's keys. Without a target it still keeps the clock
    (``train_s`` of every metrics.jsonl line, Figure 2's time axis) and the start-up figures.
    """

    def __init__(self, target: Target | None, world_size: int, start_step: int = 0, eval_every: int = 0) -> None:
        self.target, self.world_size, self.start_step, self.eval_every = target, world_size, start_step, eval_every
        self.step_seconds: list[float] = []  # every step's seconds, its wait for data included
        self.clock_s = 0.0  # their sum
        self.samples = 0  # this process's samples
        self.first_step_start: float | None = None  # perf_counter
        self.startup_s: float | None = None
        self.evaluations = 0
        self.hit: dict[str, Any] | None = None  # the first reaching evaluation
        self.wall_before_s = 0.0  # a resumed run: the earlier attempts' wall-clock from their first step on
        self.compile_before_s = 0.0  # a resumed run: the earlier attempts' one-time first-step work

    def step_done(self, seconds: float, samples: int) -> None:
        """One training step of ``seconds`` (data wait included) and ``samples`` on this process just ended."""
        if self.first_step_start is None:
            self.first_step_start = time.perf_counter() - seconds
            age = process_age_s()
            self.startup_s = None if age is None else max(0.0, age - seconds)
        self.step_seconds.append(float(seconds))
        self.clock_s += float(seconds)
        self.samples += int(samples)

    def training_seconds(self) -> float:
        """The clock so far, the first step whole (its one-time work is taken off once the run has ended)."""
        return self.clock_s

    def compile_s(self) -> float:
        """The one-time first-step work of every attempt so far: each attempt's first step less the median of its
        other steps (0 with one step), this one's added to those a checkpoint carried."""
        if len(self.step_seconds) < 2:
            return self.compile_before_s
        return self.compile_before_s + max(0.0, self.step_seconds[0] - statistics.median(self.step_seconds[1:]))

    def evaluated(self, step: int, metrics: Mapping[str, Any]) -> None:
        """An evaluation after ``step`` steps gave ``metrics``; the first that reaches the target is kept."""
        self.evaluations += 1
        if self.target is None or self.hit is not None or not self.target.reached_by(metrics.get(self.target.metric)):
            return
        wall = (
            self.wall_before_s + time.perf_counter() - self.first_step_start
            if self.first_step_start is not None
            else None
        )
        self.hit = {
            "step": int(step),
            "samples": self.samples * self.world_size,
            "clock_s": self.clock_s,
            "wall_s": wall,
            "value": float(metrics[self.target.metric]),
        }

    def figures(self) -> dict[str, Any]:
        """The record's ``time_to_target``, ``startup_s``, ``first_step_s`` and ``compile_s``."""
        compile_s = self.compile_s()
        out: dict[str, Any] = {
            "startup_s": self.startup_s,
            "first_step_s": self.step_seconds[0] if self.step_seconds else None,
            "compile_s": compile_s,
            "training_clock": CLOCK,
            "time_to_target": None,
        }
        if self.target is None:
            return out
        hit = self.hit or {}
        out["time_to_target"] = {
            "metric": self.target.metric,
            "target": self.target.value,
            "direction": self.target.direction,
            "reached": self.hit is not None,
            "step": hit.get("step"),
            "samples": hit.get("samples"),
            # an earlier attempt's hit carries its seconds with that attempt's one-time work already taken off
            "seconds": (hit["clock_s"] if hit.get("carried") else max(0.0, hit["clock_s"] - compile_s))
            if self.hit
            else None,
            "wall_s": hit.get("wall_s"),
            "value": hit.get("value"),
            "evaluations": self.evaluations,
            "eval_every": self.eval_every,
            "clock_from_step": self.start_step,
        }
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint carries so that a resumed run counts across its attempts (plain values): the
        clock as logged (``train_s``, every attempt's one-time first-step work in it, so that the log's clock runs
        on without a step back at the resume) and that work apart (``compile_s``), samples, evaluations,
        wall-clock, the hit (its seconds with the work taken off)."""
        compile_s = self.compile_s()
        wall = self.wall_before_s + (
            time.perf_counter() - self.first_step_start if self.first_step_start is not None else 0.0
        )
        hit = dict(self.hit) if self.hit else None
        if hit and not hit.get("carried"):
            hit.update(clock_s=max(0.0, hit["clock_s"] - compile_s), carried=True)
        return {
            "clock_s": self.clock_s,
            "compile_s": compile_s,
            "samples": self.samples,
            "evaluations": self.evaluations,
            "wall_s": wall,
            "hit": hit,
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Continue the counts of :meth:`state_dict` (a resumed run); the clock then runs from the run's first
        step (``clock_from_step`` 0). Without a state (an older checkpoint) the counts start at the resume."""
        if not state:
            return
        self.clock_s, self.samples = float(state["clock_s"]), int(state["samples"])
        self.evaluations, self.wall_before_s = int(state["evaluations"]), float(state["wall_s"])
        # an older checkpoint's clock has its one-time work taken off already, and no compile_s
        self.compile_before_s = float(state.get("compile_s") or 0.0)
        self.hit = dict(state["hit"]) if state.get("hit") else None
        self.start_step = 0
