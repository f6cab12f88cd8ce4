"""Tables of reproduced runs in the paper's shape, from the flat DataFrame of ``records.py``.

A *setting* is (source, task, cluster, interconnect, link, data source, model size, precision, batch per
process); a *cell*
is a setting at one layout (nodes x GPUs per node); a cell holds one row per optimizer (and Birder variant).
Within a cell the newest completed run of each optimizer is shown; speedups are over the task's baseline in
the same cell and scale efficiency is against the smallest layout of the same optimizer in the same setting,
as Birder paper, Tables 1-4 do. ``source`` (measured | predicted) is part of the setting: predicted
records (``birder-repro mode=predict``) form their own sections, with speedups and scale efficiencies over
predicted rows only, and are never mixed with measured ones.

The numbers are computed on plain numeric columns first (``cell_table``, also written as CSV) and formatted
into strings only at the end (``display_frame``), so tests and outside scripts can check the arithmetic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import pandas as pd

from . import records
from .records import STAGED_OPTIMIZERS

DIVERGED = "diverged"  # a record's status (birder_repro.schema)

SETTING = ("source", "task", "parallel", "cluster", "interconnect", "link_mbit", "data_source", "model_size",
           "precision",
           "batch_size")
LAYOUT = ("nodes", "gpus_per_node")
CELL = SETTING + LAYOUT
THROUGHPUT_MODES = ("whole", "stage")

# Baselines first, then the paper's order (Tables 1-4: baseline, 1-bit Adam, Birder) with the peers between.
OPTIM_ORDER = ("sgdm", "bertadam", "sgd", "adamw", "softsignsgd", "sgdm_fp16", "sgdm_powersgd",
               "adamw_powersgd", "onebit_adam", "onebit_lamb", "birder")
OPTIM_LABELS = {
    "sgd": "SGD", "sgdm": "SGDM", "adamw": "AdamW", "bertadam": "BertAdam", "softsignsgd": "SoftSignSGD",
    "onebit_adam": "1-bit Adam", "onebit_lamb": "1-bit LAMB", "birder": "Birder",
    "sgdm_fp16": "SGDM + fp16 hook", "sgdm_powersgd": "SGDM + PowerSGD", "adamw_powersgd": "AdamW + PowerSGD",
}
# Optimizers whose communication scheme (config optim.comm.scheme) varies under one name, with the default
# scheme; another scheme is a separate row, named in the label ("Birder (flat)"). Other optimizers' schemes
# are fixed by their name (sgdm_fp16, sgdm_powersgd, ...).
DEFAULT_VARIANTS = {"birder": "hierarchical"}
# How a metric's column is headed; a metric without a label here is headed by its own name.
METRIC_LABELS = {"top1": "top-1", "top5": "top-5", "f1": "F1", "exact_match": "EM", "perplexity": "ppl",
                 "val_perplexity": "val ppl", "mlm_loss": "MLM loss", "mlm_accuracy": "MLM acc.",
                 "nsp_accuracy": "NSP acc.", "eval_loss": "eval loss", "loss": "train loss"}
STAGE_MARK = "*"  # marks a throughput taken from the compression stage only (--throughput stage)
TARGET_HEADER = "time to target"


# ---------------------------------------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------------------------------------

def speedup(throughput: float, baseline_throughput: float) -> float:
    """Throughput over the baseline's in the same cell (Birder paper, Tables 1-4: Birder 8 GPUs,
    32/GPU: 3462 / 3693 = 0.94x)."""
    return throughput / baseline_throughput


def scale_efficiency(throughput: float, gpus: float, ref_throughput: float, ref_gpus: float) -> float:
    """T_N / ((N / N_1) * T_N1): the throughput at N GPUs over linear scaling from the smallest layout N_1.

    Birder paper, Table 3 (and DESIGN.md): SGDM, Ethernet, 16 GPUs: 2959 / ((16 / 8) * 3693) = 40.1%.
    """
    return throughput / ((gpus / ref_gpus) * ref_throughput)


def volume_ratio(inter_node_bytes: float, fp32_inter_node_bytes: float) -> float:
    """Inter-node bytes per step over those of an fp32 all-reduce of the same gradients on the same layout
    (Birder's is at most about 1/32: 1 bit against 32 per element, less on few nodes)."""
    return inter_node_bytes / fp32_inter_node_bytes


# ---------------------------------------------------------------------------------------------------------
# The numeric cell table
# ---------------------------------------------------------------------------------------------------------

def split_by_status(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(completed runs, diverged runs and predicted records, every other run): failed or unfinished runs are
    listed, never dropped silently; a diverged run is a result of its cell, shown as "diverged"
    (:func:`mark_diverged`)."""
    done = frame["status"].isin(["completed", "predicted", DIVERGED])
    return frame[done].copy(), frame[~done].copy()


def mark_diverged(shown: pd.DataFrame, cells: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The displayed ``columns`` of diverged runs say "diverged at step N", never a number (their records
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


def _fill_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing text keys become "unknown" so that such runs still group (and show) together."""
    frame = frame.copy()
    for col in ("source", "task", "optim", "cluster", "interconnect", "data_source", "model_size", "precision"):
        frame[col] = frame[col].astype("object").where(frame[col].notna(), "unknown")
    default = frame["optim"].map(DEFAULT_VARIANTS)
    named = default.notna() & frame["variant"].notna() & (frame["variant"] != default)
    frame["variant"] = frame["variant"].astype("object").where(named, "")
    return frame


def newest_per_cell(completed: pd.DataFrame) -> pd.DataFrame:
    """The newest completed run of each optimizer in each cell, with ``n_runs`` (how many there were).

    Newest by ``started``; the run directory (whose name starts with the launch time) breaks ties; records
    without a readable ``started`` count as the oldest.
    """
    keys = list(CELL) + ["optim", "variant"]
    ordered = completed.sort_values(["started_at", "run_dir"], na_position="first", kind="stable")
    ordered["n_runs"] = ordered.groupby(keys, dropna=False)["run_dir"].transform("size")
    return ordered.groupby(keys, dropna=False, sort=False).tail(1)


def shown_figures(cells: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Add the throughput and bytes per step the tables show, and ``throughput_basis`` saying whence.

    ``whole``: every optimizer over its whole run, as Birder's paper reports 1-bit Adam (its appendix E).
    ``stage``: 1-bit Adam / 1-bit LAMB over their compression stage only, as 1-bit Adam's own paper does
    (bytes too, where the record has them per stage); others, and 1-bit runs without stage figures, stay
    whole-run. Step times are always whole-run (records keep no per-stage step times).
    """
    if mode not in THROUGHPUT_MODES:
        raise ValueError(f"throughput mode must be one of {THROUGHPUT_MODES}, got {mode!r}")
    cells = cells.copy()
    staged = cells["optim"].isin(STAGED_OPTIMIZERS) & cells["throughput_compression"].notna()
    use_stage = staged & (mode == "stage")
    cells["throughput_shown"] = cells["throughput_compression"].where(use_stage, cells["throughput"])
    cells["throughput_basis"] = use_stage.map({True: "compression stage", False: "whole run"})
    stage_bytes = use_stage & cells["inter_mb_per_step_compression"].notna()
    for kind in ("intra", "inter"):
        cells[f"{kind}_mb_shown"] = cells[f"{kind}_mb_per_step_compression"].where(
            stage_bytes, cells[f"{kind}_mb_per_step"])
    cells["bytes_basis"] = stage_bytes.map({True: "compression stage", False: "whole run"})
    return cells


def add_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """``speedup`` over the baseline optimizer's run in the same cell (NaN where the cell has none)."""
    cells = cells.copy()
    is_baseline = (cells["optim"] == cells["baseline"]) & (cells["variant"] == "")
    base = cells["throughput_shown"].where(is_baseline)
    cells["baseline_throughput"] = base.groupby([cells[k] for k in CELL], dropna=False).transform("max")
    cells["speedup"] = speedup(cells["throughput_shown"], cells["baseline_throughput"])
    return cells


def add_scale_efficiency(cells: pd.DataFrame) -> pd.DataFrame:
    """``scale_efficiency`` against the smallest layout (fewest GPUs, then fewest nodes) of the same
    optimizer in the same setting; ``scale_ref`` names that layout; ``n_layouts`` counts the layouts."""
    cells = cells.sort_values(["gpus", "nodes"], na_position="last", kind="stable").copy()
    groups = cells.groupby(list(SETTING) + ["optim", "variant"], dropna=False)

    def first(values: pd.Series):  # transform("first") would skip a missing reference value
        return values.iloc[0]

    ref_throughput = groups["throughput_shown"].transform(first)
    ref_gpus = groups["gpus"].transform(first).astype("float64")
    cells["scale_efficiency"] = scale_efficiency(
        cells["throughput_shown"], cells["gpus"].astype("float64"), ref_throughput, ref_gpus)
    cells["scale_ref"] = groups["nodes"].transform(first).astype("string") + "x" + \
        groups["gpus_per_node"].transform(first).astype("string")
    cells["n_layouts"] = groups["gpus"].transform("size")
    return cells


def optim_rank(optim: pd.Series) -> pd.Series:
    order = {name: i for i, name in enumerate(OPTIM_ORDER)}
    return optim.map(lambda o: order.get(o, len(order)))


def cell_table(frame: pd.DataFrame, mode: str = "whole") -> pd.DataFrame:
    """Completed runs of ``frame`` reduced to one row per (cell, optimizer) with every derived column."""
    completed, _ = split_by_status(frame)
    cells = newest_per_cell(_fill_keys(completed))
    cells = add_scale_efficiency(add_speedup(shown_figures(cells, mode)))
    crosses_nodes = cells["fp32_inter_mb_per_step"] > 0  # on one node there is nothing to compare with
    cells["inter_vs_fp32"] = volume_ratio(cells["inter_mb_shown"], cells["fp32_inter_mb_per_step"]).where(
        crosses_nodes)
    cells["_rank"] = optim_rank(cells["optim"]) - (cells["optim"] == cells["baseline"]) * 100
    order = [*SETTING, "gpus", "nodes", "_rank", "optim", "variant"]
    cells = cells.sort_values(order, na_position="last", kind="stable")
    cells = cells.drop(columns="_rank").reset_index(drop=True)
    cells.attrs["metric_columns"] = records.metric_columns(frame)
    return cells


def csv_columns(cells: pd.DataFrame) -> list[str]:
    """Columns of the CSV files: the numbers, unformatted, with where they came from; every metric column."""
    return [*CSV_HEAD, *records.metric_columns(cells), *CSV_TAIL]


CSV_HEAD = (
    *CELL, "gpus", "optim", "variant", "baseline",
    "throughput_shown", "throughput_basis", "throughput", "throughput_warmup", "throughput_compression",
    "speedup", "scale_efficiency", "scale_ref", "headline_metric",
    "target_metric", "target_direction", "target_value", "target_reached", "target_s", "target_step",
    "target_samples", "target_wall_s", "target_evaluations", "startup_s", "compile_s",
)
CSV_TAIL = (
    "bytes_basis", "intra_mb_shown", "inter_mb_shown", "intra_mb_per_step", "inter_mb_per_step",
    "intra_mb_per_step_compression", "inter_mb_per_step_compression",
    "fp32_mb_per_step", "fp32_inter_mb_per_step", "inter_vs_fp32", "link_mb_per_step", "per_node_link_mb",
    "step_ms_total", "step_ms_compute", "step_ms_communication", "step_ms_compression", "step_ms_data_wait",
    "implementation", "steps", "global_batch_size", "device", "n_runs", "run_dir", "started",
    "status", "diverged_at_step",  # a diverged run's row: status diverged, its numbers empty
)


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------

def is_missing(x) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def fmt_number(x, digits: int = 4) -> str:
    """Throughputs, metrics and sizes: whole numbers from 1000 up, else ``digits`` significant digits."""
    if is_missing(x):
        return "—"
    x = float(x)
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


def fmt_percent(x, digits: int = 1) -> str:
    return "—" if is_missing(x) else f"{100 * float(x):.{digits}f}%"


def fmt_throughput(row) -> str:
    """"3462 (0.94x)": the shown throughput and its speedup over the cell's baseline, as the paper prints."""
    if is_missing(row["throughput_shown"]):
        return "—"
    mark = STAGE_MARK if row["throughput_basis"] == "compression stage" else ""
    text = fmt_number(row["throughput_shown"]) + mark
    return text if is_missing(row["speedup"]) else f"{text} ({row['speedup']:.2f}x)"


def fmt_layout(row) -> str:
    """"16 (2x8)": world size, then nodes x GPUs per node."""
    def part(v):
        return "?" if is_missing(v) else str(int(v))
    return f"{part(row['gpus'])} ({part(row['nodes'])}x{part(row['gpus_per_node'])})"


def fmt_scale(row) -> str:
    """Scale efficiency and its reference layout; blank where the optimizer has one layout only."""
    if row["n_layouts"] < 2 or is_missing(row["scale_efficiency"]):
        return "—"
    return f"{fmt_percent(row['scale_efficiency'])} (vs {row['scale_ref']})"


def target_goal(row) -> str:
    """"top1 >= 98": the target of a row's run (time to accuracy); "" where it has none."""
    if is_missing(row.get("target_metric")) or is_missing(row.get("target_value")):
        return ""
    sign = ">=" if row.get("target_direction") == "higher" else "<="
    return f"{metric_label(row['target_metric'])} {sign} {fmt_number(row['target_value'])}"


def fmt_time_to_target(row) -> str:
    """"5.70 s (step 55)", "not reached", or "—" where the run had no target (birder_repro.train.target)."""
    if not target_goal(row):
        return "—"
    if row.get("target_reached") is not True:
        return "not reached"
    return f"{fmt_number(row['target_s'], 3)} s (step {int(row['target_step'])})"


def has_targets(cells: pd.DataFrame) -> bool:
    return "target_metric" in cells and cells["target_metric"].notna().any()


def fmt_stages(row) -> str:
    if is_missing(row["throughput_warmup"]) and is_missing(row["throughput_compression"]):
        return ""
    return f"{fmt_number(row['throughput_warmup'])} / {fmt_number(row['throughput_compression'])}"


def metric_columns(cells: pd.DataFrame) -> list[str]:
    """The metrics any of these runs reported, in the records' order (birder_repro.schema.metric_names)."""
    return [m for m in records.metric_columns(cells) if cells[m].notna().any()]


def metric_label(column: str) -> str:
    name = column.removeprefix("metric_")
    return METRIC_LABELS.get(name, name)


def optim_label(name: str, variant: str = "") -> str:
    """"Birder", or "Birder (flat)" for a scheme other than the default (``variant`` is "" for that)."""
    label = OPTIM_LABELS.get(name, name)
    return f"{label} ({variant})" if variant else label


def throughput_header(mode: str) -> str:
    basis = "whole run" if mode == "whole" else f"{STAGE_MARK} = compression stage"
    return f"throughput, samples/s ({basis}; speedup)"


def display_frame(cells: pd.DataFrame, mode: str, with_setting: bool = False) -> pd.DataFrame:
    """The strings a reader sees: one column per paper column, extra columns only where some run has them."""
    out = pd.DataFrame(index=cells.index)
    if with_setting:
        out["source"] = cells["source"]
        out["task"] = cells["task"]
        out["cluster"] = cells["cluster"]
        out["data"] = cells["data_source"]
        out["model"] = cells["model_size"]
        out["batch/proc"] = cells["batch_size"].map(fmt_number)
    out["optimizer"] = [optim_label(o, v) for o, v in zip(cells["optim"], cells["variant"])]
    out["#GPUs (nodes x GPUs/node)"] = cells.apply(fmt_layout, axis=1)
    out[throughput_header(mode)] = cells.apply(fmt_throughput, axis=1)
    if (cells["throughput_warmup"].notna() | cells["throughput_compression"].notna()).any():
        out["warmup / compression stage"] = cells.apply(fmt_stages, axis=1)
    for m in metric_columns(cells):
        out[metric_label(m)] = cells[m].map(fmt_number)
    if has_targets(cells):  # time to accuracy, beside throughput and accuracy
        out[TARGET_HEADER] = cells.apply(fmt_time_to_target, axis=1)
    out["scale efficiency"] = cells.apply(fmt_scale, axis=1)
    mark = cells["bytes_basis"].map({"compression stage": STAGE_MARK, "whole run": ""})
    out["intra MB/step"] = cells["intra_mb_shown"].map(fmt_number) + mark
    out["inter MB/step"] = cells["inter_mb_shown"].map(fmt_number) + mark
    out["inter / fp32 inter"] = cells["inter_vs_fp32"].map(lambda x: fmt_percent(x, 2))
    if cells["link_mb_per_step"].notna().any():  # emulated clusters: bytes the kernel counted
        out["link MB/step/node"] = cells["link_mb_per_step"].map(fmt_number)
        out["link MB/step, by node"] = cells["per_node_link_mb"].astype("object").where(
            cells["per_node_link_mb"].notna(), "—")
    for part, label in (("total", "step ms"), ("compute", "compute ms"), ("communication", "comm ms"),
                        ("compression", "compress ms"), ("data_wait", "data wait ms")):
        out[label] = cells[f"step_ms_{part}"].map(lambda x: fmt_number(x, 3))
    # The run directory's last two parts (date/time_task_optim..., or multirun/<sweep>/<job>) name it.
    out["run"] = cells["run_dir"].map(lambda p: "/".join(Path(p).parts[-2:]))
    fixed = {"source", "task", "cluster", "data", "model", "batch/proc", "optimizer", "#GPUs (nodes x GPUs/node)",
             "run"}
    return mark_diverged(out, cells, [c for c in out.columns if c not in fixed]).reset_index(drop=True)


def to_markdown(table: pd.DataFrame) -> str:
    """A pipe table; tabulate where installed (pandas uses it), a plain writer otherwise."""
    try:
        return table.to_markdown(index=False)
    except ImportError:
        rows = [list(table.columns)] + table.astype(str).values.tolist()
        lines = ["| " + " | ".join(map(str, r)) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * len(table.columns))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------------------

def setting_title(row) -> str:
    prefix = ""
    if row.get("source") == "predicted":
        impl = "" if is_missing(row.get("implementation")) else f", implementation `{row['implementation']}`"
        prefix = f"PREDICTED by the performance model (nothing ran{impl}): "
    return prefix + _setting_text(row)


def _setting_text(row) -> str:
    link = "" if is_missing(row["link_mbit"]) else f", link {fmt_number(row['link_mbit'])} Mbit/s"
    if not link and row["cluster"] == "emulated":  # emulated with link_mbit=null: veths at the kernel's speed
        link = ", unshaped links"
    model = "" if row["model_size"] == "unknown" else f"{row['model_size']} model, "
    return (f"cluster `{row['cluster']}` ({row['interconnect']}{link}), {row['data_source']} data, "
            f"{model}{row['precision']}, batch {fmt_number(row['batch_size'])} per process")


def settings(cells: pd.DataFrame):
    """(title, rows) for each setting of ``cells``, in table order."""
    for _, rows in cells.groupby(list(SETTING), dropna=False, sort=False):
        yield setting_title(rows.iloc[0]), rows


def notes(cells: pd.DataFrame, mode: str) -> list[str]:
    """What every table's numbers mean, and how many runs the newest-per-cell rule left out."""
    older = int((cells["n_runs"] - 1).sum()) if len(cells) else 0
    lines = [
        "Throughput: samples/s over all processes, " + (
            "over the whole run (1-bit Adam / LAMB: warmup and compression stages together, as the Birder "
            "paper reports them)." if mode == "whole" else
            f"1-bit Adam / LAMB over their compression stage only (marked {STAGE_MARK}, as 1-bit Adam's own "
            "paper reports them; their bytes per step too, step times stay whole-run); every other "
            "optimizer over its whole run."),
        "Speedup: over the task's baseline (SGDM for CNNs, BertAdam for BERT) in the same cell "
        "(setting and layout); blank where that cell has no baseline run.",
        "Scale efficiency: T_N / ((N / N_1) * T_N1) against the smallest layout N_1 of the same optimizer and "
        "setting (Birder paper, Table 3).",
        "Bytes: MB = 10^6 bytes sent per process per step, as counted by the communication hook; "
        "inter / fp32 inter: the inter-node bytes over those of an fp32 ring all-reduce of the same "
        "gradients on the same layout (blank on one node).",
        "Step time: compute + communication (not hidden by compute) + compression + data wait (for the data "
        "loader's batch); throughput counts the whole step, data wait included, so a data-bound run shows as one.",
        "Source: measured rows are runs; predicted rows (`birder-repro mode=predict`, status `predicted`) are the "
        "performance model's (birder_repro.perf) and sit in their own sections, never mixed with measured ones.",
        f"One run per cell and optimizer: where several completed runs exist, the newest (by `started`) is "
        f"shown; {older} older run(s) left out." ,
    ]
    if has_targets(cells):
        goals = sorted({f"{t}: {target_goal(r)}" for t, (_, r) in zip(cells["task"], cells.iterrows())
                        if target_goal(r)})
        lines.append(f"Time to target ({'; '.join(goals)}; `task.target`): the training clock at the first "
                     "evaluation that reached it, from the first training step, with evaluations, checkpoints "
                     "and the first step's one-time work (JIT compilation) left out; start-up too "
                     "(birder_repro.train.target). Only as fine as `train.eval_every`. Over seeds: "
                     "time_to_target.md.")
    if "link_mb_per_step" in cells and cells["link_mb_per_step"].notna().any():
        lines.append("Link MB/step: what each node's link (emulated clusters) sent per timed step, as the kernel "
                     "counted it: the payload (the hook's bytes; from rank 0's node also DDP's broadcast of the "
                     "model's buffers) plus 66 bytes of Ethernet/IP/TCP headers per packet, ACKs included; "
                     "the mean over nodes, then each node.")
    if mode == "whole" and cells["throughput_compression"].notna().any():
        lines.append("Stage throughputs (warmup / compression) are shown beside; `--throughput stage` puts "
                     "the compression stage in the main column.")
    return lines


def not_completed_table(others: pd.DataFrame) -> pd.DataFrame:
    """The short list of failed (or unfinished) runs: run directory, task, optimizer, status, error."""
    out = pd.DataFrame({
        "run": others["run_dir"], "task": others["task"], "optimizer": others["optim"],
        "status": others["status"].astype("object").where(others["status"].notna(), "unknown"),
        "error (first line)": others["error"].astype("object").where(others["error"].notna(), ""),
    })
    return out.sort_values("run").reset_index(drop=True)


def not_completed_section(others: pd.DataFrame) -> list[str]:
    if others.empty:
        return []
    return ["", "## Runs that did not complete", "",
            f"{len(others)} run(s) without a completed record, left out of the tables above:", "",
            to_markdown(not_completed_table(others))]


def task_markdown(task: str, cells: pd.DataFrame, others: pd.DataFrame, mode: str) -> str:
    lines = [f"# {task}: reproduced runs", ""]
    lines += [f"- {n}" for n in notes(cells, mode)]
    for title, rows in settings(cells):
        lines += ["", f"## {title}", "", to_markdown(display_frame(rows, mode))]
    if cells.empty:
        lines += ["", "No completed run of this task."]
    lines += not_completed_section(others)
    return "\n".join(lines) + "\n"


def main_metric(row) -> str:
    """"top-1 75.3": the run's headline metric (its task's ``headline_metric``)."""
    name = row.get("headline_metric")
    column = None if is_missing(name) else records.metric_column(name)
    if column is None or is_missing(row.get(column)):
        return "—"
    return f"{metric_label(column)} {fmt_number(row[column])}"


def summary_frame(cells: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Every task's cells side by side in one compact table."""
    full = display_frame(cells, mode, with_setting=True)
    full["metric"] = cells.reset_index(drop=True).apply(main_metric, axis=1)
    keep = ["source", "task", "cluster", "data", "model", "batch/proc", "optimizer", "#GPUs (nodes x GPUs/node)",
            throughput_header(mode), "metric", "scale efficiency", "inter MB/step", "inter / fp32 inter",
            "step ms"]
    if TARGET_HEADER in full:
        keep.insert(keep.index("metric") + 1, TARGET_HEADER)
    return full[keep]


def summary_markdown(frame: pd.DataFrame, cells: pd.DataFrame, others: pd.DataFrame, mode: str,
                     task_files: list[str]) -> str:
    n_done = int((frame["status"] == "completed").sum())
    n_pred = int((frame["status"] == "predicted").sum())
    lines = ["# Reproduced runs: summary", "",
             f"{len(frame)} run record(s): {n_done} completed, "
             + (f"{n_pred} predicted, " if n_pred else "") + f"{len(frame) - n_done - n_pred} not completed.", ""]
    lines += [f"- {n}" for n in notes(cells, mode)]
    lines += ["", "Per task: " + ", ".join(f"[{f}]({f})" for f in task_files) + "."]
    if not cells.empty:
        lines += ["", to_markdown(summary_frame(cells, mode))]
    lines += not_completed_section(others)
    return "\n".join(lines) + "\n"


def to_latex(table: pd.DataFrame) -> Optional[str]:
    """LaTeX tabular of a display table, or None where pandas' LaTeX writer (jinja2) is missing."""
    try:
        return table.to_latex(index=False, escape=True)
    except ImportError:
        return None
