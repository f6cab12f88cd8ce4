"""Tuning on the validation split and the crossover over link rates (birder_repro.report.tuning, .crossover):
made-up records whose choices, crossovers and predictions are worked out by hand or from the model itself."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import write_records

from birder_repro.perf.model import loop_collectives_s, predict_step
from birder_repro.perf.profile import Profile
from birder_repro.report import (
    crossover,
    crossover_figure,
    crossover_find,
    crossover_render,
    tuning,
    tuning_render,
    tuning_trials,
)
from birder_repro.report import target as report_target
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame


def record(
    optim: str,
    *,
    lr: float,
    step,
    seed: int = 0,
    eval_set: str = "test",
    link=200,
    nodes: int = 2,
    seconds=None,
    status: str = "completed",
    top1: float = 88.0,
    extra_optim=None,
    stop: bool = False,
    profile=None,
    comm_ms: float = 30.0,
    total_ms: float = 40.0,
) -> dict:
    reached = step is not None and status == "completed"
    optim_cfg = {"name": optim, "lr": lr, **(extra_optim or {})}
    return {
        "status": status,
        "task": "fashion_mnist",
        "optim": optim,
        "error": None if status == "completed" else "x",
        "cluster": {
            "name": "emulated",
            "nodes": nodes,
            "gpus_per_node": 2,
            "interconnect": "emulated",
            "link_mbit": link,
        },
        "world_size": 2 * nodes,
        "batch_size": 64,
        "global_batch_size": 128 * nodes,
        "steps": 430,
        "planned_steps": 430,
        "lr": lr,
        "throughput_samples_per_s": 1000.0,
        "step_time_s": {
            "total": total_ms / 1e3,
            "compute": (total_ms - comm_ms) / 1e3,
            "communication": comm_ms / 1e3,
            "compression": 0.0,
            "data_wait": 0.0,
        },
        "metrics": {"top1": top1} if status == "completed" else {},
        "headline_metric": "top1",
        "started": f"2026-01-01T10:00:{seed:02d}",
        "compile_s": 0.1,
        "startup_s": 10.0,
        "profile": profile,
        "time_to_target": {
            "metric": "top1",
            "target": 87.0,
            "direction": "higher",
            "reached": reached,
            "step": step if reached else None,
            "samples": None,
            "seconds": (seconds if seconds is not None else step * 0.1) if reached else None,
            "wall_s": None,
            "value": 87.5 if reached else None,
            "evaluations": 10,
            "eval_every": 10,
            "clock_from_step": 0,
        },
        "config": {
            "seed": seed,
            "nodes": nodes,
            "data": {"source": "real", "eval_set": eval_set},
            "model": {"size": "full", "width": 512},
            "optim": optim_cfg,
            "cluster": {"name": "emulated", "link_mbit": link},
            "train": {"epochs": 2, "stop_at_target": stop},
            "task": {"name": "fashion_mnist", "baseline": "sgdm"},
        },
    }


def write(root: Path, records: list[dict]) -> Path:
    return write_records(root, records, lambda i, rec: f"{i:02d}_{rec['optim']}")


# ------------------------------------------------------------------------------------------------- tuning
def test_each_optimizer_chooses_its_fewest_steps_and_val_runs_stay_out_of_time_to_target(tmp_path):
    records = [
        record("sgdm", lr=0.1, step=200, eval_set="val", stop=True),
        record("sgdm", lr=0.05, step=180, eval_set="val", stop=True),
        record("sgdm", lr=0.4, step=None, eval_set="val", status="diverged"),
        record("birder", lr=1e-3, step=None, eval_set="val", top1=86.0, extra_optim={"beta": 0.9}),
        record("birder", lr=2e-3, step=None, eval_set="val", top1=86.5, extra_optim={"beta": 0.95}),
        record("sgdm", lr=0.05, step=190),  # the test-set run: time to target, not tuning
        record("sgdm", lr=0.1, step=210, eval_set="val", stop=True, seed=1),
    ]  # lr 0.1 again, newer: one
    records[-1]["config"]["seed"] = 0  # the same trial (values and seed) run again later counts once
    frame = load_frame(write(tmp_path / "runs", records))
    rows = tuning_trials.tuning_rows(frame)
    chosen = rows[rows["chosen"]].set_index("optim")
    assert set(rows["trials"]) == {3, 2} and len(chosen) == 2
    assert chosen.loc["sgdm", "tuned"] == {"lr": 0.05}  # reached in the fewest steps
    assert chosen.loc["birder", "tuned"] == {"lr": 2e-3, "beta": 0.95}  # neither reached: the higher final
    assert rows[rows["status"] == "diverged"]["score"].iloc[0][0] is True  # failed and diverged: last
    assert list(rows[rows["tuned"] == {"lr": 0.1}]["target_step"]) == [210]  # the newer run of the trial
    text = tuning_render.tuning_markdown(rows)
    assert "### SGDM: 3 trials" in text and "lr 0.05" in text and "**chosen**" in text
    in_tta = report_target.target_rows(frame)
    assert list(in_tta["runs"]) == [1]  # the one test-set run; the trials are in tuning.md only


def test_trial_score_orders_reached_then_steps_then_final_metric():
    base = {"status": "completed", "target_direction": "higher"}
    a = {**base, "target_reached": True, "target_step": 100, "final_metric_value": 80.0}
    b = {**base, "target_reached": True, "target_step": 120, "final_metric_value": 90.0}
    c = {**base, "target_reached": False, "target_step": None, "final_metric_value": 86.9}
    d = {"status": "failed", "target_reached": None, "final_metric_value": None}
    assert sorted([d, c, b, a], key=tuning_trials.trial_score) == [a, b, c, d]


# ---------------------------------------------------------------------------------------------- crossover
def test_crossing_is_interpolated_in_log_link_rate():
    # ratio 0.5 at 50 Mbit/s, 2 at 200: 1 is a third of the way in ratio, so at 50 x 4^(1/3)
    assert crossover_find.crossing(np.array([50.0, 200.0]), np.array([0.5, 2.0])) == pytest.approx(50 * 4 ** (1 / 3))
    assert crossover_find.crossing(np.array([50.0, 200.0]), np.array([0.5, 0.9])) is None


def profile(name: str) -> dict:
    return Profile(
        name=name,
        device="cpu",
        task="fashion_mnist",
        batch_size=64,
        forward_backward_s=0.012,
        parameter_count=670_730,
        optimizer_s=0.001,
        threads=1,
        host_cores=2,
        compression_s_per_element={"birder": 2e-9, "onebit": 2e-9, "fp16": 1e-9},
    ).to_dict()


def test_crossover_table_predicts_each_run_from_its_steps_and_a_one_node_profile(tmp_path):
    """SGDM and Birder at 50 and 200 Mbit/s (SGDM: 100 steps, 10 s and 2.5 s; Birder: 150 steps, 3 s at both),
    with 1-node runs giving the profiles: Birder is faster at 50, slower at 200, so the measured crossover lies
    between; each prediction is the run's steps times the model's step at its link."""
    records = [
        record("sgdm", lr=0.05, step=100, link=50, seconds=10.0),
        record("sgdm", lr=0.05, step=100, link=200, seconds=2.5, seed=1),
        record("sgdm", lr=0.05, step=100, link=200, seconds=2.7, seed=2, stop=True),
        record("birder", lr=1e-3, step=150, link=50, seconds=3.0, stop=True),
        record("birder", lr=1e-3, step=150, link=200, seconds=3.0, stop=True),
        record("sgdm", lr=0.05, step=None, nodes=1, link=None, profile=profile("sgdm")),
        record("birder", lr=1e-3, step=None, nodes=1, link=None, profile=profile("birder")),
    ]
    frame = load_frame(write(tmp_path / "runs", records))
    points, per_run = crossover.crossover_tables(frame)
    measured = points[points["source"] == "measured"].set_index(["optim", "link"])
    assert measured.loc[("sgdm", 200.0), "measured_s"] == pytest.approx(2.6)  # two seeds, one stopped at target
    assert measured.loc[("sgdm", 200.0), "runs"] == 2
    # the prediction: steps x the model's step time at the link (SGDM: fp32 all-reduce, no warmup)
    prof = Profile.from_dict(profile("sgdm"))
    spec = crossover.StepModel(records[0], prof)._spec(50.0)
    step = predict_step(prof, spec, 2, 2, "fp32", 64).total_s + loop_collectives_s(spec, 2, 2)  # training clock
    assert measured.loc[("sgdm", 50.0), "predicted_s"] == pytest.approx(100 * step)
    assert set(points[points["source"] == "predicted"]["link"]) == set(crossover.PREDICTED_LINKS)
    found = {c["optim"]: c for c in crossover_find.crossovers(points)}
    assert 50 < found["birder"]["measured"] < 200
    assert found["birder"]["measured_ratios"][50.0] == pytest.approx(0.3)
    text = crossover_render.crossover_markdown(points, per_run)
    assert "faster below about" in text and "median |predicted / measured - 1|" in text
    assert len(per_run) == 5 and per_run["predicted_s"].notna().all()


def test_a_link_one_optimizer_did_not_run_shows_the_models_time_marked_and_moves_no_crossover(tmp_path):
    """Birder at 50, 100 and 200 Mbit/s, SGDM at 50 and 200 only: SGDM's 100 Mbit/s cell is the model's time
    for SGDM's mean steps, marked `not run`, in the measured 100 Mbit/s row, and the measured crossover is taken
    over the links both ran (50 and 200), as without the extra Birder run."""
    records = [
        record("sgdm", lr=0.05, step=100, link=50, seconds=10.0),
        record("sgdm", lr=0.05, step=120, link=200, seconds=2.5),
        record("birder", lr=1e-3, step=150, link=50, seconds=3.0, stop=True),
        record("birder", lr=1e-3, step=150, link=100, seconds=3.0, stop=True),
        record("birder", lr=1e-3, step=150, link=200, seconds=3.0, stop=True),
        record("sgdm", lr=0.05, step=None, nodes=1, link=None, profile=profile("sgdm")),
        record("birder", lr=1e-3, step=None, nodes=1, link=None, profile=profile("birder")),
    ]
    points, per_run = crossover.crossover_tables(load_frame(write(tmp_path / "runs", records)))
    gap = points[points["source"] == crossover.NOT_RUN]
    assert gap[["optim", "link"]].values.tolist() == [["sgdm", 100.0]]
    model = crossover.StepModel(records[0], Profile.from_dict(profile("sgdm")))
    assert gap["predicted_s"].iloc[0] == pytest.approx(model.time_to_target(110, 100.0))  # mean of 100 and 120
    found = {c["optim"]: c for c in crossover_find.crossovers(points)}
    assert set(found["birder"]["measured_ratios"]) == {50.0, 200.0}
    rows = [
        line for line in crossover_render.crossover_markdown(points, per_run).splitlines() if line.startswith("| 100 ")
    ]
    assert len(rows) == 1 and "not run (" in rows[0]


def test_make_tables_writes_tuning_crossover_and_its_figure(tmp_path):
    records = [
        record("sgdm", lr=0.05, step=180, eval_set="val", stop=True),
        record("sgdm", lr=0.05, step=100, link=50, seconds=10.0),
        record("sgdm", lr=0.05, step=100, link=None, seconds=1.0),
        record("birder", lr=1e-3, step=150, link=50, seconds=3.0),
        record("birder", lr=1e-3, step=150, link=None, seconds=2.0),
    ]
    root = write(tmp_path / "runs", records)
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    assert "SGDM: 1 trials" in (tmp_path / "out" / "tuning.md").read_text()
    text = (tmp_path / "out" / "crossover.md").read_text()
    assert "unshaped" in text and "| 50 " in text
    assert (tmp_path / "f" / "crossover_fashion_mnist.png").stat().st_size > 10_000
    assert "(" not in text.split("| 50 ")[1].split("\n")[0]  # no 1-node profile: measured alone, no prediction


def test_a_sweep_over_links_where_no_run_reached_its_target_sets_no_crossover_and_draws_nothing(tmp_path):
    """A synthetic-data sweep (make validate-emulated) over two links reaches no target: make tables still writes
    its tables, with no crossover and no figure for it, beside a comparison that has both."""
    never = [
        record(optim, lr=lr, step=None, link=link, seconds=1.0, top1=1.0)
        for optim, lr in (("sgdm", 0.05), ("birder", 1e-3))
        for link in (50, None)
    ]
    for rec in never:
        rec["config"]["data"]["source"] = "synthetic"  # another comparison than the real-data runs below
    root = write(tmp_path / "runs", never)
    points, _ = crossover.crossover_tables(load_frame(root))
    assert not points.empty and points["measured_s"].isna().all()
    assert all(c["measured"] is None for c in crossover_find.crossovers(points))
    assert crossover_figure.crossover_figures(points, tmp_path / "f") == []
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0


def test_a_run_that_never_evaluated_has_no_row_in_time_to_target(tmp_path):
    never = record("sgdm", lr=0.05, step=None, nodes=1, link=None)
    never["time_to_target"]["evaluations"] = 0  # train.eval=false: a profile or throughput run
    frame = load_frame(write(tmp_path / "runs", [never, record("sgdm", lr=0.05, step=190)]))
    assert list(report_target.target_rows(frame)["nodes"]) == [2]


def _measured(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    """(optimizer, link Mbit/s, measured seconds to target) as crossover_tables lays out measured rows."""
    table = pd.DataFrame(
        [
            {
                "comparison": "c",
                "source": "measured",
                "link": link,
                "optim": optim,
                "variant": "",
                "series": optim,
                "measured_s": seconds,
                "steps": 100.0,
            }
            for optim, link, seconds in rows
        ]
    )
    table.attrs["models"] = {}
    return table


def test_the_crossover_is_taken_against_the_fastest_baseline_at_each_link():
    """Two baselines: SGDM (slow everywhere) and the fp16 hook (fast on fast links). Against the fastest the
    compressed optimizer pays only below about 316 Mbit/s; against the slowest it would seem to pay everywhere."""
    rows = [("sgdm", x, 100.0) for x in (50.0, 200.0, 500.0)]
    rows += [("sgdm_fp16", 50.0, 60.0), ("sgdm_fp16", 200.0, 40.0), ("sgdm_fp16", 500.0, 20.0)]
    rows += [("birder", x, 30.0) for x in (50.0, 200.0, 500.0)]
    [found] = crossover_find.crossovers(_measured(rows))
    assert found["measured_ratios"] == pytest.approx({50.0: 0.5, 200.0: 0.75, 500.0: 1.5})
    assert 200 < found["measured"] < 500 and not found["faster_everywhere_measured"]
    assert "measured: faster below about" in crossover_render.crossover_text(found)


def test_the_measured_crossover_has_a_seed_band_from_the_two_means_standard_errors():
    """Birder 0.9x SGDM at 100 Mbit/s and 1.1x at 400, each mean of 4 seeds with a sample sd of 10 % of it: the
    ratio's relative standard error is hypot(0.05, 0.05) at each link, and the band is where the ratio that far
    up and that far down crosses 1, around the crossover itself."""
    from birder_repro.report.crossover_find import band_text
    from birder_repro.report.model_error import in_band

    table = _measured([("sgdm", 100.0, 10.0), ("sgdm", 400.0, 10.0), ("birder", 100.0, 9.0), ("birder", 400.0, 11.0)])
    table["measured_sd"], table["reached"] = 0.1 * table["measured_s"], 4
    (found,) = crossover_find.crossovers(table)
    spread = math.hypot(0.05, 0.05)
    links, ratio = np.array([100.0, 400.0]), np.array([0.9, 1.1])
    low, high = found["measured_band"]
    assert low == pytest.approx(crossover_find.crossing(links, ratio * (1 + spread)))
    assert high == pytest.approx(crossover_find.crossing(links, ratio * (1 - spread)))
    assert low < found["measured"] < high
    assert in_band(found["measured"] * 1.3, (low, high)) != in_band(high * 1.01, (low, high))
    assert band_text((low, None)).endswith("and above") and band_text(None) == "—"
    table["measured_sd"] = float("nan")  # one seed each: no spread, the band is the crossover itself
    (single,) = crossover_find.crossovers(table)
    assert single["measured_band"] == (pytest.approx(single["measured"]), pytest.approx(single["measured"]))


def test_a_ratio_falling_through_1_says_where_the_optimizer_is_faster():
    """Slower on slow links and faster on fast ones (a compressor whose own work dominates there): neither
    'slower at every link' nor 'faster below'."""
    rows = [("sgdm", 50.0, 10.0), ("sgdm", 500.0, 40.0), ("birder", 50.0, 20.0), ("birder", 500.0, 20.0)]
    [found] = crossover_find.crossovers(_measured(rows))
    text = crossover_render.crossover_text(found)
    assert found["measured"] is not None and "measured: faster above about" in text, text
    assert "slower at every link" not in text


def test_1bit_adams_warmup_steps_are_priced_as_fp32_steps_and_the_rest_as_compressed(monkeypatch):
    """Time to target = freeze x the fp32 step + (steps - freeze) x the compressed step: swapping the two (or
    pricing every step alike) changes it."""
    model = crossover.StepModel.__new__(crossover.StepModel)
    model.freeze = 30
    monkeypatch.setattr(model, "step_s", lambda link, loop=True: (0.2, 0.05, 0.5), raising=False)
    assert model.time_to_target(100, 200.0) == pytest.approx(30 * 0.2 + 70 * 0.05)
    assert model.time_to_target(20, 200.0) == pytest.approx(20 * 0.2)  # reached inside the warmup


def test_trials_differing_in_freeze_are_one_study_and_equal_steps_go_to_the_higher_final_metric():
    """1-bit Adam's warmup length (optim.freeze) is tuned: its trials are one study, each showing its value; and
    two trials reaching the target at the same step are told apart by the final metric."""
    config = {"optim.name": "onebit_adam", "optim.lr": 2.5e-4, "optim.freeze": 0.15, "task.name": "fashion_mnist"}
    other = {**config, "optim.freeze": 0.3}
    assert tuning_trials.study_key(config) == tuning_trials.study_key(other)
    assert tuning_trials.tuned_values(other) == {"lr": 2.5e-4, "freeze": 0.3}
    base = {"status": "completed", "target_direction": "higher", "target_reached": True, "target_step": 200}
    low, high = {**base, "final_metric_value": 87.1}, {**base, "final_metric_value": 87.9}
    assert sorted([low, high], key=tuning_trials.trial_score) == [high, low]


def test_the_crossover_figure_draws_each_optimizers_measured_times_at_their_links(tmp_path, monkeypatch):
    """What the figure shows, read off its axes (not its size in bytes): per optimizer one measured series at its
    links (the unshaped link at the model's rate for it), log axes, the task's target in the title."""
    import matplotlib.figure

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    records = [
        record("sgdm", lr=0.05, step=100, link=50, seconds=10.0),
        record("sgdm", lr=0.05, step=100, link=None, seconds=1.0),
        record("birder", lr=1e-3, step=150, link=50, seconds=3.0),
        record("birder", lr=1e-3, step=150, link=None, seconds=2.0),
    ]
    points, _ = crossover.crossover_tables(load_frame(write(tmp_path / "runs", records)))
    [path] = crossover_figure.crossover_figures(points, tmp_path / "f")
    [fig] = drawn
    ax = fig.axes[0]
    assert path.name == "crossover_fashion_mnist.png" and ax.get_xscale() == ax.get_yscale() == "log"
    unshaped = crossover.unshaped_link()
    series = {}
    for container in ax.containers:  # one errorbar per series: its data line holds the points
        label = container.get_label().removesuffix(", measured")
        xs, ys = container.lines[0].get_data()
        series[label] = sorted(zip(map(float, xs), map(float, ys)))
    assert series == {"SGDM": [(50.0, 10.0), (unshaped, 1.0)], "Birder": [(50.0, 3.0), (unshaped, 2.0)]}
    assert "top1 87" in ax.get_title()


def _tuning_trial(freeze: float, step: int, seed: int = 0, top1: float = 88.0) -> dict:
    rec = record(
        "onebit_adam", lr=1e-3, step=step, seed=seed, eval_set="val", link=None, stop=True, top1=top1,
        extra_optim={"freeze": freeze},
    )  # fmt: skip
    rec["config"]["tuning"] = {"score_link_mbit": 200}
    return rec


def test_trials_are_scored_by_predicted_time_with_the_warmup_at_the_fp32_steps_cost(tmp_path):
    """1-bit Adam, 430 planned steps: freeze 0.3 (129 fp32 steps) reaches the target at step 150, freeze 0.15
    (64) at 170. By steps the first wins; at 200 Mbit/s each warmup step costs an fp32 step, so the second does,
    and its score is the model's: 64 fp32 steps and 106 compressed ones."""
    records = [
        _tuning_trial(0.3, 150),
        _tuning_trial(0.15, 170),
        _tuning_trial(0.05, None),  # missed the target: no time, and the study is still scored by time
        record("onebit_adam", lr=1e-3, step=None, nodes=1, link=None, profile=profile("onebit_adam")),
    ]
    frame = load_frame(write(tmp_path / "runs", records))
    by_steps = tuning_trials.tuning_rows(frame)  # without profiles: by steps
    assert by_steps[by_steps["chosen"]]["tuned"].iloc[0]["freeze"] == 0.3
    rows = tuning_trials.tuning_rows(frame, crossover.one_node_profiles(frame["run_dir"]))
    chosen = rows[rows["chosen"]]
    assert chosen["tuned"].iloc[0]["freeze"] == 0.15
    assert rows[rows["tuned"].map(lambda t: t["freeze"] == 0.05)]["predicted_s"].isna().all()
    model = crossover.StepModel(records[1], Profile.from_dict(profile("onebit_adam")))
    warm, main_s, _ = model.step_s(200.0)
    assert warm > 2 * main_s  # the premise: an fp32 step costs more than two compressed ones there
    assert chosen["predicted_s"].iloc[0] == pytest.approx(64 * warm + 106 * main_s)
    assert "predicted s to target at 200 Mbit/s" in tuning_render.tuning_markdown(rows)


def test_a_candidate_is_chosen_over_its_seeds_and_a_choice_at_the_grids_edge_is_flagged(tmp_path):
    """lr 1e-3 reaches the target at 100 with seed 0 but 200 and 210 with seeds 1 and 2 (mean 170); lr 2e-3 at
    150, 150, 160 (mean 153): the mean chooses 2e-3, the lucky seed would not. 2e-3 is the largest of the
    three learning rates tried: flagged."""

    def trial(lr, step, seed):
        return record("sgdm", lr=lr, step=step, seed=seed, eval_set="val", stop=True)

    records = [trial(1e-3, 100, 0), trial(1e-3, 200, 1), trial(1e-3, 210, 2)]
    records += [trial(2e-3, 150, 0), trial(2e-3, 150, 1), trial(2e-3, 160, 2), trial(5e-4, 300, 0)]
    frame = load_frame(write(tmp_path / "runs", records))
    rows = tuning_trials.tuning_rows(frame)
    chosen = rows[rows["chosen"]]
    assert set(chosen["seed"]) == {0, 1, 2} and {t["lr"] for t in chosen["tuned"]} == {2e-3}
    assert chosen["edge"].iloc[0] == ["lr"] and "edge of the grid: lr" in tuning_render.tuning_markdown(rows)
    # the sweep that gives the best candidates of one seed more seeds: here only lr 5e-4 lacks them, and it is
    # not among the best two
    assert tuning.rerun_overrides(rows) == []
    assert tuning.rerun_overrides(rows, best=3) == ["optim=sgdm optim.lr=0.0005 seed=1,2"]


def test_powersgd_trials_are_priced_at_their_rank_with_the_steps_before_start_iter_at_fp32():
    """PowerSGD's rank and start step are tuned: its step's bytes grow with the rank and its first
    ``start_iter`` steps all-reduce fp32, so the score must see both (a rank-4 trial priced at rank 1 was the
    bug)."""
    prof = Profile.from_dict({**profile("sgdm_powersgd"), "compression_s_per_element": {"powersgd": 1e-9}})

    def trial(rank: int, start: int) -> dict:
        extra = {"comm": {"rank": rank, "start_iter": start}}
        return record("sgdm_powersgd", lr=0.025, step=200, eval_set="val", link=None, stop=True, extra_optim=extra)

    low, high = crossover.StepModel(trial(1, 40), prof), crossover.StepModel(trial(4, 40), prof)
    assert (low.rank, high.rank) == (1, 4) and low.freeze == 40
    fp32 = crossover.StepModel(record("sgdm", lr=0.025, step=200), prof).step_s(200.0)[1]
    warm, main_low, _ = low.step_s(200.0)
    assert warm == pytest.approx(fp32) and main_low < warm
    assert high.step_s(200.0)[1] > main_low  # 4 x the factors' bytes
    assert low.time_to_target(200, 200.0) == pytest.approx(40 * fp32 + 160 * main_low)
    assert crossover.StepModel(trial(1, 1), prof).freeze == 2  # as the hook reads start_iter (at least 2)


def test_the_two_level_all_reduce_is_a_baseline_of_the_crossover_not_a_compressed_method():
    assert {"sgdm_2level", "sgdm_bf16_2level", "sgdm_fp16", "sgdm"} <= set(crossover.BASELINES)
    assert not {"birder", "diloco", "sgdm_powersgd", "onebit_adam"} & set(crossover.BASELINES)
