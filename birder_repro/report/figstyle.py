"""What every figure shares: matplotlib, one colour and line style per optimizer, file names, titles."""

from __future__ import annotations

import re

import pandas as pd

# One colour and one line style per optimizer, in STYLE_ORDER (15 optimizers; matplotlib's default cycle
# has 10 colours, which gave SGDM and Birder the same blue); names and variants beyond it take the next pairs.
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#000000",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2, 2, 2)))


# The order styles are handed out in: display.OPTIM_ORDER as it was when each name was added, new names at the
# end, so that adding an optimizer to the tables' order never changes another one's colour (Birder: black).
STYLE_ORDER = (
    "sgdm",
    "bertadam",
    "sgd",
    "adamw",
    "softsignsgd",
    "sgdm_fp16",
    "sgdm_powersgd",
    "adamw_powersgd",
    "onebit_adam",
    "onebit_lamb",
    "birder",
    "onebit_adam_precond",
    "sgdm_2level",
    "sgdm_bf16_2level",
    "diloco",
    "diloco_1bit",
    "streaming_diloco",
)


def optim_style(optim: str, variant: str = "") -> dict:
    """The colour and line style of an optimizer (and Birder variant) in every figure: distinct pairs for the
    optimizers of display.OPTIM_ORDER, then for other names by a stable index of the name."""
    index = (
        STYLE_ORDER.index(optim)
        if optim in STYLE_ORDER and not variant
        else len(STYLE_ORDER) + sum(map(ord, f"{optim}/{variant}")) % max(len(COLOURS) - len(STYLE_ORDER), 1)
    )
    return {"color": COLOURS[index % len(COLOURS)], "linestyle": LINESTYLES[index % len(LINESTYLES)]}


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
