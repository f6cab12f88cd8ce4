"""The paper's own numbers (tables/paper/*.csv, transcribed from Birder paper, Tables 1-4) beside the
reproduced cells of the same task, optimizer, layout and batch per GPU.

The CSV columns and the transcription notes are in tables/paper/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from birder_repro.config.resources import paper_tables_dir
from birder_repro.run.record import read_record

from .display import fmt_layout, fmt_number, fmt_percent, is_missing, optim_label, optim_rank, to_markdown

PAPER_METRICS = ("top1", "f1", "exact_match")
MATCH = ("task", "optimizer", "nodes", "gpus_per_node", "batch_per_gpu")


def default_paper_dir() -> Path:
    """tables/paper of this checkout, else the installed package's copy, else of the working directory."""
    return paper_tables_dir()


def load_paper_tables(paper_dir: Path | None = None) -> pd.DataFrame:
    """Every tables/paper/table*.csv in one frame (same columns in each file); empty where there are none."""
    files = sorted(Path(paper_dir or default_paper_dir()).glob("table*.csv"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def merge_repeated(paper: pd.DataFrame) -> pd.DataFrame:
    """One row per paper cell: Table 3 repeats Table 1's Ethernet 32/GPU figures (and adds scale efficiency),
    so rows with the same cell and the same throughput become one row labelled with both tables. Rows whose
    figures differ (Table 1 prints 4745 where Table 3 prints 4715) stay apart."""
    keys = list(MATCH) + ["gpus", "interconnect", "throughput", "speedup"]
    agg = {
        "table": lambda s: ", ".join(sorted({str(t) for t in s})),
        "cluster": "first",
        "scale_efficiency": "first",
        **{m: "first" for m in PAPER_METRICS},
    }
    return paper.groupby(keys, dropna=False, sort=False).agg(agg).reset_index()


def comparison_frame(cells: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Reproduced cells (from ``tables.cell_table``) joined to the paper's rows of the same cell."""
    if cells.empty or paper.empty:
        return pd.DataFrame()
    # Tiny models are smoke runs, no comparison for the paper's full-size models; Birder's flat and allgather
    # variants are not the paper's (hierarchical) Birder.
    comparable = (cells["model_size"] != "tiny") & (cells["variant"] == "")
    repro = cells[comparable].dropna(subset=["nodes", "gpus_per_node", "batch_size"]).copy()
    repro = repro.rename(columns={"optim": "optimizer", "batch_size": "batch_per_gpu"})
    for m in PAPER_METRICS:  # no run reported it: still a column, so that the paper's gets its "_paper" suffix
        if m not in repro:
            repro[m] = float("nan")
    for col in ("nodes", "gpus_per_node", "batch_per_gpu"):
        repro[col] = repro[col].astype("int64")
    joined = merge_repeated(paper).merge(repro, on=list(MATCH), suffixes=("_paper", ""))
    # A run on one of the paper's clusters (ethernet_10g, infiniband_200g) is compared with that cluster's
    # figures only; a run elsewhere (local, emulated) with every interconnect the paper reports.
    other_paper_cluster = joined["cluster"].isin(set(paper["cluster"])) & (joined["cluster"] != joined["cluster_paper"])
    joined = joined[~other_paper_cluster]
    joined = joined.assign(
        throughput_error=joined["throughput_shown"] / joined["throughput_paper"] - 1,
        speedup_error=joined["speedup"] / joined["speedup_paper"] - 1,
    )
    order = [
        "source",
        "task",
        "batch_per_gpu",
        "cluster",
        "data_source",
        "interconnect_paper",
        "gpus",
        "_rank",
        "table",
    ]
    baseline_first = (joined["optimizer"] == joined["baseline"]) * 100
    joined = joined.assign(_rank=optim_rank(joined["optimizer"]) - baseline_first)
    return joined.sort_values(order, kind="stable").drop(columns="_rank").reset_index(drop=True)


FIT_ROLES = {
    "one_node": "1-node row: the profile is derived from it",
    "in_sample": "IN-SAMPLE: fitted on",
    "held_out": "held out",
}


def _fitted_on(run_dir) -> dict | None:
    """The paper rows the links of a predicted record were fitted on (its ``prediction.fitted_on``, from the
    cluster config's ``perf.fitted_on``); None where they were fitted on none (a measured cluster spec)."""
    rec = read_record(Path(str(run_dir))) or {}
    return (rec.get("prediction") or {}).get("fitted_on")


def fit_role(row: pd.Series, fitted_on: dict | None) -> str:
    """Whether a predicted cell's paper row was used to fit the links it was predicted with: ``one_node`` (the
    paper profile is derived from the 1-node rows), ``in_sample`` (its table, node count and interconnect are
    among ``fitted_on``'s, e.g. ``{tables: [3, 4], nodes: [2, 4, 8]}`` in conf/cluster/ethernet_10g.yaml) or
    ``held_out``. A row printed in two tables (Table 1's 32-per-GPU rows are Table 3's) counts as in-sample if
    either table was fitted on."""
    if int(row["nodes"]) == 1:
        return "one_node"
    if not fitted_on:
        return "held_out"
    tables = {int(t) for t in str(row["table"]).split(",")}
    fitted = (
        tables & {int(t) for t in fitted_on.get("tables", [])}
        and int(row["nodes"]) in {int(n) for n in fitted_on.get("nodes", [])}
        and row["cluster"] == row["cluster_paper"]
    )
    return "in_sample" if fitted else "held_out"


def with_fit_roles(joined: pd.DataFrame) -> pd.DataFrame:
    """``joined`` with a ``fit_role`` column (:func:`fit_role`) on predicted rows; None on measured ones."""
    roles = [
        fit_role(r, _fitted_on(r["run_dir"])) if r["source"] == "predicted" else None for _, r in joined.iterrows()
    ]
    return joined.assign(fit_role=roles)


def fmt_paper_percent(x) -> str:
    """As the paper prints them: 40.1%, and two decimals below 10% (7.20%, 4.78%)."""
    return "—" if is_missing(x) else f"{x:.2f}%" if x < 10 else f"{x:.1f}%"


def _with_speedup(value, ratio) -> str:
    text = fmt_number(value)
    return text if is_missing(ratio) else f"{text} ({float(ratio):.2f}x)"


def comparison_display(joined: pd.DataFrame) -> pd.DataFrame:
    """Paper and reproduced figures of each matched cell side by side."""
    rows = joined.reset_index(drop=True)
    out = pd.DataFrame(
        {
            "task": rows["task"],
            "#GPUs (nodes x GPUs/node)": rows.apply(fmt_layout, axis=1),
            "batch/GPU": rows["batch_per_gpu"],
            "optimizer": rows["optimizer"].map(optim_label),
            "paper table": rows["table"],
            "paper interconnect": rows["interconnect_paper"],
            "paper throughput (speedup)": rows.apply(
                lambda r: _with_speedup(r["throughput_paper"], r["speedup_paper"]), axis=1
            ),
            "paper scale eff.": rows["scale_efficiency_paper"].map(fmt_paper_percent),
        }
    )
    what = "predicted" if (rows["source"] == "predicted").all() else "reproduced"
    if what == "predicted" and "fit_role" in rows:
        out["paper row in the links' fit?"] = rows["fit_role"].map(FIT_ROLES)
    for m in PAPER_METRICS:
        if rows[f"{m}_paper"].notna().any():
            out[f"paper {m}"] = rows[f"{m}_paper"].map(fmt_number)
            if what != "predicted":  # the model predicts speed, not accuracy
                out[f"reproduced {m}"] = rows[m].map(fmt_number)
    out[f"{what} cluster / data"] = rows["cluster"] + " / " + rows["data_source"]
    out[f"{what} throughput (speedup)"] = rows.apply(
        lambda r: _with_speedup(r["throughput_shown"], r["speedup"]), axis=1
    )
    out["throughput error"] = rows["throughput_error"].map(lambda x: "—" if is_missing(x) else f"{100 * x:+.1f}%")
    out["speedup error"] = rows["speedup_error"].map(lambda x: "—" if is_missing(x) else f"{100 * x:+.1f}%")
    out[f"{what} scale eff."] = rows.apply(
        lambda r: "—" if r["n_layouts"] < 2 else fmt_percent(r["scale_efficiency"]), axis=1
    )
    out["device"] = rows["device"]
    return out


def error_line(joined: pd.DataFrame) -> str:
    """Median and largest |throughput error| of the multi-node rows (1-node rows are the profile's own), the
    held-out rows apart from the in-sample ones where the rows say which they are (``fit_role``)."""
    multi = joined[joined["nodes"] > 1]
    if multi["throughput_error"].dropna().empty:
        return "No multi-node row to compare."

    def figures(rows: pd.DataFrame) -> str:
        err = rows["throughput_error"].abs().dropna()
        return (
            (f"median |throughput error| {100 * err.median():.1f}%, largest {100 * err.max():.1f}% ({len(err)} rows)")
            if not err.empty
            else "no rows"
        )

    if "fit_role" not in multi:
        return f"Multi-node rows: {figures(multi)}."
    return (
        f"Held-out multi-node rows (not used to fit the links): {figures(multi[multi['fit_role'] == 'held_out'])}. "
        f"In-sample rows (the links were fitted on them, so their error tests nothing): "
        f"{figures(multi[multi['fit_role'] == 'in_sample'])}."
    )


def comparison_markdown(cells: pd.DataFrame, paper: pd.DataFrame) -> str:
    lines = [
        "# The paper's numbers beside reproduced cells",
        "",
        "Paper: Birder paper, Tables 1-4 as transcribed in tables/paper/*.csv (ResNet-50 on "
        "ImageNet and BERT-Base on SQuAD 1.1, nodes of 8 A100 GPUs). A reproduced cell matches a paper "
        "row on task, optimizer, nodes, GPUs per node and batch per GPU; its interconnect, data source "
        "and device are shown, since they may differ from the paper's. Runs of `model.size=tiny` and "
        "Birder's flat and allgather variants are left out. Metrics of synthetic-data runs say nothing "
        "about the paper's accuracy.",
    ]
    if paper.empty:
        return "\n".join(lines + ["", "No paper tables found (tables/paper/table*.csv)."]) + "\n"
    joined = comparison_frame(cells, paper)
    if joined.empty:
        layouts = paper[["task", "nodes", "gpus_per_node", "batch_per_gpu"]].drop_duplicates()
        names = sorted(f"{t} {n}x{g} batch {b}" for t, n, g, b in layouts.itertuples(index=False))
        cells_text = ", ".join(names)
        lines += [
            "",
            "No reproduced cell matches a cell of the paper's tables yet. The paper's cells: " + cells_text + ".",
        ]
    else:
        for source, title in (
            ("predicted", "Predicted by the performance model (`birder-repro mode=predict`)"),
            ("measured", "Measured runs"),
        ):
            part = joined[joined["source"] == source]
            if part.empty:
                continue
            lines += ["", f"## {title}", ""]
            if source == "predicted":
                part = with_fit_roles(part)
                lines += [
                    "Error: predicted / paper - 1. The paper's profile (`predict.profile=paper`) is derived "
                    "from its 1-node rows, so those rows match by construction. Each predicted cell says "
                    "whether its paper row was used to fit the interconnect's two link numbers "
                    "(conf/cluster/<name>.yaml, `perf.fitted_on`): only held-out rows test the model "
                    "(`make validate` prints its out-of-sample figures).",
                    "",
                    error_line(part),
                    "",
                ]
            else:
                lines += ["Error: reproduced / paper - 1 (on other hardware, a difference, not an error).", ""]
            lines += [to_markdown(comparison_display(part))]
    return "\n".join(lines) + "\n"
