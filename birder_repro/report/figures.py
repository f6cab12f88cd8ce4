"""The paper's figures from run records (Birder paper, Figures 2, 3 and 4), as PNG files.

- Figure 2, convergence: training loss (and the task's headline metric, where the run evaluated it during
  training) against steps and against wall-clock time, one line per optimizer, from each run's
  ``metrics.jsonl`` (measured runs only): ``fig2_<setting>_<layout>.png``, one per cell.
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

from .tables import SETTING, optim_label, settings

PARTS = (("compute", "compute", "#4c72b0"), ("communication", "communication", "#dd8452"),
         ("compression", "compression", "#55a868"), ("data_wait", "data wait", "#c44e52"))
SOURCE_STYLE = {"measured": dict(linestyle="-", marker="o"), "predicted": dict(linestyle="--", marker="x")}


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
        colours: dict[str, str] = {}
        for (optim, variant, source), line in rows.groupby(["optim", "variant", "source"], sort=False):
            line = line.dropna(subset=["gpus", "throughput_shown"]).sort_values("gpus")
            label = f"{optim_label(optim, variant)} ({source})" + diverged_note(rows, optim, variant, source)
            kwargs = dict(SOURCE_STYLE.get(source, {}))
            if (optim, variant) in colours:
                kwargs["color"] = colours[(optim, variant)]
            (drawn,) = ax.plot(line["gpus"].astype(float), line["throughput_shown"], label=label, **kwargs)
            colours.setdefault((optim, variant), drawn.get_color())
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


def convergence_figures(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Figure 2: per measured cell, loss (and eval/<headline>) against steps and wall-clock time."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    measured = cells[cells["source"] == "measured"]
    for _, rows in measured.groupby([*SETTING, "nodes", "gpus_per_node"], dropna=False, sort=False):
        curves = [(curve_label(r), r["headline_metric"], read_metrics(r["run_dir"])) for _, r in rows.iterrows()]
        curves = [c for c in curves if not c[2].empty and "loss" in c[2]]
        if not curves:
            continue
        headline = next((h for _, h, m in curves if isinstance(h, str) and f"eval/{h}" in m), None)
        panels = [("loss", "training loss")] + ([(f"eval/{headline}", headline)] if headline else [])
        fig, axes = plt.subplots(len(panels), 2, figsize=(9, 3.2 * len(panels)), squeeze=False)
        for i, (column, name) in enumerate(panels):
            for label, _, m in curves:
                points = m.dropna(subset=[column]) if column in m else pd.DataFrame()
                if points.empty:
                    continue
                axes[i][0].plot(points["step"], points[column], label=label)
                if "time_s" in points:
                    axes[i][1].plot(points["time_s"], points[column], label=label)
            axes[i][0].set_xlabel("step")
            axes[i][1].set_xlabel("wall-clock time, s")
            for ax in axes[i]:
                ax.set_ylabel(name)
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        first = rows.iloc[0]
        fig.suptitle(f"{short_title(rows)}, {int(first['gpus'])} processes "
                     f"({int(first['nodes'])}x{int(first['gpus_per_node'])})", fontsize=9)
        fig.tight_layout()
        path = out_dir / (figure_name(rows, "fig2")[:-4] + f"_{int(first['nodes'])}x{int(first['gpus_per_node'])}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
