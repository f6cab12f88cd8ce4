"""The import layers (docs/architecture.md): import-linter's contracts in pyproject.toml hold, and no module of
birder_repro lies on an import cycle (imports inside functions count, as grimp counts them).

Needs import-linter (which brings grimp); skipped with that reason where it is not installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed: pip install 'import-linter>=2.6'")
import grimp

REPO = Path(__file__).resolve().parents[1]

# The circles users hit before the layers were checked: each group was one strongly connected set of modules.
CIRCLES = {
    "config-launch-perf-record": [
        "config.settings",
        "launch.emulated",
        "launch.local",
        "launch.torchrun",
        "perf.emulated",
        "perf.linkprobe",
        "perf.probe",
        "perf.validate",
        "run.record",
        "train.target",
    ],
    "perf-model-profiles": ["perf.model", "perf.profile", "perf.paper_profiles"],
    "checkpoint-relayout": ["train.checkpoint", "train.relayout"],
}


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``lint-imports`` (import-linter's command) run in ``cwd``, with ``cwd`` first on the import path so that the
    package it checks is that directory's, not another installed copy."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def cycles(graph: grimp.ImportGraph, package: str) -> list[tuple[str, ...]]:
    """An import cycle through each direct import ``a -> b`` of ``package`` that has a way back from ``b`` to
    ``a`` (the cycle as its chain of modules, ``a`` first); none where the imports form no circle."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if not imported.startswith(package):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                found.append((importer, *back))
    return found


def package_view(where: Path) -> Path:
    """``where/birder_repro`` laid out as the installed package is: the checkout's modules, and tasks/ as
    ``birder_repro.tasks`` (pyproject's package-dir mapping, which a checkout's file tree does not show and grimp,
    walking the package's folder, would miss). Links, not copies: the view is the checkout's code."""
    view = where / "birder_repro"
    view.mkdir(parents=True)
    for entry in (REPO / "birder_repro").iterdir():
        if entry.name not in ("__pycache__", "tasks"):
            (view / entry.name).symlink_to(entry)
    (view / "tasks").symlink_to(REPO / "tasks")
    return where


def test_lint_imports_keeps_every_contract(tmp_path):
    result = lint_imports(package_view(tmp_path), str(REPO / "pyproject.toml"))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "0 broken" in out and "BROKEN" not in out


def test_lint_imports_fails_a_lower_layer_importing_a_higher_one(tmp_path):
    """The same check, on a package whose low layer imports its high one: broken, naming the import."""
    pkg = tmp_path / "layered"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from layered import low\n")
    (pkg / "low.py").write_text("def f():\n    from layered import high  # inside a function: still counted\n")
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent("""\
        [importlinter]
        root_package = layered

        [importlinter:contract:layers]
        name = high over low
        type = layers
        layers =
            layered.high
            layered.low
        """)
    )
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "layered.low is not allowed to import layered.high" in result.stdout, result.stdout[-3000:]


def _graph() -> grimp.ImportGraph:
    origin = Path(importlib.util.find_spec("birder_repro").origin).resolve()
    assert origin.is_relative_to(REPO), (
        f"birder_repro imports from {origin}, not this checkout: run the tests with PYTHONPATH={REPO}"
    )
    return grimp.build_graph("birder_repro", cache_dir=None)


def test_no_module_lies_on_an_import_cycle():
    found = cycles(_graph(), "birder_repro")
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found[:20])


@pytest.mark.parametrize("circle", sorted(CIRCLES))
def test_the_circles_users_hit_are_gone(circle):
    graph = _graph()
    modules = [f"birder_repro.{m}" for m in CIRCLES[circle]]
    assert set(modules) <= graph.modules, set(modules) - graph.modules
    reaches = lambda a, b: graph.find_shortest_chain(importer=a, imported=b) is not None  # noqa: E731
    both_ways = [(a, b) for a, b in itertools.combinations(modules, 2) if reaches(a, b) and reaches(b, a)]
    assert not both_ways, f"these import each other (directly or through others): {both_ways}"


def test_the_cycle_finder_finds_one(tmp_path, monkeypatch):
    """A package with a -> b -> c -> a (the last one inside a function): one cycle through each of its imports."""
    pkg = tmp_path / "circular"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circular import b\n")
    (pkg / "b.py").write_text("import circular.c\n")
    (pkg / "c.py").write_text("def f():\n    from circular.a import x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = cycles(grimp.build_graph("circular", cache_dir=None), "circular")
    assert ("circular.a", "circular.b", "circular.c", "circular.a") in found and len(found) == 3


def test_config_runs_the_section_checks_the_app_hands_it(compose):
    """config imports no owner of a section: the table in birder_repro.train.checks is handed to it, and it runs
    exactly what it was handed."""
    from birder_repro.config import settings as config
    from birder_repro.train import checks

    assert config.section_checks() == [name for name, _ in checks.SECTION_CHECKS]
    cfg = compose(["task=digits", "task.target.direction=up"])
    with pytest.raises(config.ConfigError, match=r"task\.target\.direction='up'"):
        config.validate(cfg)
    try:
        config.install_section_checks([])
        config.validate(cfg)  # the config's own keys only: task.target belongs to a higher layer
    finally:
        checks.install()
    assert config.section_checks() == ["optim.name", "task.name", "task.target", "parallel", "train", "probe"]
