"""DiLoCo's steps against its replicas (birder_repro.perf.replica_steps) and their use at the paper's scale
(birder_repro.perf.paper_scale): the measured multiples, the extrapolation rule, the ASSUMPTION line."""

from __future__ import annotations

import math

import pytest
from conftest import write_records
from test_perf import _profile, _spec

from birder_repro.perf.paper_scale import Method, relative_times, replicas_line, with_replicas
from birder_repro.perf.replica_steps import extrapolate_multiple, log2_fit, replica_multiples


def test_log2_fit_by_hand():
    a, b = log2_fit({2: 1.0, 4: 1.5, 8: 2.0})  # m = 0.5 + 0.5 log2 n
    assert (a, b) == pytest.approx((0.5, 0.5))
    assert log2_fit({4: 3.0}) == (3.0, 0.0)


def test_extrapolation_follows_a_rising_fit_beyond_the_last_measured_point():
    rising = {2: 1.0, 4: 1.5, 8: 2.0}
    assert extrapolate_multiple(rising, 16) == pytest.approx(2.5)
    assert extrapolate_multiple(rising, 64) == pytest.approx(3.5)
    assert extrapolate_multiple(rising, 4) == 1.5  # measured: as measured
    assert extrapolate_multiple(rising, 1) == 1.0  # below the fewest: the fewest's
    assert extrapolate_multiple(rising, 6) == pytest.approx(1.5 + 0.5 * (math.log2(6) - 2))  # log2-linear between


def test_extrapolation_holds_a_falling_multiple_at_its_last_value():
    assert extrapolate_multiple({2: 2.0, 4: 1.5, 8: 1.2}, 32) == 1.2
    with pytest.raises(ValueError, match="no measured"):
        extrapolate_multiple({}, 4)


def _rec(optim: str, nodes: int, step, seed: int = 0, gpus: int = 1) -> dict:
    return {
        "status": "completed",
        "task": "fashion_mnist",
        "optim": optim,
        "cluster": {"name": "emulated", "nodes": nodes, "gpus_per_node": gpus},
        "time_to_target": {"reached": step is not None, "step": step},
        "config": {"seed": seed, "nodes": nodes, "gpus_per_node": gpus},
    }


def test_replica_multiples_are_ratios_of_mean_steps_over_runs_that_reached(tmp_path):
    from birder_repro.perf.replica_steps import load_replica_runs

    recs = [
        _rec("birder", 2, 100, 0),
        _rec("birder", 2, 120, 1),
        _rec("diloco", 2, 110, 0),
        _rec("diloco", 2, 220, 1),
        _rec("diloco", 2, None, 2),  # never reached: left out, never averaged
        _rec("birder", 4, 100),
        _rec("diloco", 4, 300),
        _rec("diloco", 8, 400),  # no Birder run at 8: no multiple there
        _rec("diloco", 2, 10, 3, gpus=2),  # two processes a node: not a replicas run
    ]
    write_records(tmp_path, recs, lambda i, r: f"{i:02d}_{r['optim']}")
    got = replica_multiples(load_replica_runs(tmp_path))
    assert got["diloco"] == pytest.approx({2: 165 / 110, 4: 3.0})
    assert got["birder"] == {2: 1.0, 4: 1.0}
    assert load_replica_runs(tmp_path / "absent") == []


SPEC = _spec(inter_mbit=1000.0)
PROFILE = _profile()


def test_paper_scale_grows_dilocos_field_steps_by_its_measured_multiple_from_two_replicas():
    sgdm = Method("SGDM", "fp32", 1.0, optim="sgdm")
    birder = Method("Birder", "hierarchical", 0.9, optim="birder")
    diloco = Method("DiLoCo", "diloco", 0.8, local_steps=20, optim="diloco")
    methods = with_replicas([sgdm, birder, diloco], {"diloco": {2: 1.2, 4: 1.8, 8: 2.4}, "birder": {2: 1.0}})
    got = {m.label: m for m in methods}
    assert got["Birder"].replicas == () and got["SGDM"].replicas == ()  # they keep their field multiple
    assert got["DiLoCo"].steps_at(2) == pytest.approx(0.8)  # the field's, at the field's 2 replicas
    assert got["DiLoCo"].steps_at(8) == pytest.approx(0.8 * 2.0)
    assert got["DiLoCo"].steps_at(16) == pytest.approx(0.8 * 2.5)  # the fit: 1.2 + 0.6 (log2 n - 1) = 3.0 at 16
    # relative_times uses the node count's steps: with the same step time, the ratio is the steps' growth
    at = {n: relative_times(methods, PROFILE, SPEC, n, 8)["DiLoCo"] for n in (8, 16)}
    steps_only = {n: relative_times([sgdm, diloco], PROFILE, SPEC, n, 8)["DiLoCo"] for n in (8, 16)}
    assert at[16] / steps_only[16] == pytest.approx(2.5)
    assert at[8] / steps_only[8] == pytest.approx(2.0)
    anchored = with_replicas([diloco], {"diloco": {2: 1.2, 4: 1.8}}, field_replicas=4)[0]
    assert anchored.steps_at(2) == pytest.approx(0.8 * 1.2 / 1.8)
    line = replicas_line(methods, "runs/x")
    assert "ASSUMPTION" not in line and "DiLoCo 2: 1.20x, 4: 1.80x, 8: 2.40x" in line


def test_without_replicas_runs_one_assumption_line_naming_the_make_target():
    methods = with_replicas([Method("SGDM", "fp32", 1.0, optim="sgdm")], {})
    line = replicas_line(methods, "runs/diloco-replicas")
    assert line.startswith("ASSUMPTION") and "make diloco-replicas" in line and "\n" not in line
    assert methods[0].steps_at(64) == 1.0
