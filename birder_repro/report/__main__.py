"""``python -m birder_repro.report`` (what ``make tables`` runs): run records -> tables/*.md|csv|tex, figures.

    python -m birder_repro.report [--runs DIR] [--out DIR] [--figures DIR] [--throughput whole|stage]

``--runs DIR`` is the runs root, searched at any depth: a sweep's own directory tabulates that sweep alone.
The runs the tables leave out are printed, one line each with the reason, and listed in the files.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from . import (
    crossover,
    crossover_figure,
    crossover_render,
    documents,
    figures,
    ladder,
    model_error,
    paper,
    tables,
    tuning_render,
    tuning_trials,
)
from . import target as time_to_target
from .cells import select_runs
from .display import to_latex
from .records import load_frame, runs_root


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m birder_repro.report",
        description="Tables in the paper's shape (markdown, CSV, LaTeX) and throughput figures from every run "
        "record (record.json) under the runs directory; `make tables ARGS=...` passes options.",
    )
    p.add_argument(
        "--runs",
        metavar="DIR",
        help="the runs root, searched for record.json at any depth (default: $BIRDER_RUNS, else "
        "runs/); e.g. a sweep's own directory, runs/multirun/<sweep>, for its runs alone",
    )
    p.add_argument("--out", metavar="DIR", default="tables", help="where the tables go (default: tables/)")
    p.add_argument("--figures", metavar="DIR", default="figures", help="where the figures go (default: figures/)")
    p.add_argument("--paper", metavar="DIR", help="the paper's CSVs (default: tables/paper of this checkout)")
    p.add_argument(
        "--throughput",
        choices=tables.THROUGHPUT_MODES,
        default="whole",
        help="1-bit Adam / LAMB throughput over the whole run or its compression stage",
    )
    return p.parse_args(argv)


def file_stem(task: str) -> str:
    """A task name as a file name; "summary" and "paper_comparison" are taken by the overview files."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(task))
    return f"task_{stem}" if stem in ("summary", "paper_comparison") else stem


def _write(path: Path, text: str, written: list[Path]) -> None:
    path.write_text(text)
    written.append(path)


def write_task_files(out: Path, frame: pd.DataFrame, cells: pd.DataFrame, left: pd.DataFrame, mode: str) -> list[Path]:
    """tables/<task>.md, .csv (the numbers) and .tex for every task that has any record."""
    written: list[Path] = []
    for task in sorted(frame["task"].astype("object").fillna("unknown").unique()):
        task_cells = cells[cells["task"] == task]
        task_left = left[left["task"] == task]
        stem = out / file_stem(task)
        _write(stem.with_suffix(".md"), documents.task_markdown(task, task_cells, task_left, mode), written)
        _write(stem.with_suffix(".csv"), task_cells[tables.csv_columns(task_cells)].to_csv(index=False), written)
        latex = to_latex(tables.display_frame(task_cells, mode, with_setting=True))
        if latex is not None and not task_cells.empty:
            _write(stem.with_suffix(".tex"), latex, written)
    return written


def figure_files(draw, figures_dir: Path | None) -> list[Path]:
    """``draw(figures_dir)``'s files, or nothing where there is no directory or figures are off."""
    if figures_dir is None or not figures.drawing():
        return []
    return draw(figures_dir)


def write_overview(
    out: Path,
    frame: pd.DataFrame,
    cells: pd.DataFrame,
    left: pd.DataFrame,
    mode: str,
    task_files: list[Path],
    paper_dir: str | None,
    figures_dir: Path | None = None,
) -> list[Path]:
    """tables/summary.md|csv, left_out.csv, time_to_target, tuning and crossover (with its figure) and
    tables/paper_comparison.md|csv."""
    written: list[Path] = []
    md_names = [p.name for p in task_files if p.suffix == ".md"]
    _write(out / "summary.md", documents.summary_markdown(frame, cells, left, mode, md_names), written)
    _write(out / "summary.csv", cells[tables.csv_columns(cells)].to_csv(index=False), written)
    if not left.empty:
        _write(out / "left_out.csv", documents.left_out_table(left).to_csv(index=False), written)
    # An earlier report's list (not_completed.csv: its name before left_out.csv) would read as this one's.
    for stale in ("left_out.csv", "not_completed.csv"):
        if (out / stale) not in written and (out / stale).exists():
            (out / stale).unlink()
    if "target_metric" in frame and frame["target_metric"].notna().any():  # time to accuracy (report.target)
        rows = time_to_target.target_rows(frame)
        _write(out / "time_to_target.md", time_to_target.target_markdown(rows), written)
        if not rows.empty:
            _write(out / "time_to_target.csv", time_to_target.csv_text(rows), written)
        levels = ladder.ladder_rows(frame)  # several targets, and the metric at a time budget (report.ladder)
        budgets = ladder.budget_rows(frame)
        if not levels.empty or not budgets.empty:
            _write(out / "targets.md", ladder.ladder_markdown(levels, budgets), written)
            _write(out / "targets.csv", ladder.csv_text(levels, budgets), written)
    # tuning on the validation split, scored by predicted time where 1-node profiles exist (report.tuning)
    trials = tuning_trials.tuning_rows(frame, crossover.one_node_profiles(frame["run_dir"]))
    if not trials.empty:
        _write(out / "tuning.md", tuning_render.tuning_markdown(trials), written)
        _write(out / "tuning.csv", tuning_render.csv_text(trials), written)
    points, per_run = crossover.crossover_tables(frame)  # time to target against the link rate
    if not points.empty:
        _write(out / "crossover.md", crossover_render.crossover_markdown(points, per_run), written)
        _write(out / "crossover.csv", crossover_render.csv_text(points), written)
        written += figure_files(lambda d: crossover_figure.crossover_figures(points, d), figures_dir)
    errors = model_error.model_error_rows(frame)  # the model against every multi-node run it can predict
    if not errors.empty:
        summary = model_error.model_error_summary(errors)
        crossings = model_error.crossover_error_rows(points)
        _write(out / "model_error.md", model_error.model_error_markdown(errors, summary, crossings), written)
        _write(out / "model_error.csv", model_error.csv_text(errors), written)
    paper_rows = paper.load_paper_tables(Path(paper_dir) if paper_dir else None)
    _write(out / "paper_comparison.md", paper.comparison_markdown(cells, paper_rows), written)
    joined = paper.comparison_frame(cells, paper_rows)
    if not joined.empty:
        _write(out / "paper_comparison.csv", joined.to_csv(index=False), written)
    return written


def print_left_out(left: pd.DataFrame) -> None:
    """One line per run the tables leave out, with the reason (also in the markdown files and left_out.csv)."""
    if left.empty:
        return
    print(f"left out of the tables: {len(left)} run(s)")
    for _, row in documents.left_out_table(left).iterrows():
        print(f"  {row['run']} ({row['optimizer']}, {row['steps']} steps): {row['reason']}")
    if left["reason"].astype(str).str.startswith("failed").any():
        print("  (make clean-failed lists the failed runs; make clean-failed ARGS=--yes removes them)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    root = runs_root(args.runs)
    frame = load_frame(root)
    if frame.empty:
        # Writing empty tables would look like a result; say what is missing instead.
        print(
            f"no run records (record.json) under {root}/: nothing written. Run an experiment first "
            f"(birder-repro ...), or point --runs / BIRDER_RUNS at the runs."
        )
        return 0
    n_done = int((frame["status"] == "completed").sum())
    n_pred = int((frame["status"] == "predicted").sum())
    predicted = f"{n_pred} predicted, " if n_pred else ""
    print(
        f"read {len(frame)} run record(s) under {root}/: {n_done} completed, {predicted}"
        f"{len(frame) - n_done - n_pred} not completed"
    )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = tables.cell_table(frame, args.throughput)
    _, left = select_runs(frame)
    print_left_out(left)
    written = write_task_files(out, frame, cells, left, args.throughput)
    written += write_overview(out, frame, cells, left, args.throughput, written, args.paper, Path(args.figures))
    if cells.empty:
        print("figures: no completed run to plot")
    elif figures.drawing():
        written += figures.throughput_figures(cells, Path(args.figures), args.throughput)
        written += figures.step_time_figures(cells, Path(args.figures))
        written += figures.convergence_figures(cells, Path(args.figures))
    print("wrote:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
