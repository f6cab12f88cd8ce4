"""The paper's figures from run records (Birder paper, Figures 2, 3 and 4), as PNG files.

- Figure 2, convergence (:mod:`birder_repro.report.convergence`): loss and the headline metric against steps
  and training time, one line per row of the task tables, ending at the final evaluation.
- Figure 3, throughput: ``fig3_<setting>.png``. Over several layouts, throughput against the number of processes
  (a log axis: the layouts double), one colour per row: measured runs solid with circles, predicted records
  (``mode=predict``) dashed with crosses; on one layout, one bar per row. Throughput axes start at zero; the
  bars or points carry the spread over seeds (± one sample standard deviation) where a row has several.
- Figure 4, time per iteration as stacked bars of compute, communication, compression and data wait, per
  optimizer and layout: ``fig4_<source>_<setting>.png`` (measured and predicted apart).

Every optimizer has its own colour and line style in every figure (:func:`figstyle.optim_style`).
matplotlib is a dependency of the package; it is imported only when a figure is drawn (:func:`drawing`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .cells import SETTING
from .convergence import convergence_figure, convergence_figures, read_metrics, time_axis
from .display import optim_label
from .documents import settings
from .figstyle import device_unit, figure_name, optim_style, pyplot, row_style, short_title

__all__ = [
    "convergence_figure",
    "convergence_figures",
    "drawing",
    "optim_style",
    "read_metrics",
    "step_time_figures",
    "throughput_figure",
    "throughput_figures",
    "time_axis",
]


def drawing() -> bool:
    """Whether ``python -m birder_repro.report`` draws its figures: always. The one switch for them, which the
    report's tests turn off (importing matplotlib and drawing cost seconds)."""
    return True


PARTS = (
    ("compute", "compute", "#4c72b0"),
    ("communication", "communication", "#dd8452"),
    ("compression", "compression", "#55a868"),
    ("data_wait", "data wait", "#c44e52"),
)
SOURCE_STYLE = {"measured": dict(linestyle="-", marker="o"), "predicted": dict(linestyle="--", marker="x")}
# A scale a reader of Figure 3 sees whole: from zero, with room above the highest bar or point for the legend.
HEADROOM = 1.2


def _label(row) -> str:
    note = f" [{row['setting_note']}]" if row.get("setting_note") else ""
    return optim_label(row["optim"], row["variant"]) + note


def _throughput_label(mode: str) -> str:
    basis = "whole run" if mode == "whole" else "1-bit: compression stage"
    return f"throughput, samples/s ({basis})"


def _bars(ax, rows: pd.DataFrame) -> None:
    """One layout: a bar per row (measured solid, predicted hatched), its spread over seeds as an error bar; a
    diverged row's place says so (its record holds no throughput)."""
    labels = []
    for x, (_, r) in enumerate(rows.iterrows()):
        labels.append(_label(r) + ("" if r["source"] == "measured" else "\n(predicted)"))
        if r["status"] == "diverged" or pd.isna(r["throughput_shown"]):
            ax.text(
                x,
                0,
                " " + (r["status"] if isinstance(r["status"], str) else "no figure"),
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=8,
            )
            continue
        colour = row_style(r)["color"]
        looks = (
            dict(color=colour, edgecolor="black")
            if r["source"] == "measured"
            else dict(facecolor="white", edgecolor=colour, hatch="//")
        )  # predicted: hatched in the optimizer's colour
        ax.bar(x, r["throughput_shown"], linewidth=0.8, yerr=r.get("throughput_shown_sd"), capsize=4, **looks)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    first = rows.iloc[0]
    layout = f"{int(first['nodes'])}x{int(first['gpus_per_node'])}"
    ax.set_xlabel(f"optimizer, at {int(first['gpus'])} {device_unit(rows)} ({layout})")


def _lines(ax, rows: pd.DataFrame) -> None:
    """Several layouts: throughput against #GPUs, a line per row and source, error bars over seeds."""
    for _, line in rows.groupby(["optim", "variant", "setting_note", "source"], sort=False):
        line = line.dropna(subset=["gpus", "throughput_shown"]).sort_values("gpus")
        if line.empty:
            continue
        first = line.iloc[0]
        label = f"{_label(first)} ({first['source']})" + diverged_note(rows, line)
        ax.errorbar(
            line["gpus"].astype(float),
            line["throughput_shown"],
            yerr=line["throughput_shown_sd"],
            label=label,
            capsize=3,
            color=row_style(first)["color"],
            **SOURCE_STYLE[first["source"]],
        )
    gpus = sorted(int(g) for g in rows["gpus"].dropna().unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel(f"number of {device_unit(rows)}; log scale, as the layouts double")
    ax.legend(fontsize=7, loc="upper left")


def _marks(rows: pd.DataFrame, one_layout: bool) -> str:
    """Figure 3's subtitle: what its marks mean, naming only marks that are drawn."""
    drawn = rows.dropna(subset=["throughput_shown"])
    several = drawn["n"].fillna(1).max() > 1 if "n" in drawn and len(drawn) else False
    marks = ["mean over seeds" if several else "one run each"]
    if drawn["throughput_shown_sd"].notna().any():
        marks.append("error bars: ± 1 sd over seeds")
    if set(drawn["source"]) == {"measured", "predicted"}:
        marks.append("hatched: predicted" if one_layout else "solid: measured, dashed: predicted")
    return "; ".join(marks)


def throughput_figure(rows: pd.DataFrame, mode: str):
    """Figure 3 of one setting (measured and predicted rows together)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    one_layout = rows[["nodes", "gpus_per_node"]].drop_duplicates().shape[0] == 1
    (_bars if one_layout else _lines)(ax, rows)
    top = (rows["throughput_shown"] + rows["throughput_shown_sd"].fillna(0)).max()
    ax.set_ylim(0, HEADROOM * top if top > 0 else 1.0)  # from zero: bar heights and gaps read as ratios
    ax.set_ylabel(_throughput_label(mode), fontsize=9)
    ax.set_title(short_title(rows) + "\n" + _marks(rows, one_layout), fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def throughput_figures(cells: pd.DataFrame, out_dir: Path, mode: str) -> list[Path]:
    """Figure 3: one PNG per setting (measured and predicted together, told apart by line style or hatching)."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    keys = [k for k in SETTING if k != "source"]
    for _, rows in cells.groupby(keys, dropna=False, sort=False):
        fig = throughput_figure(rows, mode)
        path = out_dir / figure_name(rows, "fig3")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def diverged_note(rows: pd.DataFrame, line: pd.DataFrame) -> str:
    """Figure 3's legend note for a line's diverged layouts (no throughput point is drawn for them)."""
    first = line.iloc[0]
    mine = rows[
        (rows["optim"] == first["optim"])
        & (rows["variant"] == first["variant"])
        & (rows["setting_note"] == first["setting_note"])
        & (rows["source"] == first["source"])
    ]
    gpus = sorted(int(g) for g in mine.loc[mine["status"] == "diverged", "gpus"].dropna())
    return f"; diverged at {', '.join(map(str, gpus))} {device_unit(mine)}" if gpus else ""


def step_time_figures(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Figure 4: per setting and source, stacked bars of the step's parts per optimizer and layout."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for _, rows in settings(cells):
        rows = rows.dropna(subset=["step_ms_total"]).sort_values(["gpus", "nodes"], kind="stable")
        if rows.empty:
            continue
        labels = [
            f"{_label(r)}\n{int(r['gpus'])} ({int(r['nodes'])}x{int(r['gpus_per_node'])})" for _, r in rows.iterrows()
        ]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(rows) + 2), 4.2))
        bottom = pd.Series(0.0, index=rows.index)
        for part, name, colour in PARTS:
            values = rows[f"step_ms_{part}"].fillna(0.0)
            ax.bar(range(len(rows)), values, bottom=bottom, label=name, color=colour)
            bottom = bottom + values
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_xlabel(f"optimizer, {device_unit(rows)} (nodes x per node)", fontsize=8)
        ax.set_ylabel("time per iteration, ms (mean over seeds)")
        source = rows.iloc[0]["source"]
        ax.set_title(f"{source.upper()}: {short_title(rows)}", fontsize=9)
        # Headroom above the tallest bar, and the legend in a row there, so that it covers no bar.
        ax.set_ylim(0, 1.25 * float(bottom.max()) if float(bottom.max()) > 0 else 1.0)
        ax.legend(fontsize=7, ncol=len(PARTS), loc="upper left")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out_dir / figure_name(rows, "fig4", with_source=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
