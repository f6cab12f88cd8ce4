"""make tune-fashion's last steps (birder_repro.report.tuning): a choice on its grid's edge reported with the
cell that extends the grid, and the field's plan (targets and budgets by the protocol's rules, each method's
step times) from made-up tuning records and 1-node profiles."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from test_report_tuning import profile, record, write

from birder_repro.perf.profile import Profile
from birder_repro.report import crossover, protocol, tuning, tuning_render, tuning_trials
from birder_repro.report.records import load_frame


def trial(optim: str, lr: float, step, seed: int = 100, top1: float = 88.0, extra=None) -> dict:
    rec = record(optim, lr=lr, step=step, seed=seed, eval_set="val", link=None, top1=top1, extra_optim=extra)
    rec["config"]["tuning"] = {"score_link_mbit": 200}
    return rec


def test_an_edge_choice_is_reported_with_the_cell_that_extends_its_grid(tmp_path):
    """lr 2e-3 reaches the target first and is the largest tried: its next value is 4e-3, one grid step up;
    lr 1e-3 would be interior and extend nothing."""
    records = [trial("sgdm", 5e-4, 300), trial("sgdm", 1e-3, 200), trial("sgdm", 2e-3, 150)]
    rows = tuning_trials.tuning_rows(load_frame(write(tmp_path / "runs", records)))
    assert tuning.extension_overrides(rows, 100, "fashion_tuning") == [
        "experiment=fashion_tuning optim=sgdm optim.lr=0.004 seed=100"
    ]
    text = tuning_render.tuning_markdown(rows)
    assert "lr 0.002: high edge, next 0.004" in text and "lr 0.0005, 0.001, 0.002" in text
    # once the extension has run (and lost), the choice is interior and nothing more is due
    records.append(trial("sgdm", 4e-3, 260))
    rows = tuning_trials.tuning_rows(load_frame(write(tmp_path / "runs2", records)))
    assert tuning.extension_overrides(rows, 100) == [] and "| interior " in tuning_render.tuning_markdown(rows)


def _curve(run_dir, points) -> None:
    lines = [{"step": s, "train_s": s * 0.1, "eval/top1": v} for s, v in points]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_the_plan_sets_targets_and_budgets_by_the_rules_before_the_field(tmp_path):
    """SGDM ends at 88.0, Birder at 87.0 (means over their chosen candidate's seeds): the targets are 97, 98 and
    99 % of 88.0. The budgets: the median method's predicted time to the middle target (86.24), and a third."""
    sgdm = [trial("sgdm", 0.025, 200, seed=s, top1=88.0) for s in (100, 101)]
    birder = [trial("birder", 5e-4, 150, seed=s, top1=87.0, extra={"beta": 0.9}) for s in (100, 101)]
    slow = trial("sgdm", 0.4, None, top1=80.0)
    # tuned too, not in the field (protocol field_methods): its higher final moves neither targets nor budgets
    local = [trial("streaming_diloco", 1e-3, 100, seed=s, top1=89.0, extra={"local_steps": 20}) for s in (100, 101)]
    optims = ("sgdm", "birder", "streaming_diloco")
    profiles = [record(o, lr=0.1, step=None, nodes=1, link=None, profile=profile(o)) for o in optims]
    root = write(tmp_path / "runs", [*sgdm, *birder, slow, *local, *profiles])
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    # the chosen candidates' validation curves: SGDM crosses 86.24 at step 180 (both seeds), Birder at 120 and 140
    for d, points in zip(dirs[:4], ([(170, 86.0), (180, 86.5)],) * 2 + ([(120, 86.3)], [(130, 86.0), (140, 86.9)])):
        _curve(d, points)
    frame = load_frame(root)
    profs = crossover.one_node_profiles(frame["run_dir"])
    rows = tuning_trials.tuning_rows(frame, profs)
    plan = tuning.field_plan(rows, profs, protocol.load_protocol())
    assert plan["targets"] == [85.36, 86.24, 87.12] and plan["best_final"] == {"optim": "sgdm", "value": 88.0}
    assert plan["picks"]["birder"] == {"lr": 5e-4, "beta": 0.9} and plan["picks"]["sgdm"] == {"lr": 0.025}
    model = {
        o: crossover.StepModel(r, Profile.from_dict(profile(o))) for o, r in (("sgdm", sgdm[0]), ("birder", birder[0]))
    }
    seconds = {
        "sgdm": model["sgdm"].time_to_target(180, 200.0),
        "birder": (model["birder"].time_to_target(120, 200.0) + model["birder"].time_to_target(140, 200.0)) / 2,
    }
    assert "streaming_diloco" in plan["picks"] and "streaming_diloco" in plan["step_s"]
    assert {k: v for k, v in plan["seconds_to_middle_target"].items() if k in seconds} == pytest.approx(
        seconds, abs=1e-3
    )
    median = statistics.median(seconds.values())
    assert plan["budgets_s"] == pytest.approx([median, median / 3], abs=1e-3)
    warm, main, _ = model["birder"].step_s(200.0)
    assert plan["step_s"]["birder"] == pytest.approx([warm, main], abs=1e-6)
    # the plan round-trips through RUNS/tuned.yaml into the field's cells
    protocol.write_plan(root, plan)
    cells = protocol.field_cells(protocol.load_protocol(), protocol.read_plan(root, {}), ["birder"], [0])
    steps = protocol.budget_steps(plan["budgets_s"][0], main, warm, 0.0)
    assert f"train.steps={steps} " in cells[1] and "task.target.value=86.24" in cells[0]
    assert math.isfinite(steps)


def test_the_command_prints_the_extension_and_confirmation_cells_for_the_sweep(tmp_path, capsys):
    records = [trial("sgdm", 5e-4, 300), trial("sgdm", 1e-3, 200), trial("sgdm", 2e-3, 150)]
    root = write(tmp_path / "runs", records)
    assert tuning.main(["--extend", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# order-seed: ")
    assert lines[1:] == ["experiment=fashion_tuning optim=sgdm optim.lr=0.004 seed=100"]
    assert tuning.main(["--rerun", str(root)]) == 0  # the best two at the other tuning seed, 101
    lines = capsys.readouterr().out.splitlines()[1:]
    assert lines == [
        "experiment=fashion_tuning optim=sgdm optim.lr=0.002 seed=101",
        "experiment=fashion_tuning optim=sgdm optim.lr=0.001 seed=101",
    ]
    assert tuning.main(["--plan", str(root)]) == 2  # no 1-node profile to price the steps: one line, no plan
    assert "no 1-node profile" in capsys.readouterr().out and not (root / protocol.PLAN_FILE).exists()
