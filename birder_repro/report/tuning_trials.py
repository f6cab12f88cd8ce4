"""Tuning trials scored and each study's choice: the rows of ``tables/tuning.md|csv`` and the input of
``python -m birder_repro.report.tuning`` (whose module doc gives the rules: studies, candidates, the score by
predicted time to the target or by steps, the edges of a grid).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .cells import fill_keys
from .display import is_missing, optim_rank
from .protocol import Edge, ProtocolError, edges, load_protocol

__all__ = ["TUNED_KEYS", "trial_score", "candidate_score", "study_key", "tuned_values", "tuning_rows", "items_of"]

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


def items_of(value: Any) -> dict:
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

    link = items_of(row.get("config_items")).get("tuning.score_link_mbit")
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
    runs["study"] = [study_key(items_of(i)) for i in runs["config_items"]]
    runs["tuned"] = [tuned_values(items_of(i)) for i in runs["config_items"]]
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
