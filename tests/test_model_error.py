"""tables/model_error.md (birder_repro.report.model_error): each measured multi-node run predicted from the
1-node profile of its setting and its own steps, its step and time-to-target errors, and per method the median
and worst of them against the targets."""

from __future__ import annotations

import math

import pytest
from test_report_tuning import profile, record, write

from birder_repro.perf.profile import Profile
from birder_repro.report import crossover, model_error
from birder_repro.report.__main__ import main
from birder_repro.report.display import fmt_number, is_missing
from birder_repro.report.records import load_frame


def field(tmp_path):
    """SGDM at 200 Mbit/s: two seeds whose measured step and time are the model's x 1.1 and x 0.8, one that
    missed the target; Birder with no 1-node profile (not predicted); the SGDM profile run."""
    sgdm_profile = profile("sgdm")
    model = crossover.StepModel(
        record("sgdm", lr=0.05, step=200), Profile.from_dict(sgdm_profile)
    )  # the model's step at 200 Mbit/s, which every SGDM step is predicted at: timed, and on the training clock
    step, clock = model.step_s(200.0, loop=False)[1], model.step_s(200.0)[1]
    runs = [
        record("sgdm", lr=0.05, step=200, seconds=200 * clock * 1.1, total_ms=1e3 * step * 1.1),
        record("sgdm", lr=0.05, step=200, seed=1, seconds=200 * clock * 0.8, total_ms=1e3 * step * 0.8),
        record("sgdm", lr=0.05, step=None, seed=2, total_ms=1e3 * step),
        record("birder", lr=1e-3, step=300, seconds=5.0),
        record("sgdm", lr=0.05, step=None, nodes=1, link=None, profile=sgdm_profile),
    ]
    return load_frame(write(tmp_path / "runs", runs))


def test_each_run_is_predicted_from_its_profile_and_its_own_steps(tmp_path):
    rows = model_error.model_error_rows(field(tmp_path))
    assert list(rows["optim"]) == ["sgdm"] * 3  # Birder has no profile; the 1-node run is not judged
    assert list(rows["time_error"].iloc[:2]) == pytest.approx([1 / 1.1 - 1, 1 / 0.8 - 1])
    assert list(rows["step_error"]) == pytest.approx([1 / 1.1 - 1, 1 / 0.8 - 1, 0.0])
    assert math.isnan(rows["time_error"].iloc[2])  # it never reached the target
    summary = model_error.model_error_summary(rows).iloc[0]
    assert summary["time_median"] == pytest.approx((0.25 + 1 - 1 / 1.1) / 2)
    assert summary["time_worst"] == pytest.approx(0.25) and not summary["meets"]  # median 17 % > 15 %


def test_make_tables_writes_the_model_error_table(tmp_path):
    frame_root = tmp_path / "runs"
    field(tmp_path)
    assert main(["--runs", str(frame_root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")]) == 0
    text = (tmp_path / "out" / "model_error.md").read_text()
    assert "| SGDM " in text and "+25.0%" in text and "**no**" in text and "not reached" in text


def test_held_out_runs_are_predicted_from_the_profiles_of_the_main_runs_and_reported_apart(tmp_path, capsys):
    """make validate-fashion's --held-out: runs made after the model was settled, in a folder of their own without
    profiles, predicted from the main folder's and summarised apart (only they, not the main runs)."""
    field(tmp_path)  # runs/: the SGDM runs and the profile
    sgdm_profile = profile("sgdm")
    model = crossover.StepModel(record("sgdm", lr=0.05, step=200), Profile.from_dict(sgdm_profile))
    step, clock = model.step_s(200.0, loop=False)[1], model.step_s(200.0)[1]
    later = [record("sgdm", lr=0.05, step=100, seed=5, seconds=100 * clock * 1.25, total_ms=1e3 * step * 1.25)]
    held_root = write(tmp_path / "held", later)
    rows = model_error.model_error_rows(load_frame(held_root), load_frame(tmp_path / "runs"))
    assert list(rows["seed"]) == [5] and list(rows["time_error"]) == pytest.approx([1 / 1.25 - 1])
    assert model_error.model_error_rows(load_frame(held_root)).empty  # no profile of its own
    assert model_error.main(["--runs", str(tmp_path / "runs"), "--held-out", str(held_root)]) == 0
    out = capsys.readouterr().out
    held_part = out[out.index("## Held out") :]
    assert "-20.0%" in held_part and "+25.0%" not in held_part and "+25.0%" in out[: out.index("## Held out")]


class _Model:
    """A made-up StepModel: time to target as a function of the link rate alone."""

    def __init__(self, seconds, comm_share=0.5):
        self.seconds, self.comm_share = seconds, comm_share

    def time_to_target(self, steps, link):
        return self.seconds(link)

    def step_s(self, link):
        return (0.0, 0.0, self.comm_share)


def test_each_crossover_is_predicted_against_the_measured_one_and_its_bracketing_links():
    """Birder measured at ratios 0.5 (100 Mbit/s) and 2.0 (400) crosses at 100 x 4^(1/3) = 158.7 Mbit/s; the
    made-up models cross where 10 + 1000/x = 14 + 100/x, at 225: 42 % off, a miss. DiLoCo, faster at both links
    and predicted faster on every link, agrees."""
    from test_report_tuning import _measured

    rows = [("sgdm", 100.0, 20.0), ("sgdm", 400.0, 10.0), ("birder", 100.0, 10.0), ("birder", 400.0, 20.0)]
    rows += [("diloco", 100.0, 2.0), ("diloco", 400.0, 2.0)]
    points = _measured(rows).assign(task="t", gpus=4, nodes=2, gpus_per_node=2, run_length="2 epochs")
    points.attrs["models"] = {
        "sgdm": _Model(lambda x: 10 + 1000 / x),
        "birder": _Model(lambda x: 14 + 100 / x),
        "diloco": _Model(lambda x: 1.0),
    }
    found = model_error.crossover_error_rows(points).set_index("optim")
    birder = found.loc["birder"]
    assert birder["measured"] == pytest.approx(100 * 4 ** (1 / 3)) and birder["bracket"] == (100.0, 400.0)
    assert birder["predicted"] == pytest.approx(225, rel=0.02)
    assert birder["error"] == pytest.approx(birder["predicted"] / birder["measured"] - 1)
    assert is_missing(found.loc["diloco", "measured"]) and found.loc["diloco", "faster_everywhere"]
    text = model_error.crossover_error_markdown(found.reset_index())
    assert f"{fmt_number(birder['measured'], 3)} (between 100 and 400)" in text and "| t: 4 (2x2), 2 epochs |" in text
    assert "| **no**" in text and "faster at every measured link; the model agrees" in text
    # A model slower on every link, against DiLoCo measured faster at both: a disagreement.
    points.attrs["models"]["diloco"] = _Model(lambda x: 100.0)
    text = model_error.crossover_error_markdown(model_error.crossover_error_rows(points))
    assert "faster at every measured link; the model **does not**" in text
    # The model within 15 % of the measured crossover (here it crosses at 160): a pass.
    points.attrs["models"]["birder"] = _Model(lambda x: 14 + 360 / x)
    close = model_error.crossover_error_rows(points).set_index("optim").loc["birder"]
    assert abs(close["error"]) <= model_error.CROSSOVER_TARGET, close["predicted"]
    assert "| yes" in model_error.crossover_error_markdown(model_error.crossover_error_rows(points))
    # Seeds spread 40 % (sd over mean, 2 seeds each): the 225 Mbit/s miss lies inside the measured seed band.
    points.attrs["models"]["birder"] = _Model(lambda x: 14 + 100 / x)
    points["measured_sd"], points["reached"] = 0.4 * points["measured_s"], 2
    wide = model_error.crossover_error_rows(points).set_index("optim").loc["birder"]
    assert wide["band"][0] < wide["measured"] < wide["predicted"] < wide["band"][1]
    assert "| **no**; inside the seed band" in model_error.crossover_error_markdown(
        model_error.crossover_error_rows(points)
    )
