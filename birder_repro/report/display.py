"""The strings a reader sees: the numbers of ``tables.cell_table`` formatted, one column per paper column.

Numbers stay numbers in the cell table (and its CSV); they become text only here, at the end.
"""

from __future__ import annotations

import math

import pandas as pd

from birder_repro.run.summary import fmt_number  # throughputs, metrics and sizes: one format for every report

from . import records
from .cells import DIVERGED, short_run

# Baselines first, then the paper's order (Tables 1-4: baseline, 1-bit Adam, Birder) with the peers between.
OPTIM_ORDER = (
    "sgdm",
    "bertadam",
    "sgd",
    "adamw",
    "softsignsgd",
    "sgdm_fp16",
    "sgdm_2level",
    "sgdm_bf16_2level",
    "sgdm_powersgd",
    "diloco",
    "diloco_1bit",
    "streaming_diloco",
    "adamw_powersgd",
    "onebit_adam",
    "onebit_adam_precond",
    "onebit_lamb",
    "birder",
)
OPTIM_LABELS = {
    "sgd": "SGD",
    "sgdm": "SGDM",
    "adamw": "AdamW",
    "bertadam": "BertAdam",
    "softsignsgd": "SoftSignSGD",
    "onebit_adam": "1-bit Adam",
    "onebit_adam_precond": "1-bit Adam, preconditioned",
    "onebit_lamb": "1-bit LAMB",
    "birder": "Birder",
    "sgdm_fp16": "SGDM + fp16 hook",
    "sgdm_2level": "SGDM + two-level fp32",
    "sgdm_bf16_2level": "SGDM + two-level bf16",
    "diloco": "DiLoCo",
    "diloco_1bit": "DiLoCo, 1-bit outer",
    "streaming_diloco": "Streaming DiLoCo",
    "sgdm_powersgd": "SGDM + PowerSGD",
    "adamw_powersgd": "AdamW + PowerSGD",
}
# How a metric's column is headed; a metric without a label here is headed by its own name.
METRIC_LABELS = {
    "top1": "top-1",
    "top5": "top-5",
    "f1": "F1",
    "exact_match": "EM",
    "perplexity": "ppl",
    "val_perplexity": "val ppl",
    "mlm_loss": "MLM loss",
    "mlm_accuracy": "MLM acc.",
    "nsp_accuracy": "NSP acc.",
    "eval_loss": "eval loss",
    "loss": "train loss",
}
# The unit of a metric where it has one (the tasks report accuracies and F1 / EM in percent).
METRIC_UNITS = {
    "top1": "%",
    "top5": "%",
    "f1": "%",
    "exact_match": "%",
    "mlm_accuracy": "%",
    "nsp_accuracy": "%",
    "accuracy": "%",
}
STAGE_MARK = "*"  # marks a throughput taken from the compression stage only (--throughput stage)
TARGET_HEADER = "time to target"
NOTE_HEADER = "setting (where the rows differ)"
# Columns a diverged row keeps (its others say "diverged at step N").
KEPT_WHEN_DIVERGED = {
    "source",
    "task",
    "cluster",
    "data",
    "model",
    "batch/proc",
    "length",
    "optimizer",
    NOTE_HEADER,
    "#GPUs (nodes x GPUs/node)",
    "run",
}


def is_missing(x) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def fmt_spread(mean, sd, digits: int = 4) -> str:
    """ "98.52 ± 0.16", "3261 ± 1009": a mean over seeds and its sample standard deviation (none for one seed),
    the sd to two significant digits and the mean to the same decimal place."""
    if is_missing(mean) or is_missing(sd):
        return fmt_number(mean, digits)
    places = 0 if float(sd) == 0 else max(0, 1 - math.floor(math.log10(abs(float(sd)))))
    return f"{float(mean):.{places}f} ± {float(sd):.{places}f}"


def fmt_percent(x, digits: int = 1) -> str:
    return "—" if is_missing(x) else f"{100 * float(x):.{digits}f}%"


def fmt_throughput(row) -> str:
    """ "3462 (0.94x)": the shown throughput (± its spread over seeds) and its speedup over the baseline."""
    if is_missing(row["throughput_shown"]):
        return "—"
    mark = STAGE_MARK if row["throughput_basis"] == "compression stage" else ""
    text = fmt_spread(row["throughput_shown"], row.get("throughput_shown_sd")) + mark
    return text if is_missing(row["speedup"]) else f"{text} ({row['speedup']:.2f}x)"


def fmt_layout(row) -> str:
    """ "16 (2x8)": world size, then nodes x GPUs per node."""

    def part(v):
        return "?" if is_missing(v) else str(int(v))

    return f"{part(row['gpus'])} ({part(row['nodes'])}x{part(row['gpus_per_node'])})"


def fmt_scale(row) -> str:
    """Scale efficiency and its reference layout; blank where the optimizer has one layout only."""
    if row["n_layouts"] < 2 or is_missing(row["scale_efficiency"]):
        return "—"
    return f"{fmt_percent(row['scale_efficiency'])} (vs {row['scale_ref']})"


def fmt_runs(row) -> str:
    """ "3 (seeds 0 1 2)": how many runs the row's figures are over."""
    n = row.get("n")
    if is_missing(n):
        return "1"
    seeds = row.get("seeds")
    return f"{int(n)} (seed{'s' if int(n) > 1 else ''} {seeds})" if isinstance(seeds, str) and seeds else str(int(n))


def fmt_steps(row) -> str:
    """ "100", or "100 (resumed: 2 attempts)" where a run was stopped and resumed in its own directory."""
    text = fmt_number(row.get("steps"))
    attempts = row.get("attempts")
    return text if is_missing(attempts) or int(attempts) < 2 else f"{text} (resumed: {int(attempts)} attempts)"


def target_goal(row) -> str:
    """ "top1 >= 98": the target of a row's run (time to accuracy); "" where it has none."""
    if is_missing(row.get("target_metric")) or is_missing(row.get("target_value")):
        return ""
    sign = ">=" if row.get("target_direction") == "higher" else "<="
    return f"{metric_label(row['target_metric'])} {sign} {fmt_number(row['target_value'])}"


def fmt_time_to_target(row) -> str:
    """ "5.70 s (step 55)", over seeds "5.7 ± 0.3 s (step 50; 3 of 3)", "not reached", or "—" (no target)."""
    if not target_goal(row):
        return "—"
    if row.get("target_reached") is not True:
        return "not reached"
    n, reached = row.get("n"), row.get("target_reached_n")
    step = f"step {fmt_number(row['target_step'], 3)}"
    if is_missing(n) or int(n) < 2:
        return f"{fmt_number(row['target_s'], 3)} s ({step})"
    return f"{fmt_spread(row['target_s'], row.get('target_s_sd'), 3)} s ({step}; {int(reached)} of {int(n)})"


def has_targets(cells: pd.DataFrame) -> bool:
    return "target_metric" in cells and cells["target_metric"].notna().any()


def fmt_stages(row) -> str:
    if is_missing(row["throughput_warmup"]) and is_missing(row["throughput_compression"]):
        return ""
    return f"{fmt_number(row['throughput_warmup'])} / {fmt_number(row['throughput_compression'])}"


def metric_columns(cells: pd.DataFrame) -> list[str]:
    """The metrics any of these runs reported, in the records' order (birder_repro.run.schema.metric_names)."""
    return [m for m in records.metric_columns(cells) if cells[m].notna().any()]


def metric_label(column: str) -> str:
    name = column.removeprefix("metric_")
    return METRIC_LABELS.get(name, name)


def optim_label(name: str, variant: str = "") -> str:
    """ "Birder", or "Birder (flat)" for a scheme other than the default (``variant`` is "" for that)."""
    label = OPTIM_LABELS.get(name, name)
    return f"{label} ({variant})" if variant else label


def optim_rank(optim: pd.Series) -> pd.Series:
    order = {name: i for i, name in enumerate(OPTIM_ORDER)}
    return optim.map(lambda o: order.get(o, len(order)))


def throughput_header(mode: str) -> str:
    basis = "whole run" if mode == "whole" else f"{STAGE_MARK} = compression stage"
    return f"throughput, samples/s ({basis}; speedup)"


def mark_diverged(shown: pd.DataFrame, cells: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The displayed ``columns`` of diverged rows say "diverged at step N", never a number (their records
    hold no measurements; a number there would read as a result)."""
    diverged = (cells["status"] == DIVERGED).to_numpy()
    if not diverged.any():
        return shown
    shown = shown.copy()
    steps = cells["diverged_at_step"].to_numpy()
    text = ["diverged" if is_missing(s) else f"diverged at step {int(s)}" for s in steps]
    for col in columns:
        shown.loc[diverged, col] = [t for t, d in zip(text, diverged) if d]
    return shown


def _setting_columns(out: pd.DataFrame, cells: pd.DataFrame) -> None:
    out["source"] = cells["source"]
    out["task"] = cells["task"]
    out["cluster"] = cells["cluster"]
    out["data"] = cells["data_source"]
    out["model"] = cells["model_size"]
    out["batch/proc"] = cells["batch_size"].map(fmt_number)
    out["length"] = cells["run_length"]


def _bytes_and_times(out: pd.DataFrame, cells: pd.DataFrame) -> None:
    mark = cells["bytes_basis"].map({"compression stage": STAGE_MARK, "whole run": ""})
    out["intra MB/step"] = cells["intra_mb_shown"].map(fmt_number) + mark
    out["inter MB/step"] = cells["inter_mb_shown"].map(fmt_number) + mark
    out["inter / fp32 inter"] = cells["inter_vs_fp32"].map(lambda x: fmt_percent(x, 2))
    if cells["link_mb_per_step"].notna().any():  # emulated clusters: bytes the kernel counted
        out["link MB/step/node"] = cells["link_mb_per_step"].map(fmt_number)
        out["link MB/step, by node"] = (
            cells["per_node_link_mb"].astype("object").where(cells["per_node_link_mb"].notna(), "—")
        )
    for part, label in (
        ("total", "step ms"),
        ("compute", "compute ms"),
        ("communication", "comm ms"),
        ("compression", "compress ms"),
        ("data_wait", "data wait ms"),
    ):
        out[label] = cells[f"step_ms_{part}"].map(lambda x: fmt_number(x, 3))


def display_frame(cells: pd.DataFrame, mode: str, with_setting: bool = False) -> pd.DataFrame:
    """The strings a reader sees: one column per paper column, extra columns only where some row has them."""
    out = pd.DataFrame(index=cells.index)
    if with_setting:
        _setting_columns(out, cells)
    out["optimizer"] = [optim_label(o, v) for o, v in zip(cells["optim"], cells["variant"])]
    if "setting_note" in cells and (cells["setting_note"] != "").any():
        out[NOTE_HEADER] = cells["setting_note"]
    out["#GPUs (nodes x GPUs/node)"] = cells.apply(fmt_layout, axis=1)
    out["runs"] = cells.apply(fmt_runs, axis=1)
    out["steps"] = cells.apply(fmt_steps, axis=1)
    out[throughput_header(mode)] = cells.apply(fmt_throughput, axis=1)
    if (cells["throughput_warmup"].notna() | cells["throughput_compression"].notna()).any():
        out["warmup / compression stage"] = cells.apply(fmt_stages, axis=1)
    for m in metric_columns(cells):
        sd = cells[f"{m}_sd"] if f"{m}_sd" in cells else pd.Series(float("nan"), index=cells.index)
        out[metric_label(m)] = [fmt_spread(x, s) for x, s in zip(cells[m], sd)]
    if has_targets(cells):  # time to accuracy, beside throughput and accuracy
        out[TARGET_HEADER] = cells.apply(fmt_time_to_target, axis=1)
    out["scale efficiency"] = cells.apply(fmt_scale, axis=1)
    _bytes_and_times(out, cells)
    out["run"] = cells["run_dir"].map(short_run)  # the newest run of the row
    return mark_diverged(out, cells, [c for c in out.columns if c not in KEPT_WHEN_DIVERGED]).reset_index(drop=True)


def main_metric(row) -> str:
    """ "top-1 75.3": the run's headline metric (its task's ``headline_metric``), ± its spread over seeds."""
    name = row.get("headline_metric")
    column = None if is_missing(name) else records.metric_column(name)
    if column is None or is_missing(row.get(column)):
        return "—"
    return f"{metric_label(column)} {fmt_spread(row[column], row.get(f'{column}_sd'))}"


def to_markdown(table: pd.DataFrame) -> str:
    """A pipe table (pandas writes it with tabulate, a dependency of the package)."""
    return table.to_markdown(index=False)


def to_latex(table: pd.DataFrame) -> str | None:
    """LaTeX tabular of a display table, or None where pandas' LaTeX writer (jinja2) is missing."""
    try:
        return table.to_latex(index=False, escape=True)
    except ImportError:
        return None
