"""The performance model against every measured multi-node run it can predict: ``tables/model_error.md|csv``.

Out of sample by construction: each prediction uses nothing of the run it is judged on but its layout, its link
and its own steps (to the target, and in all): the step times come from the 1-node profile of the same
optimizer, model and batch (report.crossover's :class:`StepModel`, the tuning score's and mode=advise's
arithmetic), the link from the emulated cluster's spec at the run's ``link_mbit``. Two errors per run,
``predicted / measured - 1``:

- the step: the run's mean step (``step_time_s.total``) against the model's mean over the run's steps (1-bit
  Adam's and PowerSGD's fp32 steps first at the fp32 step's time, DiLoCo's outer exchange as 1/H of a step);
- the time to target: ``time_to_target.seconds`` against the model's time for the run's own steps to it.

Per method: the median and the worst (largest in size, with its sign) over its runs, beside the targets the
project holds the model to (:data:`MEDIAN_TARGET`, :data:`WORST_TARGET`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from .cells import fill_keys
from .crossover import _items, _models, one_node_profiles, series_key
from .display import fmt_layout, fmt_number, fmt_percent, is_missing, optim_label, optim_rank, to_markdown

__all__ = ["MEDIAN_TARGET", "WORST_TARGET", "model_error_rows", "model_error_summary", "model_error_markdown"]

MEDIAN_TARGET = 0.15  # median |predicted / measured - 1| per method
WORST_TARGET = 0.35  # and the worst


def _runs(frame: pd.DataFrame) -> pd.DataFrame:
    need = {"config_items", "target_metric", "eval_set", "step_ms_total"}
    if frame.empty or not need <= set(frame.columns):
        return pd.DataFrame()
    runs = frame[
        (frame["source"] == "measured")
        & (frame["status"] == "completed")
        & (frame["nodes"] > 1)
        & (frame["eval_set"].astype("object").fillna("test") != "val")
        & frame["step_ms_total"].notna()
    ]
    if runs.empty:
        return runs
    runs = fill_keys(runs)
    runs["series"] = [series_key(_items(i)) for i in runs["config_items"]]
    return runs


def _error(predicted: float, measured: Any) -> float:
    if is_missing(measured) or not float(measured) or math.isnan(predicted):
        return math.nan
    return predicted / float(measured) - 1.0


def model_error_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run the model can predict (a 1-node profile of its setting exists, an emulated cluster)."""
    runs = _runs(frame)
    if runs.empty:
        return pd.DataFrame()
    models = _models(runs, one_node_profiles(frame["run_dir"]))
    rows = []
    for _, r in runs.iterrows():
        model = models.get(r["series"])
        if model is None:
            continue
        link = float("nan") if is_missing(r["link_mbit"]) else float(r["link_mbit"])
        steps = float(r["steps"])
        step_pred = model.time_to_target(steps, link) / steps
        reached = r.get("target_reached") == True  # noqa: E712 - an object column of True / False / None
        time_pred = model.time_to_target(float(r["target_step"]), link) if reached else math.nan
        rows.append(
            {
                "task": r["task"],
                "optim": r["optim"],
                "variant": r["variant"],
                "nodes": r["nodes"],
                "gpus_per_node": r["gpus_per_node"],
                "gpus": r["gpus"],
                "link": link,
                "seed": r["seed"],
                "step_measured_s": float(r["step_ms_total"]) / 1e3,
                "step_predicted_s": step_pred,
                "step_error": _error(step_pred, float(r["step_ms_total"]) / 1e3),
                "time_measured_s": r["target_s"] if reached else math.nan,
                "time_predicted_s": time_pred,
                "time_error": _error(time_pred, r["target_s"]) if reached else math.nan,
                "run_dir": r["run_dir"],
            }
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["_rank"] = optim_rank(table["optim"])
    return table.sort_values(["task", "nodes", "link", "_rank", "seed"], kind="stable").drop(columns="_rank")


def _median_worst(errors: pd.Series) -> tuple[float, float]:
    xs = [float(e) for e in errors if not is_missing(e)]
    if not xs:
        return math.nan, math.nan
    return statistics.median(abs(x) for x in xs), max(xs, key=abs)


def model_error_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method): runs, layouts and links, median and worst error of the step and the time to target,
    and whether both meet the targets."""
    out = []
    for (task, optim, variant), g in rows.groupby(["task", "optim", "variant"], sort=False):
        step_med, step_worst = _median_worst(g["step_error"])
        time_med, time_worst = _median_worst(g["time_error"])
        meets = not math.isnan(time_med) and time_med <= MEDIAN_TARGET and abs(time_worst) <= WORST_TARGET
        out.append(
            {
                "task": task,
                "optim": optim,
                "variant": variant,
                "runs": len(g),
                "layouts": " ".join(sorted({fmt_layout(r) for _, r in g.iterrows()})),
                "links": " ".join(sorted({"unshaped" if math.isnan(x) else fmt_number(x) for x in g["link"]})),
                "step_median": step_med,
                "step_worst": step_worst,
                "time_median": time_med,
                "time_worst": time_worst,
                "meets": meets,
            }
        )
    return pd.DataFrame(out)


def _signed(x: float) -> str:
    return "—" if is_missing(x) else ("+" if x >= 0 else "") + fmt_percent(x)


NOTES = (
    "Every measured multi-node run with a 1-node profile of its optimizer, model and batch, predicted from that "
    "profile, its layout, its link and its own steps (nothing else of the run): report.crossover's StepModel, "
    "as the tuning score and mode=advise use it.",
    f"Error: predicted / measured - 1. Median: of its size; worst: the largest in size, with its sign. The "
    f"targets: a median of at most {MEDIAN_TARGET:.0%} and a worst of at most {WORST_TARGET:.0%} on the time "
    "to target.",
)


def model_error_markdown(rows: pd.DataFrame, summary: pd.DataFrame) -> str:
    lines = ["# The performance model against measured runs", ""] + [f"- {n}" for n in NOTES]
    if rows.empty:
        return "\n".join(lines + ["", "No multi-node run with a 1-node profile of its setting."]) + "\n"
    shown = pd.DataFrame(
        {
            "task": summary["task"],
            "method": [optim_label(o, v) for o, v in zip(summary["optim"], summary["variant"])],
            "runs": summary["runs"],
            "layouts": summary["layouts"],
            "links, Mbit/s": summary["links"],
            "step: median": summary["step_median"].map(fmt_percent),
            "step: worst": summary["step_worst"].map(_signed),
            "time to target: median": summary["time_median"].map(fmt_percent),
            "time to target: worst": summary["time_worst"].map(_signed),
            "meets the targets": summary["meets"].map(lambda m: "yes" if m else "**no**"),
        }
    )
    per_run = pd.DataFrame(
        {
            "method": [optim_label(o, v) for o, v in zip(rows["optim"], rows["variant"])],
            "layout": [fmt_layout(r) for _, r in rows.iterrows()],
            "link, Mbit/s": ["unshaped" if math.isnan(x) else fmt_number(x) for x in rows["link"]],
            "seed": rows["seed"],
            "step ms, measured (predicted)": [
                f"{1e3 * m:.1f} ({1e3 * p:.1f})" for m, p in zip(rows["step_measured_s"], rows["step_predicted_s"])
            ],
            "step error": rows["step_error"].map(_signed),
            "time to target s, measured (predicted)": [
                "not reached" if is_missing(m) else f"{fmt_number(m, 3)} ({fmt_number(p, 3)})"
                for m, p in zip(rows["time_measured_s"], rows["time_predicted_s"])
            ],
            "time error": rows["time_error"].map(_signed),
        }
    )
    lines += ["", "## Per method", "", to_markdown(shown), "", "## Per run", "", to_markdown(per_run)]
    return "\n".join(lines) + "\n"


def csv_text(rows: pd.DataFrame) -> str | None:
    return None if rows.empty else rows.to_csv(index=False)
