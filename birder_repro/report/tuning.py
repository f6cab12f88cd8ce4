"""Tuning on the validation split: ``tables/tuning.md|csv``, every trial of every optimizer and the one chosen.

A tuning trial is a measured run scored on the validation split (``data.eval_set=val``; the test set is never
seen). A *study* is one optimizer's trials of one setting: runs whose configs differ only in the tuned keys
(:data:`TUNED_KEYS`) and the seed. Each study's trials are ranked by :func:`trial_score`: a run that reached
the target beats one that did not, then fewer steps to the target (the step time does not depend on the
learning rate, so fewer steps is less time on any link), then the higher final metric; a run that failed or
diverged ranks last. The first is the study's choice, the values an experiment's recipe should carry
(``conf/recipe/<task>/<optim>.yaml`` says where its values came from). ``trials`` says how many each optimizer
had: a fair comparison gives every optimizer the same budget (AlgoPerf's and MLPerf's rule).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from .cells import fill_keys
from .display import fmt_layout, fmt_number, is_missing, metric_label, optim_label, optim_rank, to_markdown

__all__ = ["TUNED_KEYS", "trial_score", "tuning_rows", "tuning_markdown"]

# The keys a study varies: the learning rate (every optimizer), 1-bit Adam's warmup length, Birder's beta.
TUNED_KEYS = ("optim.lr", "optim.freeze", "optim.beta")
# Keys that say how a trial ran or follow from the tuned ones (effective_lr: lr x batch scaling): left out too.
RUN_KEYS = ("train.stop_at_target", "optim.total_steps", "optim.effective_lr")


def _items(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def study_key(items: dict) -> str:
    """The config less the tuned keys (the seed is already out: report.identity)."""
    kept = {k: v for k, v in items.items() if k not in TUNED_KEYS and k not in RUN_KEYS}
    return json.dumps(kept, sort_keys=True, default=str)


def tuned_values(items: dict) -> dict[str, Any]:
    """The tuned keys this trial's config holds, short names: {"lr": 0.001, "freeze": 0.3}."""
    return {k.split(".", 1)[1]: items[k] for k in TUNED_KEYS if k in items and items[k] is not None}


def trial_score(row) -> tuple:
    """Smaller is better: (not completed, not reached, steps to target, -final metric)."""
    completed = row.get("status") == "completed"
    reached = bool(row.get("target_reached")) and completed
    step = float(row["target_step"]) if reached and not is_missing(row.get("target_step")) else math.inf
    metric = row.get("final_metric_value")
    sign = -1.0 if row.get("target_direction") != "lower" else 1.0
    final = sign * float(metric) if completed and not is_missing(metric) else math.inf
    return (not completed, not reached, step, final)


def _final(row, metric_cols: set) -> float | None:
    name = row.get("headline_metric")
    col = name if name in metric_cols else f"metric_{name}"
    value = row.get(col) if col in metric_cols else None
    return None if is_missing(value) else float(value)


def tuning_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per trial (measured runs scored on ``val``), with ``study``, ``tuned``, ``score`` and ``chosen``."""
    if "eval_set" not in frame:
        return pd.DataFrame()
    runs = fill_keys(frame[(frame["source"] == "measured") & (frame["eval_set"].astype("object") == "val")])
    if runs.empty:
        return pd.DataFrame()
    metric_cols = set(frame.columns)
    runs["final_metric_value"] = [_final(r, metric_cols) for _, r in runs.iterrows()]
    runs["study"] = [study_key(_items(i)) for i in runs["config_items"]]
    runs["tuned"] = [tuned_values(_items(i)) for i in runs["config_items"]]
    # a trial run again (the same values and seed: make tune-fashion twice) counts once, its newest run
    runs["_trial"] = [
        json.dumps([s, t, seed], default=str) for s, t, seed in zip(runs["study"], runs["tuned"], runs["seed"])
    ]
    runs = runs.sort_values("started_at", kind="stable").drop_duplicates("_trial", keep="last")
    runs = runs.drop(columns="_trial")
    runs["score"] = [trial_score(r) for _, r in runs.iterrows()]
    runs["trials"] = runs.groupby("study")["study"].transform("size")
    best = runs.groupby("study")["score"].transform("min")
    runs["chosen"] = runs["score"] == best
    # one chosen per study: ties go to the first trial in sweep order
    runs["chosen"] &= ~runs.duplicated(subset=["study", "chosen"]) | ~runs["chosen"]
    runs["_rank"] = optim_rank(runs["optim"])
    runs = runs.sort_values(["task", "_rank", "study", "started_at"], kind="stable")  # the sweep's order
    return runs.drop(columns="_rank").reset_index(drop=True)


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


NOTES = (
    "Trials: runs scored on the validation split (`data.eval_set=val`: training images held out, never "
    "trained on; the test set is never seen). A study is one optimizer's trials of one setting, its configs "
    "differing only in the tuned keys (" + ", ".join(f"`{k}`" for k in TUNED_KEYS) + ").",
    "The choice: the trial that reached the target in the fewest steps (a step's time does not depend on these "
    "values, so fewer steps is less time on any link); ties and misses by the higher final metric; failed "
    "or diverged trials last. `trials` is each optimizer's budget: the same for every optimizer of a "
    "comparison.",
    "Final metric: at the run's end, which is the target's evaluation for a run ended there (`train.stop_at_target`).",
)


def tuning_markdown(rows: pd.DataFrame) -> str:
    lines = ["# Tuning on the validation split", ""] + [f"- {n}" for n in NOTES]
    if rows.empty:
        return "\n".join(lines + ["", "No tuning run (`data.eval_set=val`)."]) + "\n"
    for task, of_task in rows.groupby("task", sort=False):
        chosen = of_task[of_task["chosen"]]
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
                "chosen values": chosen["tuned"].map(_values_text),
                "steps to target (val)": chosen.apply(_outcome, axis=1),
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
                            "outcome": trials.apply(_outcome, axis=1),
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
            "final_metric_value",
            "run_dir",
        ]
    ].copy()
    out.insert(3, "values", rows["tuned"].map(lambda t: json.dumps(t, default=str)))
    return out.to_csv(index=False)
