"""Runs that diverge stop (train.diverge_after): the watch's count, the CLI's end, the tables' cell."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from birder_repro.config.settings import ConfigError
from birder_repro.report import records as report_records
from birder_repro.report import tables
from birder_repro.run import record
from birder_repro.train.divergence import Diverged, DivergenceWatch
from birder_repro.train.settings import TrainSettings

REPO = Path(__file__).resolve().parent.parent
NAN, CPU = float("nan"), torch.device("cpu")
SGDM = OmegaConf.create({"name": "sgdm", "lr": 1e4})


class _Hook:
    nonfinite_steps = 0


def _feed(watch: DivergenceWatch, losses, hook=None, skipped_at=()) -> int:
    """Steps 1.. with these losses (one process: the agreement is the identity); the step it stopped at."""
    hook = hook or _Hook()
    for step, loss in enumerate(losses, start=1):
        if step in skipped_at:
            hook.nonfinite_steps += 1
        try:
            watch.after_step(step, loss, hook, 0.1, None)
        except Diverged as stop:
            return stop.step
    return 0


def test_stops_after_the_configured_consecutive_nonfinite_steps():
    watch = DivergenceWatch(3, SGDM, CPU)
    assert _feed(watch, [1.0, NAN, NAN, 2.0, NAN, math.inf, NAN, NAN]) == 7  # the run of 2 was broken by step 4
    assert watch.since == 5 and watch.run == 3


def test_steps_skipped_by_the_hook_count_as_nonfinite():
    watch = DivergenceWatch(2, SGDM, CPU)
    assert _feed(watch, [1.0, 1.0, 1.0, 1.0], skipped_at=(2, 3)) == 3


def test_fp16_counts_only_nonfinite_losses_not_gradscalers_skips():
    """fp16 (count_skips=False, as the loop sets it with GradScaler): GradScaler's skipped steps, which the hooks
    count as non-finite too, are its normal search for a scale; only a non-finite loss counts."""
    fp16 = DivergenceWatch(2, SGDM, CPU, count_skips=False)
    assert _feed(fp16, [1.0, 1.0, 1.0, 1.0, 1.0, NAN, NAN], skipped_at=(1, 2, 3, 4)) == 7
    assert fp16.since == 6
    fp32 = DivergenceWatch(2, SGDM, CPU)  # the same skips in fp32 or bf16 stop the run
    assert _feed(fp32, [1.0, 1.0, 1.0, 1.0, 1.0, NAN, NAN], skipped_at=(1, 2, 3, 4)) == 2


def _one_rank_diverges(rank: int, world: int) -> tuple[int, int]:
    """Rank 1 alone sees non-finite losses from step 3 on; rank 0's stay finite. (The step each stopped at, and
    the first of the run it counted.)"""
    watch = DivergenceWatch(3, SGDM, CPU)
    losses = [1.0, 1.0] + ([NAN] * 8 if rank == 1 else [2.0] * 8)
    return _feed(watch, losses), watch.since


def test_every_rank_stops_at_the_same_step_when_one_rank_alone_diverges():
    """The flag is agreed over the ranks (one all-reduce per step): a rank that decided alone would stop while
    the others train on and wait for it in their next collective."""
    from dist_utils import run_distributed

    assert run_distributed(_one_rank_diverges, 2) == [(5, 3), (5, 3)]


def test_zero_turns_it_off():
    assert _feed(DivergenceWatch(0, SGDM, CPU), [NAN] * 50) == 0


def test_the_line_names_the_step_the_setting_and_a_cause():
    watch = DivergenceWatch(2, SGDM, CPU)
    with pytest.raises(Diverged) as stop:
        for step in (1, 2):
            watch.after_step(step, NAN, _Hook(), 1e4, None)
    assert stop.value.line.startswith("diverged at step 2: ")
    assert "since step 1" in stop.value.line and "train.diverge_after=2" in stop.value.line
    assert "lower optim.lr" in stop.value.line and "\n" not in stop.value.line
    onebit = DivergenceWatch(1, OmegaConf.create({"name": "onebit_adam", "lr": 1e-3}), CPU)
    with pytest.raises(Diverged, match="optim.compress_preconditioned=true"):
        onebit.after_step(40, NAN, _Hook(), 1e-3, "compression")


def test_a_bad_setting_names_the_key():
    with pytest.raises(ConfigError, match=r"train.diverge_after=-1: use a whole number >= 0"):
        TrainSettings(batch_size=8, diverge_after=-1).check()


def _diverged_and_completed(tmp_path):
    """A completed SGDM run and a diverged AdamW run of the same cell, as their records."""
    cfg = OmegaConf.create(
        {
            "task": {"name": "digits"},
            "optim": {"name": "sgdm", "lr": 0.1},
            "cluster": {"name": "local"},
            "nodes": 1,
            "gpus_per_node": 1,
            "train": {"batch_size": 32},
        }
    )
    done = record.completed_record(
        cfg,
        tmp_path / "a",
        {"throughput_samples_per_s": 1234.5, "metrics": {"top1": 0.97}, "headline_metric": "top1"},
        started="2026-01-01T00:00:00+00:00",
    )
    diverged = record.diverged_record(
        cfg, tmp_path / "b", 16, "diverged at step 16: ...", started="2026-01-01T00:00:01+00:00"
    )
    diverged["optim"] = "adamw"
    return [(tmp_path / "a", done), (tmp_path / "b", diverged)]


def test_tables_show_a_diverged_cell_as_diverged_never_as_a_number(tmp_path):
    frame = report_records.records_frame(_diverged_and_completed(tmp_path))
    cells = tables.cell_table(frame)
    shown = tables.display_frame(cells, "whole")
    row = shown[shown["optimizer"].str.contains("AdamW")].iloc[0]
    numbers = [c for c in shown.columns if c not in ("optimizer", "#GPUs (nodes x GPUs/node)", "run")]
    assert all(row[c] == "diverged at step 16" for c in numbers), row.to_dict()
    other = shown[~shown["optimizer"].str.contains("AdamW")].iloc[0]
    assert other[tables.throughput_header("whole")].startswith("1234")  # the completed run keeps its numbers


@pytest.mark.parametrize("args", [["nodes=1", "gpus_per_node=1", "train.steps=60"]])
def test_sgdm_with_a_huge_lr_ends_as_diverged_in_one_line(tmp_path, args):
    runs = tmp_path / "runs"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "birder_repro.cli",
            "task=digits",
            "optim=sgdm",
            "optim.lr=1e4",
            "logger=none",
            "train.eval=false",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BIRDER_RUNS": str(runs), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    [path] = list(runs.rglob(record.RECORD_FILE))
    rec = record.read_record(path.parent)
    assert rec["status"] == "diverged" and rec["diverged_at_step"] < 60
    assert last == f"[birder-repro] {rec['error']}" and last.count("\n") == 0
    assert f"diverged at step {rec['diverged_at_step']}" in last and "optim.lr" in last
    assert rec["throughput_samples_per_s"] is None and rec["metrics"] == {}


def _loop_with_a_hook_that_skips_every_step(tmp_path, precision: str):
    """The training loop, in process, with a stand-in hook state whose count of skipped steps grows every step
    (as a hook's does when GradScaler searches for a scale, or when every gradient is non-finite)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import test_train as tiny

    from birder_repro.comm.accounting import CommStats
    from birder_repro.comm.topology import Topology
    from birder_repro.train import train

    class SkipsEveryStep(CommStats):
        __slots__ = ("reads",)

        def __init__(self):
            super().__init__()
            self.reads = 0

        @property
        def nonfinite_steps(self) -> int:
            self.reads += 1
            return self.reads

    torch.manual_seed(0)
    model = tiny.tiny_model()
    cfg = tiny.make_config(tmp_path, steps=6, eval=False, diverge_after=3, precision=precision)
    return train(
        cfg,
        task=tiny.BlobsTask(),
        data=tiny.blobs_data(0, 1, 8),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        comm=SkipsEveryStep(),
        topology=Topology(rank=0, world_size=1, gpus_per_node=1),
        device=CPU,
        run_dir=tmp_path,
    )


def test_the_loop_applies_fp16s_rule_and_fp32s(tmp_path):
    """The loop builds the watch from the run's precision: with fp16 the hook's skips (GradScaler's search for
    a scale) do not stop a run whose losses are finite; in fp32 the same skips stop it."""
    record = _loop_with_a_hook_that_skips_every_step(tmp_path / "fp16", "fp16")
    assert record["steps"] == 6 and math.isfinite(record["final_loss"])
    with pytest.raises(Diverged, match="diverged at step 3"):
        _loop_with_a_hook_that_skips_every_step(tmp_path / "fp32", "fp32")
