"""The Fashion-MNIST field's protocol (birder_repro.report.protocol, .stats, birder_repro.sweep's interleaved
order, record.host_load): known answers for the intervals, ties, the target and budget rules, grid edges and
their extension, the load flag, and the run order; no cluster needed."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import yaml
from conftest import compose_config

from birder_repro import sweep
from birder_repro.report import protocol, stats
from birder_repro.run import record
from birder_repro.run.directory import RunDir


# ------------------------------------------------------------------------------------------- intervals
def test_the_t_interval_matches_a_known_answer():
    """10, 12, 11, 13, 9: mean 11, sd sqrt(2.5), t(0.975, 4) = 2.776445 (Student's table): half-width
    2.776445 x 1.581139 / sqrt(5) = 1.963243."""
    iv = stats.t_interval([10, 12, 11, 13, 9])
    assert iv.mean == pytest.approx(11.0) and iv.n == 5
    assert iv.half == pytest.approx(1.963243, abs=1e-6)
    assert (iv.lo, iv.hi) == pytest.approx((9.036757, 12.963243), abs=1e-6)
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-6)
    assert stats.t_quantile(0.975, 29) == pytest.approx(2.045230, abs=1e-6)
    assert stats.t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    assert stats.t_interval([]) is None and math.isinf(stats.t_interval([3.0]).half)
    with pytest.raises(ValueError, match="confidence"):
        stats.t_interval([1, 2], confidence=95)


def test_an_order_is_claimed_only_where_the_intervals_separate():
    fast, slow = stats.Interval(10.0, 1.0, 5), stats.Interval(12.5, 1.0, 5)
    close = stats.Interval(11.5, 1.0, 5)
    assert stats.compare(fast, slow) == "<" and stats.compare(slow, fast) == ">"
    assert stats.compare(fast, close) == "tie" and stats.compare(fast, None) == "tie"
    order = stats.order_with_ties({"a": slow, "b": fast, "c": close, "d": None})
    assert order == [("b", "tie with", "c"), ("c", "tie with", "a"), ("a", "", None), ("d", "no interval", None)]
    assert stats.order_with_ties({"a": slow, "b": fast}) == [("b", "ahead of", "a"), ("a", "", None)]
    # higher is better (accuracy at a budget): the order turns round
    assert stats.order_with_ties({"a": slow, "b": fast}, lower_is_better=False)[0] == ("a", "ahead of", "b")


# ------------------------------------------------------------------------------------------- the protocol
def test_the_protocol_gives_every_method_the_same_trials_and_seeds_apart():
    proto = protocol.load_protocol()
    assert not set(proto["tuning_seeds"]) & set(proto["field_seeds"]) and len(proto["field_seeds"]) >= 5
    sizes = {m: len(protocol.grid_points(g)) for m, g in proto["grids"].items()}
    assert set(sizes.values()) == {proto["trials"]} and len(sizes) == 12
    assert {"diloco_1bit", "streaming_diloco"} <= set(sizes) and len(proto["field_methods"]) == 10
    assert set(proto["field_methods"]) <= set(sizes) and "streaming_diloco" not in proto["field_methods"]
    varied = {m: {k for p in protocol.grid_points(g) for k in p} for m, g in proto["grids"].items()}
    assert all("lr" in keys for keys in varied.values())  # every method's learning rate, PowerSGD's included
    diloco = protocol.grid_points(proto["grids"]["diloco"])
    assert {10, 20, 40, 80} <= {p["local_steps"] for p in diloco} and len({p["outer_lr"] for p in diloco}) >= 3
    assert len({p["lr"] for p in diloco}) >= 3  # its inner lr, not AdamW's
    assert {1, 2, 4, 8} <= {p["comm.rank"] for p in protocol.grid_points(proto["grids"]["sgdm_powersgd"])}


def test_a_protocol_breaking_its_rules_is_one_error(tmp_path):
    proto = yaml.safe_load(protocol.protocol_path().read_text())
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump({**proto, "field_seeds": [0, 100]}))
    with pytest.raises(protocol.ProtocolError, match=r"field_seeds \[100\] are also tuning_seeds"):
        protocol.load_protocol(bad)
    grids = {**proto["grids"], "sgdm": [{"lr": [0.1, 0.2]}]}
    bad.write_text(yaml.safe_dump({**proto, "grids": grids}))
    with pytest.raises(protocol.ProtocolError, match="grids.sgdm has 2 points, not trials=12"):
        protocol.load_protocol(bad)


def test_the_grid_cells_are_the_tuning_experiment_at_the_first_tuning_seed():
    proto = protocol.load_protocol()
    cells = protocol.grid_cells(proto)
    assert len(cells) == 12 * proto["trials"] and len(set(cells)) == len(cells)
    assert all(c.startswith("experiment=fashion_tuning optim=") and c.endswith(" seed=100") for c in cells)
    assert (
        "experiment=fashion_tuning optim=diloco optim.local_steps=80 optim.outer_lr=0.7 optim.lr=0.001 seed=100"
        in cells
    )
    streaming = next(c for c in cells if "optim=streaming_diloco" in c and "optim.fragments=4" in c)
    assert compose_config(shlex.split(streaming)).optim.fragments == 4  # the new grids' keys are the config's
    cfg = compose_config(shlex.split(cells[0]))  # a cell composes
    assert cfg.seed == 100 and cfg.data.eval_set == "val" and not cfg.train.stop_at_target
    assert cfg.task.target.value == proto["score_target"] and cfg.tuning.score_link_mbit == proto["link_mbit"]


def test_the_target_rule():
    """97, 98 and 99 % of 88.0 are 85.36, 86.24, 87.12; 88.37's are rounded down to 0.01."""
    assert protocol.target_levels(88.0, [0.99, 0.97, 0.98]) == [85.36, 86.24, 87.12]
    assert protocol.target_levels(88.37, [0.97, 0.98, 0.99]) == [85.71, 86.6, 87.48]
    with pytest.raises(protocol.ProtocolError, match="no tuned method"):
        protocol.target_levels(float("nan"), [0.97])


def test_the_budget_rule_and_a_budgets_steps_from_a_step_time():
    # the median method's time (one never reaching it counts as slowest), and a third of it
    assert protocol.budgets_from_times([30.0, 12.0, math.inf, 20.0, 15.0], [1, 3]) == pytest.approx([20.0, 20 / 3])
    with pytest.raises(protocol.ProtocolError, match="median method never reaches"):
        protocol.budgets_from_times([math.inf, math.inf, 3.0], [1])
    # 20 s at 52 ms a step: 384 steps (384 x 0.052 = 19.97 s; 385 would be 20.02)
    assert protocol.budget_steps(20.0, 0.052) == 384
    # a 15 % fp32 warmup at 0.2 s a step: each step costs 0.15 x 0.2 + 0.85 x 0.05 = 0.0725 s
    assert protocol.budget_steps(20.0, 0.05, 0.2, 0.15) == 275
    # 10 fp32 steps first (PowerSGD's start), 0.2 s each, then 0.05: 10 + (20 - 2) / 0.05 = 370
    assert protocol.budget_steps(20.0, 0.05, 0.2, 10) == 370
    assert protocol.budget_steps(1.0, 0.05, 0.2, 10) == 5  # the budget ends inside the warmup
    with pytest.raises(protocol.ProtocolError, match="positive"):
        protocol.budget_steps(20.0, 0.0)


def test_the_field_cells_carry_the_picks_targets_and_each_budgets_steps():
    proto = protocol.load_protocol()
    plan = {
        "targets": [85.36, 86.24, 87.12],
        "budgets_s": [20.0, 6.667],
        "picks": {"birder": {"lr": 0.0005, "beta": 0.9}, "onebit_adam": {"lr": 0.0005, "freeze": 0.15}},
        "step_s": {"birder": [0.052, 0.052], "onebit_adam": [0.2, 0.05]},
    }
    cells = protocol.field_cells(proto, plan, ["birder", "onebit_adam"], [0, 1])
    assert len(cells) == 2 * 2 * 3  # each method and seed: the whole run and one a budget
    whole = [c for c in cells if "train.steps" not in c]
    assert whole[0] == (
        "experiment=fashion_time_to_accuracy optim=birder optim.lr=0.0005 optim.beta=0.9 cluster.link_mbit=200 "
        "task.target.value=86.24 'task.target.ladder=[85.36,86.24,87.12]' seed=0"
    )
    assert "optim=birder" in cells[1] and "train.steps=384 train.eval_every=0 tuning.budget_s=20 seed=0" in cells[1]
    assert any(
        "optim=onebit_adam" in c and "train.steps=275 train.eval_every=0 tuning.budget_s=20 seed=1" in c for c in cells
    )
    cfg = compose_config(shlex.split(cells[1]))
    assert cfg.train.steps == 384 and cfg.tuning.budget_s == 20 and list(cfg.task.target.ladder) == plan["targets"]


def test_the_field_runs_its_ten_methods_not_the_local_step_variants():
    proto = protocol.load_protocol()
    plan = {**protocol.read_plan(__import__("pathlib").Path("/nonexistent"), proto), "provisional": False}
    cells = protocol.field_cells(proto, plan, seeds=[0])
    assert {c.split("optim=")[1].split()[0] for c in cells} == set(proto["field_methods"])


def test_the_local_steps_cells_are_every_method_link_and_field_seed():
    proto = protocol.load_protocol()
    plan = {"targets": [85.0, 86.0, 87.0], "picks": {"diloco_1bit": {"local_steps": 40, "outer_lr": 0.7}}}
    spec = proto["local_steps"]
    assert {"diloco", "streaming_diloco", "diloco_1bit", "birder", "sgdm_bf16_2level"} == set(spec["methods"])
    cells = protocol.local_steps_cells(proto, plan)
    assert len(cells) == len(spec["methods"]) * len(spec["links_mbit"]) * len(proto["field_seeds"])
    assert cells[0] == (
        "experiment=fashion_time_to_accuracy optim=diloco task.target.value=86 'task.target.ladder=[85,86,87]' "
        f"cluster.link_mbit={spec['links_mbit'][0]:g} seed={proto['field_seeds'][0]}"
    )
    one = [c for c in protocol.local_steps_cells(proto, plan, [10]) if "optim=diloco_1bit" in c]
    assert len(one) == 5 and "optim.local_steps=40 optim.outer_lr=0.7" in one[0] and "link_mbit=10 " in one[0]
    cfg = compose_config(shlex.split(one[0]))
    assert cfg.optim.name == "diloco_1bit" and cfg.cluster.link_mbit == 10 and cfg.nodes == 2 and cfg.gpus_per_node == 2


def test_the_replica_cells_keep_the_fields_global_batch():
    proto = protocol.load_protocol()
    plan = {"targets": [85.0, 86.0, 87.0]}
    cells = protocol.replica_cells(proto, plan)
    spec = proto["replicas"]
    assert (
        len(cells) == len(spec["methods"]) * len(spec["nodes"]) * len(proto["field_seeds"]) and len(spec["nodes"]) >= 3
    )
    for cell in [c for c in cells if "optim=diloco " in c and c.endswith(f"seed={proto['field_seeds'][0]}")]:
        cfg = compose_config(shlex.split(cell))
        assert cfg.gpus_per_node == 1 and cfg.nodes * cfg.train.batch_size == spec["global_batch"] == 256
        assert cfg.cluster.link_mbit is None
    assert {protocol.per_process_batch(256, n) for n in (2, 4, 8)} == {128, 64, 32}
    with pytest.raises(protocol.ProtocolError, match="does not split evenly"):
        protocol.per_process_batch(256, 3)


def test_without_a_plan_the_check_uses_the_provisional_values(tmp_path):
    proto = protocol.load_protocol()
    plan = protocol.read_plan(tmp_path, proto)
    assert plan["provisional"] and plan["targets"] == proto["provisional"]["targets"]
    protocol.write_plan(tmp_path, {"targets": [1.0, 2.0, 3.0], "budgets_s": [4.0], "step_s": {}})
    assert protocol.read_plan(tmp_path, proto)["targets"] == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------------- grid edges
KEYS = {
    "lr": {"scale": "log"},
    "beta": {"scale": "log1m"},
    "local_steps": {"scale": "int2", "min": 1, "max": 215, "why": "two outer steps"},
}


def test_an_interior_pick_has_no_edge_and_an_edge_pick_gets_the_next_value():
    tried = [{"lr": lr, "beta": b} for lr in (1e-4, 2e-4, 4e-4) for b in (0.8, 0.9, 0.95)]
    assert protocol.edges({"lr": 2e-4, "beta": 0.9}, tried, KEYS) == []
    (edge,) = protocol.edges({"lr": 4e-4, "beta": 0.9}, tried, KEYS)
    assert (edge.key, edge.side, edge.next) == ("lr", "high", pytest.approx(8e-4))
    (edge,) = protocol.edges({"lr": 2e-4, "beta": 0.95}, tried, KEYS)
    assert (edge.key, edge.side, edge.next) == ("beta", "high", pytest.approx(0.975))  # 1 - beta halves
    (edge,) = protocol.edges({"lr": 1e-4, "beta": 0.9}, tried, KEYS)
    assert (edge.side, edge.next) == ("low", pytest.approx(5e-5))


def test_an_edge_beyond_the_limit_says_why_and_a_value_never_varied_at_the_pick_gets_both_neighbours():
    tried = [{"local_steps": h, "lr": 1e-3} for h in (40, 80, 160)] + [
        {"local_steps": 20, "lr": lr} for lr in (5e-4, 2e-3)
    ]
    edges = protocol.edges({"local_steps": 160, "lr": 1e-3}, tried, KEYS)
    (h,) = [e for e in edges if e.key == "local_steps"]
    assert h.next is None and h.reason == "320 is above the limit 215 (two outer steps)"
    # lr was varied only at H 20: at the pick's H 160 it was tried once, so both neighbours are due
    assert sorted(e.next for e in edges if e.key == "lr") == pytest.approx([5e-4, 2e-3])
    assert {e.side for e in edges if e.key == "lr"} == {"untried"}


# ------------------------------------------------------------------------------------------- the host's load
def test_the_load_flag_discounts_the_runs_own_processes():
    quiet = {"start": [4.5, 3.0, 2.0], "end": [6.9, 4.0, 3.0], "cpus": 2}  # 4 own processes, limit 3
    assert not protocol.load_flag(quiet, own_processes=4, limit_per_core=1.5)
    assert protocol.load_flag({**quiet, "end": [7.1, 4.0, 3.0]}, 4, 1.5)  # 3.1 beyond its own
    assert protocol.load_flag({**quiet, "start": [7.1, 4.0, 3.0]}, 4, 1.5)  # more than the last cell fading
    assert not protocol.load_flag(None, 4, 1.5)


def test_a_record_carries_the_hosts_load_at_start_and_end(tmp_path):
    cfg = compose_config(["task=digits", "nodes=1"])
    record.write_run_files(tmp_path, cfg, "birder-repro task=digits")
    start = json.loads((tmp_path / record.LOAD_FILE).read_text())
    assert len(start) == 3
    rec = record.base_record(cfg, tmp_path)
    assert rec["host_load"]["start"] == start and len(rec["host_load"]["end"]) == 3 and rec["host_load"]["cpus"] >= 1
    (tmp_path / record.LOAD_FILE).write_text("[99.0, 1.0, 1.0]")
    record.write_run_files(tmp_path, cfg, "birder-repro task=digits")  # a resumed run keeps its first start's
    assert json.loads((tmp_path / record.LOAD_FILE).read_text())[0] == 99.0
    RunDir(tmp_path).write(rec)  # a documented key


# ------------------------------------------------------------------------------------------- the run order
CELLS = [f"optim={o} seed={s}" for o in ("sgdm", "birder", "diloco") for s in range(5)]


def test_the_interleaved_order_is_reproducible_from_its_seed_and_runs_every_cell_once():
    order = sweep.interleaved(CELLS, 7)
    assert sorted(order) == sorted(CELLS) and len(order) == len(CELLS)
    assert order == sweep.interleaved(CELLS, 7) and order != sweep.interleaved(CELLS, 8)
    assert order != CELLS  # not the sweep's own order, where a method's seeds run in a row
    text = sweep.order_text(order, 7)
    listed = [line.split(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")]
    assert listed == order and "# order-seed: 7" in text


def test_the_sweep_writes_its_order_and_says_what_is_left(tmp_path, capsys):
    cells = tmp_path / "cells.txt"
    cells.write_text("# order-seed: 7\n" + "\n".join(CELLS) + "\n")
    assert sweep.main(["--runs", str(tmp_path / "runs"), "--name", "field", "--dry-run", str(cells)]) == 0
    written = (tmp_path / "runs" / "order-field.txt").read_text()
    assert written == sweep.order_text(sweep.interleaved(CELLS, 7), 7)
    out = capsys.readouterr().out
    assert "cell 1 of 15, time left not known yet" in out and "cell 15 of 15" in out
    assert sweep.progress_line(3, 10, [60.0, 120.0]) == "cell 3 of 10, about 12 min left"
    assert sweep.progress_line(2, 100, [60.0]) == "cell 2 of 100, about 1 h 39 min left"


def test_the_sweep_runs_each_cell_and_lists_the_failed_ones(tmp_path, capsys):
    fake = tmp_path / "fake-cli"
    fake.write_text(
        '#!/bin/sh\necho "$BIRDER_RUNS $@" >> "$BIRDER_RUNS/ran.txt"\ncase "$*" in *birder*) exit 3;; esac\n'
    )
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    runs.mkdir()
    code = sweep.run_cells(sweep.interleaved(CELLS[:6], 1), [str(fake)], runs)
    assert code == sweep.FAILED_SWEEP
    ran = (runs / "ran.txt").read_text().splitlines()
    assert len(ran) == 6 and all(line.startswith(str(runs)) for line in ran)
    out = capsys.readouterr().out
    assert "sweep: 1 of 6 cells failed or were refused" in out and "optim=birder seed=0 (exit code 3)" in out


def test_a_sweep_started_again_skips_the_cells_it_finished_and_reruns_the_failed(tmp_path, capsys):
    fake = tmp_path / "fake-cli"
    fake.write_text('#!/bin/sh\necho "$@" >> "$BIRDER_RUNS/ran.txt"\ncase "$*" in *birder*) exit 3;; esac\n')
    fake.chmod(0o755)
    cells = tmp_path / "cells.txt"
    cells.write_text("# order-seed: 7\n" + "\n".join(CELLS[:6]) + "\n")
    runs = tmp_path / "runs"
    argv = ["--runs", str(runs), "--name", "grid", "--cli", str(fake), str(cells)]
    assert sweep.main(argv) == sweep.FAILED_SWEEP
    assert len((runs / "ran.txt").read_text().splitlines()) == 6
    assert sorted((runs / "done-grid.txt").read_text().splitlines()) == sorted(CELLS[:5])  # birder's failed
    capsys.readouterr()
    assert sweep.main(argv) == sweep.FAILED_SWEEP  # again: only the failed cell runs
    ran = (runs / "ran.txt").read_text().splitlines()
    assert ran[6:] == ["optim=birder seed=0"]
    out = capsys.readouterr().out
    assert "5 of 6 cells done before" in out and "cell 1 of 1" in out
    assert sweep.main([*argv[:-1], "--fresh", str(cells)]) == sweep.FAILED_SWEEP  # --fresh: all six again
    assert len((runs / "ran.txt").read_text().splitlines()) == 13


def test_a_sweep_without_an_order_seed_is_refused(tmp_path):
    cells = tmp_path / "cells.txt"
    cells.write_text("optim=sgdm seed=0\n")
    assert sweep.main(["--runs", str(tmp_path), "--dry-run", str(cells)]) == 2


def test_extra_overrides_replace_a_cells_own_of_the_same_key():
    cell = "experiment=x optim=birder train.steps=384 'task.target.ladder=[1,2]' seed=0"
    assert sweep.with_extra(cell, "train.steps=5 train.eval_every=2") == (
        "experiment=x optim=birder 'task.target.ladder=[1,2]' seed=0 train.steps=5 train.eval_every=2"
    )
    assert sweep.with_extra(cell, "") == cell


def test_the_field_needs_the_tuning_plan_and_the_check_does_not(tmp_path, capsys):
    assert protocol.main(["field", "--runs", str(tmp_path)]) == 2
    assert "run make tune-fashion first" in capsys.readouterr().err
    assert protocol.main(["check", "--runs", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("# order-seed: ") and len(lines) == 1 + 4 * 3
    assert "provisional" in captured.err


def test_a_hydra_sweeps_size_is_the_product_of_its_overrides_values():
    assert sweep.sweep_size(["optim=sgdm,birder", "seed=0,1,2", "nodes=2"]) == 6
    assert sweep.sweep_size(["task.target.ladder=[86,87]", "seed=range(0,5)", "x=choice(a,'b,c')"]) == 10
    assert sweep.sweep_size(["cluster.link_mbit=50,null", "model.width='a,b',c"]) == 4
    assert sweep.sweep_size(["optim.lr=glob(*)"]) is None and sweep.sweep_size([]) == 1


def test_a_hydra_sweep_says_which_cell_of_how_many_before_each(capsys):
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    report = sweep.SweepReport()
    report.on_multirun_start(OmegaConf.create({"hydra": {"overrides": {"task": ["optim=a,b", "seed=0,1"]}}}))
    for num in range(2):
        cfg = OmegaConf.create({"hydra": {"job": {"num": num}}})
        report.on_job_start(cfg)
        report.on_job_end(cfg, JobReturn(overrides=[], status=JobStatus.COMPLETED, _return_value=0))
    err = capsys.readouterr().err
    assert "cell 1 of 4, time left not known yet" in err and "cell 2 of 4, about" in err
