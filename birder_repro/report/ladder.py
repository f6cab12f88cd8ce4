"""Several targets and equal time: ``tables/targets.md|csv``, one row per (setting, optimizer configuration).

One target hides what happens above it: an optimizer that crosses 87 % first may never reach 88 %, and a
target at one optimizer's ceiling decides the race by that ceiling. So besides the run's own target
(``task.target.value``, report.target) the table reads each run's evaluation curve (``metrics.jsonl``: every
evaluation's ``eval/<metric>`` on the training clock ``train_s``, less the first step's one-time work
``compile_s``, as ``time_to_target`` counts it) and gives:

- **time to each target** of the ladder ``task.target.ladder`` (the run's own target always among them): the
  mean ± sample standard deviation over the runs that reached it, and how many of the row's runs did. A run
  never reaching a level is counted, never averaged;
- **the metric at equal time**: each run's metric at the last evaluation by a time budget, the budgets being
  fractions (:data:`BUDGET_FRACTIONS`) of the time the task's baseline (``task.baseline``, SGDM) takes over its
  whole run in the same setting (layout, link): "what does each method have when SGDM has finished?". A
  run that ended at its target before a budget (``train.stop_at_target``) has no metric there (—).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from .cells import CELL
from .clock import read_log, steps_clock
from .display import (
    fmt_layout,
    fmt_number,
    fmt_spread,
    is_missing,
    metric_label,
    optim_label,
    optim_rank,
    to_markdown,
)
from .documents import setting_title
from .target import GROUP, _fill, spread

__all__ = ["BUDGET_FRACTIONS", "levels_of", "run_curve", "time_to_level", "metric_at", "ladder_rows"]

# The time budgets, as fractions of the baseline's whole run in the same setting.
BUDGET_FRACTIONS = (0.25, 0.5, 1.0)


def levels_of(config: dict) -> list[float]:
    """The run's targets: ``task.target.value`` and every level of ``task.target.ladder``, ascending."""
    node = ((config.get("task") or {}).get("target")) or {}
    values = [node.get("value"), *(node.get("ladder") or [])]
    return sorted({float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)})


def run_curve(run_dir: str | Path, metric: str, compile_s: Any = None, record: Any = None) -> pd.DataFrame:
    """The run's evaluations of ``metric`` as (step, t, value), t on time_to_target's clock (``record``'s, an
    older record's log re-read on the loop clock, report.clock.steps_clock; without it, ``train_s`` as logged); a
    resumed run's repeated steps count once (the last attempt's)."""
    lines = read_log(run_dir)
    offset = 0.0 if is_missing(compile_s) else float(compile_s)
    loop = {} if record is None else steps_clock(record, run_dir, offset, lines)
    rows = [
        {"step": row["step"], "t": float(loop.get(row["step"], row["train_s"])), "value": row[f"eval/{metric}"]}
        for row in lines
        if f"eval/{metric}" in row and row.get("train_s") is not None
    ]
    curve = pd.DataFrame(rows, columns=["step", "t", "value"])
    curve = curve.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
    curve["t"] = (curve["t"] - offset).clip(lower=0.0)
    return curve.reset_index(drop=True)


def _reaches(value: Any, level: float, direction: str) -> bool:
    if is_missing(value) or not math.isfinite(float(value)):
        return False
    return float(value) >= level if direction == "higher" else float(value) <= level


def time_to_level(curve: pd.DataFrame, level: float, direction: str) -> float | None:
    """The time of the first evaluation whose metric reaches ``level``; None where none does."""
    for t, value in zip(curve["t"], curve["value"]):
        if _reaches(value, level, direction):
            return float(t)
    return None


def metric_at(curve: pd.DataFrame, budget: float, ended_early: bool) -> float | None:
    """The metric of the last evaluation at or before ``budget`` seconds; None before the first evaluation, or
    past the end of a run that stopped at its target (what it would have had is not known)."""
    if curve.empty or (ended_early and budget > float(curve["t"].iloc[-1])):
        return None
    before = curve[curve["t"] <= budget * (1 + 1e-9)]
    return None if before.empty else float(before["value"].iloc[-1])


def _baseline(runs: pd.DataFrame) -> str:
    names = runs["baseline"].dropna() if "baseline" in runs else pd.Series(dtype="object")
    return str(names.iloc[0]) if not names.empty else "sgdm"


def _per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's curve and levels, read once."""
    from birder_repro.record import read_record

    out = runs.copy()
    curves, levels, baselines = [], [], []
    for run_dir, metric, compile_s in zip(out["run_dir"], out["target_metric"], out["compile_s"]):
        rec = read_record(Path(run_dir)) or {}
        config = rec.get("config") or {}
        curves.append(run_curve(run_dir, str(metric), compile_s, rec))
        levels.append(levels_of(config))
        baselines.append((config.get("task") or {}).get("baseline"))
    out["curve"], out["levels"], out["baseline"] = curves, levels, baselines
    return out


def _budgets(setting: pd.DataFrame) -> tuple[str, list[float]]:
    """The baseline's name and the time budgets of one setting (empty where its baseline has no whole run)."""
    name = _baseline(setting)
    whole = setting[(setting["optim"] == name) & (setting["status"] == "completed") & ~setting["stop_at_target"]]
    ends = [float(c["t"].iloc[-1]) for c in whole["curve"] if not c.empty]
    if not ends:
        return name, []
    full = sum(ends) / len(ends)
    return name, [f * full for f in BUDGET_FRACTIONS]


def ladder_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per group of report.target's GROUP (less the run's own target value, which the ladder
    covers): per level, the time to it over the runs; per budget, the metric there."""
    runs = _fill(frame)
    if runs.empty:
        return pd.DataFrame()
    runs = _per_run(runs)
    group = [k for k in GROUP if k != "target_value"]
    rows = []
    for _, setting in runs.groupby(list(CELL), dropna=False, sort=False):
        baseline, budgets = _budgets(setting)
        levels = sorted({level for ls in setting["levels"] for level in ls})
        setting = setting.assign(_rank=optim_rank(setting["optim"])).sort_values(["_rank", "variant"], kind="stable")
        for keys, cell in setting.groupby(group, dropna=False, sort=False):
            row: dict[str, Any] = {**dict(zip(group, keys)), "gpus": cell["gpus"].iloc[0], "runs": len(cell)}
            row["baseline"] = baseline
            row["seeds"] = " ".join(str(int(s)) for s in sorted(cell["seed"].dropna().unique()))
            direction = str(cell["target_direction"].iloc[0])
            for level in levels:
                times = [time_to_level(c, level, direction) for c in cell["curve"]]
                hit = [t for t in times if t is not None]
                stats = spread(hit)
                row[f"time_s_mean@{level:g}"], row[f"time_s_sd@{level:g}"] = stats["mean"], stats["sd"]
                row[f"reached@{level:g}"] = len(hit)
            for fraction, budget in zip(BUDGET_FRACTIONS, budgets):
                ended = [bool(s) for s in cell["stop_at_target"]]
                values = [metric_at(c, budget, e) for c, e in zip(cell["curve"], ended)]
                stats = spread([v for v in values if v is not None])
                row[f"budget_s@{fraction:g}"] = budget
                row[f"metric_mean@{fraction:g}"], row[f"metric_sd@{fraction:g}"] = stats["mean"], stats["sd"]
                row[f"metric_runs@{fraction:g}"] = stats["n"]
            rows.append(row)
    return pd.DataFrame(rows)


def _levels(table: pd.DataFrame) -> list[str]:
    found = [c.split("@", 1)[1] for c in table.columns if c.startswith("reached@")]
    return sorted(set(found), key=float)


def display_rows(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    out["optimizer"] = [optim_label(o, v) for o, v in zip(table["optim"], table["variant"])]
    out["#GPUs (nodes x GPUs/node)"] = table.apply(fmt_layout, axis=1)
    out["runs"] = table["runs"]
    metric = metric_label(str(table["target_metric"].iloc[0]))
    sign = ">=" if table["target_direction"].iloc[0] == "higher" else "<="
    for level in _levels(table):
        if table[f"reached@{level}"].isna().all():
            continue
        out[f"time to {metric} {sign} {level}, s"] = [
            "—" if is_missing(r) else ((fmt_spread(m, s, 3) if r else "not reached") + f" ({int(r)} of {n})")
            for m, s, r, n in zip(
                table[f"time_s_mean@{level}"], table[f"time_s_sd@{level}"], table[f"reached@{level}"], table["runs"]
            )
        ]
    for fraction in BUDGET_FRACTIONS:
        key = f"{fraction:g}"
        if f"budget_s@{key}" not in table or table[f"budget_s@{key}"].isna().all():
            continue
        budget = table[f"budget_s@{key}"].dropna().iloc[0]
        out[f"{metric} at {fmt_number(budget, 3)} s ({key} x {optim_label(table['baseline'].iloc[0])}'s run)"] = [
            "—" if is_missing(m) else fmt_spread(m, s, 4) + (f" ({int(k)} of {n})" if k < n else "")
            for m, s, k, n in zip(
                table[f"metric_mean@{key}"], table[f"metric_sd@{key}"], table[f"metric_runs@{key}"], table["runs"]
            )
        ]
    out["seeds"] = table["seeds"]
    return out.reset_index(drop=True)


NOTES = (
    "Time to each target: read from each run's evaluations (every `train.eval_every` steps) on the training "
    "clock of tables/time_to_target.md; mean ± sample standard deviation over the runs that reached it, and "
    "how many of the row's runs did. The levels: `task.target.value` and `task.target.ladder`.",
    "The metric at equal time: each run's metric at its last evaluation by the budget, mean ± sd over the "
    "runs; the budgets are fractions of the mean training time of the baseline's whole runs (`task.baseline`) "
    "in the same setting. A run that stopped at its target before a budget has no metric there (counted as "
    "`k of n`).",
)


def ladder_markdown(table: pd.DataFrame) -> str:
    lines = ["# Several targets and equal time", ""] + [f"- {n}" for n in NOTES]
    if table.empty:
        return "\n".join(lines + ["", "No run with a target (`task.target`)."]) + "\n"
    for _, rows in table.groupby(list(CELL), dropna=False, sort=False):
        first = rows.iloc[0]
        lines += ["", f"## {first['task']}: {setting_title(first)}, {fmt_layout(first)}", ""]
        lines.append(to_markdown(display_rows(rows.reset_index(drop=True))))
    return "\n".join(lines) + "\n"


def csv_text(table: pd.DataFrame) -> str | None:
    return None if table.empty else table.to_csv(index=False)
