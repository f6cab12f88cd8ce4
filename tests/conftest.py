"""Fixtures every test file may use: composing the project's config, a private runs directory, and run records
written as runs write them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# One thread a process for the whole session (this process's torch, and every CLI, torchrun and worker it starts,
# which inherit it): the suite runs two pytest workers, each starting processes of its own, on two cores, where
# more threads only spin against each other. A test of the thread setting passes its own environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def compose_config(overrides: Sequence[str] = (), hydra_config: bool = False) -> DictConfig:
    """The config ``birder-repro <overrides>`` would run with (struct mode on, as in the app)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)


def write_records(root: Path, records: Sequence[dict], run_name: Callable[[int, dict], str]) -> Path:
    """Each record as ``<root>/<run_name(i, record)>/record.json``, as a run leaves it; returns ``root``."""
    for i, record in enumerate(records):
        run = root / run_name(i, record)
        run.mkdir(parents=True)
        (run / "record.json").write_text(json.dumps(record))
    return root


@pytest.fixture
def compose():
    """``compose(["task=resnet20", "nodes=2"])`` -> the composed config."""
    return compose_config


@pytest.fixture(autouse=True)
def runs_dir(tmp_path, monkeypatch) -> Path:
    """Every test's runs go to its own temporary directory (BIRDER_RUNS), never into the checkout's runs/."""
    path = tmp_path / "runs"
    monkeypatch.setenv("BIRDER_RUNS", str(path))
    monkeypatch.setenv("BIRDER_CACHE", str(tmp_path / "cache"))  # decoded datasets (tasks.fashion_mnist): not ~/.cache
    return path


DURATIONS = Path(__file__).with_name("durations.json")
_measured: dict[str, float] = {}


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--update-durations",
        action="store_true",
        help="write each test's seconds (setup, call and teardown; 1 s or more) to tests/durations.json",
    )


def pytest_collection_modifyitems(items) -> None:
    """Longest test files first (``tests/durations.json``: seconds per test of a whole run, written by
    ``make test-all ARGS=--update-durations``), a file's tests kept together and in their order: with ``--dist
    loadfile`` (``make test``) the workers take whole files, the longest first, so that no long file starts
    last and leaves the other workers idle at the end, and a file's module-scoped process pools start once, not
    once in each worker. A test the file does not know counts 0 s: a stale file only costs balance."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    weight: dict[str, float] = {}
    for item in items:
        weight[item.location[0]] = weight.get(item.location[0], 0.0) + known.get(item.nodeid, 0.0)
    items.sort(key=lambda item: -weight[item.location[0]])


def pytest_runtest_logreport(report) -> None:
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session) -> None:
    if session.config.getoption("--update-durations") and not hasattr(session.config, "workerinput"):
        slow = {k: round(v, 1) for k, v in sorted(_measured.items(), key=lambda kv: -kv[1]) if v >= 1.0}
        DURATIONS.write_text(json.dumps(slow, indent=0) + "\n")
