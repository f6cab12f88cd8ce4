"""Time to target against the link rate: ``tables/crossover.md|csv`` and ``figures/crossover_<task>.png``.

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

import numpy as np
import pandas as pd

from birder_repro.perf.advise import LINK_GRID
from birder_repro.perf.advisor import comm_rank, freeze_step, one_node_profiles
from birder_repro.perf.advisor import profile_key as _profile_key

from .cells import fill_keys
from .display import fmt_layout, fmt_number, is_missing, optim_label, optim_rank, to_markdown

__all__ = [
    "BASELINES",
    "PREDICTED_LINKS",
    "TARGET_ERROR",
    "crossover_runs",
    "crossover_tables",
    "crossover_markdown",
    "crossover_figures",
    "crossovers",
    "band_text",
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
    from birder_repro.run.record import read_record

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


def _link_text(link: float) -> str:
    return "unshaped" if is_missing(link) else fmt_number(link)


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


def _crossing(links: np.ndarray, ratio: np.ndarray) -> float | None:
    """The link rate where ``ratio`` (optimizer time / best baseline time) first rises through 1, interpolated in
    log link rate; None where it never crosses (always faster, or never)."""
    for i in range(len(links) - 1):
        a, b = ratio[i], ratio[i + 1]
        if a < 1 <= b or a >= 1 > b:
            x0, x1 = math.log(links[i]), math.log(links[i + 1])
            return math.exp(x0 + (1 - a) * (x1 - x0) / (b - a))
    return None


def _rel_se(point) -> float:
    """The standard error of a point's mean time relative to it (sample sd / mean / sqrt(seeds)); 0 for one seed."""
    sd, mean, n = point.get("measured_sd"), point.get("measured_s"), point.get("reached")
    return 0.0 if is_missing(sd) or not n or not mean else float(sd) / float(mean) / math.sqrt(int(n))


def _band(links: np.ndarray, ratio: np.ndarray, spread: np.ndarray) -> tuple[float | None, float | None]:
    """The measured crossover's seed band: where the ratio one standard error up and one down cross 1 (``spread``:
    the ratio's relative standard error at each link, the two means' combined). An end that does not cross
    within the measured links is None: the crossover may lie beyond them. Rising ratios assumed (compression
    pays below its crossover); for a falling one the two ends swap."""
    up, down = _crossing(links, ratio * (1 + spread)), _crossing(links, ratio * (1 - spread))
    rising = ratio[-1] >= ratio[0]
    low, high = (up, down) if rising else (down, up)
    if low is None and high is None and not ((ratio * (1 + spread) >= 1).any() and (ratio * (1 - spread) < 1).any()):
        return None  # the band does not reach 1 anywhere measured
    return low, high


def band_text(band) -> str:
    """A seed band (:func:`_band`) in words: ``280-560``, ``up to 120``, ``300 and above``; a dash for none."""
    if not band:
        return "—"
    low, high = band
    if low is None and high is None:
        return "any measured link"
    if low is None:
        return f"up to {fmt_number(high, 3)}"
    if high is None:
        return f"{fmt_number(low, 3)} and above"
    return f"{fmt_number(low, 3)}-{fmt_number(high, 3)}"


def _unshaped_link() -> float:
    """Where the model puts an unshaped link: conf/cluster/emulated.yaml's ``perf.inter_mbit``."""
    from birder_repro.perf.emulated import _spec

    return float(_spec(None).inter_mbit)


def crossovers(table: pd.DataFrame) -> list[dict]:
    """Per comparison and compressed optimizer: the crossover against the fastest baseline, measured and predicted."""
    out = []
    models = table.attrs.get("models", {})
    for comparison, rows in table.groupby("comparison", sort=False):
        measured = rows[rows["source"] == "measured"].copy()
        measured["x"] = measured["link"].fillna(_unshaped_link())
        # a baseline with no run that reached the target at a link (a synthetic-data sweep) sets no crossover there
        base = measured[measured["optim"].isin(BASELINES) & measured["measured_s"].notna()]
        if base.empty:
            continue
        best = base.groupby("x")["measured_s"].min()
        base_series = rows[rows["optim"].isin(BASELINES)]["series"].unique()
        for series, mine in measured[~measured["optim"].isin(BASELINES)].groupby("series", sort=False):
            mine = mine.set_index("x").sort_index()
            xs = [x for x in mine.index if x in best.index and not math.isnan(mine.loc[x, "measured_s"])]
            ratio = np.array([mine.loc[x, "measured_s"] / best[x] for x in xs])
            fastest = base.loc[base.groupby("x")["measured_s"].idxmin()].set_index("x")
            spread = np.array([math.hypot(_rel_se(mine.loc[x]), _rel_se(fastest.loc[x])) for x in xs])
            found = {
                "comparison": comparison,
                "optim": mine["optim"].iloc[0],
                "variant": mine["variant"].iloc[0],
                "measured": _crossing(np.array(xs), ratio) if len(xs) > 1 else None,
                # compression pays below the crossover when its ratio rises through 1 with the link rate
                # (the usual case), above it where the ratio falls through 1
                "measured_faster_below": bool(len(ratio) and ratio[0] < 1),
                "measured_ratios": dict(zip(xs, ratio)),
                "measured_band": _band(np.array(xs), ratio, spread) if len(xs) > 1 else None,
                "faster_everywhere_measured": bool(len(ratio) and (ratio < 1).all()),
                "slower_everywhere_measured": bool(len(ratio) and (ratio >= 1).all()),
            }
            model = models.get(series)
            base_models = [(models.get(s), rows[rows["series"] == s]["steps"].mean()) for s in base_series]
            base_models = [(m, s) for m, s in base_models if m is not None and not math.isnan(s)]
            if model is not None and base_models:
                steps = mine["steps"].mean()
                mine_t = np.array([model.time_to_target(steps, x) for x in GRID])
                base_t = np.min([[m.time_to_target(s, x) for x in GRID] for m, s in base_models], axis=0)
                ratio_p = mine_t / base_t
                found.update(
                    predicted=_crossing(GRID, ratio_p),
                    grid_ratio=ratio_p,
                    paper_regime=_paper_regime(models, rows, base_models, model, steps),
                )
            out.append(found)
    return out


def _paper_regime(models, rows, base_models, model, steps) -> dict | None:
    """The link where the model puts SGDM's communication share at the paper's (60 %), and there the
    optimizer's predicted time to target over the fastest baseline's."""
    sgdm = [s for s in rows[rows["optim"] == "sgdm"]["series"].unique() if models.get(s) is not None]
    if not sgdm:
        return None
    shares = np.array([models[sgdm[0]].step_s(x)[2] for x in GRID])
    below = np.nonzero(shares <= PAPER_COMM_SHARE)[0]
    if not len(below) or below[0] == 0:
        return None
    link = float(GRID[below[0]])
    base = min(m.time_to_target(s, link) for m, s in base_models)
    return {"link": link, "share": float(shares[below[0]]), "speedup": base / model.time_to_target(steps, link)}


def _cell(row) -> str:
    meas, pred = row["measured_s"], row["predicted_s"]
    if row["source"] == "predicted":
        return f"({fmt_number(pred, 3)})"
    if row["source"] == NOT_RUN:
        return f"not run ({fmt_number(pred, 3)})"
    if is_missing(meas):
        return f"not reached ({row['reached']} of {row['runs']})"
    sd = "" if is_missing(row["measured_sd"]) else f" ± {fmt_number(row['measured_sd'], 2)}"
    return f"{fmt_number(meas, 3)}{sd}" + ("" if is_missing(pred) else f" ({fmt_number(pred, 3)})")


NOTES = (
    "Each cell: the measured time to target in seconds (the training clock; mean ± sample sd where several "
    "seeds ran), and in brackets the performance model's: the run's own steps to target times the model's "
    "step time at that link, from a 1-node run's profile (birder_repro.report.crossover). Rows marked "
    "`predicted` are beyond the emulated links: the model alone, with the measured steps. `not run (x)`: a "
    "link this comparison ran and this optimizer did not (make time-to-accuracy runs only the methods that can "
    "be fastest at its two slowest links): the model's time there, with the optimizer's mean measured steps.",
    "SGDM's communication share: of its measured step (`step_time_s`), or the model's on predicted rows (in "
    "brackets where SGDM did not run).",
    "The crossover: the link rate below which the optimizer reaches the target sooner than the fastest "
    "uncompressed or 16-bit baseline (" + ", ".join(BASELINES) + "), interpolated in log link rate.",
)


def crossover_markdown(table: pd.DataFrame, per_run: pd.DataFrame) -> str:
    lines = ["# Time to target against the link rate: where compression pays", ""] + [f"- {n}" for n in NOTES]
    if table.empty:
        return "\n".join(lines + ["", "No comparison of the same runs over two link rates or more."]) + "\n"
    found = crossovers(table)
    for comparison, rows in table.groupby("comparison", sort=False):
        first = rows.iloc[0]
        goal = (
            f"{first['target_metric']} {'<=' if first['target_direction'] == 'lower' else '>='} "
            f"{fmt_number(first['target_value'])}"
        )
        lines += ["", f"## {first['task']}: {fmt_layout(first)}, {first['run_length']}, time to {goal}", ""]
        order = rows.assign(_r=optim_rank(rows["optim"])).sort_values(["_r", "variant"], kind="stable")
        names = list(dict.fromkeys(optim_label(o, v) for o, v in zip(order["optim"], order["variant"])))
        wide: dict[tuple, dict] = {}
        for _, r in rows.iterrows():
            row_source = "predicted" if r["source"] == "predicted" else "measured"  # not run: in its link's row
            key = (row_source, UNSHAPED_KEY if is_missing(r["link"]) else float(r["link"]))
            entry = wide.setdefault(
                key,
                {
                    "link, Mbit/s": _link_text(r["link"]) + (" (predicted)" if r["source"] == "predicted" else ""),
                    "SGDM's comm. share": "",
                },
            )
            entry[optim_label(r["optim"], r["variant"])] = _cell(r)
            if r["optim"] == "sgdm" and not is_missing(r["comm_share"]):
                share = f"{100 * r['comm_share']:.0f} %"
                entry["SGDM's comm. share"] = f"({share})" if r["source"] == NOT_RUN else share
        keys = sorted(wide, key=lambda k: (k[0] == "predicted", math.inf if k[1] == UNSHAPED_KEY else k[1]))
        lines.append(
            to_markdown(
                pd.DataFrame(
                    [{c: wide[k].get(c, "") for c in ["link, Mbit/s", "SGDM's comm. share", *names]} for k in keys]
                )
            )
        )
        mine = per_run[per_run["comparison"] == comparison] if not per_run.empty else per_run
        errors = mine["error"].dropna().abs() if not mine.empty else pd.Series(dtype=float)
        if len(errors):
            med = float(errors.median())
            verdict = "meets" if med <= TARGET_ERROR else "MISSES"
            lines += [
                "",
                f"The model against the measured times: median |predicted / measured - 1| "
                f"{100 * med:.1f} % over {len(errors)} runs, worst {100 * float(errors.max()):.1f} % "
                f"({verdict} the target of {100 * TARGET_ERROR:.0f} %).",
            ]
        lines += ["", "Crossovers (against the fastest baseline at each link):", ""]
        for c in [c for c in found if c["comparison"] == comparison]:
            lines.append("- " + _crossover_text(c))
    return "\n".join(lines) + "\n"


def _crossover_text(c: dict) -> str:
    name = optim_label(c["optim"], c["variant"])
    if c["measured"] is not None:
        side = "below" if c.get("measured_faster_below", True) else "above"
        meas = f"measured: faster {side} about {fmt_number(c['measured'], 3)} Mbit/s"
        if c.get("measured_band"):
            meas += f" (seed band {band_text(c['measured_band'])})"
    elif c["faster_everywhere_measured"]:
        meas = "measured: faster at every link run"
    else:
        meas = "measured: slower at every link run"
    ratios = ", ".join(
        f"{_link_text(x) if x < 9999 else 'unshaped'} {r:.2f}x" for x, r in sorted(c["measured_ratios"].items())
    )
    text = f"**{name}**: {meas} (its time over the fastest baseline's: {ratios})"
    if "predicted" in c:
        pred = c["predicted"]
        text += "; predicted: " + (
            f"faster below about {fmt_number(pred, 3)} Mbit/s"
            if pred is not None
            else (
                "faster on every link from 10 Mbit/s to 100 Gbit/s"
                if c["grid_ratio"][-1] < 1
                else "slower on every link from 10 Mbit/s to 100 Gbit/s"
            )
        )
        regime = c.get("paper_regime")
        if regime:
            text += (
                f"; where SGDM's communication share is the paper's 60 % (the model: at "
                f"{fmt_number(regime['link'], 3)} Mbit/s), {regime['speedup']:.2f}x the fastest baseline's "
                "speed to the target"
            )
    return text


def csv_text(table: pd.DataFrame) -> str | None:
    if table.empty:
        return None
    return table.drop(columns=["comparison", "series"]).to_csv(index=False)


# --------------------------------------------------------------------------------------------------------------
# Figure


def crossover_figures(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per comparison: time to target (log) against the link rate (log); measured points with their
    spread, the model's lines over the fine grid, the unshaped link at the model's rate for it."""
    from .figstyle import optim_style, pyplot

    if table.empty:
        return []
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    models = table.attrs.get("models", {})
    unshaped = _unshaped_link()
    written = []
    for _comparison, rows in table.groupby("comparison", sort=False):
        if not rows.loc[rows["source"] == "measured", "measured_s"].notna().any():
            continue  # no run of the comparison reached its target (a synthetic-data sweep): nothing to draw
        index = len(written)
        fig, ax = plt.subplots(figsize=(7.5, 6.4))
        for series, s in rows.groupby("series", sort=False):
            style = optim_style(s["optim"].iloc[0], s["variant"].iloc[0] or "")
            label = optim_label(s["optim"].iloc[0], s["variant"].iloc[0])
            m = s[s["source"] == "measured"].assign(x=lambda d: d["link"].fillna(unshaped)).sort_values("x")
            ax.errorbar(
                m["x"],
                m["measured_s"],
                yerr=m["measured_sd"].fillna(0),
                fmt="o",
                color=style["color"],
                label=f"{label}, measured",
                capsize=3,
            )
            model = models.get(series)
            if model is not None and not math.isnan(s["steps"].mean()):
                ax.plot(
                    GRID,
                    [model.time_to_target(s["steps"].mean(), x) for x in GRID],
                    color=style["color"],
                    linestyle=style["linestyle"],
                    linewidth=1.2,
                    label=f"{label}, model",
                )
        ax.axvline(unshaped, color="0.7", linewidth=0.8)
        ax.text(unshaped, ax.get_ylim()[1], " unshaped", color="0.4", fontsize=7, va="top")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("inter-node link, Mbit/s (each node's, both directions)")
        ax.set_ylabel("time to target, s (training clock)")
        first = rows.iloc[0]
        ax.set_title(
            f"{first['task']}: {fmt_layout(first)}, time to {first['target_metric']} "
            f"{fmt_number(first['target_value'])}",
            fontsize=10,
        )
        ax.grid(True, which="both", alpha=0.3)
        # below the axes: ten methods' lines and points inside them hid the fast links' points and the
        # unshaped marker
        ax.legend(fontsize=6.5, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
        fig.tight_layout()
        path = out_dir / f"crossover_{first['task']}{'' if index == 0 else f'_{index}'}.png"
        fig.savefig(path, dpi=130, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
