"""What an offline W&B run tells the user at start: one line of ours (where the run is, the `wandb sync`
command), not W&B's "Run `wandb online`", which is the wrong advice here (the mode follows WANDB_API_KEY and
WANDB_MODE: birder_repro.train.logger.wandb_mode)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from birder_repro.train.logger import RunLogger, offline_hint

ROOT = Path(__file__).resolve().parent.parent


def wandb_config(mode: str) -> OmegaConf:
    """The real conf/logger/wandb.yaml with ``mode``, on a run with just enough keys for W&B's group."""
    logger = OmegaConf.load(ROOT / "conf" / "logger" / "wandb.yaml")
    logger.mode = mode
    return OmegaConf.create(
        {
            "logger": logger,
            "task": {"name": "blobs"},
            "optim": {"name": "sgdm"},
            "cluster": {"name": "local"},
            "nodes": 1,
            "gpus_per_node": 1,
        }
    )


class _FakeRun:
    def __init__(self, sync_dir: str):
        self.sync_dir = sync_dir

    def finish(self, exit_code: int = 0) -> None:
        pass


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_offline_runs_silence_wandb_and_print_our_sync_line(tmp_path, monkeypatch, capsys, mode):
    seen = {}

    def init(**kwargs):
        seen.update(kwargs)
        return _FakeRun(str(tmp_path / "wandb" / "offline-run-1"))

    monkeypatch.setenv("WANDB_MODE", "disabled")  # the configured mode wins over the environment
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=dict))
    RunLogger(wandb_config(mode), tmp_path).finish()
    out = capsys.readouterr().out
    assert seen["mode"] == mode
    assert seen["settings"]["silent"] is (mode == "offline")  # W&B's own header and footer off, offline only
    hint = offline_hint(tmp_path / "wandb" / "offline-run-1")
    assert (hint in out) is (mode == "offline")
    assert f"wandb sync {tmp_path / 'wandb' / 'offline-run-1'}" in hint


def test_the_installed_wandb_prints_no_wandb_online_advice(tmp_path, capfd, monkeypatch):
    """The real wandb, offline: its header ("Run `wandb online` ...") is gone and our line names its run."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    logger = RunLogger(wandb_config("offline"), tmp_path)
    logger.log(1, {"loss": 1.0})
    logger.finish()
    said = capfd.readouterr()
    text = said.out + said.err
    assert "wandb online" not in text and "WANDB_MODE=online" not in text, text
    [run] = (tmp_path / "wandb").glob("offline-run-*")
    assert offline_hint(run) in said.out, text
