"""The training clock, as the report reads it (report.clock) and as the model prices it (perf.model's loop
collectives): known answers on made-up logs and clusters."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_perf import _profile, _spec

from birder_repro.perf.advise import step_times
from birder_repro.perf.collectives import Link, collective_time
from birder_repro.perf.model import LOOP_COLLECTIVES, loop_collectives_s
from birder_repro.report.clock import loop_clock, loop_seconds
from birder_repro.report.records import flatten_record


def _line(step, time_s, train_s, evaluation=False):
    return {"step": step, "time_s": time_s, "train_s": train_s, **({"eval/top1": 80.0} if evaluation else {"loss": 1})}


# Steps 10, 20, 30 logged then evaluated (0.5 s each); step 40 evaluated only. Rank 0's clock gains 3 s an
# interval where the loop took 4 s: a ratio of 4/3.
LOG = [
    _line(10, 5.0, 3.0),
    _line(10, 5.5, 3.0, True),
    _line(20, 9.5, 6.0),
    _line(20, 10.0, 6.0, True),
    _line(30, 14.0, 9.0),
    _line(30, 14.5, 9.0, True),
    _line(40, 19.0, 12.0, True),  # 4.5 s of wall: the loop's 4, then its evaluation's 0.5
]


def test_the_loop_clock_sums_the_logged_wall_time_between_evaluations():
    clock = loop_clock(LOG, compile_s=0.6)
    # the first interval: its one-time work as it is, the rest at the run's ratio: 0.6 + 2.4 x 4/3 = 3.8
    assert clock == pytest.approx({10: 3.8, 20: 7.8, 30: 11.8, 40: 15.8})


def test_an_interval_the_log_cannot_see_whole_is_scaled():
    resumed = [*LOG[:4], _line(30, 2.0, 9.0), _line(30, 2.5, 9.0, True)]  # a new attempt: time_s starts over
    assert loop_clock(resumed, compile_s=0.6)[30] == pytest.approx(7.8 + 3.0 * 4 / 3)


def test_a_record_on_the_loop_clock_is_kept_an_older_one_is_read_from_its_log(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in LOG) + '{"step": 4')
    older = {"time_to_target": {"seconds": 5.4, "step": 20, "reached": True}, "compile_s": 0.6}
    assert loop_seconds(older, tmp_path) == pytest.approx(7.8 - 0.6)
    assert flatten_record(older, tmp_path)["target_s"] == pytest.approx(7.2)  # what every table reads
    newer = {"time_to_target": {"seconds": 5.4, "step": 20, "reached": True}, "compile_s": 0.6}
    newer["training_clock"] = "loop"
    assert loop_seconds(newer, tmp_path) == 5.4
    assert loop_seconds({"time_to_target": {"seconds": 5.4, "step": 50}}, tmp_path) == 5.4  # not in the log


def test_the_loop_collectives_are_two_tiny_all_reduces_over_every_process_on_the_training_clock():
    spec = _spec(world_allreduce="ring", inter_latency_us=300.0, intra_latency_us=400.0)
    ring = Link(spec.inter.alpha_s, 1.0 / max(spec.inter.beta, spec.intra.beta))
    by_hand = sum(collective_time("allreduce", op.nbytes, 4, ring) for op in LOOP_COLLECTIVES)
    assert len(LOOP_COLLECTIVES) == 2
    assert loop_collectives_s(spec, 2, 2) == pytest.approx(by_hand)
    assert loop_collectives_s(spec, 2, 2) == pytest.approx(2 * 6 * 300e-6, rel=1e-3)  # 6 ring steps of alpha
    assert loop_collectives_s(spec, 1, 1) == 0.0
    # between steps no process computes: a shared host's measured wait for a turn is not charged to them
    waits = _spec(world_allreduce="ring", inter_latency_us=300.0, shared_host=True, world_latency_us={"allreduce": 900})
    assert loop_collectives_s(waits, 2, 2) == pytest.approx(loop_collectives_s(spec, 2, 2))
    assert waits.world_alpha_s("allreduce") == pytest.approx(900e-6)  # the step's collectives still pay it
    prof = _profile()
    with_loop = step_times(prof, spec, 2, 2, "fp32", 32)
    timed = step_times(prof, spec, 2, 2, "fp32", 32, loop=False)
    assert with_loop[0] - timed[0] == pytest.approx(loop_collectives_s(spec, 2, 2))
    assert with_loop[1] - timed[1] == pytest.approx(loop_collectives_s(spec, 2, 2))


def test_the_ladder_and_figure_2_read_an_older_log_on_the_loop_clock(tmp_path):
    from birder_repro.report.convergence import time_axis
    from birder_repro.report.ladder import run_curve

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in LOG))
    older = run_curve(tmp_path, "top1", compile_s=0.6, record={"compile_s": 0.6})
    assert list(older["t"]) == pytest.approx([3.2, 7.2, 11.2, 15.2])
    newer = run_curve(tmp_path, "top1", compile_s=0.6, record={"training_clock": "loop"})
    assert list(newer["t"]) == pytest.approx([2.4, 5.4, 8.4, 11.4])
    frame = pd.DataFrame(LOG)
    t, _ = time_axis(frame, 0.6, loop_clock(LOG, 0.6))
    assert list(t) == pytest.approx([3.2, 3.2, 7.2, 7.2, 11.2, 11.2, 15.2])
