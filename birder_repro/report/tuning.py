"""Tuning on the validation split: ``tables/tuning.md|csv``, every trial of every optimizer and the one chosen.

A tuning trial is a measured run scored on the validation split (``data.eval_set=val``; the test set is never
seen). A *study* is one optimizer's trials of one setting: runs whose configs differ only in the tuned keys
(:data:`TUNED_KEYS`) and the seed. A *candidate* is one set of tuned values, run with one or more seeds.

What a trial costs the user is time, not steps: 1-bit Adam's warmup steps (``optim.freeze``, a tuned key) are
full fp32 steps, several times a compressed one's time on a slow link. So where the trial's config names the
link it is tuned for (``tuning.score_link_mbit``) and a 1-node profile of its optimizer exists, a trial is
scored by its predicted time to the target there: its steps, the first ``freeze`` of them at the fp32 step's
time, the rest at its own scheme's (:class:`~birder_repro.report.crossover.StepModel`, the performance model
the crossover uses); otherwise by its steps (the table says which). Candidates are ranked by
:func:`trial_score` over their seeds: every seed completed and reached the target beats any that did not, then
the mean score over the seeds, then the higher mean final metric. The first is the study's choice. A choice
at the smallest or largest of the values tried around it is on an edge (:func:`birder_repro.report.protocol.edges`):
the table gives the next value or why the grid cannot extend. ``trials`` says how many runs each optimizer had:
a fair comparison gives every optimizer the same budget (AlgoPerf's and MLPerf's rule).

``python -m birder_repro.report.tuning`` with ``--rerun RUNS`` prints the cells that run each study's best
candidates at the other tuning seeds, ``--extend RUNS`` the cells one step past each edge, and ``--plan RUNS``
writes ``RUNS/tuned.yaml``, the field's input: the choices, the targets and budgets by the protocol's rules
(conf/tuning/<task>.yaml) and each method's step times at the field's link.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .cells import fill_keys
from .display import fmt_layout, fmt_number, is_missing, metric_label, optim_label, optim_rank, to_markdown
from .protocol import Edge, ProtocolError, edges, load_protocol

__all__ = ["TUNED_KEYS", "trial_score", "tuning_rows", "tuning_markdown"]

# The keys a study varies: the learning rate (every optimizer), SGDM's momentum, AdamW's weight decay, 1-bit
# Adam's warmup length, Birder's beta, PowerSGD's rank and start step, DiLoCo's local steps and outer lr.
TUNED_KEYS = (
    "optim.lr",
    "optim.momentum",
    "optim.weight_decay",
    "optim.freeze",
    "optim.beta",
    "optim.comm.rank",
    "optim.comm.start_iter",
    "optim.local_steps",
    "optim.outer_lr",
)
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
    """Smaller is better: (not completed, not reached, cost to the target, -final metric). The cost is the
    predicted seconds (``predicted_s``) where the trial has them, else its steps."""
    completed = row.get("status") == "completed"
    reached = bool(row.get("target_reached")) and completed
    seconds = row.get("predicted_s")
    if reached and not is_missing(seconds):
        cost = float(seconds)
    elif reached and not is_missing(row.get("target_step")):
        cost = float(row["target_step"])
    else:
        cost = math.inf
    metric = row.get("final_metric_value")
    sign = -1.0 if row.get("target_direction") != "lower" else 1.0
    final = sign * float(metric) if completed and not is_missing(metric) else math.inf
    return (not completed, not reached, cost, final)


def candidate_score(scores: Sequence[tuple]) -> tuple:
    """A candidate's score over its seeds' trial scores: (any not completed, any not reached, mean cost, mean
    final), so that a lucky seed does not choose."""
    n = len(scores)
    return (
        any(s[0] for s in scores),
        any(s[1] for s in scores),
        sum(s[2] for s in scores) / n,
        sum(s[3] for s in scores) / n,
    )


def predicted_seconds(row, profiles: dict | None) -> float | None:
    """The trial's predicted seconds to its target at ``tuning.score_link_mbit``; None where the config names no
    link, the trial did not reach the target, or no 1-node profile of its setting exists."""
    from .crossover import StepModel, _profile_key, _record

    link = _items(row.get("config_items")).get("tuning.score_link_mbit")
    if link is None or is_missing(link) or not profiles or not row.get("target_reached"):
        return None
    if is_missing(row.get("target_step")):
        return None
    rec = _record(str(row["run_dir"]))
    profile = profiles.get(_profile_key(rec)[:-1] + ("emulated",)) if rec else None
    if profile is None:
        return None
    return StepModel(rec, profile).time_to_target(float(row["target_step"]), float(link))


def key_specs() -> dict[str, Any]:
    """How each tuned key steps beyond a grid's edge (conf/tuning/fashion_mnist.yaml's ``keys``); a key it does
    not name steps on a log scale."""
    try:
        return dict(load_protocol()["keys"])
    except (ProtocolError, KeyError):
        return {}


def _edges(trials: pd.DataFrame, chosen: dict, specs: dict) -> list[Edge]:
    """The chosen values on an edge of what the study tried around them (report.protocol.edges)."""
    keys = {k: specs.get(k, {"scale": "log"}) for k in chosen}
    return edges(chosen, list(trials["tuned"]), keys)


def _final(row, metric_cols: set) -> float | None:
    name = row.get("headline_metric")
    col = name if name in metric_cols else f"metric_{name}"
    value = row.get(col) if col in metric_cols else None
    return None if is_missing(value) else float(value)


def tuning_rows(frame: pd.DataFrame, profiles: dict | None = None) -> pd.DataFrame:
    """One row per trial (measured runs scored on ``val``), with ``study``, ``tuned``, ``predicted_s``,
    ``score``, ``seeds`` (of its candidate), ``chosen`` (every seed of the chosen candidate) and ``edge``.
    ``profiles``: 1-node profiles (:func:`birder_repro.report.crossover.one_node_profiles`)."""
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
    runs["predicted_s"] = [predicted_seconds(r, profiles) for _, r in runs.iterrows()]
    runs["score"] = [trial_score(r) for _, r in runs.iterrows()]
    runs["trials"] = runs.groupby("study")["study"].transform("size")
    runs["candidate"] = [json.dumps([s, t], default=str) for s, t in zip(runs["study"], runs["tuned"])]
    runs["seeds"] = runs.groupby("candidate")["candidate"].transform("size")
    scores = {c: candidate_score(list(g["score"])) for c, g in runs.groupby("candidate", sort=False)}
    runs["candidate_score"] = runs["candidate"].map(scores)
    # one chosen candidate per study: the best mean over its seeds; ties go to the first in sweep order
    first = runs.sort_values("started_at", kind="stable").drop_duplicates("candidate")
    best = {}
    for study, cands in first.groupby("study", sort=False):
        best[study] = min(cands["candidate"], key=lambda c: scores[c])
    runs["chosen"] = runs["candidate"] == runs["study"].map(best)
    specs = key_specs()
    runs["edges"] = [
        _edges(runs[runs["study"] == s], t, specs) if c else []
        for s, t, c in zip(runs["study"], runs["tuned"], runs["chosen"])
    ]
    runs["edge"] = [list(dict.fromkeys(e.key for e in es)) for es in runs["edges"]]
    runs["_rank"] = optim_rank(runs["optim"])
    runs = runs.sort_values(["task", "_rank", "study", "started_at"], kind="stable")  # the sweep's order
    return runs.drop(columns="_rank").reset_index(drop=True)


def rerun_overrides(rows: pd.DataFrame, best: int = 2, seeds: Sequence[int] = (1, 2)) -> list[str]:
    """The sweeps that run each study's ``best`` candidates (by their seed-0 score) with ``seeds`` more: one
    ``birder-repro -m`` argument line per candidate, for the Makefile to run after the grids."""
    lines = []
    for _study, trials in rows.groupby("study", sort=False):
        ranked = trials.drop_duplicates("candidate").sort_values("candidate_score", kind="stable")
        for _, row in ranked.head(best).iterrows():
            if row["candidate_score"][1]:
                continue  # a candidate that missed the target is not worth more seeds
            have = set(trials[trials["candidate"] == row["candidate"]]["seed"])
            wanted = [s for s in seeds if s not in have]
            if not wanted:
                continue
            values = _values_args(row["tuned"])
            lines.append(f"optim={row['optim']} {values} seed={','.join(str(s) for s in wanted)}")
    return lines


def _values_args(values: dict) -> str:
    return " ".join(f"optim.{k}={v:g}" if isinstance(v, float) else f"optim.{k}={v}" for k, v in values.items())


def extension_overrides(rows: pd.DataFrame, seed: int = 0, experiment: str | None = None) -> list[str]:
    """The cells that carry each study's grid one step past the chosen values' edges (report.protocol.edges):
    the chosen values with one key at its next value, at ``seed``, each once and only where not yet tried. An
    edge that cannot extend (its next value beyond the key's limit) gives no cell; the table says why."""
    lines: list[str] = []
    chosen = rows[rows["chosen"]].drop_duplicates("study") if not rows.empty else rows
    for _, row in chosen.iterrows():
        tried = list(rows[rows["study"] == row["study"]]["tuned"])
        for edge in row["edges"]:
            if edge.next is None:
                continue
            values = {**row["tuned"], edge.key: edge.next}
            if values in tried:
                continue
            head = f"experiment={experiment} " if experiment else ""
            line = f"{head}optim={row['optim']} {_values_args(values)} seed={seed}"
            if line not in lines:
                lines.append(line)
    return lines


def _middle_target_seconds(trials: pd.DataFrame, level: float, profiles: dict | None) -> float:
    """A chosen candidate's mean predicted seconds to ``level`` (on the validation curve) at its scoring link
    over its seeds; inf where a seed never reaches it or cannot be priced."""
    from .crossover import StepModel, _profile_key, _record
    from .ladder import run_curve

    times = []
    for _, row in trials.iterrows():
        rec = _record(str(row["run_dir"]))
        link = _items(row.get("config_items")).get("tuning.score_link_mbit")
        profile = profiles.get(_profile_key(rec)[:-1] + ("emulated",)) if rec and profiles else None
        curve = run_curve(row["run_dir"], str(row["target_metric"]))
        hit = curve[curve["value"] >= level]
        if profile is None or link is None or hit.empty:
            return math.inf
        times.append(StepModel(rec, profile).time_to_target(float(hit["step"].iloc[0]), float(link)))
    return sum(times) / len(times) if times else math.inf


def _step_times(row, link: float, profiles: dict | None) -> list[float] | None:
    from .crossover import StepModel, _profile_key, _record

    rec = _record(str(row["run_dir"]))
    profile = profiles.get(_profile_key(rec)[:-1] + ("emulated",)) if rec and profiles else None
    if profile is None:
        return None
    warm, main, _ = StepModel(rec, profile).step_s(float(link))
    return [round(float(warm), 6), round(float(main), 6)]


def field_plan(rows: pd.DataFrame, profiles: dict | None, proto: dict) -> dict[str, Any]:
    """What the field runs, from the tuning alone (report.protocol's rules): each method's chosen values, the
    targets (fractions of the best chosen candidate's mean final validation metric), the budgets (the median
    method's predicted time to the middle target at the field's link, divided) and each method's step times
    there (warmup step, step), from which a budget run's steps follow."""
    from .protocol import budgets_from_times, target_levels

    if rows.empty:
        raise ProtocolError("no tuning trial (data.eval_set=val) under the runs folder: run make tune-fashion")
    chosen = rows[rows["chosen"]]
    finals = chosen.groupby("optim")["final_metric_value"].mean()
    # the targets and budgets are the field's (protocol field_methods): a method tuned for another target (make
    # local-steps) gets its pick and step times, and moves neither
    field = set(proto.get("field_methods") or finals.index)
    finals = finals[[o in field for o in finals.index]] if any(o in field for o in finals.index) else finals
    best = str(finals.idxmax())
    targets = target_levels(float(finals.max()), proto["target_fractions"])
    middle = targets[len(targets) // 2]
    picks, step_s, seconds = {}, {}, {}
    for optim, trials in chosen.groupby("optim", sort=False):
        picks[str(optim)] = {k: (float(v) if isinstance(v, float) else v) for k, v in trials["tuned"].iloc[0].items()}
        steps = _step_times(trials.iloc[0], proto["link_mbit"], profiles)
        if steps is None:
            raise ProtocolError(f"{optim}: no 1-node profile to price its steps (make tune-fashion's first sweep)")
        step_s[str(optim)] = steps
        seconds[str(optim)] = _middle_target_seconds(trials, middle, profiles)
    in_field = [v for k, v in seconds.items() if k in field] or list(seconds.values())
    budgets = budgets_from_times(in_field, proto["budget_divisors"])
    return {
        "rule": (
            f"targets: {proto['target_fractions']} x the best chosen method's mean final validation "
            f"{chosen['headline_metric'].iloc[0]} ({best}, {float(finals.max()):.4g}); budgets: the median "
            f"method's predicted seconds to {middle:g} at {proto['link_mbit']} Mbit/s / {proto['budget_divisors']}"
        ),
        "best_final": {"optim": best, "value": round(float(finals.max()), 4)},
        "targets": targets,
        "budgets_s": [round(b, 3) for b in budgets],
        "seconds_to_middle_target": {k: (round(v, 3) if math.isfinite(v) else None) for k, v in seconds.items()},
        "picks": picks,
        "step_s": step_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from .crossover import one_node_profiles
    from .protocol import write_plan
    from .records import load_frame

    parser = argparse.ArgumentParser(prog="python -m birder_repro.report.tuning", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--rerun", type=Path, help="print the cells that give each study's best candidates more seeds")
    what.add_argument("--extend", type=Path, help="print the cells one step past each choice's grid edge")
    what.add_argument("--plan", type=Path, help="write RUNS/tuned.yaml: picks, targets, budgets (the field's input)")
    parser.add_argument("--protocol", type=Path, default=None, help="default: conf/tuning/fashion_mnist.yaml")
    args = parser.parse_args(argv)
    runs = args.rerun or args.extend or args.plan
    try:
        proto = load_protocol(args.protocol)
    except ProtocolError as exc:
        print(f"[birder-repro] tuning: {exc}")
        return 2
    frame = load_frame(runs)
    rows = tuning_rows(frame, one_node_profiles(frame["run_dir"]))
    experiment = f"{proto['tuning_experiment']}"
    if not args.plan:
        print(f"# order-seed: {proto['order_seed']}")
    if args.rerun:
        lines = rerun_overrides(rows, proto["confirm_best"], proto["tuning_seeds"][1:])
        print("\n".join(f"experiment={experiment} {line}" for line in lines))
    elif args.extend:
        print("\n".join(extension_overrides(rows, proto["tuning_seeds"][0], experiment)))
    else:
        try:
            path = write_plan(runs, field_plan(rows, one_node_profiles(frame["run_dir"]), proto))
        except ProtocolError as exc:
            print(f"[birder-repro] tuning: {exc}")
            return 2
        print(f"[birder-repro] tuning: the field's plan: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


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
    links = {_items(i).get("tuning.score_link_mbit") for i in rows["config_items"]}
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
