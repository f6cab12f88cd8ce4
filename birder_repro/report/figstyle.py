"""What every figure shares: matplotlib, one colour and line style per optimizer (birder_repro.styles), file names,
titles."""

from __future__ import annotations

import re

import pandas as pd

# the styles live below both the report and the performance model (the advisor's figure draws with them too)
from birder_repro.styles import COLOURS, LINESTYLES, STYLE_ORDER, optim_style

__all__ = [
    "COLOURS",
    "LINESTYLES",
    "STYLE_ORDER",
    "optim_style",
    "row_style",
    "pyplot",
    "figure_name",
    "short_title",
    "device_unit",
]


def row_style(row) -> dict:
    """A row's style: its optimizer's, or another pair where it is one of several settings of that optimizer."""
    note = row.get("setting_note") or ""
    variant = row["variant"] + (f"|{note}" if note else "")
    return optim_style(row["optim"], variant)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes or CI
    import matplotlib.pyplot as plt

    return plt


def _safe(parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts))


def figure_name(rows: pd.DataFrame, prefix: str = "fig3", with_source: bool = False) -> str:
    """``<prefix>_[<source>_]<task>_<cluster>[_<link>]_<data>[_<model size>]_b<batch>[_<length>].png``."""
    first = rows.iloc[0]
    link = [] if pd.isna(first["link_mbit"]) else [f"{first['link_mbit']:g}mbit"]
    model = [] if first["model_size"] == "unknown" else [first["model_size"]]
    source = [first["source"]] if with_source else []
    length = [] if first.get("run_length") in (None, "unknown") else [str(first["run_length"]).replace(" ", "")]
    parts = [
        prefix,
        *source,
        first["task"],
        first["cluster"],
        *link,
        first["data_source"],
        *model,
        f"b{first['batch_size']}",
        *length,
    ]
    return _safe(parts) + ".png"


def short_title(rows: pd.DataFrame) -> str:
    first = rows.iloc[0]
    link = "" if pd.isna(first["link_mbit"]) else f" {first['link_mbit']:g} Mbit/s"
    length = "" if first.get("run_length") in (None, "unknown") else f", {first['run_length']}"
    return (
        f"{first['task']}: {first['cluster']}{link}, {first['data_source']} data, {first['batch_size']}/process{length}"
    )


def device_unit(rows: pd.DataFrame) -> str:
    """What a layout's processes run on, from the records' ``device`` ("cpu", "cuda (<GPU name>)", a predicted
    record's "predicted for: ..."): "CPU processes", "GPUs" (with their name where all are one kind), or
    "processes" where the rows disagree or do not say."""
    devices = {str(d).removeprefix("predicted for: ") for d in rows.get("device", pd.Series(dtype=object)).dropna()}
    if devices and all(d == "cpu" for d in devices):
        return "CPU processes"
    if devices and all(d.startswith("cuda") for d in devices):
        names = {m.group(1) for d in devices if (m := re.fullmatch(r"cuda \((.+)\)", d))}
        return f"{names.pop()} GPUs" if len(names) == 1 and len(devices) == 1 else "GPUs"
    return "processes"
