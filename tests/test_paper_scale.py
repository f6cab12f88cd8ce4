"""The paper's question at its scale (birder_repro.perf.paper_scale): each method's predicted time to the target
over SGDM's, from a profile, a cluster and its steps over SGDM's."""

from __future__ import annotations

import pytest
from test_perf import _profile, _spec

from birder_repro.perf.model import predict_step
from birder_repro.perf.paper_scale import CAST_S_PER_ELEMENT, Method, relative_times, scale_markdown
from birder_repro.perf.profile import Profile

SPEC = _spec(inter_mbit=1000.0)
PROFILE = _profile(compression_s_per_element={"onebit": 1e-10})


def test_times_are_steps_times_step_time_over_sgdms_by_hand():
    sgdm = Method("SGDM", "fp32", 1.0)
    methods = [sgdm, Method("slow", "fp32", 2.0), Method("1-bit", "onebit", 1.0, freeze=0.25)]
    rel = relative_times(methods, PROFILE, SPEC, 4, 8)
    fp32 = predict_step(PROFILE, SPEC, 4, 8, "fp32").total_s
    onebit = predict_step(PROFILE, SPEC, 4, 8, "onebit").total_s
    assert rel["SGDM"] == 1.0 and rel["slow"] == pytest.approx(2.0)
    # the first quarter of SGDM's steps at the fp32 step's time, the rest compressed
    assert rel["1-bit"] == pytest.approx((0.25 * fp32 + 0.75 * onebit) / fp32)
    with pytest.raises(ValueError, match="needs SGDM"):
        relative_times(methods[1:], PROFILE, SPEC, 4, 8)


def test_the_16bit_casts_are_priced_at_the_assumed_memory_bandwidth():
    rel = relative_times([Method("SGDM", "fp32", 1.0), Method("fp16", "fp16", 1.0)], PROFILE, SPEC, 2, 8)
    with_casts = predict_step(
        Profile(**{**PROFILE.to_dict(), "compression_s_per_element": {"fp16": CAST_S_PER_ELEMENT}}), SPEC, 2, 8, "fp16"
    ).total_s
    assert rel["fp16"] == pytest.approx(with_casts / predict_step(PROFILE, SPEC, 2, 8, "fp32").total_s)


def test_the_papers_tables_rank_birder_first_on_a_slow_link_and_sgdm_last():
    text = scale_markdown([Method("SGDM", "fp32", 1.0), Method("Birder", "hierarchical", 1.0)])
    rows = [line for line in text.splitlines() if line.startswith("|") and line.split("|")[1].strip() == "2"]
    assert len(rows) == 2  # one table a task
    assert all(row.split("|")[2].strip().startswith("Birder") for row in rows)  # 2 nodes at 1 Gbit/s
    assert "SGDM 1.00" in text


def test_with_no_runs_it_says_to_run_make_time_to_accuracy_first(tmp_path):
    """The steps come from the Fashion-MNIST field: without its runs, one line naming the make target, non-zero."""
    from birder_repro.perf.paper_scale import main

    with pytest.raises(SystemExit) as stop:
        main(["--runs", str(tmp_path)])
    message = str(stop.value.code)
    assert "make time-to-accuracy" in message and "\n" not in message and stop.value.code != 0
