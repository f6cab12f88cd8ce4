"""The crossovers of ``tables/crossover.md`` (:mod:`birder_repro.report.crossover` builds the points): per
comparison and compressed optimizer, the link rate below which it reaches the target sooner than the fastest of
the baselines (:data:`~birder_repro.report.crossover.BASELINES`), measured (interpolated in log link rate
between the two measured links where the order changes, with its seed band) and predicted (on the model's
fine grid), and where the model puts SGDM's communication share at the paper's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .crossover import BASELINES, GRID, PAPER_COMM_SHARE, unshaped_link
from .display import fmt_number, is_missing

__all__ = ["crossovers", "crossing", "seed_band", "band_text"]


def crossing(links: np.ndarray, ratio: np.ndarray) -> float | None:
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


def seed_band(links: np.ndarray, ratio: np.ndarray, spread: np.ndarray) -> tuple[float | None, float | None]:
    """The measured crossover's seed band: where the ratio one standard error up and one down cross 1 (``spread``:
    the ratio's relative standard error at each link, the two means' combined). An end that does not cross
    within the measured links is None: the crossover may lie beyond them. Rising ratios assumed (compression
    pays below its crossover); for a falling one the two ends swap."""
    up, down = crossing(links, ratio * (1 + spread)), crossing(links, ratio * (1 - spread))
    rising = ratio[-1] >= ratio[0]
    low, high = (up, down) if rising else (down, up)
    if low is None and high is None and not ((ratio * (1 + spread) >= 1).any() and (ratio * (1 - spread) < 1).any()):
        return None  # the band does not reach 1 anywhere measured
    return low, high


def band_text(band) -> str:
    """A seed band (:func:`seed_band`) in words: ``280-560``, ``up to 120``, ``300 and above``; a dash for none."""
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


def crossovers(table: pd.DataFrame) -> list[dict]:
    """Per comparison and compressed optimizer: the crossover against the fastest baseline, measured and predicted."""
    out = []
    models = table.attrs.get("models", {})
    for comparison, rows in table.groupby("comparison", sort=False):
        measured = rows[rows["source"] == "measured"].copy()
        measured["x"] = measured["link"].fillna(unshaped_link())
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
                "measured": crossing(np.array(xs), ratio) if len(xs) > 1 else None,
                # compression pays below the crossover when its ratio rises through 1 with the link rate
                # (the usual case), above it where the ratio falls through 1
                "measured_faster_below": bool(len(ratio) and ratio[0] < 1),
                "measured_ratios": dict(zip(xs, ratio)),
                "measured_band": seed_band(np.array(xs), ratio, spread) if len(xs) > 1 else None,
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
                    predicted=crossing(GRID, ratio_p),
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
