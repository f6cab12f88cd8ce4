"""``tables/tuning.md|csv``: every tuning trial of :mod:`birder_repro.report.tuning_trials` and each study's
choice, with its grid and whether it is interior.
"""

from __future__ import annotations

import json

import pandas as pd

from .display import fmt_layout, fmt_number, is_missing, metric_label, optim_label, to_markdown
from .tuning_trials import TUNED_KEYS, items_of

__all__ = ["tuning_markdown", "csv_text", "NOTES"]


def _values_text(tuned: dict) -> str:
    return ", ".join(f"{k} {fmt_number(v, 3)}" for k, v in tuned.items()) or "—"


def _outcome(row) -> str:
    if row["status"] != "completed":
        return str(row["status"])
    if row.get("target_reached"):
        return f"step {int(row['target_step'])}"
    return "not reached"


def _final_text(row) -> str:
    value = row["final_metric_value"]
    return "—" if is_missing(value) else fmt_number(value, 4)


def _chosen_text(row) -> str:
    text = _values_text(row["tuned"])
    return text + (f" (edge of the grid: {', '.join(row['edge'])})" if row["edge"] else "")


def _grid_text(trials: pd.DataFrame) -> str:
    """Each key the study varied and the values it tried: "lr 0.001-0.004 (3), beta 0.9, 0.95"."""
    parts = []
    keys = list(dict.fromkeys(k for t in trials["tuned"] for k in t))
    for key in keys:
        tried = sorted({t[key] for t in trials["tuned"] if key in t and isinstance(t[key], (int, float))})
        if len(tried) > 1:
            parts.append(f"{key} " + ", ".join(fmt_number(v, 3) for v in tried))
    return "; ".join(parts) or "—"


def _interior_text(row) -> str:
    """'interior', or each edge with the next value to run (report.tuning --extend) or why there is none."""
    if not row["edges"]:
        return "interior"
    out = []
    for e in row["edges"]:
        where = "only value tried here" if e.side == "untried" else f"{e.side} edge"
        then = f"next {fmt_number(e.next, 3)}" if e.next is not None else f"cannot extend: {e.reason}"
        out.append(f"{e.key} {fmt_number(e.value, 3)}: {where}, {then}")
    return "; ".join(out)


def _seconds_text(value) -> str:
    return "—" if is_missing(value) else fmt_number(float(value), 3)


def _scored_by(rows: pd.DataFrame) -> str:
    links = {items_of(i).get("tuning.score_link_mbit") for i in rows["config_items"]}
    link = next(iter(links)) if len(links) == 1 else None
    reached = rows[rows["target_reached"] == True]  # noqa: E712 - a trial that missed the target has no time
    if link is not None and not reached.empty and reached["predicted_s"].notna().all():
        return f"predicted s to target at {fmt_number(link)} Mbit/s"
    return "scored by steps (no link or no 1-node profile)"


NOTES = (
    "Trials: runs scored on the validation split (`data.eval_set=val`: training images held out, never "
    "trained on; the test set is never seen). A study is one optimizer's trials of one setting, its configs "
    "differing only in the tuned keys (" + ", ".join(f"`{k}`" for k in TUNED_KEYS) + ").",
    "The score: a trial's predicted time to the target at the link the tuning is for (`tuning.score_link_mbit`): "
    "its steps at the performance model's step times from the optimizer's 1-node profile, 1-bit Adam's warmup "
    "(`optim.freeze`) at the fp32 step's time; without a link or a profile, its steps. A candidate (one set of "
    "values) is scored over its seeds (every seed must reach the target; then the mean); the choice is the "
    "best candidate, ties and misses by the higher mean final metric, failed or diverged trials last. A choice "
    "at the smallest or largest of the values tried around it (the other keys at the chosen values) is on an "
    "edge: `interior?` gives the next value, which `python -m birder_repro.report.tuning --extend RUNS` prints "
    "as the cell to run, or why the grid cannot extend (conf/tuning/<task>.yaml's `keys`). `trials` is each "
    "optimizer's budget: the same for every optimizer of a comparison (conf/tuning/<task>.yaml's `trials`, plus "
    "the confirming seeds and any extension).",
    "Final metric: at the run's end, which is the target's evaluation for a run ended there (`train.stop_at_target`).",
)


def tuning_markdown(rows: pd.DataFrame) -> str:
    lines = ["# Tuning on the validation split", ""] + [f"- {n}" for n in NOTES]
    if rows.empty:
        return "\n".join(lines + ["", "No tuning run (`data.eval_set=val`)."]) + "\n"
    for task, of_task in rows.groupby("task", sort=False):
        chosen_runs = of_task[of_task["chosen"]]
        chosen = chosen_runs.drop_duplicates("study")
        mean_s = chosen_runs.groupby("study")["predicted_s"].mean()
        first = chosen.iloc[0]
        goal = (
            f"{metric_label(first['target_metric'])} {'<=' if first['target_direction'] == 'lower' else '>='} "
            f"{fmt_number(first['target_value'])}"
        )
        lines += [
            "",
            f"## {task}: {fmt_layout(first)}, {first['run_length']}, target {goal} on the validation split",
            "",
            "The choices (each optimizer's best trial):",
            "",
        ]
        table = pd.DataFrame(
            {
                "optimizer": [optim_label(o, v) for o, v in zip(chosen["optim"], chosen["variant"])],
                "trials": chosen["trials"].astype(int),
                "chosen values": chosen.apply(_chosen_text, axis=1),
                "grid": chosen["study"].map(lambda st: _grid_text(of_task[of_task["study"] == st])),
                "interior?": chosen.apply(_interior_text, axis=1),
                "seeds": chosen["seeds"].astype(int),
                "steps to target (val, first seed)": chosen.apply(_outcome, axis=1),
                "s to target (mean over seeds)": chosen["study"].map(mean_s).map(_seconds_text),
                f"final {metric_label(first['headline_metric'])} (val)": chosen.apply(_final_text, axis=1),
            }
        )
        lines.append(to_markdown(table))
        for _study, trials in of_task.groupby("study", sort=False):
            head = trials.iloc[0]
            lines += ["", f"### {optim_label(head['optim'], head['variant'])}: {len(trials)} trials", ""]
            lines.append(
                to_markdown(
                    pd.DataFrame(
                        {
                            "values": trials["tuned"].map(_values_text),
                            "seed": trials["seed"],
                            "outcome": trials.apply(_outcome, axis=1),
                            _scored_by(trials): trials["predicted_s"].map(_seconds_text),
                            f"final {metric_label(head['headline_metric'])} (val)": trials.apply(_final_text, axis=1),
                            "chosen": trials["chosen"].map(lambda c: "**chosen**" if c else ""),
                            "run": trials["run_dir"].map(lambda d: "/".join(str(d).split("/")[-2:])),
                        }
                    )
                )
            )
    return "\n".join(lines) + "\n"


def csv_text(rows: pd.DataFrame) -> str | None:
    if rows.empty:
        return None
    out = rows[
        [
            "task",
            "optim",
            "variant",
            "nodes",
            "gpus_per_node",
            "run_length",
            "trials",
            "chosen",
            "status",
            "target_reached",
            "target_step",
            "predicted_s",
            "seed",
            "final_metric_value",
            "run_dir",
        ]
    ].copy()
    out.insert(3, "values", rows["tuned"].map(lambda t: json.dumps(t, default=str)))
    return out.to_csv(index=False)
