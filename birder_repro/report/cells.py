"""Which runs a table shows, and how: one row per configuration, its seeds aggregated; the rest listed with why.

A *setting* is :data:`SETTING` (source, task, cluster, data, model size, precision, batch per process, the
run's length...); a *cell* is a setting at one layout (:data:`CELL`); a *row* is one configuration of one
optimizer in a cell (:data:`ROW`: the cell, the optimizer and its variant, and the config key of
birder_repro.report.identity, which leaves out only the seed and settings that cannot change a result). So a
run of another setting (2 steps instead of 60, another learning rate) is another row or another section, and
never takes the place of a sweep because it is newer.

A row's runs are its seeds: :func:`aggregate` gives the mean of every figure, the sample standard deviation of
throughput, metrics and time to target, and n. :func:`select_runs` leaves out, each with its reason:
failed, interrupted or otherwise unfinished runs; a run resumed in a new directory before runs kept one
directory (its figures cover only the steps after the resume); smoke runs (far fewer steps than the longest run
of their cell); a run superseded by a newer run of the same configuration and seed; and a diverged seed of a
row whose other seeds completed (a row whose every run diverged is shown, as "diverged").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from . import records

DIVERGED = "diverged"  # a record's status (birder_repro.run.schema)
SHOWN_STATUSES = ("completed", "predicted", DIVERGED)
DONE_STATUSES = ("completed", "predicted")

SETTING = (
    "source",
    "task",
    "parallel",
    "cluster",
    "interconnect",
    "link_mbit",
    "data_source",
    "model_size",
    "precision",
    "batch_size",
    "run_length",
)
LAYOUT = ("nodes", "gpus_per_node")
CELL = SETTING + LAYOUT
ROW = (*CELL, "optim", "variant", "cell_key")
# Optimizers whose communication scheme (config optim.comm.scheme) varies under one name, with the default
# scheme; another scheme is a separate row, named in the label ("Birder (flat)").
DEFAULT_VARIANTS = {"birder": "hierarchical"}
# A measured run with at most this fraction of the steps of the longest run of its cell (any optimizer) is a
# smoke run: listed as left out, never a row beside the sweep it was tried before.
SMOKE_FRACTION = 0.1
# Figures whose spread over seeds the tables show (beside the mean); metric columns are added.
SPREAD_COLUMNS = ("throughput", "throughput_compression", "target_s")
TARGET_MEANS = ("target_s", "target_step", "target_samples", "target_wall_s")


def fill_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing text keys become "unknown" so that such runs still group (and show) together."""
    frame = frame.copy()
    for col in (
        "source",
        "task",
        "optim",
        "cluster",
        "interconnect",
        "data_source",
        "model_size",
        "precision",
        "run_length",
    ):
        frame[col] = frame[col].astype("object").where(frame[col].notna(), "unknown")
    default = frame["optim"].map(DEFAULT_VARIANTS)
    named = default.notna() & frame["variant"].notna() & (frame["variant"] != default)
    frame["variant"] = frame["variant"].astype("object").where(named, "")
    return frame


def short_run(run_dir) -> str:
    """The run directory's last two parts (date/time_task_optim..., or multirun/<sweep>/<job>) name it."""
    return "/".join(Path(str(run_dir)).parts[-2:])


def _int_text(value) -> str:
    return "?" if pd.isna(value) else str(int(value))


def status_reason(row) -> str:
    """Why a run that is not a result is left out: its status and what it says."""
    status = row["status"] if isinstance(row["status"], str) else "unknown status"
    error = row.get("error") if isinstance(row.get("error"), str) and row.get("error") else None
    if status == "interrupted":  # its error line, where it has one, says how to resume it
        return f"interrupted at step {_int_text(row['steps'])}: " + (
            error or "not a result until resumed and completed"
        )
    return f"{status}: {error}" if error else status


# ---------------------------------------------------------------------------------------------- selection
# Each rule takes the runs no earlier rule left out and gives the reason it leaves each out (None: kept).
def _unfinished(runs: pd.DataFrame) -> pd.Series:
    """Failed, interrupted or otherwise unfinished runs: no result."""
    unfinished = ~runs["status"].isin(SHOWN_STATUSES)
    return runs.apply(status_reason, axis=1).where(unfinished)


def _partial_resume(runs: pd.DataFrame) -> pd.Series:
    """Runs resumed into a new directory (records from before a resumed run kept its directory and its
    attempts): their clock and samples start at the checkpoint's step."""
    partial = runs["resumed_from_step"].notna() & (runs["attempts"].fillna(1) <= 1)
    return (
        runs["resumed_from_step"]
        .map(
            lambda s: (
                f"resumed from step {_int_text(s)} in a new directory (an old "
                "record): its figures cover only the steps after it"
            )
        )
        .where(partial)
    )


def _budget_run(items: Any) -> bool:
    """A run made for a time budget (``tuning.budget_s``, report.protocol): its steps sized on purpose."""
    return isinstance(items, dict) and items.get("tuning.budget_s") is not None


def _smoke(runs: pd.DataFrame) -> pd.Series:
    """Measured runs with at most SMOKE_FRACTION of the steps of the longest run of their cell (any optimizer,
    any length asked for). A run made for a time budget is no smoke run, and no measure of the others' length:
    a short budget sizes a slow method's run to a fraction of a fast one's on purpose."""
    budget = runs["config_items"].map(_budget_run) if "config_items" in runs else pd.Series(False, index=runs.index)
    steps = runs["steps"].astype("float64")
    whole = steps.where(~budget)
    longest = whole.groupby([runs[k] for k in CELL if k != "run_length"], dropna=False).transform("max")
    smoke = (runs["source"] == "measured") & ~budget & (steps <= SMOKE_FRACTION * longest)
    text = [
        f"smoke run: {_int_text(n)} steps, at most a tenth of the {_int_text(m)} of its cell's longest run"
        for n, m in zip(steps, longest)
    ]
    return pd.Series(text, index=runs.index, dtype="object").where(smoke)


def _superseded(runs: pd.DataFrame) -> pd.Series:
    """Older runs of a configuration and seed that a newer one repeats."""
    ordered = runs.sort_values(["started_at", "run_dir"], na_position="first", kind="stable")
    newest = ordered.groupby([*ROW, "seed"], dropna=False, sort=False)["run_dir"].transform("last")
    newest = newest.reindex(runs.index)
    text = newest.map(lambda n: f"superseded by a newer run of the same configuration and seed ({short_run(n)})")
    return text.where(newest != runs["run_dir"])


def _diverged_seed(runs: pd.DataFrame) -> pd.Series:
    """A diverged run of a row whose other seeds completed (a row whose every run diverged shows as such)."""
    done = runs["status"].isin(DONE_STATUSES).groupby([runs[k] for k in ROW], dropna=False).transform("any")
    text = "diverged: left out of the means of its row, whose other seeds completed"
    return pd.Series(text, index=runs.index, dtype="object").where((runs["status"] == DIVERGED) & done)


def _none(runs: pd.DataFrame) -> pd.Series:
    return pd.Series(None, index=runs.index, dtype="object")


RULES = (_unfinished, _partial_resume, _smoke, _superseded, _diverged_seed)


def select_runs(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs the tables aggregate, the runs left out with a ``reason`` column), keys filled: the
    :data:`RULES` in turn, each on the runs the earlier ones kept."""
    frame = fill_keys(frame)
    reason = _none(frame)
    for rule in RULES:
        open_ = frame[reason.isna()]
        if len(open_):
            reason.update(rule(open_).dropna())
    left = frame[reason.notna()].assign(reason=reason[reason.notna()])
    return frame[reason.isna()].copy(), left


# ---------------------------------------------------------------------------------------------- aggregation
def _mean_columns(frame: pd.DataFrame) -> list[str]:
    """Float columns averaged over a row's seeds (the keys stay as they are; target times: see below)."""
    return [c for c in frame.columns if frame[c].dtype == "float64" and c not in CELL and c not in TARGET_MEANS]


def _spread_columns(frame: pd.DataFrame) -> list[str]:
    return [*SPREAD_COLUMNS, *records.metric_columns(frame)]


def _aggregate_row(runs: pd.DataFrame, means: list[str], spreads: list[str]) -> dict:
    """One row from the runs of one configuration: the newest's keys, the completed runs' means and spreads."""
    ordered = runs.sort_values(["started_at", "run_dir"], na_position="first", kind="stable")
    done = ordered[ordered["status"].isin(DONE_STATUSES)]
    if done.empty:  # every run diverged: the row says so (its records hold no measurements)
        done = ordered
    row = done.iloc[-1].to_dict()
    row.update({c: done[c].mean() for c in means})
    row.update({f"{c}_sd": done[c].std(ddof=1) if len(done) > 1 else float("nan") for c in spreads})
    reached = done[done["target_reached"] == True]  # noqa: E712 - True / False / None in an object column
    row.update({c: reached[c].astype("float64").mean() for c in TARGET_MEANS})
    row["target_s_sd"] = reached["target_s"].std(ddof=1) if len(reached) > 1 else float("nan")
    row["target_reached_n"] = len(reached)
    row["per_run"] = _per_run(done)
    row["target_reached"] = True if len(reached) else row.get("target_reached")
    seeds = sorted({int(s) for s in done["seed"].dropna()})
    row.update(
        n=len(done),
        seeds=" ".join(map(str, seeds)),
        run_dirs=list(done["run_dir"]),
        attempts=int(done["attempts"].fillna(1).max()),
    )
    return row


def _per_run(runs: pd.DataFrame) -> dict[str, dict]:
    """What Figure 2 draws of each run of a row (a mean over seeds would fit none of them): its one-time
    first-step work, left out of its time axis, and its time-to-target point (step, seconds) where it had one."""
    out = {}
    for _, r in runs.iterrows():
        hit = (float(r["target_step"]), float(r["target_s"])) if r["target_reached"] is True else None
        out[r["run_dir"]] = {"compile_s": r["compile_s"], "hit": hit}
    return out


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per :data:`ROW` of the selected runs, with ``n``, ``seeds``, ``run_dirs``, ``<figure>_sd`` and
    ``target_reached_n``; then ``setting_note`` (:func:`add_setting_notes`)."""
    if runs.empty:
        empty = runs.assign(
            n=pd.Series(dtype="int64"), seeds="", run_dirs=None, target_reached_n=0, setting_note="", match_note=""
        )
        for col in _spread_columns(runs):
            empty[f"{col}_sd"] = pd.Series(dtype="float64")
        return empty
    means, spreads = _mean_columns(runs), _spread_columns(runs)
    rows = [_aggregate_row(group, means, spreads) for _, group in runs.groupby(list(ROW), dropna=False, sort=False)]
    table = pd.DataFrame(rows)
    for col in ("nodes", "gpus_per_node", "gpus", "batch_size", "steps", "seed"):
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("Int64")
    table.attrs["metric_columns"] = records.metric_columns(runs)
    return add_setting_notes(table)


# ---------------------------------------------------------------------------------------------- notes
def _value_text(value) -> str:
    return "—" if value is None else json.dumps(value, default=str) if not isinstance(value, str) else value


def differing_keys(cell: pd.DataFrame) -> list[str]:
    """Config keys in which some optimizer's rows of one cell differ from each other (seed left out)."""
    keys: set[str] = set()
    for _, same in cell.groupby(["optim", "variant"], sort=False):
        items = [i if isinstance(i, dict) else {} for i in same["config_items"]]
        for key in set().union(*items):
            if len({_value_text(i.get(key)) for i in items}) > 1:
                keys.add(key)
    return sorted(keys)


def add_setting_notes(rows: pd.DataFrame) -> pd.DataFrame:
    """``setting_note``: "train.eval_every=0" where an optimizer has several rows in a cell, naming the keys
    they differ in; ``match_note``: the same less the optimizer's own keys (optim.*), which the speedup's
    baseline row must share (SGDM's learning rate is never Birder's)."""
    rows = rows.copy()
    rows["setting_note"], rows["match_note"] = "", ""
    for _, cell in rows.groupby(list(CELL), dropna=False, sort=False):
        keys = differing_keys(cell)
        for i in cell.index:
            items = rows.at[i, "config_items"] if isinstance(rows.at[i, "config_items"], dict) else {}
            rows.at[i, "setting_note"] = ", ".join(f"{k}={_value_text(items.get(k))}" for k in keys)
            rows.at[i, "match_note"] = ", ".join(
                f"{k}={_value_text(items.get(k))}" for k in keys if not k.startswith("optim.")
            )
    return rows
