"""A run's training clock on the loop clock (birder_repro.train.target), for records written before it.

Records whose ``training_clock`` is ``loop`` (and their logs' ``train_s``) count the wall time of every
pass of the training loop, evaluations, checkpoints and calibration passes left out, the same on every rank.
Older records summed rank 0's own step times: where rank 0 finished its step before a slower rank, it waited for
it in the loop's next collective (the stop agreement, the divergence check), outside that sum, and the clock ran
slow by as much (2-27 % on the Fashion-MNIST field, most for DiLoCo, whose ranks take turns on shared cores).

Their logs hold the correction. Rank 0 writes each metrics.jsonl line with ``time_s`` (its wall-clock since the
logger started) and ``train_s`` (the clock); an evaluation's line comes after the training line of its step
and after the evaluation. So between the last line of one step and the first line of the next logged step,
the wall time is the loop's alone, evaluation excluded: :func:`loop_clock` sums those, and scales the clock of
the intervals the log cannot see whole (the steps before the first line, a resumed attempt's restart) by the
ratio of loop time to clock over the intervals it can. An interval whose first line is an evaluation's (a step
evaluated but not logged) has that evaluation's time taken off at the run's median evaluation.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

__all__ = ["LOOP", "is_loop_clock", "read_log", "loop_clock", "steps_clock", "loop_seconds"]

LOOP = "loop"  # birder_repro.train.target.CLOCK (kept apart: the report does not import the trainer)


def is_loop_clock(record: Mapping[str, Any] | None) -> bool:
    """Whether the record's clock is already the loop clock."""
    return (record or {}).get("training_clock") == LOOP


def read_log(run_dir: str | Path) -> list[dict]:
    """metrics.jsonl's lines in order (a line cut short by a killed run left out); [] without the file."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _is_eval(row: Mapping[str, Any]) -> bool:
    return any(str(k).startswith("eval/") for k in row)


def _groups(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Consecutive lines of one step that carry both clocks."""
    out: list[list[Mapping[str, Any]]] = []
    for row in rows:
        if row.get("train_s") is None or row.get("time_s") is None or row.get("step") is None:
            continue
        if out and out[-1][0]["step"] == row["step"]:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def loop_clock(rows: Sequence[Mapping[str, Any]], compile_s: float = 0.0) -> dict[int, float]:
    """Each logged step's ``train_s`` on the loop clock, from an older log's lines (module doc). ``compile_s``:
    the record's first-step one-time work, which the scaled first interval keeps unscaled."""
    groups = _groups(rows)
    if not groups:
        return {}
    evals = [float(g[-1]["time_s"]) - float(g[0]["time_s"]) for g in groups if len(g) > 1 and _is_eval(g[-1])]
    eval_s = statistics.median(evals) if evals else 0.0
    walls: list[float | None] = [None]
    for before, group in pairwise(groups):
        wall = float(group[0]["time_s"]) - float(before[-1]["time_s"])
        wall -= eval_s if _is_eval(group[0]) else 0.0
        clock = float(group[0]["train_s"]) - float(before[0]["train_s"])
        seen = group[0]["step"] > before[0]["step"] and wall > 0 and clock > 0
        walls.append(wall if seen else None)
    clocks = [float(groups[0][0]["train_s"])] + [
        float(g[0]["train_s"]) - float(b[0]["train_s"]) for b, g in pairwise(groups)
    ]
    seen_wall = sum(w for w in walls if w is not None)
    seen_clock = sum(c for w, c in zip(walls, clocks) if w is not None)
    ratio = seen_wall / seen_clock if seen_clock > 0 else 1.0
    out, t = {}, 0.0
    for i, (group, wall, clock) in enumerate(zip(groups, walls, clocks)):
        if wall is not None:
            t += wall
        elif i == 0:
            first = min(max(float(compile_s), 0.0), clock)
            t += first + (clock - first) * ratio
        else:
            t += max(clock, 0.0) * ratio
        out[int(group[0]["step"])] = t
    return out


def steps_clock(
    record: Mapping[str, Any] | None, run_dir: str | Path, compile_s: float = 0.0, lines: Sequence | None = None
) -> dict[int, float]:
    """Each logged step's ``train_s`` on the loop clock where ``record`` was written before it (its log re-read,
    :func:`loop_clock`; ``lines``: the log already read); {} where its clock is the loop clock already, so that
    its own ``train_s`` stand. What every table and figure that reads a run's clock asks."""
    if is_loop_clock(record):
        return {}
    return loop_clock(read_log(run_dir) if lines is None else lines, compile_s)


def loop_seconds(record: Mapping[str, Any], run_dir: str | Path) -> float | None:
    """The record's time to target on the loop clock: as recorded for a loop-clock record, else from its log
    (the clock at the reaching step, less ``compile_s``); as recorded where the log does not have that step (a
    run directory without its metrics.jsonl: nothing to correct it with)."""
    target = record.get("time_to_target") or {}
    if target.get("seconds") is None:
        return None
    compile_s = float(record.get("compile_s") or 0.0)
    clock = steps_clock(record, run_dir, compile_s).get(int(target.get("step") or -1))
    return target["seconds"] if clock is None else max(0.0, clock - compile_s)
