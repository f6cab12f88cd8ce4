"""``tables/crossover.md|csv``: the points of :mod:`birder_repro.report.crossover` as one table per comparison
(measured and predicted times to target by link rate and optimizer), the model's error against the measured
times, and the crossovers of :mod:`birder_repro.report.crossover_find` in words.
"""

from __future__ import annotations

import math

import pandas as pd

from .crossover import BASELINES, NOT_RUN, TARGET_ERROR, UNSHAPED_KEY
from .crossover_find import band_text, crossovers
from .display import fmt_layout, fmt_number, is_missing, optim_label, optim_rank, to_markdown

__all__ = ["crossover_markdown", "crossover_text", "csv_text", "link_text", "NOTES"]


def link_text(link: float) -> str:
    return "unshaped" if is_missing(link) else fmt_number(link)


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
                    "link, Mbit/s": link_text(r["link"]) + (" (predicted)" if r["source"] == "predicted" else ""),
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
            lines.append("- " + crossover_text(c))
    return "\n".join(lines) + "\n"


def crossover_text(c: dict) -> str:
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
        f"{link_text(x) if x < 9999 else 'unshaped'} {r:.2f}x" for x, r in sorted(c["measured_ratios"].items())
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
