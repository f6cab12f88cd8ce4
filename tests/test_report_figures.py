"""Figures a reader parses at a glance: Figure 2 draws the final evaluation and names only what it draws; every
axis carries its unit; Figure 3's throughput axis starts at zero and its subtitle and legend match its marks.

The matplotlib objects are inspected (lines, markers, labels), not the pixels.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import write_records

from birder_repro.report import figures, tables
from birder_repro.report.records import load_frame


def record(
    optim: str,
    *,
    seed: int = 0,
    nodes: int = 2,
    throughput: float = 100.0,
    eval_every: int = 10,
    status: str = "completed",
    reached_at: int | None = None,
) -> dict:
    return {
        "status": status,
        "task": "digits",
        "optim": optim,
        "headline_metric": "top1",
        "cluster": {"name": "local", "nodes": nodes, "gpus_per_node": 1, "interconnect": "loopback", "link_mbit": None},
        "world_size": nodes,
        "batch_size": 32,
        "steps": 60,
        "throughput_samples_per_s": throughput,
        "metrics": {"top1": 97.5, "loss": 0.05},
        "started": f"2026-01-01T10:00:0{seed}",
        "compile_s": 0.0,
        "training_clock": "loop",
        "time_to_target": {
            "metric": "top1",
            "target": 98.0,
            "direction": "higher",
            "reached": reached_at is not None,
            "step": reached_at,
            "seconds": None if reached_at is None else reached_at / 100,
            "evaluations": 6,
        },
        "config": {
            "seed": seed,
            "nodes": nodes,
            "task": {"name": "digits", "baseline": "sgdm"},
            "data": {"source": "real"},
            "model": {"size": "full"},
            "train": {"steps": 60, "eval_every": eval_every},
            "optim": {"name": optim},
        },
    }


def metrics_lines(eval_every: int, final_top1: float = 97.5) -> list[dict]:
    """metrics.jsonl as a 60-step run logs it: loss every 10 steps, eval/ every ``eval_every``, final/ at 60."""
    lines = []
    for step in range(10, 61, 10):
        lines.append({"step": step, "time_s": step / 90, "train_s": step / 100, "loss": 1.0 / step})
        if eval_every and step % eval_every == 0 and step < 60:
            lines.append({"step": step, "time_s": step / 90, "train_s": step / 100, "eval/top1": 90 + step / 10})
    lines.append({"step": 60, "time_s": 0.7, "train_s": 0.6, "final/top1": final_top1, "final/loss": 0.05})
    return lines


def write_runs(root: Path, records: list[dict], eval_every: int = 10) -> Path:
    write_records(root, records, lambda i, rec: f"2026-01-01/{i:02d}_{rec['optim']}_n{rec['cluster']['nodes']}")
    for run in sorted(root.glob("2026-01-01/*")):
        lines = metrics_lines(eval_every)
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def cells_of(root: Path):
    return tables.cell_table(load_frame(root))


def close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_figure_2_ends_each_metric_curve_at_the_final_evaluation(tmp_path):
    root = write_runs(tmp_path, [record("sgdm", reached_at=40), record("birder")])
    fig = figures.convergence_figure(cells_of(root))
    metric_steps, metric_time = fig.axes[2:4]  # after the loss against steps and against time
    for ax in (metric_steps, metric_time):
        curves = [line for line in ax.get_lines() if line.get_label() in ("SGDM", "Birder")]
        assert len(curves) == 2
        assert all(line.get_ydata()[-1] == 97.5 for line in curves)  # the final evaluation, last on the curve
    assert all(line.get_xdata()[-1] == 60 for line in metric_steps.get_lines() if line.get_label() == "SGDM")
    squares = [line for line in metric_steps.get_lines() if line.get_marker() == "s"]
    stars = [line for line in metric_steps.get_lines() if line.get_marker() == "*"]
    assert len(squares) == 2 and len(stars) == 1 and list(stars[0].get_xdata()) == [40.0]
    assert "square: final evaluation" in fig._suptitle.get_text()
    assert "star: time to target" in fig._suptitle.get_text()
    close(fig)


def test_figure_2_axes_carry_units(tmp_path):
    fig = figures.convergence_figure(cells_of(write_runs(tmp_path, [record("sgdm"), record("birder")])))
    labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]
    assert [y for _, y in labels[2:]] == ["top-1 on the evaluation set, %"] * 2
    assert all("nats" in y for _, y in labels[:2])
    assert all(x == "step (optimizer steps)" for x, _ in labels[0::2])
    assert all(x.endswith(", s") for x, _ in labels[1::2])
    close(fig)


def test_figure_2_without_evaluations_during_training_says_so_and_mentions_no_star(tmp_path):
    root = write_runs(
        tmp_path, [record("sgdm", eval_every=0, reached_at=60), record("birder", eval_every=0)], eval_every=0
    )
    fig = figures.convergence_figure(cells_of(root))
    assert len(fig.axes) == 4  # the metric panel holds the final evaluations
    title = fig._suptitle.get_text()
    assert "final evaluation only (train.eval_every=0)" in title
    stars = [line for ax in fig.axes for line in ax.get_lines() if line.get_marker() == "*"]
    assert ("star" in title) == bool(stars)
    close(fig)


def test_figure_3_starts_at_zero_and_names_only_its_marks(tmp_path):
    one_layout = write_runs(tmp_path / "one", [record("sgdm", throughput=4400.0), record("birder", throughput=3700.0)])
    fig = figures.throughput_figure(cells_of(one_layout), "whole")
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0 and "samples/s" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["SGDM", "Birder"]
    assert "dashed" not in ax.get_title() and "error bars" not in ax.get_title()  # nothing of the kind drawn
    close(fig)
    seeds = [
        record(o, seed=s, nodes=n, throughput=t * n + s)
        for o, t in (("sgdm", 100.0), ("birder", 150.0))
        for n in (1, 2, 4)
        for s in (0, 1)
    ]
    fig = figures.throughput_figure(cells_of(write_runs(tmp_path / "many", seeds)), "whole")
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0 and "log scale" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["SGDM (measured)", "Birder (measured)"]
    assert "error bars: ± 1 sd over seeds" in ax.get_title() and "dashed" not in ax.get_title()
    close(fig)


def test_figure_2_draws_every_seed_on_its_own_clock(tmp_path):
    """A row's seeds are drawn each on its own time axis: its own first-step one-time work left out, never the
    row's mean (a seed that compiled for 5 s would start 2.5 s late, the others at zero)."""
    slow = record("birder", seed=1)
    slow["compile_s"] = 0.05
    fig = figures.convergence_figure(cells_of(write_runs(tmp_path, [record("birder", seed=0), slow])))
    loss_time = fig.axes[1]
    starts = sorted(round(float(line.get_xdata()[0]), 3) for line in loss_time.get_lines())
    assert starts == [0.05, 0.1]  # train_s 0.1 at step 10, less 0.05 and less 0
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["Birder (2 seeds)"]
    close(fig)


def test_figure_3_and_4_name_the_devices_the_records_ran_on(tmp_path):
    """CPU runs are not "GPUs": the axes say what the records' ``device`` says."""
    runs = [{**record(o, throughput=t), "device": "cpu"} for o, t in (("sgdm", 4400.0), ("birder", 3700.0))]
    fig = figures.throughput_figure(cells_of(write_runs(tmp_path / "cpu", runs)), "whole")
    assert fig.axes[0].get_xlabel() == "optimizer, at 2 CPU processes (2x1)"
    close(fig)
    gpus = [{**record("birder", nodes=n), "device": "cuda (NVIDIA H100)"} for n in (1, 2)]
    fig = figures.throughput_figure(cells_of(write_runs(tmp_path / "gpu", gpus)), "whole")
    assert fig.axes[0].get_xlabel().startswith("number of NVIDIA H100 GPUs; log scale")
    close(fig)
