"""The package as a user installs it: a wheel built from the tracked files alone, installed (not editable) into a
fresh virtual environment, runs ``birder-repro`` away from the checkout: its configs (``birder_repro.conf``)
and the paper's tables (``birder_repro.paper_tables``) travel in the wheel.

To stay fast and offline, the fresh environment gets the wheel alone (``--no-deps``) and sees this environment's
installed dependencies through a ``.pth`` line naming their site-packages. A directory added that way is not
a site directory, so the ``.pth`` files inside it (an editable install's finder among them) do not run, and
``birder_repro`` can only come from the wheel.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None or shutil.which("git") is None or not (REPO / ".git").exists(),
    reason="needs setuptools in this environment (the wheel is built without build isolation: offline) and a git "
    "checkout (the wheel is built from its tracked files)",
)


def _run(argv: list, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``argv`` in ``cwd``; never with PYTHONPATH (which may point at the checkout: pip would then take the
    checkout's birder_repro for an installed one and skip the wheel)."""
    env = env if env is not None else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{argv}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _clean_copy(dest: Path) -> Path:
    """The repository's tracked files (as they are in the working tree), nothing untracked: what a clone has."""
    files = _run(["git", "ls-files", "-z"], REPO).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; returns its bin/ directory."""
    root = tmp_path_factory.mktemp("package")
    src = _clean_copy(root / "src")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", src],
        root,
        timeout=300,
    )
    (wheel,) = (root / "dist").glob("birder_repro-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], root)
    python = root / "venv" / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        root,
        timeout=300,
    )
    # After the install: pip would otherwise see (and decline to replace) this environment's own birder-repro.
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    (Path(purelib) / "birder_repro_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python.parent


def _env(runs: Path) -> dict:
    """This environment less PYTHONPATH (which may point at the checkout), runs into ``runs``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "BIRDER_RUNS": str(runs), "PYTHONUNBUFFERED": "1"}


def test_the_installed_package_comes_from_the_wheel_with_its_data(installed, tmp_path):
    code = (
        "import birder_repro, birder_repro.config.resources as r; from birder_repro.report.paper import "
        "load_paper_tables; from birder_repro.gpucheck.runs import plan; print(birder_repro.__file__); "
        "print(r.conf_dir()); print(len(load_paper_tables())); print(len(plan(['digits'], ['fp32'])))"
    )
    out = _run([installed / "python", "-c", code], tmp_path, env=_env(tmp_path)).stdout.split()
    module, conf, paper_rows, gpucheck_runs = out
    site_packages = Path(module).parent.parent
    assert not Path(module).is_relative_to(REPO) and site_packages.name == "site-packages"
    assert Path(conf) == site_packages / "birder_repro" / "conf" and int(paper_rows) > 0
    assert int(gpucheck_runs) == 3  # make gpu-check's plan reads each task's baseline from the installed conf


def test_the_installed_cli_prints_the_config(installed, tmp_path):
    out = _run(
        [installed / "birder-repro", "--cfg", "job", "task=digits", "optim=sgdm"], tmp_path, env=_env(tmp_path / "runs")
    )
    printed = yaml.safe_load(out.stdout)
    assert printed["task"]["name"] == "digits" and printed["optim"]["name"] == "sgdm"


def test_the_installed_cli_runs_a_tiny_run(installed, tmp_path):
    runs = tmp_path / "runs"
    out = _run(
        [
            installed / "birder-repro",
            "task=digits",
            "train.steps=2",
            "logger=none",
            "nodes=1",
            "gpus_per_node=1",
            "device=cpu",
            "train.eval_max_batches=1",
        ],
        tmp_path,
        timeout=300,
        env=_env(runs),
    )
    (record,) = runs.rglob("record.json")
    rec = yaml.safe_load(record.read_text())  # JSON is YAML
    assert rec["status"] == "completed" and rec["steps"] == 2 and rec["task"] == "digits"
    assert str(record) in out.stdout
