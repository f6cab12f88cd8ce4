"""What a run directory decides on its own (birder_repro.run.directory): which statuses are finished, which run
``train.resume=auto`` continues, and what makes two runs the same cell. Pure functions over files written as runs
write them: no process is started."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from birder_repro.run.digest import LAUNCH_ENV, cell_digest
from birder_repro.run.directory import RunDir, attempt_entry, find_resumable
from birder_repro.train.checkpoint import CHECKPOINTS, COMPLETE, MANIFEST


def _run(path: Path, status: str, digest: str = "cell", ended: str = "2026-01-01T10:00:00", checkpoint=True) -> Path:
    path.mkdir(parents=True)
    (path / "record.json").write_text(json.dumps({"status": status, "config_digest": digest, "ended": ended}))
    if checkpoint:
        step = path / CHECKPOINTS / "step-000002"
        step.mkdir(parents=True)
        (step / COMPLETE).write_text("")
        (step / MANIFEST).write_text("{}")
    return path


def test_a_diverged_run_is_finished_like_a_completed_one(tmp_path):
    """Relaunched in its own directory, a diverged run must stop (it would diverge again, or resume with no
    checkpoint to resume from), as a completed one does."""
    for status in ("completed", "diverged"):
        decision = RunDir(_run(tmp_path / status, status, checkpoint=False)).decide(cell="cell")
        assert decision.action == "stop" and f"already holds a {status} run" in decision.line, decision
    assert RunDir(_run(tmp_path / "stopped", "interrupted")).decide(cell="cell").action == "resume"


def test_resume_auto_continues_the_newest_run_by_its_records_end_not_its_files_time(tmp_path):
    older = _run(tmp_path / "a", "interrupted", ended="2026-01-01T10:00:00")
    newer = _run(tmp_path / "b", "interrupted", ended="2026-01-02T10:00:00")
    os.utime(newer / "record.json", (1_000_000, 1_000_000))  # copied, touched: file times say nothing
    os.utime(older / "record.json", (2_000_000, 2_000_000))
    assert find_resumable(tmp_path, "cell") == newer
    _run(tmp_path / "other", "interrupted", digest="another cell", ended="2026-01-03T10:00:00")
    assert find_resumable(tmp_path, "cell") == newer  # another configuration is never continued


def test_the_seed_is_part_of_the_cell_with_any_optimizer(compose):
    """Every seed test used Birder, whose optim.seed follows seed: with SGDM seeds 0 and 3 must still be two
    cells, or resume=auto would continue the other seed's run."""
    for optim in ("sgdm", "birder"):
        digests = {cell_digest(compose([f"optim={optim}", f"seed={s}"])) for s in (0, 3)}
        assert len(digests) == 2, optim
    same = {cell_digest(compose(["optim=sgdm", "seed=0", f"logger={x}"])) for x in ("none", "wandb")}
    assert len(same) == 1  # a setting that cannot change the result does not make another cell


# ------------------------------------------------------------------------------------------ one writer
PACKAGE = Path(__file__).resolve().parents[1] / "birder_repro"
RECORD_NAMES = {"RECORD_FILE", "record_file", "record.json"}  # how the package names the record file
WRITE_CALLS = {"write_text", "write_bytes", "atomic_write", "dump", "replace", "rename", "copy", "copy2", "copyfile"}


def _names_the_record(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` mentions the record file: its constant, its name, or a variable bound to either."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value in RECORD_NAMES:
            return True
        if isinstance(sub, ast.Name) and (sub.id in RECORD_NAMES or sub.id in tainted):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in RECORD_NAMES:
            return True
    return False


def _writes_the_record(tree: ast.AST) -> bool:
    """A call of a record writer (``write_record``), or a write call (write_text, os.replace, json.dump, open
    for writing, ...) whose receiver or arguments name the record file, in any function (or the module)."""
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    return any(_scope_writes(scope) for scope in scopes)


def _own_nodes(scope: ast.AST):
    """Every node of ``scope`` but those of the functions defined inside it (each is a scope of its own)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            todo.extend(ast.iter_child_nodes(node))


def _scope_writes(scope: ast.AST) -> bool:
    tainted: set[str] = set()
    for node in _own_nodes(scope):  # names bound to the record's path here (path = run_dir / RECORD_FILE)
        if isinstance(node, ast.Assign) and _names_the_record(node.value, set()):
            tainted |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name | ast.Attribute) and "write_record" in (getattr(node, "id", ""), node_attr(node)):
            return True
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else node_attr(node.func)
        writes = name in WRITE_CALLS or (
            name == "open" and any(isinstance(a, ast.Constant) and str(a.value)[:1] in "wax" for a in node.args[1:2])
        )
        if writes and _names_the_record(node, tainted):
            return True
    return False


def node_attr(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ""


def record_writers(package: Path = PACKAGE) -> list[str]:
    """The package's modules that write ``record.json`` (paths relative to the package's parent)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if _writes_the_record(ast.parse(path.read_text(), str(path))):
            found.append(path.relative_to(package.parent).as_posix())
    return found


def test_only_the_run_directory_writes_the_record():
    """One run, one record, one writer: the CLI, the worker, a run's end, the emulated launcher and mode=predict
    hand their records to RunDir.write (birder_repro.run.directory), the one module that writes record.json.
    The scan finds that module itself, so it is known to see a writer."""
    assert record_writers() == ["birder_repro/run/directory.py"]


def test_the_writer_scan_sees_every_way_of_writing(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    ways = {
        "direct.py": "def f(d):\n    (d / RECORD_FILE).write_text('{}')\n",
        "bound.py": "def f(d):\n    path = d / record.RECORD_FILE\n    atomic_write(path, '{}')\n",
        "opened.py": "def f(d):\n    with open(d / 'record.json', 'w') as out:\n        out.write('{}')\n",
        "helper.py": "def f(d, rec):\n    record.write_record(d, rec)\n",
        "reads.py": "def f(d):\n    return (d / RECORD_FILE).read_text()\n",
    }
    for name, text in ways.items():
        (pkg / name).write_text(text)
    assert record_writers(pkg) == [f"pkg/{n}" for n in sorted(ways) if n != "reads.py"]


def test_the_run_directory_writes_a_checked_record_atomically(tmp_path):
    run = RunDir(tmp_path / "run")
    with pytest.raises(ValueError, match="not_a_key"):
        run.write({"status": "completed", "not_a_key": 1})
    assert run.read() is None
    rec = {"status": "interrupted", "ended": "2026-01-01T10:00:00+00:00"}
    assert run.write(rec) == run.record_file and run.read() == rec
    assert [p.name for p in run.path.iterdir()] == ["record.json"]  # no temporary file left behind
    assert (
        run.fresh_record("2026-01-01T09:00:00+00:00") == rec and run.fresh_record("2026-01-01T11:00:00+00:00") is None
    )


def test_a_stopped_run_resumes_from_its_newest_complete_checkpoint_and_without_one_starts_afresh(tmp_path):
    stopped = _run(tmp_path / "stopped", "interrupted")
    newer = stopped / CHECKPOINTS / "step-000007"
    newer.mkdir()
    (newer / MANIFEST).write_text("{}")  # no COMPLETE: its writing was cut short
    decision = RunDir(stopped).decide(cell="cell")
    assert decision.action == "resume" and decision.checkpoint.name == "step-000002"
    assert RunDir(stopped).newest_step() == 2
    for status in ("interrupted", "failed"):
        bare = RunDir(_run(tmp_path / f"bare-{status}", status, checkpoint=False))
        assert bare.decide(cell="another cell").action == "start", status  # nothing to lose: run it again
        assert bare.newest_checkpoint() is None and bare.newest_step() == 0


def test_the_attempts_before_this_launch_leave_out_this_launchs_own(tmp_path):
    """A run resumed in place lists every earlier launch once; rank 0 and the CLI of the same launch (the same
    BIRDER_LAUNCH) must not count it twice."""
    run = RunDir(tmp_path)
    assert run.previous_attempts({}) == []
    run.write(
        {
            "status": "interrupted",
            "attempts": [attempt_entry("interrupted", "t0", "t1", 0, 4, env={LAUNCH_ENV: "first"})],
        }
    )
    assert [a["launch"] for a in run.previous_attempts({LAUNCH_ENV: "second"})] == ["first"]
    assert run.previous_attempts({LAUNCH_ENV: "first"}) == []
    run.write({"status": "failed", "started": "t0", "ended": "t1", "stopped_at_step": 3})  # before attempts were kept
    assert [(a["status"], a["to_step"]) for a in run.previous_attempts({LAUNCH_ENV: "x"})] == [("failed", 3)]


def test_the_launchers_tell_finish_which_node_it_is_on(compose, monkeypatch):
    """run.finish asks no launcher: launch.ending hands it the node, whether the run spans nodes, this node's own
    log, whether the user's CLI relays it (cluster=emulated) and the summary."""
    from birder_repro.launch import emulated_nodes
    from birder_repro.launch.ending import summarize, teller
    from birder_repro.run.finish import Teller

    monkeypatch.delenv(emulated_nodes.NODE_ENV, raising=False)
    assert teller(compose(["nodes=2", "gpus_per_node=1"])) == Teller(summarize=summarize)
    node1 = teller(compose(["nodes=2", "gpus_per_node=1", "launcher=torchrun", "launcher.node_rank=1"]))
    assert (node1.node, node1.multi_node, node1.log_name, node1.relayed) == (1, True, "output.node1.log", False)
    monkeypatch.setenv(emulated_nodes.NODE_ENV, "0")
    assert teller(compose(["nodes=1", "gpus_per_node=1", "launcher=torchrun"])).relayed
