"""The markdown documents ``make tables`` writes: tables/<task>.md and tables/summary.md, each with what its
numbers mean, one table per setting, and the runs left out with the reason."""

from __future__ import annotations

import pandas as pd

from .cells import SETTING, SMOKE_FRACTION, short_run
from .display import (
    STAGE_MARK,
    TARGET_HEADER,
    display_frame,
    fmt_layout,
    fmt_number,
    has_targets,
    is_missing,
    main_metric,
    optim_label,
    target_goal,
    throughput_header,
    to_markdown,
)
from .identity import IGNORED_KEYS, MEASURED_ONLY_KEYS

__all__ = ["left_out_table", "notes", "setting_title", "settings", "summary_markdown", "task_markdown"]


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
    length = "" if row.get("run_length") in (None, "unknown") else f", {row['run_length']}"
    return (
        f"cluster `{row['cluster']}` ({row['interconnect']}{link}), {row['data_source']} data, "
        f"{model}{row['precision']}, batch {fmt_number(row['batch_size'])} per process{length}"
    )


def settings(cells: pd.DataFrame):
    """(title, rows) for each setting of ``cells``, in table order."""
    for _, rows in cells.groupby(list(SETTING), dropna=False, sort=False):
        yield setting_title(rows.iloc[0]), rows


def _ignored_text() -> str:
    names = [f"`{k}`" for k in IGNORED_KEYS] + [f"`{k}` (measured runs)" for k in MEASURED_ONLY_KEYS]
    return ", ".join(names)


def notes(cells: pd.DataFrame, mode: str) -> list[str]:
    """What every table's numbers mean."""
    lines = [
        "Rows: one per configuration, i.e. the resolved config less the seed and the settings that cannot "
        f"change a result ({_ignored_text()}; why: birder_repro.report.identity.IGNORED_KEYS). Its runs are "
        "its seeds: figures are means, ± the sample standard deviation over them; `runs` says how many. A run "
        "of any other setting is another row (the keys they differ in are named) or section, never a newer "
        "run in its place; runs left out are listed below with the reason.",
        "Throughput: samples/s over all processes, "
        + (
            "over the whole run (1-bit Adam / LAMB: warmup and compression stages together, as the Birder "
            "paper reports them)."
            if mode == "whole"
            else f"1-bit Adam / LAMB over their compression stage only (marked {STAGE_MARK}, as 1-bit Adam's own "
            "paper reports them; their bytes per step too, step times stay whole-run); every other "
            "optimizer over its whole run."
        ),
        "Speedup: over the task's baseline (SGDM for CNNs, BertAdam for BERT) in the same cell "
        "(setting and layout); blank where that cell has no baseline run of the same setting.",
        "Scale efficiency: T_N / ((N / N_1) * T_N1) against the smallest layout N_1 of the same optimizer and "
        "setting (Birder paper, Table 3).",
        "Bytes: MB = 10^6 bytes sent per process per step, as counted by the communication hook; "
        "inter / fp32 inter: the inter-node bytes over those of an fp32 ring all-reduce of the same "
        "gradients on the same layout (blank on one node).",
        "Step time: compute + communication (not hidden by compute) + compression + data wait (for the data "
        "loader's batch); throughput counts the whole step, data wait included, so a data-bound run shows as one.",
        "Steps: of the run; `resumed: k attempts` where it was stopped and resumed in its own directory (its "
        "figures count every attempt).",
        "Source: measured rows are runs; predicted rows (`birder-repro mode=predict`, status `predicted`) are the "
        "performance model's (birder_repro.perf) and sit in their own sections, never mixed with measured ones.",
    ]
    if has_targets(cells):
        goals = sorted(
            {f"{t}: {target_goal(r)}" for t, (_, r) in zip(cells["task"], cells.iterrows()) if target_goal(r)}
        )
        lines.append(
            f"Time to target ({'; '.join(goals)}; `task.target`): the training clock at the first "
            "evaluation that reached it, from the first training step, with evaluations, checkpoints "
            "and the first step's one-time work (JIT compilation) left out; start-up too "
            "(birder_repro.train.target). Only as fine as `train.eval_every`. Over seeds: the mean "
            "over the runs that reached it (`k of n`); more in time_to_target.md."
        )
    if "link_mb_per_step" in cells and cells["link_mb_per_step"].notna().any():
        lines.append(
            "Link MB/step: what each node's link (emulated clusters) sent per timed step, as the kernel "
            "counted it: the payload (the hook's bytes; from rank 0's node also DDP's broadcast of the "
            "model's buffers) plus 66 bytes of Ethernet/IP/TCP headers per packet, ACKs included; "
            "the mean over nodes, then each node."
        )
    if mode == "whole" and cells["throughput_compression"].notna().any():
        lines.append(
            "Stage throughputs (warmup / compression) are shown beside; `--throughput stage` puts "
            "the compression stage in the main column."
        )
    return lines


def left_out_table(left: pd.DataFrame) -> pd.DataFrame:
    """The runs the tables leave out: run directory, task, optimizer, layout, steps, status and the reason."""
    if left.empty:
        return pd.DataFrame(
            columns=["run", "task", "optimizer", "#GPUs (nodes x GPUs/node)", "steps", "status", "reason"]
        )
    out = pd.DataFrame(
        {
            "run": left["run_dir"].map(short_run),
            "task": left["task"],
            "optimizer": [optim_label(o, v) for o, v in zip(left["optim"], left["variant"])],
            "#GPUs (nodes x GPUs/node)": left.apply(fmt_layout, axis=1),
            "steps": left["steps"].map(fmt_number),
            "status": left["status"].astype("object").where(left["status"].notna(), "unknown"),
            "reason": left["reason"],
        }
    )
    return out.sort_values("run").reset_index(drop=True)


def left_out_section(left: pd.DataFrame) -> list[str]:
    if left.empty:
        return []
    smoke = left["reason"].str.startswith("smoke run").any()
    why = f" (smoke runs: at most {SMOKE_FRACTION:.0%} of the steps of their cell's longest run)" if smoke else ""
    return [
        "",
        "## Runs left out",
        "",
        f"{len(left)} run(s) are not in the tables above{why}:",
        "",
        to_markdown(left_out_table(left)),
    ]


def task_markdown(task: str, cells: pd.DataFrame, left: pd.DataFrame, mode: str) -> str:
    lines = [f"# {task}: reproduced runs", ""]
    lines += [f"- {n}" for n in notes(cells, mode)]
    for title, rows in settings(cells):
        lines += ["", f"## {title}", "", to_markdown(display_frame(rows, mode))]
    if cells.empty:
        lines += ["", "No completed run of this task."]
    lines += left_out_section(left)
    return "\n".join(lines) + "\n"


def summary_frame(cells: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Every task's cells side by side in one compact table."""
    full = display_frame(cells, mode, with_setting=True)
    full["metric"] = cells.reset_index(drop=True).apply(main_metric, axis=1)
    keep = [
        "source",
        "task",
        "cluster",
        "data",
        "model",
        "batch/proc",
        "length",
        "optimizer",
        "#GPUs (nodes x GPUs/node)",
        "runs",
        throughput_header(mode),
        "metric",
        "scale efficiency",
        "inter MB/step",
        "inter / fp32 inter",
        "step ms",
    ]
    if TARGET_HEADER in full:
        keep.insert(keep.index("metric") + 1, TARGET_HEADER)
    return full[[c for c in keep if c in full]]


def summary_markdown(
    frame: pd.DataFrame, cells: pd.DataFrame, left: pd.DataFrame, mode: str, task_files: list[str]
) -> str:
    n_done = int((frame["status"] == "completed").sum())
    n_pred = int((frame["status"] == "predicted").sum())
    lines = [
        "# Reproduced runs: summary",
        "",
        f"{len(frame)} run record(s): {n_done} completed, "
        + (f"{n_pred} predicted, " if n_pred else "")
        + f"{len(frame) - n_done - n_pred} not completed; "
        f"{len(left)} left out of the tables (listed at the end).",
        "",
    ]
    lines += [f"- {n}" for n in notes(cells, mode)]
    lines += ["", "Per task: " + ", ".join(f"[{f}]({f})" for f in task_files) + "."]
    if not cells.empty:
        lines += ["", to_markdown(summary_frame(cells, mode))]
    lines += left_out_section(left)
    return "\n".join(lines) + "\n"
