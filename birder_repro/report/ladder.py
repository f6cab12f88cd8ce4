"""Several targets and fixed time budgets: ``tables/targets.md|csv``, one row per (setting, optimizer configuration).

One target hides what happens above it: an optimizer that crosses 87 % first may never reach 88 %, and a
target at one optimizer's ceiling decides the race by that ceiling. So besides the run's own target
(``task.target.value``, report.target) the table reads each run's evaluation curve (``metrics.jsonl``: every
evaluation's ``eval/<metric>`` on the training clock ``train_s``, less the first step's one-time work
``compile_s``, as ``time_to_target`` counts it) and gives:

- **time to each target** of the ladder ``task.target.ladder`` (the run's own target always among them): the
  mean and its 95 % Student t interval over the runs that reached it (report.stats), and how many of the row's
  runs did ("not reached" where none). A run never reaching a level is counted, never averaged. Per level, the
  order: each method against the next faster one, "ahead of" only where the two intervals separate, else "tie";
- **the metric at a time budget**: runs made for a budget (``tuning.budget_s``: their steps sized so that their
  schedule ends at the budget on their link, report.protocol.budget_steps) give their final metric (the
  record's), with its interval and order, and the training time they actually took (the log's last ``train_s``);
- **the host's load**: a run whose host carried more than the protocol's load besides its own processes
  (report.protocol.load_flag) is counted in ``load-flagged`` and listed for a rerun.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from birder_repro.run.record import read_record

from .cells import CELL
from .clock import read_log, steps_clock
from .display import (
    fmt_layout,
    fmt_number,
    is_missing,
    metric_label,
    optim_label,
    optim_rank,
    to_markdown,
)
from .documents import setting_title
from .target import GROUP, _fill, spread

__all__ = ["levels_of", "run_curve", "time_to_level", "ladder_rows", "budget_rows"]


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


def _budget_of(items: Any) -> float | None:
    value = (items if isinstance(items, dict) else {}).get("tuning.budget_s")
    return None if is_missing(value) else float(value)


def _own_processes(rec: dict) -> int:
    """The processes a run put on its host: every one on the emulated cluster (its nodes share the host), else
    one node's."""
    cluster = rec.get("cluster") or {}
    if cluster.get("name") == "emulated":
        return int(rec.get("world_size") or 1)
    return int(cluster.get("gpus_per_node") or 1)


def protocol_value(key: str, default: float) -> float:
    """A number of the protocol (conf/tuning/fashion_mnist.yaml: ``load_limit_per_core``, ``confidence``), the
    default where it cannot be read."""
    from .protocol import ProtocolError, load_protocol

    try:
        return float(load_protocol()[key])
    except (ProtocolError, KeyError, TypeError):
        return default


def _per_run(runs: pd.DataFrame, load_limit: float) -> pd.DataFrame:
    """Each run's curve, levels, budget and load flag, read once."""
    from .protocol import load_flag

    out = runs.copy()
    curves, levels, budgets, flagged = [], [], [], []
    for run_dir, metric, compile_s, items in zip(
        out["run_dir"], out["target_metric"], out["compile_s"], out["config_items"]
    ):
        rec = read_record(Path(run_dir)) or {}
        config = rec.get("config") or {}
        curves.append(run_curve(run_dir, str(metric), compile_s, rec))
        levels.append(levels_of(config))
        budgets.append(_budget_of(items))
        flagged.append(load_flag(rec.get("host_load"), _own_processes(rec), load_limit))
    out["curve"], out["levels"], out["budget_s"], out["load_flagged"] = curves, levels, budgets, flagged
    return out


def _final_metric(row) -> float | None:
    """A completed run's final headline metric (its record's ``metrics``), None otherwise."""
    from .records import metric_column

    if row.get("status") != "completed":
        return None
    value = row.get(metric_column(str(row.get("headline_metric"))))
    return None if is_missing(value) else float(value)


def _training_s(run_dir: Any, compile_s: Any) -> float | None:
    """The training seconds a run took: its log's last ``train_s`` less the first step's one-time work."""
    times = [row["train_s"] for row in read_log(run_dir) if row.get("train_s") is not None]
    if not times:
        return None
    return max(0.0, float(times[-1]) - (0.0 if is_missing(compile_s) else float(compile_s)))


def _orders(rows: list[dict], key: str, lower_is_better: bool) -> dict[int, str]:
    """Each row's relation to the next one in its order by ``key``'s interval (report.stats.order_with_ties):
    "ahead of SGDM", "tie with SGDM", "" for the last, "not ordered" without an interval."""
    from .stats import order_with_ties

    labels = [optim_label(row["optim"], row["variant"]) for row in rows]
    out = {}
    for i, relation, nxt in order_with_ties({i: row.get(key) for i, row in enumerate(rows)}, lower_is_better):
        out[i] = (
            "not ordered" if relation == "no interval" else (f"{relation} {labels[nxt]}" if nxt is not None else "")
        )
    return out


def ladder_rows(frame: pd.DataFrame, load_limit: float | None = None, confidence: float | None = None) -> pd.DataFrame:
    """One row per group of report.target's GROUP (less the run's own target value, which the ladder
    covers) of whole runs (no ``tuning.budget_s``): per level, the time to it over the runs with its interval
    and the row's place in the order at that level."""
    from .stats import t_interval

    runs = _fill(frame)
    if runs.empty:
        return pd.DataFrame()
    runs = _per_run(runs, protocol_value("load_limit_per_core", 1.5) if load_limit is None else load_limit)
    confidence = protocol_value("confidence", 0.95) if confidence is None else confidence
    runs = runs[runs["budget_s"].isna()]
    group = [k for k in GROUP if k != "target_value"]
    rows = []
    for _, setting in runs.groupby(list(CELL), dropna=False, sort=False):
        levels = sorted({level for ls in setting["levels"] for level in ls})
        setting = setting.assign(_rank=optim_rank(setting["optim"])).sort_values(["_rank", "variant"], kind="stable")
        cell_rows = []
        for keys, cell in setting.groupby(group, dropna=False, sort=False):
            row: dict[str, Any] = {**dict(zip(group, keys)), "gpus": cell["gpus"].iloc[0], "runs": len(cell)}
            row["seeds"] = " ".join(str(int(s)) for s in sorted(cell["seed"].dropna().unique()))
            row["load_flagged"] = int(cell["load_flagged"].sum())
            row["flagged_runs"] = [str(d) for d, f in zip(cell["run_dir"], cell["load_flagged"]) if f]
            direction = str(cell["target_direction"].iloc[0])
            for level in levels:
                times = [time_to_level(c, level, direction) for c in cell["curve"]]
                hit = [t for t in times if t is not None]
                stats = spread(hit)
                interval = t_interval(hit, confidence)
                row[f"time_s_mean@{level:g}"], row[f"time_s_sd@{level:g}"] = stats["mean"], stats["sd"]
                row[f"time_s_ci@{level:g}"] = interval.half if interval else math.nan
                row[f"reached@{level:g}"] = len(hit)
                # an order only among rows every run of which reached the level
                row[f"_interval@{level:g}"] = interval if len(hit) == len(cell) else None
            cell_rows.append(row)
        for level in levels:
            for i, relation in _orders(cell_rows, f"_interval@{level:g}", lower_is_better=True).items():
                cell_rows[i][f"order@{level:g}"] = relation
        rows += cell_rows
    table = pd.DataFrame(rows)
    return table.drop(columns=[c for c in table.columns if c.startswith("_interval@")])


def budget_rows(frame: pd.DataFrame, load_limit: float | None = None, confidence: float | None = None) -> pd.DataFrame:
    """One row per (setting less its length, budget, optimizer configuration) of the runs made for a time
    budget (``tuning.budget_s``): their steps, the training seconds they took (the last evaluation's time on
    the loop clock), the final metric with its interval, and the order at the budget (higher is better)."""
    from .stats import t_interval

    runs = _fill(frame)
    if runs.empty:
        return pd.DataFrame()
    runs = _per_run(runs, protocol_value("load_limit_per_core", 1.5) if load_limit is None else load_limit)
    confidence = protocol_value("confidence", 0.95) if confidence is None else confidence
    runs = runs[runs["budget_s"].notna()]
    if runs.empty:
        return pd.DataFrame()
    setting_keys = [k for k in CELL if k != "run_length"] + ["budget_s"]
    group = [k for k in GROUP if k not in ("target_value", "run_length", "cell_key")]
    rows = []
    for _, setting in runs.groupby(setting_keys, dropna=False, sort=False):
        setting = setting.assign(_rank=optim_rank(setting["optim"])).sort_values(["_rank", "variant"], kind="stable")
        budget_rows_: list[dict] = []
        for keys, cell in setting.groupby(group, dropna=False, sort=False):
            finals = [_final_metric(r) for _, r in cell.iterrows()]
            finals = [v for v in finals if v is not None]
            took = [t for t in (_training_s(d, c) for d, c in zip(cell["run_dir"], cell["compile_s"])) if t is not None]
            interval = t_interval(finals, confidence)
            row: dict[str, Any] = {**dict(zip(group, keys)), "gpus": cell["gpus"].iloc[0], "runs": len(cell)}
            row["budget_s"] = float(cell["budget_s"].iloc[0])
            row["steps"] = float(cell["steps"].mean())
            row["took_s_mean"] = spread(took)["mean"]
            row["metric_mean"] = interval.mean if interval else math.nan
            row["metric_ci"] = interval.half if interval else math.nan
            row["metric_runs"] = len(finals)
            row["seeds"] = " ".join(str(int(s)) for s in sorted(cell["seed"].dropna().unique()))
            row["load_flagged"] = int(cell["load_flagged"].sum())
            row["flagged_runs"] = [str(d) for d, f in zip(cell["run_dir"], cell["load_flagged"]) if f]
            row["_interval"] = interval if len(finals) == len(cell) else None
            budget_rows_.append(row)
        higher = str(setting["target_direction"].iloc[0]) != "lower"
        for i, relation in _orders(budget_rows_, "_interval", lower_is_better=not higher).items():
            budget_rows_[i]["order"] = relation
        rows += budget_rows_
    return pd.DataFrame(rows).drop(columns="_interval")


def _levels(table: pd.DataFrame) -> list[str]:
    found = [c.split("@", 1)[1] for c in table.columns if c.startswith("reached@")]
    return sorted(set(found), key=float)


def _ci_text(mean: Any, half: Any, digits: int = 3) -> str:
    if is_missing(mean):
        return "—"
    if is_missing(half) or not math.isfinite(float(half)):
        return f"{fmt_number(mean, digits)} (one run: no interval)"
    return f"{fmt_number(mean, digits)} ± {fmt_number(half, 2)}"


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
        out[f"time to {metric} {sign} {level}, s (95 % CI)"] = [
            "—" if is_missing(r) else ((_ci_text(m, h) if r else "not reached") + f" ({int(r)} of {n})")
            for m, h, r, n in zip(
                table[f"time_s_mean@{level}"], table[f"time_s_ci@{level}"], table[f"reached@{level}"], table["runs"]
            )
        ]
        out[f"order at {level}"] = table[f"order@{level}"].fillna("")
    out["load-flagged"] = table["load_flagged"]
    out["seeds"] = table["seeds"]
    return out.reset_index(drop=True)


def budget_display(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    metric = metric_label(str(table["target_metric"].iloc[0]))
    out["optimizer"] = [optim_label(o, v) for o, v in zip(table["optim"], table["variant"])]
    out["runs"] = table["runs"]
    out["steps"] = table["steps"].map(lambda v: fmt_number(v, 3))
    out["training s taken"] = table["took_s_mean"].map(lambda v: "—" if is_missing(v) else fmt_number(v, 3))
    out[f"final {metric} (95 % CI)"] = [
        _ci_text(m, h, 4) + (f" ({int(k)} of {n})" if k < n else "")
        for m, h, k, n in zip(table["metric_mean"], table["metric_ci"], table["metric_runs"], table["runs"])
    ]
    out["order"] = table["order"].fillna("")
    out["load-flagged"] = table["load_flagged"]
    out["seeds"] = table["seeds"]
    return out.reset_index(drop=True)


NOTES = (
    "Time to each target: read from each run's evaluations (every `train.eval_every` steps) on the training "
    "clock of tables/time_to_target.md; the mean and its 95 % Student t interval (± the half-width) over the "
    "runs that reached it, and how many of the row's runs did. The levels: `task.target.value` and "
    "`task.target.ladder` (the field's: fixed by the protocol's rule before it ran, report.protocol).",
    "Order: each method against the next faster one at that level, 'ahead of' only where the two intervals do "
    "not overlap, else 'tie'; a row with a run that missed the level is not ordered.",
    "Time budgets: runs made for a budget (`tuning.budget_s`), each sized to end there on its link (its steps = "
    "the budget over its step times, its cosine schedule ending with them); their final metric with its "
    "interval, the training seconds they took, and the order (higher is better, ties as above).",
    "Load-flagged: runs whose host's load average, less their own processes, passed the protocol's limit "
    "(`load_limit_per_core` x cores, conf/tuning/fashion_mnist.yaml) at their start or end; listed below to rerun.",
)


def _rerun_section(tables: list[pd.DataFrame]) -> list[str]:
    flagged = [d for t in tables if not t.empty and "flagged_runs" in t for ds in t["flagged_runs"] for d in ds]
    if not flagged:
        return []
    return ["", "## Load-flagged runs, to rerun", ""] + [f"- {d}" for d in flagged]


def ladder_markdown(table: pd.DataFrame, budgets: pd.DataFrame | None = None) -> str:
    budgets = pd.DataFrame() if budgets is None else budgets
    lines = ["# Several targets and time budgets", ""] + [f"- {n}" for n in NOTES]
    if table.empty and budgets.empty:
        return "\n".join(lines + ["", "No run with a target (`task.target`)."]) + "\n"
    if not table.empty:
        for _, rows in table.groupby(list(CELL), dropna=False, sort=False):
            first = rows.iloc[0]
            lines += ["", f"## {first['task']}: {setting_title(first)}, {fmt_layout(first)}", ""]
            lines.append(to_markdown(display_rows(rows.reset_index(drop=True))))
    if not budgets.empty:
        keys = [k for k in CELL if k != "run_length"] + ["budget_s"]
        for _, rows in budgets.groupby(keys, dropna=False, sort=False):
            first = rows.iloc[0]
            title = f"{first['task']}: a budget of {fmt_number(first['budget_s'], 3)} s, {fmt_layout(first)}"
            lines += ["", f"## {title}", ""]
            lines.append(to_markdown(budget_display(rows.reset_index(drop=True))))
    lines += _rerun_section([table, budgets])
    return "\n".join(lines) + "\n"


def csv_text(table: pd.DataFrame, budgets: pd.DataFrame | None = None) -> str | None:
    parts = [t for t in (table, budgets) if t is not None and not t.empty]
    if not parts:
        return None
    return pd.concat(parts, ignore_index=True).drop(columns="flagged_runs", errors="ignore").to_csv(index=False)
