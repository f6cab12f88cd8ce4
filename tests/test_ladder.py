"""tables/targets.md (birder_repro.report.ladder): the time to several targets read from each run's evaluation
curve, and the metric every method has at equal time budgets (fractions of the baseline's whole run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import compose_config
from test_target import target_record

from birder_repro import config as layout
from birder_repro.report import ladder
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame


def curve_run(root: Path, name: str, optim: str, seed: int, points, *, compile_s=0.5, stop_at_target=False):
    """A run whose evaluations are ``points`` [(step, train_s, top1)] and whose ladder is 97, 98.5, 99."""
    final = points[-1][2]
    reached = next(((s, t) for s, t, v in points if v >= 98.0), None)
    rec = target_record(optim, seed, None if reached is None else reached[1] - compile_s, step=reached and reached[0])
    rec["compile_s"] = compile_s
    rec["training_clock"] = "loop"  # written now: train_s is the loop clock (report.clock)
    rec["metrics"] = {"top1": final}
    rec["config"]["task"]["target"] = {"metric": "top1", "value": 98.0, "direction": "higher", "ladder": [97, 98.5, 99]}
    rec["config"]["train"] = {"stop_at_target": stop_at_target}
    run = root / name
    run.mkdir(parents=True)
    (run / "record.json").write_text(json.dumps(rec))
    lines = []
    for step, t, value in points:  # a training line and an evaluation line per evaluation, as the logger writes
        lines.append({"step": step, "time_s": t + 3.0, "train_s": t, "loss": 0.1})
        lines.append({"step": step, "time_s": t + 3.1, "train_s": t, "eval/loss": 0.1, "eval/top1": value})
    lines.append({"step": points[-1][0], "train_s": points[-1][1], "final/top1": final})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut sho")
    return run


def write_field(root: Path) -> Path:
    # SGDM: whole runs of 10.5 s (t less compile 0.5 s: 10 s); reaches 97 at 4, 98 at 6, 98.5 at 8, never 99
    curve_run(
        root, "a", "sgdm", 0, [(10, 2.5, 95.0), (20, 4.5, 97.0), (30, 6.5, 98.0), (40, 8.5, 98.6), (50, 10.5, 98.7)]
    )
    curve_run(
        root, "b", "sgdm", 1, [(10, 2.5, 96.0), (20, 4.5, 97.5), (30, 6.5, 98.2), (40, 8.5, 98.4), (50, 10.5, 98.5)]
    )
    # Birder: fast to 97 and 98, stalls below 98.5
    curve_run(
        root, "c", "birder", 0, [(10, 1.5, 97.2), (20, 2.5, 98.1), (30, 3.5, 98.2), (40, 4.5, 98.3), (50, 5.5, 98.3)]
    )
    return root


def test_levels_are_the_target_and_its_ladder_ascending_once():
    assert ladder.levels_of({"task": {"target": {"value": 87.0, "ladder": [88, 86, 87]}}}) == [86.0, 87.0, 88.0]
    assert ladder.levels_of({"task": {"target": {"value": 87.0}}}) == [87.0]
    assert ladder.levels_of({}) == []


def test_time_to_each_level_and_the_metric_at_equal_time(tmp_path):
    rows = ladder.ladder_rows(load_frame(write_field(tmp_path / "runs")))
    sgdm, birder = (rows[rows["optim"] == o].iloc[0] for o in ("sgdm", "birder"))
    # times on time_to_target's clock: train_s less compile_s
    assert sgdm["time_s_mean@97"] == pytest.approx(4.0) and sgdm["reached@97"] == 2
    assert sgdm["time_s_mean@98"] == pytest.approx(6.0) and sgdm["time_s_sd@98"] == pytest.approx(0.0)
    assert sgdm["time_s_mean@98.5"] == pytest.approx(9.0) and sgdm["time_s_sd@98.5"] == pytest.approx(math.sqrt(2))
    assert sgdm["reached@99"] == 0 and math.isnan(sgdm["time_s_mean@99"])
    assert birder["time_s_mean@97"] == pytest.approx(1.0) and birder["time_s_mean@98"] == pytest.approx(2.0)
    assert birder["reached@98.5"] == 0
    # budgets: 1/4, 1/2 and all of SGDM's whole run (10 s)
    assert [sgdm[f"budget_s@{f:g}"] for f in ladder.BUDGET_FRACTIONS] == pytest.approx([2.5, 5.0, 10.0])
    assert sgdm["metric_mean@0.25"] == pytest.approx(95.5)  # at 2.5 s: the evaluations at t = 2 s
    assert sgdm["metric_mean@0.5"] == pytest.approx(97.25)  # at 5 s: the evaluations at t = 4 s
    assert birder["metric_mean@0.25"] == pytest.approx(98.1)  # at 2.5 s: t = 2 s (the one at 3 s is later)
    assert birder["metric_mean@1"] == pytest.approx(98.3)  # ended at 5 s: its final metric holds
    assert list(rows["optim"]) == ["sgdm", "birder"]
    text = ladder.ladder_markdown(rows)
    assert "time to top-1 >= 98.5, s" in text and "not reached (0 of 1)" in text and "9.0 ± 1.4 (2 of 2)" in text
    assert "top-1 at 10 s (1 x SGDM's run)" in text


def test_a_run_that_stopped_at_its_target_has_no_metric_after_it(tmp_path):
    root = write_field(tmp_path / "runs")
    curve_run(root, "d", "adamw", 0, [(10, 2.5, 97.0), (20, 3.5, 98.0)], stop_at_target=True)
    rows = ladder.ladder_rows(load_frame(root))
    adamw = rows[rows["optim"] == "adamw"].iloc[0]
    assert adamw["metric_mean@0.25"] == pytest.approx(97.0) and math.isnan(adamw["metric_mean@1"])
    assert adamw["metric_runs@1"] == 0


def test_make_tables_writes_targets_md(tmp_path):
    root = write_field(tmp_path / "runs")
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    text = (tmp_path / "out" / "targets.md").read_text()
    assert "# Several targets and equal time" in text and "| Birder " in text
    assert "time_s_mean@98.5" in (tmp_path / "out" / "targets.csv").read_text()


def test_a_bad_ladder_is_one_error_naming_the_key():
    from birder_repro import cli

    cfg = compose_config(["task=fashion_mnist", "task.target.ladder=[86,x]"], hydra_config=True)
    with pytest.raises(layout.ConfigError, match=r"task.target.ladder=\[86, 'x'\]: give a list of numbers"):
        layout.validate(cfg, cli.reference_configs(cfg))


def test_the_ladder_and_mode_advise_settings_are_not_part_of_a_measured_cell():
    """Neither changes what a run trains: runs before and after a config tree that gained them are one cell
    (tuning trials of one sweep were split in two when conf/config.yaml gained `advise:`)."""
    from birder_repro.report.identity import is_ignored

    assert is_ignored("task.target.ladder") and not is_ignored("task.target.value")
    assert is_ignored("advise.runs") and not is_ignored("advise.runs", source="predicted")
