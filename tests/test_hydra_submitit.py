"""Sweeps through Hydra's submitit launcher (``hydra-submitit-launcher``, the ``slurm`` extra): each cell of a
``-m`` sweep becomes a job that runs the birder-repro app, with our config as it is. Skipped where the plugin is
not installed (``pip install -e .[slurm]``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from birder_repro.config import settings as layout

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: hydra-submitit-launcher")

REPO = Path(__file__).resolve().parent.parent


def test_submitit_slurm_composes_with_our_config(compose):
    """A cell per job of 2 nodes x 8 GPUs: submitit asks SLURM for the nodes, each task runs the app, whose
    launcher (auto: torchrun inside the allocation) starts that node's workers."""
    cfg = compose(
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.nodes=2",
            "hydra.launcher.tasks_per_node=1",
            "hydra.launcher.gpus_per_node=8",
            "hydra.launcher.timeout_min=240",
            "task=resnet50",
            "optim=birder",
            "nodes=2",
            "gpus_per_node=8",
            "cluster=ethernet_10g",
        ],
        hydra_config=True,
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 1, 8)
    assert OmegaConf.select(cfg, "hydra.runtime.choices")["hydra/launcher"] == "submitit_slurm"
    resolved = layout.resolve(cfg, gpu_count=0)
    assert resolved.launcher.name == "auto" and "hydra" not in resolved  # the run's config is the same


@pytest.mark.slow  # 30 s of submitit's job processes; the sweep's cells as this project runs them: tests/test_cli.py
def test_a_sweep_through_submitit_local_runs_each_cell_as_a_job(runs_dir):
    """submitit's local executor: each cell in a process of its own, as on SLURM; dry runs, so nothing trains."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "birder_repro.cli",
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=5",
            "optim=sgdm,birder",
            "task=digits",
            "nodes=1",
            "gpus_per_node=1",
            "logger=none",
            "dry_run=true",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BIRDER_RUNS": str(runs_dir)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cells = sorted(p.parent for p in runs_dir.rglob("config.yaml") if p.parent.name != ".hydra")
    assert [OmegaConf.load(c / "config.yaml").optim.name for c in cells] == ["sgdm", "birder"]
    logs = "".join(p.read_text() for p in runs_dir.rglob("*_log.out"))  # what each job printed
    assert logs.count("# dry run (launcher=local)") == 2, logs
