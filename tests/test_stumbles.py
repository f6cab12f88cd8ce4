"""What a new user tripped on, each kept fixed: numbers without exponents, the kernels' compile line, torchrun's
stop-grace warning, ``make help``'s columns, ``make clean-failed``, the figures' device names."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from birder_repro.comm.kernels import compile_note
from birder_repro.launch import torchrun
from birder_repro.report import clean_failed, display
from birder_repro.report.figstyle import device_unit
from birder_repro.run import summary

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ numbers
def test_one_number_format_without_exponents_for_the_summary_the_tables_and_the_advice():
    from birder_repro.perf import advice_rows

    assert display.fmt_number is summary.fmt_number and advice_rows.fmt_number is summary.fmt_number
    assert summary.human_bytes(1010 * 2**20) == "1010 MiB"  # was 1.01e+03 MiB
    assert summary.human_bytes(300 * 2**20) == "300 MiB" and summary.human_bytes(1.5 * 2**30) == "1.5 GiB"
    assert [summary.fmt_number(x) for x in (3261.4, 12345.6, 98.523, 0.01927)] == ["3261", "12346", "98.52", "0.01927"]
    assert [summary.fmt_number(x, 3) for x in (1054.3, 299.6, 1.144)] == ["1054", "300", "1.14"]
    assert [summary.fmt_number(x) for x in (None, float("nan"), pd.NA)] == ["—"] * 3


# ------------------------------------------------------------------------------- the kernels' compile
class _Kernel:
    """A numba dispatcher as compile_note reads it: compiled signatures, and its on-disk cache's index."""

    def __init__(self, signatures=(), index=None, broken=False):
        self.signatures = list(signatures)

        def load():
            if broken:
                raise AttributeError("numba moved it")
            return index or {}

        self._cache = SimpleNamespace(_cache_file=SimpleNamespace(_load_index=load))


@pytest.fixture
def fresh_note(monkeypatch):
    monkeypatch.setattr(compile_note, "_said", False)
    monkeypatch.setattr(compile_note, "_checked", [])


def _said(kernels, **env) -> str:
    out = io.StringIO()
    compile_note.announce(kernels, env=env, out=out)
    return out.getvalue()


def test_the_compile_line_is_said_once_before_a_cold_kernel_compiles(fresh_note):
    warm, cold = _Kernel(index={"sig": "data.nbc"}), _Kernel()
    assert _said([warm]) == ""  # its cache holds it: loaded, not compiled
    assert _said([cold]) == f"[birder-repro] {compile_note.COMPILING_LINE}\n"
    assert _said([_Kernel()]) == ""  # once a process
    assert compile_note.cache_cold([_Kernel(signatures=["f4"])]) is False  # compiled in this process already


def test_the_compile_line_is_rank_0s_and_said_where_the_cache_cannot_be_read(fresh_note):
    assert _said([_Kernel()], RANK="1") == ""
    assert compile_note.cache_cold([_Kernel(broken=True)]) is None
    assert compile_note.COMPILING_LINE in _said([_Kernel(broken=True)], RANK="0")


def test_numbas_cache_is_readable_by_the_compile_line():
    """numba's private cache layout, which the line reads, is still where it looks (else it says the line every
    time, on rank 0)."""
    from birder_repro.comm.kernels import cpu

    assert compile_note.cache_cold([cpu._worker, cpu._server, cpu._unpack]) in (True, False)


# ------------------------------------------------------------------------------------------ torchrun
def test_an_older_torchrun_warns_of_any_other_stop_timeout_shorter_or_longer(monkeypatch, capsys):
    torchrun._say_once.cache_clear()  # said once a process: another test in this worker may have said it
    monkeypatch.setattr(torchrun, "torchrun_has_option", lambda option: False)
    for seconds in (10, 45):
        assert torchrun.shutdown_timeout_option(seconds) == []
        said = capsys.readouterr().err
        assert f"its fixed {torchrun.TORCHRUN_STOP_GRACE_S} s" in said and f"train.stop_timeout_s={seconds}" in said
    assert torchrun.shutdown_timeout_option(torchrun.TORCHRUN_STOP_GRACE_S) == []
    assert capsys.readouterr().err == ""


# -------------------------------------------------------------------------------------------- make help
def test_make_help_starts_every_description_in_one_column_after_the_longest_name():
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    names = [re.match(r"  make (\S+)", line).group(1) for line in lines]
    assert "clean-failed" in names and len(names) > 10
    starts = {len(line) - len(line[len("  make ") :].split(" ", 1)[1].lstrip()) for line in lines}
    assert starts == {len("  make ") + max(map(len, names)) + 2}, lines


# ----------------------------------------------------------------------------------------- clean-failed
def _run(root: Path, name: str, status: str, checkpoint: bool = False) -> Path:
    run_dir = root / "2026-01-01" / name
    run_dir.mkdir(parents=True)
    (run_dir / "record.json").write_text(json.dumps({"status": status, "error": f"{name} went wrong"}))
    if checkpoint:  # a complete one, as train.checkpoint marks it
        from birder_repro.train import checkpoint as ckpt

        step = ckpt.step_dir(run_dir, 4)
        step.mkdir(parents=True)
        (step / ckpt.MANIFEST).write_text("{}")
        (step / ckpt.COMPLETE).write_text("")
    return run_dir


def test_clean_failed_lists_and_removes_only_when_asked(tmp_path, capsys):
    root = tmp_path / "runs"
    refused = _run(root, "refused", "failed")
    done = _run(root, "done", "completed")
    stopped = _run(root, "stopped", "interrupted")
    assert clean_failed.main(["--runs", str(root)]) == 0
    said = capsys.readouterr().out
    assert "failed runs under" in said and "refused: refused went wrong" in said and "nothing removed" in said
    assert refused.is_dir()  # a dry run by default
    assert clean_failed.main(["--runs", str(root), "--yes"]) == 0
    assert "removed 1 run directories" in capsys.readouterr().out
    assert not refused.exists() and done.is_dir() and stopped.is_dir()
    assert clean_failed.main(["--runs", str(root)]) == 0 and "failed runs under" in capsys.readouterr().out


def test_clean_failed_keeps_a_failed_run_that_can_be_resumed_and_empties_its_day(tmp_path, capsys):
    root = tmp_path / "runs"
    resumable = _run(root, "resumable", "failed", checkpoint=True)
    other_day = _run(root / "other", "gone", "failed")
    runs = clean_failed.failed_runs(root)
    assert sorted((r.run_dir.name, r.resumable) for r in runs) == [("gone", False), ("resumable", True)]
    assert clean_failed.remove(runs, root) == 1
    assert resumable.is_dir() and not other_day.parent.exists() and root.is_dir()


# ---------------------------------------------------------------------------------------------- figures
@pytest.mark.parametrize(
    "devices,unit",
    [
        (["cpu", "cpu"], "CPU processes"),
        (["cuda (NVIDIA H100 80GB HBM3)"], "NVIDIA H100 80GB HBM3 GPUs"),
        (["cuda (A)", "cuda (B)"], "GPUs"),
        (["predicted for: cpu"], "CPU processes"),
        (["cpu", "cuda (A)"], "processes"),
        ([None], "processes"),
    ],
)
def test_the_figures_name_the_records_devices(devices, unit):
    assert device_unit(pd.DataFrame({"device": devices})) == unit
