"""Figure 2 of the Birder paper, convergence: ``fig2_<setting>_<layout>.png``, one per measured cell.

Training loss, and the task's headline metric on the evaluation set, against steps and against time, one line
per row of the task tables (an optimizer; every seed of the row drawn in its colour), from each run's
``metrics.jsonl``. The metric's curve holds the evaluations during training (every ``train.eval_every`` steps,
``eval/<metric>``) and ends at the final evaluation (``final/<metric>``, marked with a square); with
``train.eval_every=0`` the final evaluation is all there is, and the panel says so. The time axis is the run's
training clock (birder_repro.train.target): it starts at the first training step, with evaluations and the
first step's one-time work (JIT compilation) left out. Where a run has a target, it is a dotted line and the
run's time to target a star. Titles name only what is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from birder_repro.run.record import read_record

from .cells import SETTING
from .clock import read_log, steps_clock
from .display import METRIC_UNITS, is_missing, metric_label, optim_label
from .figstyle import figure_name, pyplot, row_style, short_title

LOSS_LABEL = "training loss, nats (cross-entropy)"  # every task's loss is a cross-entropy (tasks/)
STEP_LABEL = "step (optimizer steps)"


def read_metrics(run_dir: str | Path) -> pd.DataFrame:
    """A run's ``metrics.jsonl`` (birder_repro.train.logger) as a frame; empty where it has none."""
    return pd.DataFrame(read_log(run_dir))


def time_axis(metrics: pd.DataFrame, compile_s, loop: Mapping[int, float] | None = None) -> tuple[pd.Series, str]:
    """Figure 2's time of each metrics.jsonl line: the training clock (``train_s``; ``loop``: the steps' clock
    re-read on the loop clock, report.clock, for a record written before it) less the first step's one-time work
    (the record's ``compile_s``), as time_to_target counts it; records written before the clock existed fall
    back to ``time_s`` (seconds since the logger started, start-up and JIT included)."""
    if "train_s" in metrics and metrics["train_s"].notna().any():
        offset = 0.0 if is_missing(compile_s) else float(compile_s)
        clock = metrics["train_s"] if not loop else metrics["step"].map(loop).fillna(metrics["train_s"])
        return (clock - offset).clip(lower=0.0), "training time from the first step, s"
    return metrics["time_s"], "wall-clock time since the logger started, s"


def series(metrics: pd.DataFrame, column: str) -> pd.DataFrame:
    """The lines of ``metrics`` that hold ``column``, one per step (a resumed run logs the steps after its
    checkpoint again: the last attempt's line counts), in step order."""
    if column not in metrics:
        return pd.DataFrame(columns=["step", "t", column])
    points = metrics.dropna(subset=[column]).drop_duplicates("step", keep="last")
    return points.sort_values("step", kind="stable")


def metric_axis_label(metric: str) -> str:
    """ "top-1 on the evaluation set, %": the metric's name and its unit where it has one."""
    unit = METRIC_UNITS.get(metric)
    return f"{metric_label(metric)} on the evaluation set" + (f", {unit}" if unit else "")


def row_label(row) -> str:
    """A row's legend entry: its optimizer, its setting where the cell holds several, its seeds, divergence."""
    label = optim_label(row["optim"], row["variant"])
    if row.get("setting_note"):
        label += f" [{row['setting_note']}]"
    n = row.get("n")
    if not is_missing(n) and int(n) > 1:
        label += f" ({int(n)} seeds)"
    if row.get("status") == "diverged":
        step = row.get("diverged_at_step")
        label += ": diverged" + ("" if is_missing(step) else f" at step {int(step)}")
    return label


curve_label = row_label  # the name tests and earlier code use


def _seconds(value) -> float:
    return 0.0 if is_missing(value) else float(value)


def _runs_of(row) -> list[str]:
    dirs = row.get("run_dirs")
    return list(dirs) if isinstance(dirs, list) and dirs else [row["run_dir"]]


def curves(rows: pd.DataFrame) -> list[dict]:
    """Per run of each row of a cell: its label (the row's first run only), style, metrics.jsonl with a time
    column ``t``, and its time-to-target point (step, seconds) where it reached the target."""
    found = []
    for _, r in rows.iterrows():
        per_run = r.get("per_run") if isinstance(r.get("per_run"), dict) else {}
        target = None if is_missing(r.get("target_value")) else (r["target_metric"], float(r["target_value"]))
        for run_dir in _runs_of(r):
            m = read_metrics(run_dir)
            if m.empty or "loss" not in m:
                continue
            own = per_run.get(run_dir, {"compile_s": r.get("compile_s"), "hit": None})
            xlabel = "time, s"
            if "time_s" in m or "train_s" in m:
                loop = steps_clock(read_record(Path(run_dir)), run_dir, _seconds(own["compile_s"]))
                m["t"], xlabel = time_axis(m, own["compile_s"], loop)
            first = not any(c["row"] == r.name for c in found)  # the row's legend entry, once
            found.append(
                {
                    "row": r.name,
                    "label": row_label(r) if first else None,
                    "style": row_style(r),
                    "headline": r["headline_metric"],
                    "metrics": m,
                    "xlabel": xlabel,
                    "hit": own["hit"],
                    "target": target,
                }
            )
    return found


def _headline(found: list[dict]) -> str | None:
    """The headline metric some run evaluated, during training or at the end."""
    for c in found:
        h = c["headline"]
        if isinstance(h, str) and (f"eval/{h}" in c["metrics"] or f"final/{h}" in c["metrics"]):
            return h
    return None


def _draw_metric(axes, c: dict, metric: str) -> tuple[bool, bool]:
    """A run's metric curve: the evaluations during training, then the final one (a square). Returns
    (drew an evaluation during training, drew a final evaluation)."""
    during = series(c["metrics"], f"eval/{metric}").rename(columns={f"eval/{metric}": "value"})
    final = series(c["metrics"], f"final/{metric}").rename(columns={f"final/{metric}": "value"})
    line = pd.concat([during, final], ignore_index=True)
    for ax, x in zip(axes, ("step", "t")):
        if line.empty or x not in line:
            continue
        ax.plot(line[x], line["value"], label=c["label"], marker="o", markersize=3, **c["style"])
        if not final.empty:
            ax.plot(
                final[x],
                final["value"],
                marker="s",
                markersize=7,
                linestyle="none",
                color=c["style"]["color"],
                markeredgecolor="black",
            )
    return not during.empty, not final.empty


def _draw_target(axes, found: list[dict], metric: str) -> tuple[bool, bool]:
    """The target as a dotted line and a star where each run first reached it (its time to target).
    Returns (drew a target line, drew a star)."""
    targets = {c["target"] for c in found if c["target"] and c["target"][0] == metric}
    for _, value in targets:
        for ax in axes:
            ax.axhline(value, color="0.3", linestyle=":", linewidth=1)
    stars = False
    for c in found:
        if c["hit"] is None or not c["target"] or c["target"][0] != metric:
            continue
        for ax, x in zip(axes, c["hit"]):
            ax.plot(
                [x],
                [c["target"][1]],
                marker="*",
                markersize=11,
                color=c["style"]["color"],
                markeredgecolor="black",
                linestyle="none",
            )
        stars = True
    return bool(targets), stars


def _loss_panel(axes, found: list[dict]) -> None:
    for c in found:
        points = series(c["metrics"], "loss")
        axes[0].plot(points["step"], points["loss"], label=c["label"], **c["style"])
        if "t" in points:
            axes[1].plot(points["t"], points["loss"], label=c["label"], **c["style"])
    for ax in axes:
        ax.set_ylabel(LOSS_LABEL, fontsize=8)


def _metric_panel(axes, found: list[dict], metric: str) -> list[str]:
    """The headline metric's panel; returns what its marks mean, for the title."""
    drawn = [_draw_metric(axes, c, metric) for c in found]
    line, star = _draw_target(axes, found, metric)
    for ax in axes:
        ax.set_ylabel(metric_axis_label(metric), fontsize=8)
    marks = []
    if any(during for during, _ in drawn):
        marks.append("dots: evaluations during training")
    else:
        marks.append("final evaluation only (train.eval_every=0)")
    if any(final for _, final in drawn):
        marks.append("square: final evaluation")
    if line:
        marks.append("dotted: target")
    if star:
        marks.append("star: time to target")
    return marks


def convergence_figure(rows: pd.DataFrame):
    """Figure 2 of one measured cell (its rows from tables.cell_table), or None where no run logged a loss."""
    found = curves(rows)
    if not found:
        return None
    plt = pyplot()
    metric = _headline(found)
    # sharex: the metric's steps and times on the loss's scale, also where only the final evaluation is drawn
    fig, axes = plt.subplots(2 if metric else 1, 2, figsize=(9, 6.6 if metric else 3.4), squeeze=False, sharex="col")
    _loss_panel(axes[0], found)
    marks = _metric_panel(axes[1], found, metric) if metric else []
    for panel in axes:
        panel[0].set_xlabel(STEP_LABEL)
        panel[1].set_xlabel(found[0]["xlabel"])
        panel[1].set_xlim(left=0)  # the clock's zero: the first training step
        for ax in panel:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    first = rows.iloc[0]
    title = f"{short_title(rows)}, {int(first['gpus'])} processes ({int(first['nodes'])}x{int(first['gpus_per_node'])})"
    fig.suptitle(title + ("\n" + "; ".join(marks) if marks else ""), fontsize=9)
    fig.tight_layout()
    return fig


def convergence_figures(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Figure 2 for every measured cell with curves: ``fig2_<setting>_<nodes>x<gpus>.png``."""
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    measured = cells[cells["source"] == "measured"]
    for _, rows in measured.groupby([*SETTING, "nodes", "gpus_per_node"], dropna=False, sort=False):
        fig = convergence_figure(rows)
        if fig is None:
            continue
        first = rows.iloc[0]
        path = out_dir / (figure_name(rows, "fig2")[:-4] + f"_{int(first['nodes'])}x{int(first['gpus_per_node'])}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
