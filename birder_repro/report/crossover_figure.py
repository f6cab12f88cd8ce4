"""``figures/crossover_<task>.png``: per comparison, time to target (log) against the link rate (log), the
measured points of :mod:`birder_repro.report.crossover` with the model's lines over its fine grid.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .crossover import GRID, unshaped_link
from .display import fmt_layout, fmt_number, optim_label

__all__ = ["crossover_figures"]


def crossover_figures(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per comparison: time to target (log) against the link rate (log); measured points with their
    spread, the model's lines over the fine grid, the unshaped link at the model's rate for it."""
    from .figstyle import optim_style, pyplot

    if table.empty:
        return []
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    models = table.attrs.get("models", {})
    unshaped = unshaped_link()
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
