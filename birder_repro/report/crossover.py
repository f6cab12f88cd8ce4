"""Time to target against the link rate: the points behind ``tables/crossover.md|csv`` and
``figures/crossover_<task>.png`` (the crossovers: :mod:`birder_repro.report.crossover_find`; the tables:
:mod:`birder_repro.report.crossover_render`; the figures: :mod:`birder_repro.report.crossover_figure`).

Where compression starts to pay. A *series* is one optimizer setting run at several link rates: measured runs
with a target, scored on the test set, on more than one node, whose configs differ only in the link
(``cluster.link_mbit``), in whether the run ended at its target (``train.stop_at_target``: the time to target
is the same) and in the seed. Series of one task, layout and length whose configs differ only in ``optim.*``
form one comparison.

Measured: at each link, the mean time to target over the series' runs that reached it (the training clock,
report.target). Predicted (the performance model, birder_repro.perf.model, implementation ``this``): each
run's own measured steps to target S times the model's step time at that link, from the profile of a 1-node
run of the same optimizer, model and batch (nothing of a multi-node run but its layout and link goes in, as
``make validate-emulated``): 1-bit Adam's first F steps (its freeze step) at the fp32 warmup's step time, the
rest at its compressed step's. The emulated cluster's links are conf/cluster/emulated.yaml's ``perf`` block
at the run's ``link_mbit`` (unshaped: its ``inter_mbit``). Beyond the measured links the model goes on
(:data:`PREDICTED_LINKS`), with each series' mean steps.

The crossover: the link rate below which an optimizer reaches the target sooner than the fastest of the
baselines that compress nothing or to 16 bits (:data:`BASELINES`): measured, between the two measured links
where the order changes (interpolated in log link rate), and predicted, on the model's fine grid.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from birder_repro.perf.advice_methods import comm_rank, freeze_step
from birder_repro.perf.advice_profiles import one_node_profiles
from birder_repro.perf.advice_profiles import profile_key as _profile_key
from birder_repro.perf.advise import LINK_GRID
from birder_repro.run.record import read_record

from .cells import fill_keys

__all__ = [
    "BASELINES",
    "PREDICTED_LINKS",
    "TARGET_ERROR",
    "crossover_runs",
    "crossover_tables",
    "StepModel",
    "unshaped_link",
    "NOT_RUN",
]

# The uncompressed and 16-bit exchanges a compressed optimizer must beat.
# The two-level ones are what topology-aware NCCL gives users on a cluster: the 16-bit baseline a reviewer asks for.
BASELINES = ("sgdm", "adamw", "sgdm_fp16", "sgdm_2level", "sgdm_bf16_2level", "bertadam")
# Link rates (Mbit/s) the model predicts beyond the measured ones, and the fine grid the crossovers are read on.
PREDICTED_LINKS = (1000.0, 10000.0, 100000.0)
GRID = LINK_GRID  # 10 Mbit/s to 100 Gbit/s (birder_repro.perf.advise, mode=advise's grid too)
TARGET_ERROR = 0.15  # the model's median |predicted / measured - 1| over the sweep should be at most this
PAPER_COMM_SHARE = 0.60  # SGDM's communication share of a 2-node step in the paper's Table 3 (ResNet-50, 10 GbE)
# Keys a series' runs may differ in (besides the seed, which report.identity leaves out).
FREE_KEYS = ("cluster.link_mbit", "train.stop_at_target")
NOT_RUN = "not run"  # a point's source: a link its comparison ran, this optimizer not; the model's time there
UNSHAPED_KEY = -1.0  # the unshaped link (NaN) where links are compared as set members


def _items(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _key(items: dict, drop) -> str:
    return json.dumps({k: v for k, v in items.items() if not drop(k)}, sort_keys=True, default=str)


def series_key(items: dict) -> str:
    return _key(items, lambda k: k in FREE_KEYS)


def comparison_key(items: dict) -> str:
    return _key(items, lambda k: k in FREE_KEYS or k.startswith("optim."))


def crossover_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The measured multi-node test-set runs with a target, with ``series`` and ``comparison`` keys; only
    comparisons whose runs cover two link rates or more."""
    need = {"eval_set", "config_items", "target_metric"}
    if frame.empty or not need <= set(frame.columns):
        return pd.DataFrame()
    runs = frame[
        (frame["source"] == "measured")
        & frame["target_metric"].notna()
        & (frame["nodes"] > 1)
        & (frame["eval_set"].astype("object").fillna("test") != "val")
    ]
    if runs.empty:
        return pd.DataFrame()
    runs = fill_keys(runs)
    runs["series"] = [series_key(_items(i)) for i in runs["config_items"]]
    runs["comparison"] = [comparison_key(_items(i)) for i in runs["config_items"]]
    runs["link"] = runs["link_mbit"].astype("float64")
    links = runs.groupby("comparison")["link"].agg(lambda s: s.fillna(UNSHAPED_KEY).nunique())
    return runs[runs["comparison"].isin(links[links >= 2].index)].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------------------
# The model's side


class StepModel:
    """The model's step times of one run's setting at any link: (warmup step, compressed step) seconds."""

    def __init__(self, rec: dict, profile) -> None:
        from birder_repro.perf.schemes import scheme_for_optim

        cfg = rec.get("config") or {}
        self.profile, self.rec = profile, rec
        self.scheme = scheme_for_optim(rec["optim"], ((cfg.get("optim") or {}).get("comm") or {}).get("scheme"))
        self.nodes, self.gpus = int(rec["cluster"]["nodes"]), int(rec["cluster"]["gpus_per_node"])
        self.batch = int(rec["batch_size"])
        self.freeze = freeze_step(cfg, int(rec.get("planned_steps") or rec["steps"]))
        self.local_steps = int((cfg.get("optim") or {}).get("local_steps") or 1)  # DiLoCo's H
        self.rank = comm_rank(cfg)  # PowerSGD's: its bytes and work (tuned, so it must be priced)
        self.cluster = (rec.get("cluster") or {}).get("name")

    def _spec(self, link: float | None):
        from birder_repro.perf.emulated import _spec

        return _spec(None if link is None or math.isnan(link) else float(link))

    def step_s(self, link: float | None, loop: bool = True) -> tuple[float, float, float]:
        """(warmup step s, compressed step s, communication share of the compressed step); ``loop``: on the
        training clock (the loop's own collectives included, perf.advise.step_times), else the timed step."""
        from birder_repro.perf.advise import step_times

        return step_times(
            self.profile,
            self._spec(link),
            self.nodes,
            self.gpus,
            self.scheme,
            self.batch,
            freeze=self.freeze,
            local_steps=self.local_steps,
            rank=self.rank,
            loop=loop,
        )

    def time_to_target(self, steps: float, link: float | None, loop: bool = True) -> float:
        from birder_repro.perf.advise import time_to_target

        warm, main, _ = self.step_s(link, loop)
        return time_to_target(steps, self.freeze, warm, main)


def _record(run_dir: str) -> dict | None:
    return read_record(Path(run_dir))


def _models(runs: pd.DataFrame, profiles: dict) -> dict[str, StepModel | None]:
    """A StepModel per series (None where no 1-node profile of its setting, or not an emulated cluster)."""
    out: dict[str, StepModel | None] = {}
    for series, rows in runs.groupby("series", sort=False):
        rec = _record(rows["run_dir"].iloc[0])
        profile = profiles.get(_profile_key(rec)[:-1] + ("emulated",)) if rec else None
        emulated = rec is not None and (rec.get("cluster") or {}).get("name") == "emulated"
        out[series] = StepModel(rec, profile) if profile is not None and emulated else None
    return out


# --------------------------------------------------------------------------------------------------------------
# Tables


def crossover_tables(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, per-run): one row per (series, link) with the measured mean and the predicted time to target,
    predicted-only rows at :data:`PREDICTED_LINKS`; and one row per run with its own prediction."""
    runs = crossover_runs(frame)
    if runs.empty:
        return pd.DataFrame(), pd.DataFrame()
    models = _models(runs, one_node_profiles(frame["run_dir"]))
    per_run, points = [], []
    for (comparison, series, link), rows in runs.groupby(["comparison", "series", "link"], dropna=False, sort=False):
        model = models.get(series)
        hit = rows[(rows["status"] == "completed") & (rows["target_reached"] == True)]  # noqa: E712
        preds = []
        for _, r in hit.iterrows():
            pred = model.time_to_target(float(r["target_step"]), link) if model else float("nan")
            preds.append(pred)
            per_run.append(
                {
                    "comparison": comparison,
                    "optim": r["optim"],
                    "variant": r["variant"],
                    "link": link,
                    "seed": r["seed"],
                    "steps": int(r["target_step"]),
                    "measured_s": r["target_s"],
                    "predicted_s": pred,
                    "error": pred / r["target_s"] - 1 if r["target_s"] else math.nan,
                    "run_dir": r["run_dir"],
                }
            )
        first = rows.iloc[0]
        comm = (rows["step_ms_communication"] / rows["step_ms_total"]).mean()
        points.append(
            {
                "comparison": comparison,
                "series": series,
                "task": first["task"],
                "optim": first["optim"],
                "variant": first["variant"],
                "nodes": first["nodes"],
                "gpus_per_node": first["gpus_per_node"],
                "gpus": first["gpus"],
                "run_length": first["run_length"],
                "target_metric": first["target_metric"],
                "target_value": first["target_value"],
                "target_direction": first["target_direction"],
                "link": link,
                "source": "measured",
                "runs": len(rows),
                "reached": len(hit),
                "measured_s": hit["target_s"].mean() if len(hit) else math.nan,
                "measured_sd": hit["target_s"].std() if len(hit) > 1 else math.nan,
                "steps": hit["target_step"].astype(float).mean() if len(hit) else math.nan,
                "predicted_s": statistics.mean(preds) if preds and model else math.nan,
                "comm_share": comm,
            }
        )
    table = pd.DataFrame(points)
    run_links = table.groupby("comparison")["link"].agg(lambda s: set(s.fillna(UNSHAPED_KEY)))
    extra = []
    for series, rows in table.groupby("series", sort=False):
        model, steps = models.get(series), rows["steps"].mean()
        if model is None or math.isnan(steps):
            continue
        # A link the comparison ran that this optimizer did not (make time-to-accuracy runs only the methods
        # that can be fastest at the slowest links): the model's time there, marked as not run.
        mine = set(rows["link"].fillna(UNSHAPED_KEY))
        missing = sorted(run_links[rows["comparison"].iloc[0]] - mine)
        not_run = [(math.nan if link == UNSHAPED_KEY else link, NOT_RUN) for link in missing]
        for link, source in [*not_run, *((link, "predicted") for link in PREDICTED_LINKS)]:
            if source == "predicted" and (rows["link"] == link).any():
                continue
            extra.append(
                {
                    **rows.iloc[0].to_dict(),
                    "link": link,
                    "source": source,
                    "runs": 0,
                    "reached": 0,
                    "measured_s": math.nan,
                    "measured_sd": math.nan,
                    "steps": steps,
                    "predicted_s": model.time_to_target(steps, link),
                    "comm_share": model.step_s(link)[2],
                }
            )
    table = pd.concat([table, pd.DataFrame(extra)], ignore_index=True) if extra else table
    table.attrs["models"] = models
    return table, pd.DataFrame(per_run)


def unshaped_link() -> float:
    """Where the model puts an unshaped link: conf/cluster/emulated.yaml's ``perf.inter_mbit``."""
    from birder_repro.perf.emulated import _spec

    return float(_spec(None).inter_mbit)
