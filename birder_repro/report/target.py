"""Time to accuracy over seeds: ``tables/time_to_target.md|csv``, one row per (cell, optimizer, target).

The task tables show one row per configuration; this table gathers every measured run of a cell that has a
target (``time_to_target`` in its record, birder_repro.train.target), typically the seeds of one sweep
(``conf/experiment/time_to_accuracy.yaml``), and gives the time to the target as mean, sample standard
deviation and range over the runs that reached it, how many did, the steps it took, the plain wall-clock, and
the throughput and final metric beside it. Runs with another learning rate or length form rows of their own.
A run that ended otherwise than completed (failed, diverged) is counted in its row, never averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from . import records
from .cells import CELL, SETTING, fill_keys, select_runs
from .display import fmt_layout, fmt_number, is_missing, metric_label, optim_label, optim_rank, target_goal, to_markdown
from .documents import settings

__all__ = ["GROUP", "spread", "target_rows", "target_markdown"]

# cell_key: one configuration less its seed (birder_repro.report.identity), as the task tables' rows
# (its asked length, not the steps taken: a run ended at its target by train.stop_at_target took fewer)
GROUP = (*CELL, "optim", "variant", "cell_key", "target_metric", "target_value", "target_direction", "run_length", "lr")
# Runs left out here as in the task tables; failed, interrupted and diverged runs stay, counted and never averaged.
LEFT_OUT_HERE = ("smoke run", "superseded", "resumed from step")


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation (n - 1; NaN for one value), min and max of ``values`` (NaN when empty)."""
    xs = [float(v) for v in values if not is_missing(v)]
    nan = float("nan")
    if not xs:
        return {"mean": nan, "sd": nan, "min": nan, "max": nan, "n": 0}
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else nan
    return {"mean": mean, "sd": sd, "min": min(xs), "max": max(xs), "n": len(xs)}


def _fill(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured runs with a target, their text keys filled as the task tables fill them, less smoke runs,
    superseded repeats and old-style partial resumes (cells.select_runs)."""
    runs = frame[(frame["status"] != "predicted") & frame["target_metric"].notna()]
    if "eval_set" in runs:  # tuning runs, scored on the validation split: tables/tuning.md (report.tuning)
        runs = runs[runs["eval_set"].astype("object").fillna("test") != "val"]
    # a completed run that never evaluated (train.eval=false: a throughput or profile run) has no time to target
    never = (runs["status"] == "completed") & (runs["target_evaluations"].fillna(-1) == 0)
    runs = runs[~never]
    _, left = select_runs(runs)
    dropped = left.index[left["reason"].str.startswith(LEFT_OUT_HERE)]
    return fill_keys(runs.drop(index=dropped))


def _row(keys: dict, runs: pd.DataFrame) -> dict:
    done = runs[runs["status"] == "completed"]
    hit = done[done["target_reached"] == True]  # noqa: E712 - an object column of True / False / None
    headline = done["headline_metric"].dropna()
    metric_col = records.metric_column(headline.iloc[0]) if not headline.empty else None
    final = spread(done[metric_col]) if metric_col in done else spread([])
    others = runs[runs["status"] != "completed"]["status"].fillna("unknown").value_counts()
    return {
        **keys,
        "gpus": runs["gpus"].iloc[0],
        "runs": len(runs),
        "completed": len(done),
        "reached": len(hit),
        "not_completed": ", ".join(f"{n} {status}" for status, n in others.items()),
        "seeds": " ".join(str(int(s)) for s in sorted(runs["seed"].dropna().unique())),
        **{f"target_s_{k}": v for k, v in spread(hit["target_s"]).items() if k != "n"},
        **{f"target_step_{k}": v for k, v in spread(hit["target_step"]).items() if k != "n"},
        "target_wall_s_mean": spread(hit["target_wall_s"])["mean"],
        "throughput_mean": spread(done["throughput"])["mean"],
        "final_metric": headline.iloc[0] if not headline.empty else None,
        "final_metric_mean": final["mean"],
        "final_metric_sd": final["sd"],
        "compile_s_mean": spread(done["compile_s"])["mean"],
        "startup_s_mean": spread(done["startup_s"])["mean"],
    }


def target_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per group of :data:`GROUP` with the figures of :func:`_row`, in the task tables' order."""
    runs = _fill(frame)
    if runs.empty:
        return pd.DataFrame()
    rows = [_row(dict(zip(GROUP, keys)), group) for keys, group in runs.groupby(list(GROUP), dropna=False, sort=False)]
    table = pd.DataFrame(rows)
    table["_rank"] = optim_rank(table["optim"])
    table = table.sort_values(
        [*SETTING, "gpus", "nodes", "_rank", "variant", "lr", "run_length"], na_position="last", kind="stable"
    )
    return table.drop(columns="_rank").reset_index(drop=True)


def _mean_sd(row, prefix: str, digits: int = 3) -> str:
    mean, sd = row[f"{prefix}_mean"], row[f"{prefix}_sd"]
    if is_missing(mean):
        return "—"
    return fmt_number(mean, digits) + ("" if is_missing(sd) else f" ± {fmt_number(sd, 2)}")


def _range(row, prefix: str) -> str:
    lo, hi = row[f"{prefix}_min"], row[f"{prefix}_max"]
    return "—" if is_missing(lo) else f"{fmt_number(lo, 3)} – {fmt_number(hi, 3)}"


def display_rows(table: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(index=table.index)
    out["optimizer"] = [optim_label(o, v) for o, v in zip(table["optim"], table["variant"])]
    out["#GPUs (nodes x GPUs/node)"] = table.apply(fmt_layout, axis=1)
    out["target"] = table.apply(lambda r: target_goal(r), axis=1)
    out["reached"] = [
        f"{r} of {n}" + (f" ({o})" if o else "")
        for r, n, o in zip(table["reached"], table["runs"], table["not_completed"])
    ]
    out["time to target, s (mean ± sd)"] = table.apply(lambda r: _mean_sd(r, "target_s"), axis=1)
    out["range, s"] = table.apply(lambda r: _range(r, "target_s"), axis=1)
    out["steps to target"] = table.apply(lambda r: _mean_sd(r, "target_step", 3), axis=1)
    out["wall-clock, s (mean)"] = table["target_wall_s_mean"].map(lambda x: fmt_number(x, 3))
    out["throughput, samples/s (mean)"] = table["throughput_mean"].map(fmt_number)
    out["final metric (mean ± sd)"] = [
        "—" if is_missing(m) else f"{metric_label(name)} {_mean_sd(r, 'final_metric', 4)}"
        for name, m, (_, r) in zip(table["final_metric"], table["final_metric_mean"], table.iterrows())
    ]
    out["first-step one-time work, s"] = table["compile_s_mean"].map(lambda x: fmt_number(x, 3))
    out["seeds"] = table["seeds"]
    return out.reset_index(drop=True)


NOTES = (
    "Time to target: the training clock at the first evaluation whose metric reached `task.target`: the "
    "training steps' seconds from the first step on, with evaluations, checkpoints, log lines and the first "
    "step's one-time work (JIT compilation or its cache load, DDP's first iteration: the last column) left "
    "out, and start-up before the first step too (birder_repro.train.target). Only as fine as "
    "`train.eval_every`.",
    "Mean ± sample standard deviation and range over the runs that reached the target (`reached`: how many "
    "of the runs did); a run that did not complete is counted, never averaged.",
    "Wall-clock: from the first step's start to the end of the reaching evaluation, everything included.",
    "Throughput and the final metric: means over the completed runs.",
)


def target_markdown(table: pd.DataFrame) -> str:
    lines = ["# Time to accuracy", ""] + [f"- {n}" for n in NOTES]
    if table.empty:
        return "\n".join(lines + ["", "No run with a target (`task.target`)."]) + "\n"
    for title, rows in settings(table):
        lines += ["", f"## {rows.iloc[0]['task']}: {title}", "", to_markdown(display_rows(rows))]
    return "\n".join(lines) + "\n"


def csv_text(table: pd.DataFrame) -> str | None:
    return None if table.empty else table.to_csv(index=False)
