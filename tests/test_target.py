"""Time to accuracy (birder_repro.train.target): each task's target, the training clock and the first reaching
evaluation on a fake clock, and the report's time-to-target table over seeds (known answers: made-up
records whose means and deviations are worked out by hand). The loop's own use of it: tests/test_train.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import CONF_DIR, compose_config, write_records
from omegaconf import OmegaConf

from birder_repro import tasks
from birder_repro.config import settings as layout
from birder_repro.report import figures, tables
from birder_repro.report import target as report_target
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame
from birder_repro.run import schema
from birder_repro.train import checks  # noqa: F401 - validate runs the higher layers' section checks too
from birder_repro.train import target as target_mod
from birder_repro.train.target import Target, TimeToTarget, target_from_config

TASKS = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))


# ------------------------------------------------------------------------------------------- the target
def test_reached_by_follows_the_direction_and_never_takes_a_missing_value():
    top1, ppl = Target("top1", 98.0, "higher"), Target("perplexity", 70.0, "lower")
    assert top1.reached_by(98.0) and top1.reached_by(99.5) and not top1.reached_by(97.99)
    assert ppl.reached_by(70.0) and ppl.reached_by(61.2) and not ppl.reached_by(70.01)
    for bad in (float("nan"), float("inf") * -1, None, "98", True):
        assert not top1.reached_by(bad) and not ppl.reached_by(bad)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_names_a_target_on_one_of_its_metrics(task):
    cfg = compose_config([f"task={task}"])
    metrics = schema.declared_metrics(tasks.get_task(task))
    target = target_from_config(cfg, metrics)
    assert target is not None and target.metric == metrics[0]  # the headline metric
    assert target.direction == ("lower" if target.metric in ("perplexity", "mlm_loss") else "higher")


@pytest.mark.parametrize(
    "override,message",
    [
        ("task.target.direction=up", "task.target.direction='up': use higher or lower"),
        ("task.target.metric=f1", "task.target.metric='f1' is not a metric of task 'digits': use one of top1"),
        ("task.target.value=abc", "task.target.value='abc'"),
    ],
)
def test_a_bad_target_is_one_error_naming_the_key_before_anything_starts(override, message):
    from birder_repro.config.compose import reference_configs

    cfg = compose_config(["task=digits", override], hydra_config=True)
    with pytest.raises(layout.ConfigError) as err:
        layout.validate(cfg, reference_configs(cfg))
    assert str(err.value).startswith(message), str(err.value)


def test_a_null_target_value_is_no_target():
    assert target_from_config(compose_config(["task=digits", "task.target.value=null"]), ("top1",)) is None
    assert target_from_config(OmegaConf.create({"task": {"name": "blobs"}})) is None


# -------------------------------------------------------------------------------- the clock, faked
class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_to_target_on_a_fake_clock(monkeypatch):
    """Steps of 5 s (the first: 4 s of one-time work), then 1 s; an evaluation of 3 s after steps 2, 4 and 6;
    top-1 55, 60 (reached), 70: the first reaching one counts, at the training clock 5 + 3 x 1 - 4 = 4 s, the
    wall-clock 5 + 1 + 3 (the evaluation after step 2) + 2 + 3 (this evaluation) = 14 s."""
    clock = FakeClock()
    monkeypatch.setattr(target_mod.time, "perf_counter", clock)
    monkeypatch.setattr(target_mod, "process_age_s", lambda: 12.0)
    t = TimeToTarget(Target("top1", 60.0, "higher"), world_size=4, eval_every=2)
    for step, seconds in enumerate([5.0, 1, 1, 1, 1, 1], start=1):
        clock.now += seconds
        t.step_done(seconds, samples=8)
        if step % 2 == 0:
            clock.now += 3.0  # the evaluation
            t.evaluated(step, {"top1": {2: 55.0, 4: 60.0, 6: 70.0}[step], "loss": 0.1})
    fig = t.figures()
    assert fig["startup_s"] == pytest.approx(12.0 - 5.0)  # the process's age when the first step began
    assert fig["first_step_s"] == 5.0 and fig["compile_s"] == pytest.approx(4.0)
    hit = fig["time_to_target"]
    assert hit["reached"] is True and hit["step"] == 4 and hit["value"] == 60.0
    assert hit["seconds"] == pytest.approx(4.0) and hit["wall_s"] == pytest.approx(14.0)
    assert hit["samples"] == 4 * 8 * 4 and hit["evaluations"] == 3 and hit["eval_every"] == 2
    assert t.training_seconds() == pytest.approx(10.0)  # the raw clock: every step, the first one whole


def test_a_resumed_runs_clock_runs_on_and_each_attempts_one_time_work_is_taken_off_once(monkeypatch):
    """Attempt 1: steps of 5 (4 s one-time), 1, 1 s, then a checkpoint; attempt 2 resumes from it: steps of 3
    (2 s one-time), 1, 1 s, the target reached after its last. The logged clock (train_s) runs on from 7 s to
    12 s, no step back; the record's compile_s is both attempts' work, 6 s; the time to target 12 - 6 = 6 s. A
    checkpoint of the earlier kind (its clock corrected, no compile_s) resumes as before."""
    monkeypatch.setattr(target_mod.time, "perf_counter", FakeClock())
    monkeypatch.setattr(target_mod, "process_age_s", lambda: None)
    first = TimeToTarget(Target("top1", 60.0, "higher"), world_size=1)
    for seconds in (5.0, 1.0, 1.0):
        first.step_done(seconds, samples=1)
    state = first.state_dict()
    assert state["clock_s"] == pytest.approx(7.0) and state["compile_s"] == pytest.approx(4.0)

    second = TimeToTarget(Target("top1", 60.0, "higher"), world_size=1, start_step=3)
    second.load_state_dict(state)
    logged = []
    for seconds in (3.0, 1.0, 1.0):
        second.step_done(seconds, samples=1)
        logged.append(second.training_seconds())
    second.evaluated(6, {"top1": 61.0})
    assert logged == pytest.approx([10.0, 11.0, 12.0])  # on from attempt 1's 7 s
    fig = second.figures()
    assert fig["compile_s"] == pytest.approx(6.0) and fig["time_to_target"]["seconds"] == pytest.approx(6.0)

    older = TimeToTarget(Target("top1", 60.0, "higher"), world_size=1, start_step=3)
    older.load_state_dict({k: v for k, v in state.items() if k != "compile_s"} | {"clock_s": 3.0})
    for seconds in (3.0, 1.0, 1.0):
        older.step_done(seconds, samples=1)
    older.evaluated(6, {"top1": 61.0})
    assert older.figures()["time_to_target"]["seconds"] == pytest.approx(3.0 + 5.0 - 2.0)


def test_a_target_never_reached_says_so_and_lower_is_better(monkeypatch):
    monkeypatch.setattr(target_mod.time, "perf_counter", FakeClock())
    t = TimeToTarget(Target("perplexity", 70.0, "lower"), world_size=1)
    for step in range(1, 4):
        t.step_done(1.0, 20)
        t.evaluated(step, {"perplexity": 80.0 - step})
    hit = t.figures()["time_to_target"]
    assert hit["reached"] is False and hit["seconds"] is None and hit["step"] is None and hit["evaluations"] == 3
    t.evaluated(4, {"perplexity": 69.5})
    assert t.figures()["time_to_target"]["step"] == 4
    no_target = TimeToTarget(None, 1)
    no_target.step_done(1.0, 1)
    assert no_target.figures()["time_to_target"] is None and no_target.figures()["first_step_s"] == 1.0


def test_process_age_is_this_process_age():
    age = target_mod.process_age_s()
    if age is None:
        pytest.skip("no /proc here")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert 0 < age <= uptime  # started after boot: the pytest process has run a while, never before boot


def test_records_with_a_target_pass_the_schema_check():
    record = {"time_to_target": dict.fromkeys(schema.TARGET_PARTS), "startup_s": 1.0, "compile_s": 0.1}
    schema.check(record)
    with pytest.raises(ValueError, match="time_to_target"):
        schema.check({"time_to_target": {"secs": 1.0}})


# ---------------------------------------------------------------------------------------- the report
def target_record(optim: str, seed: int, seconds, *, step=None, status="completed", top1=99.0) -> dict:
    reached = seconds is not None and status == "completed"
    return {
        "status": status,
        "task": "digits",
        "optim": optim,
        "error": None if status == "completed" else "x",
        "cluster": {"name": "emulated", "nodes": 2, "gpus_per_node": 2, "interconnect": "emulated", "link_mbit": 100},
        "world_size": 4,
        "batch_size": 32,
        "global_batch_size": 128,
        "steps": 120,
        "lr": 0.05,
        "throughput_samples_per_s": 1000.0 + seed if status == "completed" else None,
        "metrics": {"top1": top1} if status == "completed" else {},
        "headline_metric": "top1",
        "started": f"2025-01-01T10:00:0{seed}",
        "compile_s": 0.5,
        "startup_s": 20.0,
        "time_to_target": {
            "metric": "top1",
            "target": 98.0,
            "direction": "higher",
            "reached": reached,
            "step": step if reached else None,
            "samples": None,
            "seconds": seconds if reached else None,
            "wall_s": seconds + 1.0 if reached else None,
            "value": 98.5 if reached else None,
            "evaluations": 24,
            "eval_every": 5,
            "clock_from_step": 0,
        },
        "config": {"seed": seed, "data": {"source": "real"}, "task": {"name": "digits", "baseline": "sgdm"}},
    }


def write(root: Path, records: list[dict]) -> Path:
    return write_records(root, records, lambda i, rec: f"{i:02d}_{rec['optim']}_{rec['config']['seed']}")


def test_time_to_target_over_seeds_gives_mean_spread_and_counts(tmp_path):
    """SGDM: 1, 2 and 3 s (mean 2, sample sd 1), a fourth seed that never reached it and a fifth that diverged;
    Birder: 4 s alone (no sd)."""
    records = [
        target_record("sgdm", 0, 1.0, step=10),
        target_record("sgdm", 1, 2.0, step=20),
        target_record("sgdm", 2, 3.0, step=45),
        target_record("sgdm", 3, None, top1=97.0),
        target_record("sgdm", 4, None, status="diverged"),
        target_record("birder", 0, 4.0, step=40),
    ]
    rows = report_target.target_rows(load_frame(write(tmp_path / "runs", records)))
    sgdm, birder = (rows[rows["optim"] == o].iloc[0] for o in ("sgdm", "birder"))
    assert (sgdm["runs"], sgdm["completed"], sgdm["reached"], sgdm["not_completed"]) == (5, 4, 3, "1 diverged")
    assert sgdm["target_s_mean"] == pytest.approx(2.0) and sgdm["target_s_sd"] == pytest.approx(1.0)
    assert (sgdm["target_s_min"], sgdm["target_s_max"]) == (1.0, 3.0)
    assert sgdm["target_step_mean"] == pytest.approx(25.0) and sgdm["target_wall_s_mean"] == pytest.approx(3.0)
    assert sgdm["final_metric_mean"] == pytest.approx((3 * 99.0 + 97.0) / 4)  # completed runs only
    assert sgdm["throughput_mean"] == pytest.approx(1001.5) and sgdm["seeds"] == "0 1 2 3 4"
    assert birder["target_s_mean"] == 4.0 and math.isnan(birder["target_s_sd"])
    text = report_target.target_markdown(rows)
    assert "| SGDM " in text and "3 of 5 (1 diverged)" in text and "2 ± 1" in text and "top-1 >= 98" in text
    assert list(rows["optim"]) == ["sgdm", "birder"]  # the baseline first, as the task tables


def test_make_tables_shows_time_to_target_beside_throughput_and_accuracy(tmp_path):
    root = write(tmp_path / "runs", [target_record("sgdm", 0, 2.5, step=30), target_record("birder", 0, None)])
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    md = (tmp_path / "out" / "digits.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| optimizer"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns.index("time to target") == columns.index("top-1") + 1
    assert "2.5 s (step 30)" in md and "not reached" in md and "digits: top-1 >= 98" in md
    assert "time to target" in (tmp_path / "out" / "summary.md").read_text()
    assert (tmp_path / "out" / "time_to_target.md").is_file()


# ---------------------------------------------------------------------------------------- Figure 2
def test_every_optimizer_has_its_own_colour_and_line_style():
    styles = [figures.optim_style(o) for o in tables.OPTIM_ORDER]
    assert len({s["color"] for s in styles}) == len(styles)  # 11 colours: SGDM and Birder no longer share blue
    assert len({(s["color"], str(s["linestyle"])) for s in styles}) == len(styles)
    assert figures.optim_style("sgdm")["color"] != figures.optim_style("birder")["color"]
    assert figures.optim_style("birder", "flat") != figures.optim_style("birder")
    from birder_repro.report.figstyle import COLOURS, STYLE_ORDER

    assert set(STYLE_ORDER) == set(tables.OPTIM_ORDER)  # a new optimizer gets a style of its own, at the end
    assert figures.optim_style("birder")["color"] == "#000000"  # and the others keep theirs
    from birder_repro.optim import list_optimizers

    assert set(list_optimizers()) <= set(tables.OPTIM_ORDER)  # every registered optimizer has its place
    assert len(COLOURS) > len(STYLE_ORDER)  # colours left for variants and names beyond the order
    assert figures.optim_style("someone_elses", "x")["color"] in COLOURS


def test_figure_2_time_starts_at_the_first_step():
    import pandas as pd

    lines = pd.DataFrame({"time_s": [30.0, 31.0], "train_s": [6.2, 7.2]})
    t, label = figures.time_axis(lines, compile_s=5.0)
    assert list(t) == pytest.approx([1.2, 2.2]) and "first step" in label  # start-up (30 s) and compile left out
    old, label = figures.time_axis(pd.DataFrame({"time_s": [30.0]}), compile_s=None)
    assert list(old) == [30.0] and "logger" in label


def test_the_training_clock_is_the_same_on_every_rank_when_one_falls_behind(tmp_path):
    """Rank 1 sleeps 1 s before step 3 (BIRDER_TEST_FAULT=slow:1:3): rank 0 waits for it in the loop's next
    collective, so the clock it records (metrics.jsonl's train_s, time to target's) holds that second. The clock
    that summed rank 0's own step times left such waits out (a 2 x 2 run's clock ran up to 27 % slow)."""
    from test_failures import tiny_two_node_run

    from birder_repro.train.restarts import SLOW_S

    out = tiny_two_node_run(tmp_path, "slow:1:3")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    [metrics] = list(tmp_path.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert max(r["train_s"] for r in rows if r["step"] == 6) >= SLOW_S
