"""Tables of reproduced runs in the paper's shape, from the flat DataFrame of ``records.py``: the numbers.

Which runs a row holds is :mod:`birder_repro.report.cells`' job (one configuration of one optimizer in a cell,
its seeds aggregated; every other run listed with the reason it is left out); this module computes what the
paper's tables show from those rows: speedups over the task's baseline in the same cell (the baseline's row of
the same setting, where several exist), and scale efficiency against the smallest layout of the same
optimizer in the same setting, as Birder paper, Tables 1-4 do. ``source`` (measured | predicted) is part of
the setting: predicted records (``birder-repro mode=predict``) form their own sections, with speedups and
scale efficiencies over predicted rows only, and are never mixed with measured ones.

The numbers are computed on plain numeric columns first (``cell_table``, also written as CSV) and formatted
into strings only at the end (:mod:`birder_repro.report.display`), so tests and outside scripts can check the
arithmetic.
"""

from __future__ import annotations

import pandas as pd

from . import records
from .cells import CELL, DIVERGED, LAYOUT, SETTING, aggregate, select_runs
from .display import OPTIM_LABELS, OPTIM_ORDER, STAGE_MARK, TARGET_HEADER, display_frame, optim_rank, throughput_header
from .records import STAGED_OPTIMIZERS

__all__ = [
    "CELL",
    "DIVERGED",
    "LAYOUT",
    "OPTIM_LABELS",
    "OPTIM_ORDER",
    "SETTING",
    "STAGE_MARK",
    "TARGET_HEADER",
    "THROUGHPUT_MODES",
    "add_scale_efficiency",
    "add_speedup",
    "cell_table",
    "csv_columns",
    "display_frame",
    "scale_efficiency",
    "shown_figures",
    "speedup",
    "throughput_header",
    "volume_ratio",
]

THROUGHPUT_MODES = ("whole", "stage")


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
    cells["throughput_shown_sd"] = cells["throughput_compression_sd"].where(use_stage, cells["throughput_sd"])
    cells["throughput_basis"] = use_stage.map({True: "compression stage", False: "whole run"})
    stage_bytes = use_stage & cells["inter_mb_per_step_compression"].notna()
    for kind in ("intra", "inter"):
        cells[f"{kind}_mb_shown"] = cells[f"{kind}_mb_per_step_compression"].where(
            stage_bytes, cells[f"{kind}_mb_per_step"]
        )
    cells["bytes_basis"] = stage_bytes.map({True: "compression stage", False: "whole run"})
    return cells


def add_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """``speedup`` over the baseline optimizer's row in the same cell and of the same setting where the cell
    holds several (``match_note``: the keys they differ in, the optimizers' own left out); NaN where there is
    none."""
    cells = cells.copy()
    is_baseline = (cells["optim"] == cells["baseline"]) & (cells["variant"] == "")
    base = cells["throughput_shown"].where(is_baseline)
    keys = [cells[k] for k in (*CELL, "match_note")]
    cells["baseline_throughput"] = base.groupby(keys, dropna=False).transform("max")
    cells["speedup"] = speedup(cells["throughput_shown"], cells["baseline_throughput"])
    return cells


def add_scale_efficiency(cells: pd.DataFrame) -> pd.DataFrame:
    """``scale_efficiency`` against the smallest layout (fewest GPUs, then fewest nodes) of the same
    optimizer in the same setting (and of the same ``setting_note``); ``scale_ref`` names that layout;
    ``n_layouts`` counts the layouts."""
    cells = cells.sort_values(["gpus", "nodes"], na_position="last", kind="stable").copy()
    groups = cells.groupby(list(SETTING) + ["optim", "variant", "setting_note"], dropna=False)

    def first(values: pd.Series):  # transform("first") would skip a missing reference value
        return values.iloc[0]

    ref_throughput = groups["throughput_shown"].transform(first)
    ref_gpus = groups["gpus"].transform(first).astype("float64")
    cells["scale_efficiency"] = scale_efficiency(
        cells["throughput_shown"], cells["gpus"].astype("float64"), ref_throughput, ref_gpus
    )
    cells["scale_ref"] = (
        groups["nodes"].transform(first).astype("string")
        + "x"
        + groups["gpus_per_node"].transform(first).astype("string")
    )
    cells["n_layouts"] = groups["gpus"].transform("size")
    return cells


def cell_table(frame: pd.DataFrame, mode: str = "whole") -> pd.DataFrame:
    """The runs of ``frame`` the tables show, one row per configuration (cells.ROW) with every derived column;
    ``cells.select_runs`` gives the runs left out."""
    kept, _ = select_runs(frame)
    cells = aggregate(kept)
    cells = add_scale_efficiency(add_speedup(shown_figures(cells, mode)))
    crosses_nodes = cells["fp32_inter_mb_per_step"] > 0  # on one node there is nothing to compare with
    cells["inter_vs_fp32"] = volume_ratio(cells["inter_mb_shown"], cells["fp32_inter_mb_per_step"]).where(crosses_nodes)
    cells["_rank"] = optim_rank(cells["optim"]) - (cells["optim"] == cells["baseline"]) * 100
    order = [*SETTING, "gpus", "nodes", "_rank", "optim", "variant", "setting_note"]
    cells = cells.sort_values(order, na_position="last", kind="stable")
    cells = cells.drop(columns="_rank").reset_index(drop=True)
    cells.attrs["metric_columns"] = records.metric_columns(frame)
    return cells


def csv_columns(cells: pd.DataFrame) -> list[str]:
    """Columns of the CSV files: the numbers, unformatted, with where they came from; every metric column and
    its spread over seeds."""
    metrics = [c for m in records.metric_columns(cells) for c in (m, f"{m}_sd")]
    return [c for c in (*CSV_HEAD, *metrics, *CSV_TAIL) if c in cells]


CSV_HEAD = (
    *CELL,
    "gpus",
    "optim",
    "variant",
    "baseline",
    "throughput_shown",
    "throughput_basis",
    "throughput",
    "throughput_warmup",
    "throughput_compression",
    "throughput_shown_sd",
    "n",
    "seeds",
    "attempts",
    "setting_note",
    "cell_key",
    "speedup",
    "scale_efficiency",
    "scale_ref",
    "headline_metric",
    "target_metric",
    "target_direction",
    "target_value",
    "target_reached",
    "target_s",
    "target_step",
    "target_samples",
    "target_wall_s",
    "target_evaluations",
    "target_reached_n",
    "target_s_sd",
    "startup_s",
    "compile_s",
)
CSV_TAIL = (
    "bytes_basis",
    "intra_mb_shown",
    "inter_mb_shown",
    "intra_mb_per_step",
    "inter_mb_per_step",
    "intra_mb_per_step_compression",
    "inter_mb_per_step_compression",
    "fp32_mb_per_step",
    "fp32_inter_mb_per_step",
    "inter_vs_fp32",
    "link_mb_per_step",
    "per_node_link_mb",
    "step_ms_total",
    "step_ms_compute",
    "step_ms_communication",
    "step_ms_compression",
    "step_ms_data_wait",
    "implementation",
    "steps",
    "global_batch_size",
    "device",
    "run_dir",
    "started",
    "status",
    "diverged_at_step",  # a diverged run's row: status diverged, its numbers empty
)
