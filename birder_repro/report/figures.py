"""Throughput against the number of GPUs, one line per optimizer (the shape of papers/birder.txt Figure 3).

matplotlib is optional: it is not a dependency of the package, and without it no figure is drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .tables import optim_label, settings


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def figure_name(rows: pd.DataFrame) -> str:
    """``<task>_<cluster>[_<link>]_<data>[_<model size>]_b<batch>.png``: one per setting, a safe file name."""
    first = rows.iloc[0]
    link = [] if pd.isna(first["link_mbit"]) else [f"{first['link_mbit']:g}mbit"]
    model = [] if first["model_size"] == "unknown" else [first["model_size"]]
    parts = [first["task"], first["cluster"], *link, first["data_source"], *model, f"b{first['batch_size']}"]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts)) + ".png"


def short_title(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    link = "" if pd.isna(first["link_mbit"]) else f" {first['link_mbit']:g} Mbit/s"
    return (f"{first['task']}: {first['cluster']}{link}, {first['data_source']} data, "
            f"{first['batch_size']}/process")


def throughput_figures(cells: pd.DataFrame, out_dir: Path, mode: str) -> list[Path]:
    """One PNG per setting of ``cells``; returns the files written."""
    import matplotlib
    matplotlib.use("Agg")  # no display on cluster nodes or CI
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for _, rows in settings(cells):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for optim, line in rows.groupby("optim", sort=False):
            line = line.dropna(subset=["gpus", "throughput_shown"]).sort_values("gpus")
            ax.plot(line["gpus"].astype(float), line["throughput_shown"], marker="o", label=optim_label(optim))
        gpus = sorted(int(g) for g in rows["gpus"].dropna().unique())
        ax.set_xscale("log", base=2)  # layouts double, as the paper's 8, 16, 32, 64 GPUs
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("#GPUs (processes)")
        basis = "whole run" if mode == "whole" else "1-bit: compression stage"
        ax.set_ylabel(f"throughput, samples/s\n({basis})", fontsize=9)
        ax.set_title(short_title(rows), fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / figure_name(rows)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
