"""The paper's figures from run records (Birder paper, Figures 2, 3 and 4), as PNG files.

- Figure 2, convergence: training loss (and the task's headline metric, where the run evaluated it during
  training) against steps and against time, one line per optimizer, from each run's ``metrics.jsonl``
  (measured runs only): ``fig2_<setting>_<layout>.png``, one per cell. The time axis is the run's training
  clock (birder_repro.train.target): it starts at the first training step, with evaluations and the first
  step's one-time work (JIT compilation) left out, and start-up before it; each optimizer's time to its
  target is marked (a dotted line at the target, a star where the run first reached it).
Every optimizer has its own colour and line style in every figure (:func:`optim_style`).

- Figure 3, throughput against the number of GPUs, one colour per optimizer: measured runs solid with
  circles, predicted records (``mode=predict``) dashed with crosses: ``fig3_<setting>.png``.
- Figure 4, time per iteration as stacked bars of compute, communication, compression and data wait, per
  optimizer and layout: ``fig4_<source>_<setting>.png`` (measured and predicted apart).

matplotlib is optional: it is not a dependency of the package, and without it no figure is drawn.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from .cells import SETTING
from .display import OPTIM_ORDER, is_missing, optim_label
from .documents import settings

PARTS = (("compute", "compute", "#4c72b0"), ("communication", "communication", "#dd8452"),
         ("compression", "compression", "#55a868"), ("data_wait", "data wait", "#c44e52"))
SOURCE_STYLE = {"measured": dict(linestyle="-", marker="o"), "predicted": dict(linestyle="--", marker="x")}
# One colour and one line style per optimizer, in tables.OPTIM_ORDER (11 optimizers; matplotlib's default cycle
# has 10 colours, which gave SGDM and Birder the same blue); names and variants beyond it take the next pairs.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#000000", "#aec7e8", "#ffbb78", "#98df8a")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2, 2, 2)))


def optim_style(optim: str, variant: str = "") -> dict:
    """The colour and line style of an optimizer (and Birder variant) in every figure: distinct pairs for the
    optimizers of tables.OPTIM_ORDER, then for other names by a stable index of the name."""
    index = OPTIM_ORDER.index(optim) if optim in OPTIM_ORDER and not variant else \
        len(OPTIM_ORDER) + sum(map(ord, f"{optim}/{variant}")) % (len(COLOURS) - len(OPTIM_ORDER))
    return {"color": COLOURS[index % len(COLOURS)], "linestyle": LINESTYLES[index % len(LINESTYLES)]}


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display on cluster nodes or CI
    import matplotlib.pyplot as plt

    return plt


def _safe(parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts))


def figure_name(rows: pd.DataFrame, prefix: str = "fig3", with_source: bool = False) -> str:
    """``<prefix>_[<source>_]<task>_<cluster>[_<link>]_<data>[_<model size>]_b<batch>.png``: a safe name."""
    first = rows.iloc[0]
    link = [] if pd.isna(first["link_mbit"]) else [f"{first['link_mbit']:g}mbit"]
    model = [] if first["model_size"] == "unknown" else [first["model_size"]]
    source = [first["source"]] if with_source else []
    parts = [prefix, *source, first["task"], first["cluster"], *link, first["data_source"], *model,
             f"b{first['batch_size']}"]
    return _safe(parts) + ".png"


def short_title(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    link = "" if pd.isna(first["link_mbit"]) else f" {first['link_mbit']:g} Mbit/s"
    return (f"{first['task']}: {first['cluster']}{link}, {first['data_source']} data, "
            f"{first['batch_size']}/process")


def throughput_figures(cells: pd.DataFrame, out_dir: Path, mode: str) -> list[Path]:
    """Figure 3: one PNG per setting (measured and predicted together, told apart by line style)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    keys = [k for k in SETTING if k != "source"]
    for _, rows in cells.groupby(keys, dropna=False, sort=False):
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for (optim, variant, source), line in rows.groupby(["optim", "variant", "source"], sort=False):
            line = line.dropna(subset=["gpus", "throughput_shown"]).sort_values("gpus")
            label = f"{optim_label(optim, variant)} ({source})" + diverged_note(rows, optim, variant, source)
            kwargs = {**SOURCE_STYLE.get(source, {}), "color": optim_style(optim, variant)["color"]}
            ax.plot(line["gpus"].astype(float), line["throughput_shown"], label=label, **kwargs)
        gpus = sorted(int(g) for g in rows["gpus"].dropna().unique())
        ax.set_xscale("log", base=2)  # layouts double, as the paper's 8, 16, 32, 64 GPUs
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("#GPUs (processes)")
        basis = "whole run" if mode == "whole" else "1-bit: compression stage"
        ax.set_ylabel(f"throughput, samples/s\n({basis})", fontsize=9)
        ax.set_title(short_title(rows) + "\nsolid: measured, dashed: predicted", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / figure_name(rows, "fig3")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def step_time_figures(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Figure 4: per setting and source, stacked bars of the step's parts per optimizer and layout."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for _, rows in settings(cells):
        rows = rows.dropna(subset=["step_ms_total"]).sort_values(["gpus", "nodes"], kind="stable")
        if rows.empty:
            continue
        labels = [f"{optim_label(o, v)}\n{int(g)} ({int(n)}x{int(m)})" for o, v, g, n, m in
                  zip(rows["optim"], rows["variant"], rows["gpus"], rows["nodes"], rows["gpus_per_node"])]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(rows) + 2), 4.2))
        bottom = pd.Series(0.0, index=rows.index)
        for part, name, colour in PARTS:
            values = rows[f"step_ms_{part}"].fillna(0.0)
            ax.bar(range(len(rows)), values, bottom=bottom, label=name, color=colour)
            bottom = bottom + values
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_ylabel("time per iteration, ms")
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


def curve_label(row) -> str:
    """Figure 2's label of a run: its optimizer, and "diverged at step N" where it diverged (its curve stops
    there: the loss it logged was non-finite)."""
    label = optim_label(row["optim"], row["variant"])
    if row.get("status") != "diverged":
        return label
    step = row.get("diverged_at_step")
    return f"{label}: diverged" + ("" if pd.isna(step) else f" at step {int(step)}")


def diverged_note(rows: pd.DataFrame, optim: str, variant: str, source: str) -> str:
    """Figure 3's legend note for an optimizer's diverged layouts (no throughput point is drawn for them)."""
    mine = rows[(rows["optim"] == optim) & (rows["variant"] == variant) & (rows["source"] == source)]
    gpus = sorted(int(g) for g in mine.loc[mine["status"] == "diverged", "gpus"].dropna())
    return f"; diverged at {', '.join(map(str, gpus))} GPUs" if gpus else ""


def read_metrics(run_dir: str | Path) -> pd.DataFrame:
    """A run's ``metrics.jsonl`` (birder_repro.logger) as a frame; empty where it has none."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return pd.DataFrame()
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
    return pd.DataFrame(rows)


def time_axis(metrics: pd.DataFrame, compile_s) -> tuple[pd.Series, str]:
    """Figure 2's time of each metrics.jsonl line: the training clock (``train_s``) less the first step's
    one-time work (the record's ``compile_s``), as time_to_target counts it; records written before the
    clock existed fall back to ``time_s`` (seconds since the logger started, start-up and JIT included)."""
    if "train_s" in metrics and metrics["train_s"].notna().any():
        offset = 0.0 if is_missing(compile_s) else float(compile_s)
        return (metrics["train_s"] - offset).clip(lower=0.0), "training time from the first step, s"
    return metrics["time_s"], "wall-clock time since the logger started, s"


def _curves(rows: pd.DataFrame) -> list[dict]:
    """Per run of a cell: its label, style, metrics.jsonl, and its time-to-target point, where it has one."""
    curves = []
    for _, r in rows.iterrows():
        m = read_metrics(r["run_dir"])
        if m.empty or "loss" not in m:
            continue
        if "time_s" in m or "train_s" in m:
            m["t"], xlabel = time_axis(m, r.get("compile_s"))
        else:
            xlabel = "time, s"
        hit = None
        if r.get("target_reached") is True:
            hit = (float(r["target_step"]), float(r["target_s"]))
        curves.append({"label": curve_label(r), "style": optim_style(r["optim"], r["variant"]),
                       "headline": r["headline_metric"], "metrics": m, "xlabel": xlabel, "hit": hit,
                       "target": None if is_missing(r.get("target_value")) else
                       (r["target_metric"], float(r["target_value"]))})
    return curves


def _draw_target(axes, curves: list[dict], metric: str) -> None:
    """The target as a dotted line and a star where each run first reached it (its time to target)."""
    targets = {c["target"] for c in curves if c["target"] and c["target"][0] == metric}
    for _, value in targets:
        for ax in axes:
            ax.axhline(value, color="0.3", linestyle=":", linewidth=1)
    for c in curves:
        if c["hit"] is None or not c["target"] or c["target"][0] != metric:
            continue
        step, seconds = c["hit"]
        for ax, x in zip(axes, (step, seconds)):
            ax.plot([x], [c["target"][1]], marker="*", markersize=11, color=c["style"]["color"],
                    markeredgecolor="black", linestyle="none")


def convergence_figures(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Figure 2: per measured cell, loss (and eval/<headline>) against steps and training time, with each
    optimizer's time to target marked."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    measured = cells[cells["source"] == "measured"]
    for _, rows in measured.groupby([*SETTING, "nodes", "gpus_per_node"], dropna=False, sort=False):
        curves = _curves(rows)
        if not curves:
            continue
        headline = next((c["headline"] for c in curves
                         if isinstance(c["headline"], str) and f"eval/{c['headline']}" in c["metrics"]), None)
        panels = [("loss", "training loss")] + ([(f"eval/{headline}", headline)] if headline else [])
        fig, axes = plt.subplots(len(panels), 2, figsize=(9, 3.2 * len(panels)), squeeze=False)
        for i, (column, name) in enumerate(panels):
            for c in curves:
                m = c["metrics"]
                points = m.dropna(subset=[column]) if column in m else pd.DataFrame()
                if points.empty:
                    continue
                axes[i][0].plot(points["step"], points[column], label=c["label"], **c["style"])
                if "t" in points:
                    axes[i][1].plot(points["t"], points[column], label=c["label"], **c["style"])
            if column.startswith("eval/"):
                _draw_target(axes[i], curves, column.removeprefix("eval/"))
            axes[i][0].set_xlabel("step")
            axes[i][1].set_xlabel(curves[0]["xlabel"])
            axes[i][1].set_xlim(left=0)  # the clock's zero: the first training step
            for ax in axes[i]:
                ax.set_ylabel(name)
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        first = rows.iloc[0]
        marked = "; star: time to target" if any(c["hit"] for c in curves) else ""
        fig.suptitle(f"{short_title(rows)}, {int(first['gpus'])} processes "
                     f"({int(first['nodes'])}x{int(first['gpus_per_node'])}){marked}", fontsize=9)
        fig.tight_layout()
        path = out_dir / (figure_name(rows, "fig2")[:-4] + f"_{int(first['nodes'])}x{int(first['gpus_per_node'])}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
