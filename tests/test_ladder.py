"""tables/targets.md (birder_repro.report.ladder): the time to several targets read from each run's evaluation
curve with 95 % t intervals and the order they allow, the metric of runs sized to a time budget, and the runs
taken on a loaded host."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import compose_config
from test_target import target_record

from birder_repro.config import settings as layout
from birder_repro.report import ladder
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame
from birder_repro.train import checks  # noqa: F401 - validate runs the higher layers' section checks too


def curve_run(
    root: Path,
    name: str,
    optim: str,
    seed: int,
    points,
    *,
    compile_s=0.5,
    stop_at_target=False,
    budget_s=None,
    host_load=None,
):
    """A run whose evaluations are ``points`` [(step, train_s, top1)] and whose ladder is 97, 98.5, 99."""
    final = points[-1][2]
    reached = next(((s, t) for s, t, v in points if v >= 98.0), None)
    rec = target_record(optim, seed, None if reached is None else reached[1] - compile_s, step=reached and reached[0])
    rec["compile_s"] = compile_s
    rec["training_clock"] = "loop"  # written now: train_s is the loop clock (report.clock)
    rec["metrics"] = {"top1": final}
    rec["config"]["task"]["target"] = {"metric": "top1", "value": 98.0, "direction": "higher", "ladder": [97, 98.5, 99]}
    rec["config"]["train"] = {"stop_at_target": stop_at_target}
    if budget_s is not None:  # a run sized to a time budget (report.protocol): its own length
        rec["config"]["train"]["steps"] = points[-1][0]
        rec["config"]["tuning"] = {"budget_s": budget_s}
        rec["steps"] = points[-1][0]
    rec["host_load"] = host_load
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


def test_time_to_each_level_with_its_t_interval_and_the_order_it_allows(tmp_path):
    rows = ladder.ladder_rows(load_frame(write_field(tmp_path / "runs")))
    sgdm, birder = (rows[rows["optim"] == o].iloc[0] for o in ("sgdm", "birder"))
    # times on time_to_target's clock: train_s less compile_s
    assert sgdm["time_s_mean@97"] == pytest.approx(4.0) and sgdm["reached@97"] == 2
    assert sgdm["time_s_mean@98"] == pytest.approx(6.0) and sgdm["time_s_sd@98"] == pytest.approx(0.0)
    assert sgdm["time_s_mean@98.5"] == pytest.approx(9.0) and sgdm["time_s_sd@98.5"] == pytest.approx(math.sqrt(2))
    # 8 and 10 s: sd sqrt(2), half-width t(0.975, 1) x sqrt(2) / sqrt(2) = 12.706
    assert sgdm["time_s_ci@98.5"] == pytest.approx(12.7062, abs=1e-3)
    assert sgdm["reached@99"] == 0 and math.isnan(sgdm["time_s_mean@99"])
    assert birder["time_s_mean@97"] == pytest.approx(1.0) and birder["time_s_mean@98"] == pytest.approx(2.0)
    assert birder["reached@98.5"] == 0
    # Birder's one seed has no interval: faster by its mean, still a tie
    assert birder["order@98"] == "tie with SGDM" and sgdm["order@98"] == ""
    assert list(rows["optim"]) == ["sgdm", "birder"]
    assert not any(c.startswith(("budget_s@", "metric_mean@")) for c in rows.columns)  # no equal-time column
    text = ladder.ladder_markdown(rows)
    assert "time to top-1 >= 98.5, s (95 % CI)" in text and "not reached (0 of 1)" in text
    assert "9 ± 13 (2 of 2)" in text and "1 (one run: no interval) (1 of 1)" in text


def test_separated_intervals_give_an_order_and_overlapping_ones_a_tie(tmp_path):
    root = tmp_path / "runs"
    # SGDM reaches 98 at 6.5 +- 0.1 s, Birder at 2.5 +- 0.1 s, AdamW at 6.0 +- 1 s (three seeds each)
    for seed, (a, b, c) in enumerate([(6.4, 2.4, 5.0), (6.5, 2.5, 6.0), (6.6, 2.6, 7.0)]):
        curve_run(root, f"s{seed}", "sgdm", seed, [(10, 1.0, 95.0), (20, a + 0.5, 98.0), (30, 9.5, 98.2)])
        curve_run(root, f"b{seed}", "birder", seed, [(10, 1.0, 95.0), (20, b + 0.5, 98.0), (30, 9.5, 98.2)])
        curve_run(root, f"a{seed}", "adamw", seed, [(10, 1.0, 95.0), (20, c + 0.5, 98.0), (30, 9.5, 98.2)])
    # 1-bit Adam reaches 98 fast in two seeds of three and never in the third: it is not ordered at 98
    curve_run(root, "o0", "onebit_adam", 0, [(10, 1.0, 95.0), (20, 1.5, 98.0), (30, 9.5, 98.2)])
    curve_run(root, "o1", "onebit_adam", 1, [(10, 1.0, 95.0), (20, 1.6, 98.0), (30, 9.5, 98.2)])
    curve_run(root, "o2", "onebit_adam", 2, [(10, 1.0, 95.0), (20, 1.6, 97.0), (30, 9.5, 97.2)])
    rows = ladder.ladder_rows(load_frame(root)).set_index("optim")
    assert rows.loc["onebit_adam", "order@98"] == "not ordered" and rows.loc["onebit_adam", "reached@98"] == 2
    assert rows.loc["birder", "order@98"] == "ahead of AdamW"  # 2.5 +- 0.25 against 6.0 +- 2.5
    assert rows.loc["adamw", "order@98"] == "tie with SGDM"  # 6.0 +- 2.5 against 6.5 +- 0.25
    assert rows.loc["sgdm", "order@98"] == ""


def _budget_field(root: Path) -> Path:
    """Runs sized to a 10 s budget: Birder ends at 98.0-98.2, SGDM at 96.0-96.2, AdamW at 95.0-95.8."""
    for seed in range(3):
        curve_run(root, f"bs{seed}", "sgdm", seed, [(10, 5.0, 95.0), (20, 10.4, 96.0 + seed / 10)], budget_s=10.0)
        curve_run(root, f"bb{seed}", "birder", seed, [(10, 5.0, 97.0), (60, 10.2, 98.0 + seed / 10)], budget_s=10.0)
        curve_run(root, f"ba{seed}", "adamw", seed, [(10, 5.0, 95.0), (22, 10.0, 95.0 + 0.4 * seed)], budget_s=10.0)
    return root


def test_runs_sized_to_a_budget_give_their_final_metric_with_intervals_and_stay_out_of_the_ladder(tmp_path):
    root = _budget_field(write_field(tmp_path / "runs"))
    frame = load_frame(root)
    levels = ladder.ladder_rows(frame)
    assert levels["runs"].sum() == 3  # the whole runs of write_field only
    budgets = ladder.budget_rows(frame).set_index("optim")
    assert list(budgets.index) == ["sgdm", "adamw", "birder"]
    assert budgets.loc["birder", "metric_mean"] == pytest.approx(98.1)
    assert budgets.loc["birder", "metric_ci"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert budgets.loc["birder", "steps"] == 60 and budgets.loc["birder", "took_s_mean"] == pytest.approx(9.7)
    # by mean Birder 98.1 +- 0.25, SGDM 96.1 +- 0.25, AdamW 95.4 +- 0.99: the first two separate, the last two not
    assert budgets.loc["birder", "order"] == "ahead of SGDM"
    assert budgets.loc["sgdm", "order"] == "tie with AdamW" and budgets.loc["adamw", "order"] == ""
    text = ladder.ladder_markdown(levels, ladder.budget_rows(frame))
    assert "## digits: a budget of 10 s" in text and "98.1 ± 0.25" in text


def test_a_run_on_a_loaded_host_is_flagged_and_listed_for_rerun(tmp_path):
    root = write_field(tmp_path / "runs")
    # 2 cpus, limit 1.5 x 2 = 3, the run's own 4 processes: end load 7.5 - 4 = 3.5 > 3
    curve_run(
        root, "loaded", "adamw", 0, [(10, 2.5, 97.0), (20, 3.5, 98.0)],
        host_load={"start": [1.0, 1.0, 1.0], "end": [7.5, 3.0, 2.0], "cpus": 2},
    )  # fmt: skip
    curve_run(
        root, "quiet", "adamw", 1, [(10, 2.5, 97.0), (20, 3.5, 98.0)],
        host_load={"start": [6.5, 1.0, 1.0], "end": [6.9, 3.0, 2.0], "cpus": 2},
    )  # fmt: skip
    rows = ladder.ladder_rows(load_frame(root), load_limit=1.5)
    adamw = rows[rows["optim"] == "adamw"].iloc[0]
    assert adamw["load_flagged"] == 1 and adamw["flagged_runs"] == [str(root / "loaded")]
    text = ladder.ladder_markdown(rows)
    assert "## Load-flagged runs, to rerun" in text and str(root / "loaded") in text


def test_make_tables_writes_targets_md(tmp_path):
    root = _budget_field(write_field(tmp_path / "runs"))
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    text = (tmp_path / "out" / "targets.md").read_text()
    assert "# Several targets and time budgets" in text and "| Birder " in text and "a budget of 10 s" in text
    assert "time_s_ci@98.5" in (tmp_path / "out" / "targets.csv").read_text()


def test_a_bad_ladder_is_one_error_naming_the_key():
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(["task=fashion_mnist", "task.target.ladder=[86,x]"], hydra_config=True)
    with pytest.raises(layout.ConfigError, match=r"task.target.ladder=\[86, 'x'\]: give a list of numbers"):
        layout.validate(cfg, reference_configs(cfg))


def test_the_ladder_and_mode_advise_settings_are_not_part_of_a_measured_cell():
    """Neither changes what a run trains: runs before and after a config tree that gained them are one cell
    (tuning trials of one sweep were split in two when conf/config.yaml gained `advise:`)."""
    from birder_repro.report.identity import is_ignored

    assert is_ignored("task.target.ladder") and not is_ignored("task.target.value")
    assert is_ignored("advise.runs") and not is_ignored("advise.runs", source="predicted")
