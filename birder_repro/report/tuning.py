"""Tuning on the validation split: ``tables/tuning.md|csv``, every trial of every optimizer and the one chosen.

A tuning trial is a measured run scored on the validation split (``data.eval_set=val``; the test set is never
seen). A *study* is one optimizer's trials of one setting: runs whose configs differ only in the tuned keys
(:data:`~birder_repro.report.tuning_trials.TUNED_KEYS`) and the seed. A *candidate* is one set of tuned values,
run with one or more seeds.

What a trial costs the user is time, not steps: 1-bit Adam's warmup steps (``optim.freeze``, a tuned key) are
full fp32 steps, several times a compressed one's time on a slow link. So where the trial's config names the
link it is tuned for (``tuning.score_link_mbit``) and a 1-node profile of its optimizer exists, a trial is
scored by its predicted time to the target there: its steps, the first ``freeze`` of them at the fp32 step's
time, the rest at its own scheme's (:class:`~birder_repro.report.crossover.StepModel`, the performance model
the crossover uses); otherwise by its steps (the table says which). Candidates are ranked by
:func:`~birder_repro.report.tuning_trials.trial_score` over their seeds: every seed completed and reached the
target beats any that did not, then the mean score over the seeds, then the higher mean final metric. The
first is the study's choice. A choice at the smallest or largest of the values tried around it is on an edge
(:func:`birder_repro.report.protocol.edges`): the table gives the next value or why the grid cannot extend.
``trials`` says how many runs each optimizer had: a fair comparison gives every optimizer the same budget
(AlgoPerf's and MLPerf's rule).

``python -m birder_repro.report.tuning`` with ``--rerun RUNS`` prints the cells that run each study's best
candidates at the other tuning seeds, ``--extend RUNS`` the cells one step past each edge, and ``--plan RUNS``
writes ``RUNS/tuned.yaml``, the field's input: the choices, the targets and budgets by the protocol's rules
(conf/tuning/<task>.yaml) and each method's step times at the field's link.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .protocol import ProtocolError, load_protocol
from .tuning_trials import items_of, tuning_rows

__all__ = ["rerun_overrides", "extension_overrides", "field_plan", "main"]


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
        link = items_of(row.get("config_items")).get("tuning.score_link_mbit")
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
