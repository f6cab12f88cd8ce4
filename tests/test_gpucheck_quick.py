"""gpu-check's quick plan (birder_repro/gpucheck/quick.py) for a lent GPU machine: its dry run imports no torch,
it fits the budget on a lent machine's cores, its table is written row by row, its overflow runs are checked, and
the stress rows (birder_repro/gpucheck/stress.py) say what they found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_gpucheck import _fake_run

from birder_repro.gpucheck import Rows, quick, runs, stress
from birder_repro.gpucheck.table import FAIL, PASS, SKIP, Check

REPO = Path(__file__).resolve().parents[1]
NO_TORCH = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('torch imported' if 'torch' in sys.modules else 'no torch', file=sys.stderr)); "
    "sys.argv = ['gpucheck', '--quick', '--dry-run']; runpy.run_module('birder_repro.gpucheck', run_name='__main__')"
)


def test_the_dry_run_prints_the_plan_and_its_time_and_imports_no_torch():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "no torch"
    sections = [line.split()[0] for line in out.stdout.splitlines()[1:-1]]
    assert sections == ["hooks", "stress", "runs", "kernels"]  # by value: a cut run did the most telling first
    assert "predicted" in out.stdout.splitlines()[-1]


def test_the_quick_plan_fits_six_minutes_on_a_lent_machines_cores():
    items = quick.plan(gpus=1, cores=16)
    assert sum(i.predicted_s for i in items) <= quick.BUDGET_S
    assert quick.jobs_for(4, cores=16) == 4 and quick.jobs_for(4, cores=2) == 1 and quick.jobs_for(2, cores=64) == 2
    assert quick.RUN_TIMEOUT_S <= 120
    labels = [s.label for s in quick.quick_runs()]
    assert any("sgdm_powersgd fp16, overflow" in x for x in labels), labels  # review 4's PowerSGD bug, on a GPU


def test_the_table_is_written_as_each_row_arrives(tmp_path):
    rows = Rows(tmp_path, "header", {})
    rows.add(Check("hooks", "first", PASS))
    assert "first" in (tmp_path / "gpu-check.md").read_text()
    rows.add(Check("runs", "second", FAIL))
    table = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [c["name"] for c in table["checks"]] == ["first", "second"] and not table["passed"]


def test_an_overflow_run_must_skip_once_and_halve_the_scale(tmp_path):
    run_dir = _fake_run(tmp_path)
    rec = json.loads((run_dir / "record.json").read_text())
    rec["config"]["train"]["precision"] = "fp16"
    spec = runs.RunSpec("fashion_mnist", "sgdm_powersgd", "fp16", overflow=True)
    # what review 4 saw: the run completed with 11 of 12 steps skipped
    (run_dir / "record.json").write_text(json.dumps({**rec, "nonfinite_steps": 11, "loss_scale": 2.0**5}))
    row = runs.check_record(spec, run_dir)
    assert row.status == FAIL and "11 steps skipped" in row.detail
    (run_dir / "record.json").write_text(json.dumps({**rec, "nonfinite_steps": 1, "loss_scale": 2.0**15}))
    assert runs.check_record(spec, run_dir).status == PASS


def _stress(overlap, inside, control, syncs):
    return {"stress_ordering": {"overlap": overlap, "inside": inside, "control": control}, "host_syncs": syncs}


def test_the_stress_rows_fail_a_difference_a_control_that_shows_nothing_and_a_host_sync():
    a, b = [torch.ones(3)], [torch.ones(3) * 2]
    exposed, hidden = {"without a wait": 0.0, "with the wait": 1.0}, {"without a wait": 1.0, "with the wait": 1.0}
    good = stress.check_stress([_stress(a, a, exposed, {"ok": True})] * 2)
    assert [r.status for r in good] == [PASS, PASS, PASS]
    differ = stress.check_stress([_stress(a, a, exposed, {"ok": True}), _stress(a, b, exposed, {"ok": True})])
    assert differ[0].status == FAIL
    blind = stress.check_stress([_stress(a, a, hidden, {"ok": True})] * 2)
    assert blind[1].status == FAIL and "proves nothing" in blind[1].detail
    synced = stress.check_stress([_stress(a, a, exposed, {"error_in_backward": "called a synchronizing op"})] * 2)
    assert synced[2].status == FAIL and "synchronizing" in synced[2].detail


def test_without_a_gpu_the_stress_scenarios_are_skips():
    from birder_repro.gpucheck.scenarios import run_processes

    per_rank = run_processes(2, 1, "gloo", names=tuple(stress.STRESS.values()))
    assert [r.status for r in stress.check_stress(per_rank)] == [SKIP, SKIP]


@pytest.mark.slow  # 20-40 s each on 2 CPU cores (the CLI, torchrun, a worker)
@pytest.mark.parametrize("spec", quick.quick_runs(), ids=lambda s: s.name)
def test_the_quick_runs_pass_on_cpu(spec, tmp_path):
    """Each quick run through the CLI on CPU, its record checked as on a GPU (the fp16 overflow ones: one skip,
    the scale halved once: torch's PowerSGD trains on after it)."""
    row = runs.check_runs([spec], tmp_path, jobs=1, device="cpu", timeout_s=300)[0]
    assert row.status == PASS, row.detail


@pytest.mark.parametrize("gpus, spawn", [(1, (2, "staged:cuda", 1)), (2, (2, "nccl", 1))])
def test_the_quick_hook_section_is_one_spawn_with_the_stress_checks_in_it(monkeypatch, gpus, spawn):
    import birder_repro.gpucheck as gpucheck
    from birder_repro.gpucheck import hooks

    called = []

    def fake(world, backend, training, m, sanitizer, stress=False):
        called.append((world, backend, m, training, sanitizer, stress))
        return [Check("hooks", "birder", PASS)]

    monkeypatch.setattr(hooks, "check_hooks", fake)
    seen = []
    rows = gpucheck._hooks(gpus, on_row=seen.append, quick=True)
    assert called == [(*spawn, True, False, True)] and seen == rows


def overlap_on_and_off_on_cpu(topology, device):
    """The stress's two runs on CPU, with nothing to slow (``torch.cuda._sleep`` a no-op): what the GPU row
    compares must be equal where no stream can race, or the row would fail for another reason."""
    torch.cuda._sleep = lambda cycles: None
    return {"on": stress._slowed_run(topology, device, True), "off": stress._slowed_run(topology, device, False)}


def test_birder_with_overlap_on_equals_off_bit_for_bit_where_nothing_races():
    from birder_repro.gpucheck.scenarios import run_processes

    for rank in run_processes(2, 1, "gloo", names=(overlap_on_and_off_on_cpu,)):
        got = rank["overlap_on_and_off_on_cpu"]
        assert "error" not in got, got.get("error")
        assert all(torch.equal(a, b) for a, b in zip(got["on"], got["off"])) and len(got["on"]) == 6
