"""``make gpu-check`` (birder_repro.gpucheck) here, without a GPU: the no-CUDA line, the table and its verdict
with injected results, the kernel comparison with Triton's interpreter against the CPU backend, the record
checks, the plan for 0, 1, 2 and 4 GPUs (the rows only 2 GPUs run, skipped on 1), the process-group timeout,
and (slow) the hook comparisons on gloo processes (2x1 and 1x2), a real run through the runner on CPU and the
2-process runs (fp16 overflow, accumulation, SIGTERM and resume) on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from birder_repro import cuda_env, gpucheck
from birder_repro.comm.pack import padded_size
from birder_repro.gpucheck import hooks, plan, runs, scenarios, training, training_checks
from birder_repro.gpucheck.kernels import _differences, compare_kernels, segments_of
from birder_repro.gpucheck.table import FAIL, PASS, SKIP, Check, exit_code, markdown, write

HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None


# ---------------------------------------------------------------------------------------- without CUDA
def _gpucheck(cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """The real command with CUDA hidden from torch and the NVIDIA probe pointed at ``env``'s stand-ins."""
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.gpucheck"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )


def test_without_an_nvidia_device_one_line_exit_0_and_nothing_written(tmp_path):
    """A machine without NVIDIA devices (an empty stand-in root, no nvidia-smi): one line, exit 0, no table."""
    (tmp_path / "root").mkdir()
    (tmp_path / "cwd").mkdir()
    proc = _gpucheck(
        tmp_path / "cwd",
        {cuda_env.ROOT_ENV: str(tmp_path / "root"), cuda_env.SMI_ENV: str(tmp_path / "no-such-nvidia-smi")},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and "no NVIDIA GPU here" in lines[0] and "nothing was checked" in lines[0]
    assert "kernels" in lines[0] and "NCCL" in lines[0] and "bf16" in lines[0]  # it names what it would check
    assert list((tmp_path / "cwd").iterdir()) == []  # claims nothing: no table


def test_on_a_gpu_node_without_usable_cuda_one_line_and_a_failure(tmp_path):
    """A stand-in NVIDIA device and driver, CUDA unusable for torch: the cause and the fix in one line, exit 1."""
    from test_cuda_env import stand_in

    (tmp_path / "cwd").mkdir()
    proc = _gpucheck(tmp_path / "cwd", stand_in(tmp_path, driver="570.124.06"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: FAILED: torch sees no CUDA device")
    assert "1 NVIDIA GPU" in lines[0] and "CUDA_VISIBLE_DEVICES=''" in lines[0] and "nothing was checked" in lines[0]


# ------------------------------------------------------------------------------------- table and verdict
def _rows(*statuses: str, section: str = "kernels") -> list[Check]:
    return [Check(section, f"check {i}", s, measured="1.0 ms", expected="<= 2 ms") for i, s in enumerate(statuses)]


def test_verdict_fails_on_any_failed_row_and_on_nothing_checked():
    assert exit_code(_rows(PASS, PASS, SKIP)) == 0
    assert exit_code(_rows(PASS, FAIL, PASS)) == 1
    assert exit_code(_rows(SKIP)) == 1 and exit_code([]) == 1  # nothing ran: no claim that it works
    with pytest.raises(ValueError, match="status"):
        Check("kernels", "x", "ok")


def test_table_is_markdown_and_json(tmp_path):
    rows = _rows(PASS, FAIL) + [Check("runs", "a | b", PASS, numbers={"coverage": float("nan")})]
    md, js = write(rows, tmp_path / "out", header="device X")
    text = md.read_text()
    assert "**FAILED**: 2 passed, 1 failed, 0 skipped" in text and "device X" in text
    assert "| kernels | check 1 | FAIL | 1.0 ms | <= 2 ms |" in text and "a \\| b" in text
    data = json.loads(js.read_text())
    assert data["passed"] is False and [c["status"] for c in data["checks"]] == [PASS, FAIL, PASS]
    assert data["checks"][2]["numbers"]["coverage"] is None  # NaN is not JSON
    assert markdown(rows[:1]).count("\n| kernels") == 1


@pytest.mark.parametrize("injected, code", [((PASS, PASS), 0), ((PASS, FAIL), 1)])
def test_main_with_cuda_writes_the_table_and_exits_on_the_verdict(injected, code, monkeypatch, tmp_path, capsys):
    """The CUDA path of main() with the sections' results injected: the exit code follows the rows."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpucheck, "environment", lambda: {"device": "injected"})
    monkeypatch.setattr(gpucheck, "_kernels", lambda args: _rows(injected[0]))
    monkeypatch.setattr(gpucheck, "_runs", lambda args, out, gpus, **k: _rows(injected[1], section="runs"))
    monkeypatch.setattr(gpucheck, "_hooks", lambda gpus, **k: [Check("hooks", "every hook on NCCL", SKIP)])
    assert gpucheck.main(["--out", str(tmp_path / "t")]) == code
    data = json.loads((tmp_path / "t" / "gpu-check.json").read_text())
    assert [c["section"] for c in data["checks"]] == ["kernels", "runs", "hooks"]
    assert ("**FAILED**" in capsys.readouterr().out) == bool(code)


def test_a_section_that_crashes_is_a_failed_row(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpucheck, "environment", lambda: {})
    monkeypatch.setattr(gpucheck, "_kernels", lambda args: 1 / 0)
    assert gpucheck.main(["--out", str(tmp_path), "--only", "kernels"]) == 1
    row = json.loads((tmp_path / "gpu-check.json").read_text())["checks"][0]
    assert row["status"] == FAIL and "ZeroDivisionError" in row["detail"]


# ------------------------------------------------------------------------------------ kernel comparison
def test_differences_name_what_differs():
    a = {"packed": torch.zeros(4, dtype=torch.uint8), "m": torch.zeros(8)}
    b = {"packed": torch.tensor([0, 1, 0, 0], dtype=torch.uint8), "m": torch.zeros(8, dtype=torch.float64)}
    assert _differences(a, b) == ["packed: 1 of 4 differ", "m: torch.float32(8,) vs torch.float64(8,)"]
    assert _differences(a, {"packed": a["packed"]}) and not _differences(a, dict(a))


def test_segments_cover_the_buffer_and_pass_2_to_the_32():
    s = segments_of(1 << 16)
    assert s.starts[0] == 0 and s.starts.numel() == 5 and int(s.global_offsets[-1]) > 1 << 32


_TRITON_SCRIPT = textwrap.dedent("""
    import json, sys
    from birder_repro.gpucheck.kernels import compare_kernels
    rows = compare_kernels(int(sys.argv[1]), "cpu", backend="triton", reference="cpu")
    print(json.dumps([[r.status, r.name, r.measured, r.detail] for r in rows]))
""")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_compare_kernels_triton_interpreter_against_cpu_backend():
    """The comparison the GPU runs, with Triton's interpreter on CPU tensors (read at import: a subprocess)."""
    numel = 2056  # not a multiple of Triton's block: masked tails in every kernel
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, str(numel)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert len(rows) == 8 and all(r[0] == PASS and r[2] == "bit-identical" for r in rows), rows


def test_compare_kernels_fails_a_backend_that_differs(monkeypatch):
    """A backend whose worker step is off by one bit must fail its row (and only the rows it touches)."""
    from birder_repro.comm.kernels import reference

    real = reference.worker_compress

    def off_by_one(*args):
        out = real(*args)
        out[0] ^= 1
        return out

    rows = {r.name.split(",")[0]: r for r in compare_kernels(64, "cpu", backend="cpu", reference="torch")}
    assert all(r.status == PASS for r in rows.values())
    monkeypatch.setattr(reference, "worker_compress", off_by_one)
    rows = {r.name.split(",")[0]: r for r in compare_kernels(64, "cpu", backend="cpu", reference="torch")}
    assert rows["worker"].status == FAIL and "packed: 1 of 8 differ" in rows["worker"].measured
    assert rows["server segments"].status == PASS and rows["unpack"].status == PASS


# --------------------------------------------------------------------------------------- record checks
def _fake_run(
    tmp_path: Path,
    parts=(0.006, 0.002, 0.001, 0.001),
    wall_per_step=0.011,
    status="completed",
    device="cuda (NVIDIA H100)",
    overlapped=True,
) -> Path:
    """A run directory as the runner writes it: record.json and metrics.jsonl logged every 4 steps."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    step = dict(zip(runs.PARTS, parts), total=sum(parts))
    record = {
        "status": status,
        "error": None if status == "completed" else "Traceback\nRuntimeError: boom",
        "device": device,
        "steps": 12,
        "timed_steps": 8,
        "step_time_s": step,
        "overlap_s": {"overlapped": overlapped},
        "throughput_by_stage": {},
        "throughput_samples_per_s": 100.0,
        "config": {"train": {"precision": "bf16"}},
    }
    (run_dir / "record.json").write_text(json.dumps(record))
    lines = [{"step": s, "time_s": 1.0 + (s - 4) * wall_per_step, "loss": 1.0} for s in (4, 8, 12)]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return run_dir


SPEC = runs.RunSpec("digits", "birder", "bf16")


def test_record_check_passes_a_consistent_run(tmp_path):
    row = runs.check_record(SPEC, _fake_run(tmp_path))
    assert row.status == PASS, row.detail
    assert row.numbers["coverage"] == pytest.approx(0.01 / 0.011)


@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(status="failed"), "RuntimeError: boom"),
        (dict(device="cpu"), "not cuda"),
        (dict(wall_per_step=0.05), "wall-clock"),  # steps timed without waiting for the GPU: far below the wall
        (dict(wall_per_step=0.009), "wall-clock"),  # more time in the steps than passed
        (dict(overlapped=False), "did not overlap"),
    ],
)
def test_record_check_fails(tmp_path, kwargs, why):
    row = runs.check_record(SPEC, _fake_run(tmp_path, **kwargs))
    assert row.status == FAIL and why in row.detail


def test_record_check_fails_parts_that_do_not_sum_and_another_precision(tmp_path):
    run_dir = _fake_run(tmp_path)
    rec = json.loads((run_dir / "record.json").read_text())
    rec["step_time_s"]["compute"] += 0.001
    rec["config"]["train"]["precision"] = "fp32"
    (run_dir / "record.json").write_text(json.dumps(rec))
    row = runs.check_record(SPEC, run_dir)
    assert row.status == FAIL and "parts sum to" in row.detail and "precision is 'fp32'" in row.detail
    assert runs.check_record(SPEC, tmp_path / "missing").status == FAIL


def test_an_fp16_run_must_record_gradscalers_scale(tmp_path):
    run_dir = _fake_run(tmp_path)
    rec = json.loads((run_dir / "record.json").read_text())
    rec["config"]["train"]["precision"] = "fp16"
    (run_dir / "record.json").write_text(json.dumps(rec))
    spec = runs.RunSpec("digits", "birder", "fp16")
    row = runs.check_record(spec, run_dir)
    assert row.status == FAIL and "no loss scale" in row.detail
    (run_dir / "record.json").write_text(json.dumps({**rec, "loss_scale": 1024.0}))
    assert runs.check_record(spec, run_dir).status == PASS


def test_plan_has_birder_onebit_and_each_tasks_baseline():
    specs = runs.plan(["resnet20", "bert_squad", "vit"], ["fp32", "bf16"])
    optims = {(s.task, s.optim) for s in specs}
    assert {
        ("resnet20", "sgdm"),
        ("bert_squad", "bertadam"),
        ("vit", "adamw"),
        ("vit", "birder"),
        ("bert_squad", "onebit_adam"),
    } <= optims and len(specs) == 3 * 3 * 2
    fp16 = [s for s in runs.plan(["digits", "vit"], ["fp32", "bf16"], ("digits",)) if s.precision == "fp16"]
    assert {(s.task, s.optim) for s in fp16} == {
        ("digits", "birder"),
        ("digits", "onebit_adam"),
        ("digits", runs.baseline("digits")),
    }
    assert not [s for s in runs.plan(["vit"], ["fp16"], ("digits",)) if s.task == "digits"]
    args = runs.overrides(SPEC, Path("/r"))
    assert "device=cuda" in args and "train.precision=bf16" in args and "optim.comm.overlap=true" in args


# ---------------------------------------------------------------------------------------------- hooks
def test_birder_bytes_formula_is_the_one_the_hook_tests_write_out():
    """Section 4's volume (tests/test_birder.py writes it by hand) from comm.accounting's functions."""
    for n, m in ((2, 2), (2, 1), (4, 2)):
        for p in (1001, 37):
            padded = padded_size(p, 8 * m * n)
            intra, inter = hooks.birder_expected_bytes(p, n, m)
            assert inter == pytest.approx(2 * (n - 1) / n * padded / (8 * m) + (n - 1))
            assert intra == pytest.approx((m - 1) / m * (padded + m) * 4 + (m - 1) * padded / m / 8)
    assert [hooks.layout(g) for g in (2, 3, 4, 6, 8)] == [(2, 1), (3, 1), (2, 2), (3, 2), (4, 2)]


@pytest.mark.slow
def test_every_hook_on_gloo_matches_its_reference():
    """The hook scenarios on 2 plain gloo processes (NCCL needs a GPU each)."""
    rows = hooks.check_hooks(2, backend="gloo", training=False)
    assert len(rows) == 16 and all(r.status == PASS for r in rows), [r for r in rows if r.status != PASS]


@pytest.mark.slow  # 24 s; every hook against its reference across processes stays in the default run (test_*hooks*)
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_multi_rank_section_runs_on_cpu_as_on_one_gpu(monkeypatch):
    """The hooks section as a 1-GPU node runs it (2 ranks, every collective through the staged backend), here on
    CPUs with Birder's Triton kernels interpreted: every hook against its reference, and Birder and 1-bit Adam
    under DDP and FSDP2 in fp32, bf16 and fp16 (fp16 under FSDP2 is refused by the runner: a skip)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by the spawned processes' triton at import
    monkeypatch.setenv(training.KERNELS_ENV, "triton")
    rows = hooks.check_hooks(2, backend="staged:cpu")
    assert [r for r in rows if r.status == FAIL] == []
    names = {r.name for r in rows if r.status == PASS}
    for frame, precisions in (("DDP", ("fp32", "bf16", "fp16")), ("FSDP2", ("fp32", "bf16"))):
        for p in precisions:
            assert f"birder {frame}, {p}, 2x1 = reference" in names
            assert f"1-bit Adam {frame}, {p}, 2 processes = reference" in names
    assert {r.name for r in rows if r.status == SKIP} == {"birder FSDP2, fp16", "1-bit Adam FSDP2, fp16"}
    assert len(rows) == 16 + 12


def _hook_section(monkeypatch, gpus: int) -> tuple[list, list]:
    """The hook section on a machine with ``gpus`` GPUs: its spawns (faked) and its rows."""
    called = []

    def fake(world, backend, training, gpus_per_node, sanitizer):
        called.append((world, gpus_per_node, backend, training, sanitizer))
        return [Check("hooks", "birder", PASS)]

    monkeypatch.setattr(hooks, "check_hooks", fake)
    return called, gpucheck._hooks(gpus)


def test_the_hook_section_plans_staged_on_one_gpu_and_nccl_2x1_and_1x2_on_two(monkeypatch):
    """1 GPU: 2 processes share it (staged: NCCL refuses two ranks on one GPU), the NCCL layouts are skipped
    rows; 2+ GPUs: NCCL as 2 nodes x 1 and 1 node x 2, a GPU each (and the runner's layout on 4); CSAN once."""
    assert plan.hook_runs(0) == []
    called, rows = _hook_section(monkeypatch, 1)
    assert called == [(2, 1, "staged:cuda", True, False), (2, 1, "staged:cuda", False, True)]
    assert [(r.name, r.status, r.detail) for r in rows] == [
        ("staged 2x1 on 1 GPU: birder", PASS, ""),
        ("NCCL 2x1", SKIP, "skipped: needs 2 GPUs"),
        ("NCCL 1x2", SKIP, "skipped: needs 2 GPUs"),
        ("CSAN, staged 2x1 on 1 GPU: birder", PASS, ""),
    ]
    called, rows = _hook_section(monkeypatch, 2)
    assert called == [(2, 1, "nccl", True, False), (2, 2, "nccl", True, False), (2, 1, "nccl", False, True)]
    assert all(r.status == PASS for r in rows) and [r.name for r in rows][-1] == "CSAN, NCCL 2x1: birder"
    called, _ = _hook_section(monkeypatch, 4)
    assert (4, 2, "nccl", True, False) in called and "staged:cuda" not in {c[2] for c in called}


def test_the_two_process_runs_need_two_gpus_and_say_so_in_the_table(monkeypatch, tmp_path):
    monkeypatch.setattr(runs, "check_runs", lambda *a, **k: [])
    monkeypatch.setattr(runs, "check_pairs", lambda specs, root, **k: [Check("runs", s.name, PASS) for s in specs])
    args = gpucheck._parser().parse_args(["--tasks", "digits"])
    names = [s.name for s in runs.pair_specs()]
    one = gpucheck._runs(args, tmp_path, 1)
    assert [(r.name, r.status, r.detail) for r in one] == [(n, SKIP, "skipped: needs 2 GPUs") for n in names]
    assert "| skip |  |  | skipped: needs 2 GPUs |" in markdown(one)
    assert [(r.name, r.status) for r in gpucheck._runs(args, tmp_path, 2)] == [(n, PASS) for n in names]
    assert any("overflow" in n for n in names) and any("accumulate" in n for n in names)
    assert any("SIGTERM" in n for n in names)


def fails_on_rank_1(topology, device):
    """A scenario that fails on rank 1 only: rank 1 goes on to the barrier while rank 0 waits in an all-reduce
    that rank 1 never joins."""
    if torch.distributed.get_rank() == 1:
        raise RuntimeError("rank 1 fails")
    torch.distributed.all_reduce(torch.ones(1, device=device))
    return {}


def test_the_sanitized_spawn_runs_its_processes_under_torch_cuda_sanitizer(monkeypatch):
    """``TORCH_CUDA_SANITIZER=1`` is set while the processes start (torch reads it at import) and only then.
    (CSAN itself needs a CUDA driver: on a CPU machine its dispatch mode fails at the first collective.)"""
    seen = []

    def spawn(*args, **kwargs):
        seen.append(os.environ.get(scenarios.SANITIZER_ENV))
        raise RuntimeError("stop here")

    monkeypatch.delenv(scenarios.SANITIZER_ENV, raising=False)
    monkeypatch.setattr(scenarios.mp, "spawn", spawn)
    for sanitizer in (True, False):
        with pytest.raises(RuntimeError, match="stop here"):
            scenarios.run_processes(2, 1, "gloo", sanitizer=sanitizer)
    assert seen == ["1", None] and scenarios.SANITIZER_ENV not in os.environ


def test_a_scenario_failing_on_one_rank_ends_at_the_process_group_timeout():
    """Without a timeout of its own the check would hang for gloo's thirty minutes (NCCL's ten) here."""
    assert scenarios.PG_TIMEOUT_S == 60
    try:
        outcome = scenarios.run_processes(2, 1, "gloo", names=(fails_on_rank_1,), timeout_s=3)
    except Exception as exc:  # noqa: BLE001 - a process that dies at the timeout ends the spawn
        outcome = exc
    assert isinstance(outcome, Exception) or "error" in outcome[1]["fails_on_rank_1"], outcome


@pytest.mark.slow
def test_a_real_run_through_the_runner_passes_its_record_checks(tmp_path):
    row = runs.check_runs([runs.RunSpec("digits", "birder", "fp32")], tmp_path, jobs=1, device="cpu")[0]
    assert row.status == PASS, row.detail


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_on_cuda_small(tmp_path):
    """On a GPU node (``pytest -m gpu``): the kernels on a 1M bucket and one task's runs, end to end."""
    gpucheck.main(
        [
            "--out",
            str(tmp_path),
            "--only",
            "kernels",
            "runs",
            "--sizes",
            str(1 << 20),
            "--tasks",
            "digits",
            "--precisions",
            "fp32",
            "--repeats",
            "5",
        ]
    )
    rows = json.loads((tmp_path / "gpu-check.json").read_text())["checks"]
    # the timing rows are left out: on a 1M bucket the launch overhead, not the kernel, is what they would time
    checked = [r for r in rows if " time, " not in r["name"]]
    assert len(checked) == 8 + 3 and all(r["status"] == PASS for r in checked), checked


def test_onebit_under_fsdp_with_two_processes_a_node_is_a_skip_not_a_failure():
    """With 4+ GPUs (2 a node) 1-bit Adam's FSDP2 shards are laid out per local rank, which the reference of this
    section is not given: a skip row, so that a correct hook does not fail there (tests/test_fsdp.py covers it)."""
    per_rank = [{"onebit_ddp_precisions": {"error": "Traceback\nRuntimeError: boom"}, "onebit_fsdp_precisions": {}}] * 4
    rows = training_checks.check_onebit_precisions(per_rank, m=2)
    assert [r.status for r in rows] == [FAIL, SKIP, SKIP] and "boom" in rows[0].detail


@pytest.mark.slow  # 20-40 s each on 2 CPU cores (CLI, torchrun, 2 processes)
@pytest.mark.parametrize("spec", runs.pair_specs(), ids=lambda s: s.name)
def test_the_two_process_runs_pass_on_cpu(spec, tmp_path):
    """The rows a 2-GPU machine runs, with gloo on CPUs: the injected fp16 overflow is skipped on every rank
    (1 skipped step, the scale halved once), accumulation completes, a SIGTERM'd run resumes to the end."""
    row = runs.check_pairs([spec], tmp_path, device="cpu")[0]
    assert row.status == PASS, row.detail


@pytest.mark.slow
def test_the_hooks_as_one_node_of_two_processes_match_their_references_on_gloo():
    """The ``NCCL 1x2`` spawn's layout (one node, the intra-node communicator only) on gloo processes."""
    rows = hooks.check_hooks(2, backend="gloo", training=False, gpus_per_node=2)
    assert rows and all(r.status == PASS for r in rows), [r for r in rows if r.status != PASS]
    assert "birder hierarchical: 1x2 processes = reference" in {r.name for r in rows}


# ------------------------------------------------------------- the staged backend on older torch releases
def test_staged_falls_back_to_a_process_group_where_backend_has_no_python_constructor(monkeypatch):
    """torch 2.11 (the first GPU machine) says "StagedBackend: No constructor defined!": ``create`` then builds
    the whole process group instead; any other TypeError is not swallowed."""
    from datetime import timedelta

    from birder_repro.gpucheck import staged

    store, timeout = torch.distributed.HashStore(), timedelta(seconds=30)
    assert isinstance(staged.create(store, 0, 1, timeout), staged.StagedBackend)

    def no_constructor(self, *args):
        raise TypeError("StagedBackend: No constructor defined!")

    monkeypatch.setattr(staged.StagedBackend, "__init__", no_constructor)
    group = staged.create(store, 0, 1, timeout)
    assert isinstance(group, staged.StagedProcessGroup) and group.size() == 1 and group.getBackendName() == "staged"

    def other(self, *args):
        raise TypeError("something else")

    monkeypatch.setattr(staged.StagedBackend, "__init__", other)
    with pytest.raises(TypeError, match="something else"):
        staged.create(store, 0, 1, timeout)


def test_staged_calls_gloo_by_the_names_of_older_torch_releases():
    """torch 2.11's ProcessGroupGloo binds ``alltoall_base``, ``_allgather_base`` and ``_reduce_scatter_base``
    (it said "'ProcessGroupGloo' object has no attribute 'all_to_all_single'" there)."""
    from birder_repro.gpucheck import staged

    class OldGloo:
        def alltoall_base(self, *args):
            return "old all-to-all"

    class NewGloo(OldGloo):
        def all_to_all_single(self, *args):
            return "new all-to-all"

    group = staged._Staged()
    group.gloo = OldGloo()
    assert group._gloo("all_to_all_single", "alltoall_base")() == "old all-to-all"
    group.gloo = NewGloo()
    assert group._gloo("all_to_all_single", "alltoall_base")() == "new all-to-all"
    assert staged._Staged._allgather_base is staged._Staged.all_gather_single
    assert staged._Staged._reduce_scatter_base is staged._Staged.reduce_scatter_single


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_every_hook_and_training_path_through_the_staged_process_group(monkeypatch):
    """The 1-GPU hook section through ``StagedProcessGroup`` (what torch 2.11 gets), here on CPUs: every hook
    against its reference, and Birder and 1-bit Adam under DDP and FSDP2 (which looks the group up by name)."""
    from birder_repro.gpucheck import staged

    monkeypatch.setenv(staged.AS_PROCESS_GROUP_ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(training.KERNELS_ENV, "triton")
    rows = hooks.check_hooks(2, backend="staged:cpu")
    assert [r for r in rows if r.status == FAIL] == [] and len(rows) == 16 + 12
