"""The report compares like with like: a row is one configuration less its seed, its seeds aggregated; runs of
other settings (a smoke run, another learning rate) never take its place; what is left out is listed with why.

Records are synthetic, shaped as runs write them (a resolved ``config`` included), in temporary directories.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
from conftest import write_records

from birder_repro.report import cells as report_cells
from birder_repro.report import figures, identity, tables
from birder_repro.report.__main__ import main
from birder_repro.report.records import load_frame

SGDM_TOP1 = {"sgdm": 98.3, "onebit_adam": 98.1, "birder": 97.8}


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    monkeypatch.setattr(figures, "drawing", lambda: False)


def config(optim: str, seed: int = 0, steps: int = 60, **train) -> dict:
    """A resolved config as a digits run records it (the keys that matter here)."""
    return {
        "mode": "train",
        "nodes": 2,
        "gpus_per_node": 1,
        "seed": seed,
        "dry_run": False,
        "device": "cpu",
        "parallel": "ddp",
        "train": {
            "steps": steps,
            "epochs": 10,
            "batch_size": 32,
            "eval_every": 10,
            "log_every": 10,
            "checkpoint_every": 0,
            "resume": None,
            "max_restarts": 0,
            "timeout_s": 300,
            "precision": "fp32",
            **train,
        },
        "predict": {"implementation": "this"},
        "task": {"name": "digits", "baseline": "sgdm"},
        "model": {"size": "full"},
        "data": {"source": "real", "split_seed": 0},
        "optim": {"name": optim, "lr": {"sgdm": 0.05}.get(optim, 0.003), "seed": seed},
        "cluster": {"name": "local", "interconnect": "loopback", "link_mbit": None},
        "launcher": {"name": "auto", "node_rank": None, "rdzv_id": None},
        "logger": {"name": "none"},
    }


def run_record(
    optim: str,
    throughput: float,
    *,
    seed: int = 0,
    steps: int = 60,
    top1: float | None = None,
    started: str = "2026-01-01T10:00:00",
    status: str = "completed",
    **train,
) -> dict:
    return {
        "status": status,
        "task": "digits",
        "optim": optim,
        "cluster": {"name": "local", "nodes": 2, "gpus_per_node": 1, "interconnect": "loopback", "link_mbit": None},
        "world_size": 2,
        "batch_size": 32,
        "global_batch_size": 64,
        "steps": steps,
        "lr": 0.003,
        "throughput_samples_per_s": throughput if status == "completed" else None,
        "metrics": {"top1": SGDM_TOP1[optim] if top1 is None else top1, "loss": 0.05} if status == "completed" else {},
        "headline_metric": "top1",
        "started": started,
        "precision": "fp32",
        "config": config(optim, seed, steps, **train),
    }


def write(root: Path, records: list[dict]) -> Path:
    return write_records(root, records, lambda i, rec: f"2026-01-01/{i:02d}_{rec['optim']}")


def report(tmp_path: Path, records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(rows, runs left out, digits.md) of ``records``."""
    root = write(tmp_path / "runs", records)
    frame = load_frame(root)
    assert main(["--runs", str(root), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "fig")]) == 0
    return tables.cell_table(frame), report_cells.select_runs(frame)[1], (tmp_path / "out" / "digits.md").read_text()


def only(rows: pd.DataFrame, **where) -> pd.Series:
    found = rows
    for key, value in where.items():
        found = found[found[key] == value]
    assert len(found) == 1, found[["optim", "run_length", "setting_note"]]
    return found.iloc[0]


# ---------------------------------------------------------------------------------------------- the key
def test_the_cell_key_leaves_out_the_seed_and_what_cannot_change_a_result():
    base = config("birder", seed=0)
    other = copy.deepcopy(config("birder", seed=3))
    other["logger"] = {"name": "wandb", "project": "x"}
    other["launcher"] = {"name": "slurm", "node_rank": 1, "rdzv_id": "job-17"}
    other["train"].update(checkpoint_every=10, resume="auto", max_restarts=3, log_every=1)
    other["predict"] = {"implementation": "paper"}  # a measured run never reads it
    other["cluster"]["perf"] = {"inter_efficiency": 0.9}  # nor the performance model's links
    assert identity.config_key(base) == identity.config_key(other)
    for change in ({"steps": 2}, {"eval_every": 0}, {"precision": "bf16"}):
        changed = copy.deepcopy(base)
        changed["train"].update(change)
        assert identity.config_key(changed) != identity.config_key(base), change
    assert identity.config_key(base, "predicted") != identity.config_key(other, "predicted")
    assert all(why for why in identity.IGNORED_KEYS.values())  # every key left out says why


def test_a_setting_added_later_with_a_null_default_does_not_split_a_cell():
    before = config("birder", seed=0)
    after = copy.deepcopy(config("birder", seed=1))
    after["cluster"]["cores_per_node"] = None  # a run made once the key existed, left at its default
    assert identity.config_key(before) == identity.config_key(after)
    after["cluster"]["cores_per_node"] = 1
    assert identity.config_key(before) != identity.config_key(after)


# ---------------------------------------------------------------------------------------------- the brief's case
def sweep_and_smoke() -> list[dict]:
    """A 60-step digits sweep of three optimizers, then one newer 2-step smoke run of Birder."""
    return [
        run_record("sgdm", 4423.0),
        run_record("onebit_adam", 6248.0),
        run_record("birder", 3699.0),
        run_record("birder", 7080.0, steps=2, top1=27.22, started="2026-01-01T11:00:00"),
    ]


def test_a_smoke_run_never_takes_the_place_of_the_sweep(tmp_path):
    rows, left, md = report(tmp_path, sweep_and_smoke())
    assert sorted(rows["optim"]) == ["birder", "onebit_adam", "sgdm"] and set(rows["steps"]) == {60}
    birder = only(rows, optim="birder")
    assert birder["throughput_shown"] == 3699.0 and birder["top1"] == 97.8
    assert birder["speedup"] == pytest.approx(3699.0 / 4423.0)
    assert list(left["reason"]) == ["smoke run: 2 steps, at most a tenth of the 60 of its cell's longest run"]
    assert "## Runs left out" in md and "smoke run: 2 steps" in md
    assert "27.22" not in md and "7080" not in md.split("## Runs left out")[0]


def test_a_smoke_run_of_an_optimizer_with_no_full_length_run_is_left_out_too(tmp_path):
    """The longest run is its cell's, any optimizer's: a 2-step run of 1-bit LAMB beside the 60-step sweep is a
    smoke run even though no 60-step 1-bit LAMB run exists."""
    smoke = run_record("onebit_lamb", 5000.0, steps=2, top1=30.0, started="2026-01-01T11:00:00")
    rows, left, _ = report(tmp_path, [*sweep_and_smoke()[:3], smoke])
    assert sorted(rows["optim"]) == ["birder", "onebit_adam", "sgdm"]
    assert list(left["reason"]) == ["smoke run: 2 steps, at most a tenth of the 60 of its cell's longest run"]


def test_left_out_runs_are_printed_with_the_reason(tmp_path, capsys):
    report(tmp_path, sweep_and_smoke())
    printed = capsys.readouterr().out
    assert "left out of the tables: 1 run(s)" in printed and "(Birder, 2 steps): smoke run" in printed


def test_runs_of_another_length_that_are_not_smoke_runs_are_a_section_of_their_own(tmp_path):
    records = [
        run_record("sgdm", 4000.0),
        run_record("birder", 3600.0),
        run_record("birder", 3900.0, steps=30, started="2026-01-01T11:00:00"),
    ]
    rows, left, md = report(tmp_path, records)
    assert left.empty and sorted(rows["run_length"]) == ["30 steps", "60 steps", "60 steps"]
    assert pd.isna(only(rows, run_length="30 steps")["speedup"])  # no SGDM of 30 steps to compare with
    assert "per process, 30 steps" in md and "per process, 60 steps" in md


# ---------------------------------------------------------------------------------------------- seeds
def test_three_seeds_are_one_row_with_mean_spread_and_n(tmp_path):
    records = [
        run_record("birder", t, seed=s, top1=a)
        for s, (t, a) in enumerate([(100.0, 97.0), (110.0, 98.0), (120.0, 99.0)])
    ]
    rows, left, md = report(tmp_path, [run_record("sgdm", 100.0), *records])
    birder = only(rows, optim="birder")
    assert (birder["n"], birder["seeds"]) == (3, "0 1 2") and left.empty
    assert birder["throughput_shown"] == pytest.approx(110.0) and birder["throughput_shown_sd"] == pytest.approx(10.0)
    assert birder["top1"] == pytest.approx(98.0) and birder["top1_sd"] == pytest.approx(1.0)
    line = next(x for x in md.splitlines() if x.startswith("| Birder"))
    assert "3 (seeds 0 1 2)" in line and "110 ± 10 (1.10x)" in line and "98.0 ± 1.0" in line


def test_rows_that_differ_in_a_setting_say_so_and_compare_with_the_same_setting(tmp_path):
    records = [
        run_record("sgdm", 100.0),
        run_record("birder", 150.0),
        run_record("sgdm", 80.0, eval_every=1),
        run_record("birder", 90.0, eval_every=1),
    ]
    rows, left, md = report(tmp_path, records)
    assert len(rows) == 4 and left.empty
    frequent = only(rows, optim="birder", setting_note="train.eval_every=1")
    assert frequent["speedup"] == pytest.approx(90.0 / 80.0)
    assert only(rows, optim="birder", setting_note="train.eval_every=10")["speedup"] == pytest.approx(1.5)
    assert "setting (where the rows differ)" in md and "train.eval_every=1 " in md


def test_a_diverged_seed_is_left_out_of_the_means_and_listed(tmp_path):
    diverged = run_record("birder", 0.0, seed=2, status="diverged")
    diverged["diverged_at_step"] = 16
    rows, left, _ = report(
        tmp_path, [run_record("birder", 100.0, seed=0), run_record("birder", 120.0, seed=1), diverged]
    )
    assert only(rows, optim="birder")["n"] == 2
    assert list(left["reason"]) == ["diverged: left out of the means of its row, whose other seeds completed"]


# ---------------------------------------------------------------------------------------------- stopped runs
def test_a_resumed_run_is_shown_as_resumed_and_an_interrupted_one_left_out(tmp_path):
    resumed = run_record("birder", 3700.0, steps=100)
    resumed["attempts"] = [{"from_step": 0, "to_step": 50}, {"from_step": 50, "to_step": 100}]
    resumed["resumed_from_step"] = 50
    interrupted = run_record("birder", 0.0, steps=59, status="interrupted", started="2026-01-01T12:00:00")
    interrupted["config"] = config("birder", steps=100)
    rows, left, md = report(tmp_path, [run_record("sgdm", 4000.0, steps=100), resumed, interrupted])
    assert only(rows, optim="birder")["attempts"] == 2 and only(rows, optim="birder")["throughput_shown"] == 3700.0
    assert "100 (resumed: 2 attempts)" in md
    assert list(left["reason"]) == ["interrupted at step 59: not a result until resumed and completed"]


def test_an_old_style_resume_in_a_new_directory_is_left_out(tmp_path):
    """Before a resumed run kept its directory, resuming made a new run whose clock covered only the steps after
    the checkpoint: such a record never stands for its cell."""
    full = run_record("birder", 3700.0, steps=100, started="2026-01-01T10:00:00")
    tail = run_record("birder", 3900.0, steps=100, started="2026-01-01T11:00:00")
    tail["resumed_from_step"] = 50
    rows, left, _ = report(tmp_path, [full, tail])
    assert only(rows, optim="birder")["throughput_shown"] == 3700.0
    assert left["reason"].iloc[0].startswith("resumed from step 50 in a new directory")


def test_the_ddp_fsdp_table_keeps_a_row_per_configuration():
    from birder_repro.report import parallel_table

    sweep = run_record("birder", 3700.0, started="2026-01-01T10:00:00")
    other_seed = run_record("birder", 3800.0, seed=1, started="2026-01-01T10:30:00")
    smoke = run_record("birder", 7000.0, steps=2, started="2026-01-01T11:00:00")
    longer = run_record("birder", 3600.0, steps=120, started="2026-01-01T11:30:00")
    rows = parallel_table.rows([sweep, other_seed, smoke, longer])
    steps_at = parallel_table.HEADER.index("steps")
    # the newest run of each length (seed left out); the 2-step run is a smoke run, left out as in the main tables
    assert sorted((r[steps_at], r[steps_at + 1]) for r in rows) == [(60, 3800.0), (120, 3600.0)]
    assert [r[steps_at] for r in parallel_table.smoke_runs([sweep, smoke])] == [2]


def test_the_ddp_fsdp_table_leaves_out_a_smoke_run_of_another_optimizer():
    """A smoke run is measured against the longest run of its task, parallelism, layout and link, whatever its
    optimizer (as in the main tables): SGDM's 2 steps beside Birder's 60 are a smoke run."""
    from birder_repro.report import parallel_table

    rows = parallel_table.rows([run_record("birder", 3700.0), run_record("sgdm", 9000.0, steps=2)])
    optim_at = parallel_table.HEADER.index("optim")
    assert [r[optim_at] for r in rows] == ["birder"]
    assert [
        r[optim_at] for r in parallel_table.smoke_runs([run_record("birder", 3700.0), run_record("sgdm", 1.0, steps=2)])
    ] == ["sgdm"]


@pytest.mark.parametrize("key", ["stop_timeout_s", "resume_policy"])
def test_a_run_differing_only_in_a_setting_that_cannot_change_a_result_is_in_the_same_row(tmp_path, key):
    """birder_repro.run.digest.NO_RESULT is the one list of such settings: the cell digest and a table's rows both
    leave them out (train.stop_timeout_s made a row of its own when the two lists disagreed)."""
    from birder_repro.run import digest

    first = run_record("birder", 3600.0, seed=0, started="2026-01-01T10:00:00")
    second = run_record("birder", 3800.0, seed=1, started="2026-01-01T11:00:00", **{key: "other"})
    rows, _, _ = report(tmp_path, [run_record("sgdm", 4000.0), first, second])
    assert only(rows, optim="birder")["n"] == 2
    assert set(digest.NO_RESULT) <= set(identity.IGNORED_KEYS)
    assert all(identity.is_ignored(k) and why for k, why in digest.NO_RESULT.items())
    same_seed = copy.deepcopy(second["config"])
    same_seed["seed"] = same_seed["optim"]["seed"] = 0
    assert digest.cell_digest(first["config"]) == digest.cell_digest(same_seed)  # resume=auto's identity too


def test_a_run_refused_for_a_value_that_is_no_number_is_read_without_a_warning(tmp_path, capsys):
    """``train.steps=ten`` is refused before the run starts; its failed record keeps the value as given. make tables
    reads it like any failed run: one line among the runs left out, no warning about the record."""
    refused = run_record("birder", 0.0, status="failed", started="2026-01-01T12:00:00")
    refused.update(error="config error: train.steps='ten': use a whole number >= 1", steps=None)
    refused["config"]["train"]["steps"] = "ten"
    _, left, _ = report(tmp_path, [run_record("sgdm", 4000.0), refused])
    said = capsys.readouterr()
    assert "skipping run record" not in said.err
    assert "(make clean-failed lists the failed runs; make clean-failed ARGS=--yes removes them)" in said.out
    assert list(left["reason"]) == ["failed: config error: train.steps='ten': use a whole number >= 1"]


def budget_run(optim: str, steps: int, budget_s: float) -> dict:
    """A run sized to a time budget (report.protocol.budget_steps): ``tuning.budget_s`` in its config."""
    rec = run_record(optim, 5000.0, steps=steps, top1=80.0, started="2026-01-01T11:00:00")
    rec["config"]["tuning"] = {"budget_s": budget_s}
    return rec


def test_a_run_sized_to_a_time_budget_is_no_smoke_run_and_no_measure_of_the_others(tmp_path):
    """A short budget gives a slow method a fraction of a fast one's steps on purpose (seen: SGDM's 51 steps at
    9.5 s beside DiLoCo's 791 at 28.5 s were left out as a smoke run); and a long budget run does not make the
    whole runs beside it smoke runs."""
    records = [*sweep_and_smoke()[:3], budget_run("sgdm", 5, 1.0), budget_run("birder", 900, 30.0)]
    _, left, _ = report(tmp_path, records)
    assert list(left["reason"]) == []
