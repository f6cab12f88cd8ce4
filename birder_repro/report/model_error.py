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
project holds the model to (:data:`MEDIAN_TARGET`, :data:`WORST_TARGET`). Per compressed method and layout, the
crossover against the fastest baseline (report.crossover): the measured one, the two measured links around it,
and the model's, within :data:`CROSSOVER_TARGET` of the measured link rate or not.

``python -m birder_repro.report.model_error [--runs DIR]`` (``make validate-fashion``) prints the tables and
writes nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pandas as pd

from .cells import fill_keys
from .crossover import _items, _models, crossover_tables, one_node_profiles, series_key, unshaped_link
from .crossover_find import band_text, crossovers
from .display import fmt_layout, fmt_number, fmt_percent, is_missing, optim_label, optim_rank, to_markdown

__all__ = [
    "MEDIAN_TARGET",
    "WORST_TARGET",
    "CROSSOVER_TARGET",
    "model_error_rows",
    "model_error_summary",
    "crossover_error_rows",
    "model_error_markdown",
    "main",
]

MEDIAN_TARGET = 0.15  # median |predicted / measured - 1| per method
WORST_TARGET = 0.35  # and the worst
CROSSOVER_TARGET = 0.15  # |predicted / measured - 1| of each crossover's link rate


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


def model_error_rows(frame: pd.DataFrame, profile_frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run the model can predict (a 1-node profile of its setting exists, an emulated cluster); the
    profiles come from ``profile_frame``'s 1-node runs (default: ``frame``'s own)."""
    runs = _runs(frame)
    if runs.empty:
        return pd.DataFrame()
    models = _models(runs, one_node_profiles((frame if profile_frame is None else profile_frame)["run_dir"]))
    rows = []
    for _, r in runs.iterrows():
        model = models.get(r["series"])
        if model is None:
            continue
        link = float("nan") if is_missing(r["link_mbit"]) else float(r["link_mbit"])
        steps = float(r["steps"])
        step_pred = model.time_to_target(steps, link, loop=False) / steps  # the timed step, as step_ms_total
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


def crossover_error_rows(points: pd.DataFrame) -> pd.DataFrame:
    """Per comparison (task, layout, run length) and compressed method measured at two links or more: where it
    stops being faster than the fastest baseline, measured (interpolated between the two links that bracket it)
    and predicted, and the error of the predicted link rate. ``points``: report.crossover.crossover_tables'."""
    if points.empty:
        return pd.DataFrame()
    titles = {
        comparison: f"{g.iloc[0]['task']}: {fmt_layout(g.iloc[0])}, {g.iloc[0]['run_length']}"
        for comparison, g in points.groupby("comparison", sort=False)
    }
    rows = []
    for c in crossovers(points):
        if len(c["measured_ratios"]) < 2:
            continue
        links = sorted(c["measured_ratios"])
        measured, predicted = c["measured"], c.get("predicted")  # None where it does not cross
        bracket = None if measured is None else next((a, b) for a, b in pairwise(links) if a <= measured <= b)
        rows.append(
            {
                "comparison": titles[c["comparison"]],
                "optim": c["optim"],
                "variant": c["variant"],
                "links": links,
                "measured": measured,
                "bracket": bracket,
                "band": c.get("measured_band"),
                "predicted": predicted,
                "error": _error(predicted, measured) if measured is not None and predicted is not None else math.nan,
                "faster_everywhere": c["faster_everywhere_measured"],
                "slower_everywhere": c["slower_everywhere_measured"],
                # where the model never crosses on its grid: faster on all of it, or slower
                "predicted_faster_everywhere": predicted is None
                and "grid_ratio" in c
                and bool(c["grid_ratio"][-1] < 1),
            }
        )
    return pd.DataFrame(rows)


def _crossover_verdict(r) -> str:
    if is_missing(r["measured"]):
        where = "faster" if r["faster_everywhere"] else "slower"
        beyond = max(r["links"]) if r["faster_everywhere"] else min(r["links"])
        # faster at every measured link: the model agrees if it crosses above them (or never); slower: below
        if is_missing(r["predicted"]):
            agrees = bool(r["predicted_faster_everywhere"]) == bool(r["faster_everywhere"])
        else:
            agrees = (r["predicted"] > beyond) == bool(r["faster_everywhere"])
        return f"{where} at every measured link; the model " + ("agrees" if agrees else "**does not**")
    if is_missing(r["error"]):
        return "no predicted crossover: **no**"
    if abs(r["error"]) <= CROSSOVER_TARGET:
        return "yes"
    return "**no**" + ("; inside the seed band" if in_band(r["predicted"], r.get("band")) else "")


def in_band(link: float | None, band) -> bool:
    """Whether ``link`` lies in a measured crossover's seed band (report.crossover_find.seed_band; None: open end)."""
    if link is None or is_missing(link) or not band:
        return False
    low, high = band
    return (low is None or link >= low) and (high is None or link <= high)


def crossover_error_markdown(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "No compressed method measured at two links or more."
    shown = pd.DataFrame(
        {
            "comparison": rows["comparison"],
            "method": [optim_label(o, v) for o, v in zip(rows["optim"], rows["variant"])],
            "measured links": [" ".join(_link(x) for x in xs) for xs in rows["links"]],
            "measured crossover, Mbit/s": [
                "—" if is_missing(m) else f"{fmt_number(m, 3)} (between {_link(b[0])} and {_link(b[1])})"
                for m, b in zip(rows["measured"], rows["bracket"])
            ],
            "seed band, Mbit/s": [band_text(b) for b in rows["band"]],
            "predicted, Mbit/s": ["—" if is_missing(p) else fmt_number(p, 3) for p in rows["predicted"]],
            "error": rows["error"].map(_signed),
            f"within {CROSSOVER_TARGET:.0%}": [_crossover_verdict(r) for _, r in rows.iterrows()],
        }
    )
    return to_markdown(shown)


def _link(x: float) -> str:
    return "unshaped" if x == unshaped_link() else fmt_number(x)


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


def _per_method_table(summary: pd.DataFrame) -> str:
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
    return to_markdown(shown)


def _per_run_table(rows: pd.DataFrame) -> str:
    runs = pd.DataFrame(
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
    return to_markdown(runs)


def model_error_markdown(
    rows: pd.DataFrame, summary: pd.DataFrame, crossings: pd.DataFrame | None = None, per_run: bool = True
) -> str:
    """The tables: per method, the crossovers (where given), and every run (``per_run``)."""
    lines = ["# The performance model against measured runs", ""] + [f"- {n}" for n in NOTES]
    if rows.empty:
        return "\n".join(lines + ["", "No multi-node run with a 1-node profile of its setting."]) + "\n"
    lines += ["", "## Per method", "", _per_method_table(summary)]
    if crossings is not None:
        lines += [
            "",
            "## Crossovers, predicted against measured",
            "",
            "Against the fastest uncompressed or 16-bit baseline at each link (tables/crossover.md); the "
            "measured one interpolated in log link rate between the two measured links around it. The seed "
            "band: where the measured ratio one standard error of the seeds' means up and one down crosses 1 "
            "(the measurement's own resolution: a ratio that changes little between two links puts its "
            "crossover far apart for a few percent of seed spread).",
            "",
            crossover_error_markdown(crossings),
        ]
    if per_run:
        lines += ["", "## Per run", "", _per_run_table(rows)]
    return "\n".join(lines) + "\n"


def held_out_markdown(rows: pd.DataFrame, root: str) -> str:
    """The runs under ``root`` (made after the model was settled, at a link or layout used for nothing else),
    predicted from the same profiles: per method and per run, apart from the runs the model was looked at on."""
    lines = ["", f"## Held out: the runs under {root}", ""]
    if rows.empty:
        return "\n".join(lines + ["No multi-node run there with a 1-node profile of its setting."]) + "\n"
    return "\n".join(lines + [_per_method_table(model_error_summary(rows)), "", _per_run_table(rows)]) + "\n"


def csv_text(rows: pd.DataFrame) -> str | None:
    return None if rows.empty else rows.to_csv(index=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the model's errors on every predictable run under ``--runs`` (default: runs/time-to-accuracy)."""
    from .records import load_frame, runs_root

    parser = argparse.ArgumentParser(
        prog="python -m birder_repro.report.model_error",
        description="The performance model against measured multi-node runs, out of sample: each predicted from "
        "a 1-node profile, its layout, its link and its own steps. Prints; writes nothing.",
    )
    parser.add_argument("--runs", metavar="DIR", default="runs/time-to-accuracy", help="the runs root")
    parser.add_argument(
        "--held-out",
        metavar="DIR",
        default=None,
        help="runs made after the model was settled (a link or layout used for nothing else), predicted from the "
        "profiles under --runs and reported apart (not in the crossovers)",
    )
    args = parser.parse_args(argv)
    frame = load_frame(runs_root(args.runs))
    if frame.empty:
        print(f"no run records under {args.runs}", file=sys.stderr)
        return 1
    rows = model_error_rows(frame)
    crossings = crossover_error_rows(crossover_tables(frame)[0])
    print(model_error_markdown(rows, model_error_summary(rows), crossings, per_run=False).rstrip())
    if args.held_out:
        held = load_frame(runs_root(args.held_out))  # predicted from the profiles under --runs
        print(held_out_markdown(model_error_rows(held, frame) if not held.empty else held, args.held_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
