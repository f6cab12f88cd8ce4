"""The local-steps and replicas tables (birder_repro.report.local_steps): made-up runs, known answers."""

from __future__ import annotations

import json

import pytest
from conftest import write_records

from birder_repro.report.local_steps import (
    RunResult,
    load_results,
    replica_rows,
    replicas_markdown,
    versus,
    versus_markdown,
    versus_rows,
)
from birder_repro.report.stats import Interval

REFS = ["diloco", "birder"]


def _runs(optim, link, times, level=87.0, nodes=2, steps=None):
    return [
        RunResult(optim, link, nodes, seed, {level: t}, {level: (steps[seed] if steps else None)})
        for seed, t in enumerate(times)
    ]


def test_versus_orders_only_separated_intervals():
    assert versus(Interval(10, 1, 5), Interval(20, 1, 5)) == "faster"
    assert versus(Interval(20, 1, 5), Interval(10, 1, 5)) == "slower"
    assert versus(Interval(10, 6, 5), Interval(20, 6, 5)) == "tie"
    assert versus(None, Interval(20, 1, 5)) == "not reached"


def test_each_variant_against_diloco_and_birder_per_link():
    runs = (
        _runs("diloco", 50, [20.0, 20.2, 19.8])
        + _runs("diloco_1bit", 50, [10.0, 10.1, 9.9])  # faster than both
        + _runs("streaming_diloco", 50, [19.0, 21.5, 20.5])  # ties DiLoCo
        + _runs("birder", 50, [30.0, 30.1, 29.9])
        + _runs("sgdm_bf16_2level", 50, [80.0, None, 81.0])  # one run never reached: no interval
        + _runs("diloco", 100, [15.0, 15.1, 14.9])
        + _runs("diloco_1bit", 100, [16.0, 16.1, 15.9])  # slower than DiLoCo at 100
        + _runs("birder", 100, [16.0, 16.1, 15.9])
    )
    methods = ["diloco", "streaming_diloco", "diloco_1bit", "birder", "sgdm_bf16_2level"]
    rows = {(r["link_mbit"], r["optim"]): r for r in versus_rows(runs, methods, REFS)}
    assert rows[(50, "diloco_1bit")]["vs diloco"] == "faster" and rows[(50, "diloco_1bit")]["vs birder"] == "faster"
    assert rows[(50, "streaming_diloco")]["vs diloco"] == "tie"
    assert rows[(50, "streaming_diloco")]["vs birder"] == "faster"
    assert rows[(50, "diloco")]["vs diloco"] == "" and rows[(50, "diloco")]["vs birder"] == "faster"
    assert rows[(50, "sgdm_bf16_2level")]["vs birder"] == "not reached"
    assert rows[(50, "sgdm_bf16_2level")]["reached"] == 2
    assert rows[(100, "diloco_1bit")]["vs diloco"] == "slower"
    assert rows[(100, "diloco_1bit")]["vs birder"] == "tie"
    assert (100, "streaming_diloco") not in rows  # no runs there: no row
    assert rows[(50, "diloco")]["interval"].mean == pytest.approx(20.0)
    text = versus_markdown(versus_rows(runs, methods, REFS), REFS)
    assert "**50 Mbit/s**" in text and "**100 Mbit/s**" in text
    assert "| 87 % | 1-bit DiLoCo | 10 ± 0.25 | 3 of 3 | faster | faster |" in text
    assert "| 87 % | SGDM + two-level bf16 | - | 2 of 3 | not reached | not reached |" in text


def test_replica_rows_give_steps_and_the_multiple_of_birders():
    runs = (
        _runs("birder", None, [1, 1, 1], nodes=2, steps=[100, 110, 120])
        + _runs("diloco", None, [1, 1, 1], nodes=2, steps=[100, 110, 120])
        + _runs("birder", None, [1, 1, 1], nodes=8, steps=[100, 100, 100])
        + _runs("diloco", None, [1, 1, 1], nodes=8, steps=[200, 210, 190])
    )
    rows = {(r["optim"], r["nodes"]): r for r in replica_rows(runs, ["diloco", "birder"])}
    at8 = rows[("diloco", 8)]["targets"][87.0]
    assert at8["multiple"] == pytest.approx(2.0)
    assert at8["ratio"].mean == pytest.approx(2.0) and at8["steps"].mean == pytest.approx(200.0)
    assert rows[("diloco", 2)]["targets"][87.0]["multiple"] == pytest.approx(1.0)
    assert rows[("diloco", 2)]["targets"][87.0]["ratio"].half == pytest.approx(0.0)
    text = replicas_markdown(list(rows.values()))
    assert "| DiLoCo | 8 | 3 | 200 ± 25 | 2.00 (± 0.25) |" in text


def test_load_results_reads_steps_and_times_of_each_target_from_the_log(tmp_path):
    rec = {
        "status": "completed",
        "optim": "diloco",
        "headline_metric": "top1",
        "cluster": {"name": "emulated", "link_mbit": 50},
        "time_to_target": {"metric": "top1", "direction": "higher", "reached": True, "step": 20},
        "config": {"seed": 3, "nodes": 2, "task": {"target": {"value": 87.0, "ladder": [86.0, 88.0]}}},
    }
    budget = {**rec, "config": {**rec["config"], "tuning": {"budget_s": 9.5}}}
    write_records(tmp_path, [rec, budget], lambda i, r: f"run{i}")
    log = [
        {"step": 10, "train_s": 1.0, "eval/top1": 86.5},
        {"step": 20, "train_s": 2.0, "eval/top1": 87.2},
        {"step": 30, "train_s": 3.0, "final/top1": 88.1},  # the synchronised model's final evaluation counts
    ]
    (tmp_path / "run0" / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in log) + "\n")
    (got,) = load_results(tmp_path)  # the budget run is left out
    assert (got.optim, got.link_mbit, got.nodes, got.seed) == ("diloco", 50.0, 2, 3)
    assert got.steps == {86.0: 10, 87.0: 20, 88.0: 30}
    assert got.times == {86.0: 1.0, 87.0: 2.0, 88.0: 3.0}


def test_the_command_without_runs_says_which_target_makes_them(tmp_path, capsys):
    from birder_repro.report.local_steps import main

    assert main(["--runs", str(tmp_path / "none")]) == 2
    assert main(["--replicas", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "run make local-steps" in err[0] and "run make diloco-replicas" in err[1] and len(err) == 2
