"""Bad input, one row each: what the user sees is one clear line, a record where a run was started, and no
earlier checkpoint or record lost. (Namespaces and bridges left by a killed emulated run: tests/test_emulated.py,
test_a_run_killed_with_sigkill_is_cleaned_by_the_next_run, which needs root.)"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from birder_repro.run import failures, record
from birder_repro.train import checkpoint as ckpt
from birder_repro.train import resume_point
from birder_repro.train.checkpoint import CheckpointError, RunIdentity, load_checkpoint, save_checkpoint, step_dir

REPO = Path(__file__).resolve().parent.parent
OPTIMS = ", ".join(sorted(p.stem for p in (REPO / "conf" / "optim").glob("*.yaml")))  # optim=adamz's line names them
CPU = torch.device("cpu")
ID = RunIdentity(task="blobs", optim="sgdm", scheme="allreduce", nodes=1, gpus_per_node=1, world_size=1)
# The identity of the QUICK run (resnet20 with Birder, experiment=smoke): its checkpoint passes the identity check
QUICK_ID = RunIdentity(
    task="resnet20", optim="birder", scheme="birder/hierarchical", nodes=1, gpus_per_node=1, world_size=1
)
QUICK = [
    "experiment=smoke",
    "logger=none",
    "model.size=tiny",
    "train.batch_size=8",
    "data.synthetic_train_size=64",
    "data.synthetic_eval_size=16",
    "train.eval_max_batches=1",
    "nodes=1",
    "gpus_per_node=1",
    "train.steps=2",
]


def cli(*args: str, runs: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "BIRDER_RUNS": str(runs), "OMP_NUM_THREADS": "1"},
    )


def records(runs: Path) -> list[dict]:
    return [record.read_record(p.parent) for p in sorted(runs.rglob(record.RECORD_FILE))]


# --------------------------------------------------------------------------------- through the CLI
@pytest.mark.parametrize(
    "args,line,recorded",
    [
        (["train.stepz=3"], "train.stepz: no such setting; did you mean train.steps?", False),  # before any run
        (["+train.stepz=3"], "train.stepz: no such setting; did you mean train.steps?", True),  # added unknown key
        (["optim.lr=abc"], "optim.lr='abc': use a number", True),
        (["data.source=real", "data.root=/nonexistent/cifar"], "not found at '/nonexistent/cifar", True),
        (["nodes=0"], "nodes=0: use a whole number >= 1", True),
        (["train.resume=/nonexistent/run"], "train.resume=/nonexistent/run: no such file or directory", True),
        (["train.resume_policy=maybe"], "train.resume_policy='maybe': use strict or reset_errors", True),
        (["optim=adamz"], f"optim=adamz: no such choice; did you mean optim=adamw? the choices: {OPTIMS}", False),
        (["resume=/x"], "resume: no such setting; did you mean train.resume?", False),
        (["cluster.link_mbit=-5"], "cluster.link_mbit=-5: give a rate > 0 in Mbit/s, or null (no link given)", True),
        (["train.steps=ten"], "train.steps='ten': use a whole number >= 1", True),
    ],
    ids=[
        "misspelt-key",
        "added-unknown-key",
        "wrong-type",
        "missing-dataset",
        "impossible-layout",
        "resume-missing",
        "bad-policy",
        "unknown-choice",
        "setting-without-its-section",
        "negative-link",
        "not-a-number",
    ],
)
def test_cli_bad_input(tmp_path, args, line, recorded):
    """Each bad input through the CLI: the line, the record, the exit code; and what the docs' bad-input table
    says the user sees, checked on the same run (the table test leaves these rows to this one: one CLI run
    each, not two)."""
    runs = tmp_path / "runs"
    out = cli(*QUICK, *args, runs=runs)
    assert out.returncode != 0
    said = out.stdout + out.stderr
    recs = records(runs)
    assert line in said, said[-3000:]
    assert len(recs) == (1 if recorded else 0)
    assert all(r["status"] == "failed" for r in recs)
    if not recorded:  # refused while composing: one line, exit 2 like every config error
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"[birder-repro] config error: {line}"]
    if recorded:  # one line, last, and the record's error is that line
        assert out.stderr.strip().splitlines()[-1] == f"[birder-repro] {recs[0]['error']}"
        assert "Traceback" not in said
    row = CLI_ROWS[" ".join(args)]
    shown = said if row.startswith("misspelt key") else out.stderr.strip().splitlines()[-1]
    assert re.search(as_pattern(docs_rows()[row]), shown.removeprefix("[birder-repro] ")), docs_rows()[row]


# ------------------------------------------------------------ the docs' bad-input table, checked
TABLE_PAGE = REPO / "docs" / "bad-inputs.md"
TABLE_HEADING = "## Bad input"
# Every row the table must hold (its first column): a row deleted from the page, or one added without a check
# in _shown_for, fails test_the_bad_input_table_holds_every_row.
ROWS = [
    "misspelt key `train.stepz=3`",
    "added unknown key `+train.stepz=3`",
    "wrong type `optim.lr=abc`",
    "missing dataset",
    "impossible layout `nodes=0`",
    "resume from a missing path",
    "resume from an incomplete checkpoint",
    "resume from a truncated or corrupt file",
    "any exception inside training on one rank",
    "a checkpoint carrying a pickled object",
    "a checkpoint of another task / optimizer / scheme",
    "a checkpoint of another layout",
    "disk full while checkpointing",
    "runs directory not writable",
    "namespaces and bridges left by a killed emulated run",
    "`train.resume_policy=maybe`",
    "unknown config-group choice `optim=adamz`",
    "a setting without its section `resume=/x`",
    "link rate `cluster.link_mbit=-5`",
    "a value that is no number `train.steps=ten`",
]
NOT_HERE = {"namespaces and bridges left by a killed emulated run"}  # tests/test_emulated.py (needs root)
# Rows whose input test_cli_bad_input runs through the CLI: it checks the table's text on that run.
CLI_ROWS = {
    "train.stepz=3": "misspelt key `train.stepz=3`",
    "+train.stepz=3": "added unknown key `+train.stepz=3`",
    "optim.lr=abc": "wrong type `optim.lr=abc`",
    "data.source=real data.root=/nonexistent/cifar": "missing dataset",
    "nodes=0": "impossible layout `nodes=0`",
    "train.resume=/nonexistent/run": "resume from a missing path",
    "train.resume_policy=maybe": "`train.resume_policy=maybe`",
    "optim=adamz": "unknown config-group choice `optim=adamz`",
    "resume=/x": "a setting without its section `resume=/x`",
    "cluster.link_mbit=-5": "link rate `cluster.link_mbit=-5`",
    "train.steps=ten": "a value that is no number `train.steps=ten`",
}


def table_rows(text: str) -> dict[str, str]:
    """The page's bad-input table: {input: the first `quoted` text of what the user sees}. The table is the first
    block of lines starting with "|" after the heading."""
    after = text[text.index(TABLE_HEADING) :].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    end = next((i for i in range(start, len(after)) if not after[i].startswith("|")), len(after))
    rows = {}
    for line in after[start + 2 : end]:  # after the header and its --- line
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        quoted = re.search(r"`([^`]+)`", cells[1])
        rows[cells[0]] = quoted.group(1) if quoted else cells[1]
    return rows


def docs_rows() -> dict[str, str]:
    return table_rows(TABLE_PAGE.read_text())


def test_the_bad_input_table_holds_every_row():
    rows = docs_rows()
    missing, unchecked = [r for r in ROWS if r not in rows], [r for r in rows if r not in ROWS]
    assert not missing, f"{TABLE_PAGE}: rows missing from the bad-input table: {missing}"
    assert not unchecked, f"{TABLE_PAGE}: rows with no check here (add them to ROWS and _shown_for): {unchecked}"


@pytest.mark.parametrize("cut", ["a row", "every row"])
def test_the_table_check_notices_a_row_deleted_or_the_table_emptied(cut):
    text = TABLE_PAGE.read_text()
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith("| ") and line.split("|")[1].strip() in ROWS]
    gone = rows[:1] if cut == "a row" else rows
    left = table_rows("\n".join(line for i, line in enumerate(lines) if i not in gone))
    assert [r for r in ROWS if r not in left]


def as_pattern(shown: str) -> str:
    """The page's text as a regular expression: <placeholders> and ... stand for anything."""
    return ".*".join(re.escape(part) for part in re.split(r"<[^>]+>|\.\.\.", shown))


def _cli_last_line(tmp_path, *args) -> str:
    out = cli(*QUICK, *args, runs=tmp_path / "runs")
    assert out.returncode != 0
    return out.stderr.strip().splitlines()[-1].removeprefix("[birder-repro] ")


def _raised(call) -> str:
    with pytest.raises(Exception) as err:
        call()
    return str(err.value)


def _shown_for(row: str, tmp_path) -> str:
    """What the user sees for the table's ``row``, produced for real (the rows of CLI_ROWS: test_cli_bad_input)."""
    if row == "resume from an incomplete checkpoint":
        where = _saved(tmp_path)
        (where / ckpt.COMPLETE).unlink()
        return _cli_last_line(tmp_path, f"train.resume={where}")
    if row == "resume from a truncated or corrupt file":
        model, opt = _parts()  # a checkpoint of the quick run's identity, written here rather than by a first run
        where = save_checkpoint(tmp_path, 2, 8.0, model, opt, None, 0, 1, CPU, QUICK_ID, keep=2)
        (where / ckpt.MODEL).write_bytes((where / ckpt.MODEL).read_bytes()[:200])
        return _cli_last_line(tmp_path, f"train.resume={where}", "train.steps=4")
    if row == "any exception inside training on one rank":
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError as exc:
            return failures.final_line(tmp_path, 1)[0] if failures.write_failure(tmp_path, 3, 0, exc) else ""
    if row == "a checkpoint carrying a pickled object":
        where = _saved(tmp_path)
        torch.save({"step": 2, "model": _RunsCode(str(tmp_path / "code-ran"))}, where / ckpt.MODEL)
        return _raised(lambda: _load(where))
    if row == "a checkpoint of another task / optimizer / scheme":
        return _raised(lambda: _load(_saved(tmp_path), RunIdentity(**{**ID.__dict__, "task": "b"})))
    if row == "a checkpoint of another layout":
        model, opt = _parts()
        where = save_checkpoint(tmp_path, 2, 8.0, model, opt, _ErrorFeedback(), 0, 1, CPU, ID, keep=2)
        other = RunIdentity(**{**ID.__dict__, "nodes": 2, "world_size": 2})
        return _raised(lambda: load_checkpoint(where, model, opt, _ErrorFeedback(), 0, 2, CPU, other))
    if row == "disk full while checkpointing":
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                torch, "save", lambda *_a, **_k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
            )
            return _raised(lambda: _saved(tmp_path, step=4))
    if row == "runs directory not writable":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        return cli(*QUICK, runs=blocker / "runs").stderr.strip().splitlines()[-1]
    raise KeyError(row)


@pytest.mark.parametrize("row", [r for r in ROWS if r not in NOT_HERE and r not in CLI_ROWS.values()])
def test_the_bad_input_table_is_what_users_see(tmp_path, row):
    rows = docs_rows()
    assert row in rows, f"{TABLE_PAGE}: the bad-input table has no row {row!r}"
    shown = rows[row]
    assert re.search(as_pattern(shown), _shown_for(row, tmp_path)), shown


def test_cli_runs_directory_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = cli(*QUICK, runs=blocker / "runs")
    assert out.returncode != 0
    assert "cannot write the runs directory" in out.stderr and "BIRDER_RUNS" in out.stderr
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------------------------- checkpoints
def _parts():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _saved(run_dir: Path, step: int = 2) -> Path:
    model, opt = _parts()
    return save_checkpoint(run_dir, step, 8.0, model, opt, None, 0, 1, CPU, ID, keep=2)


def _load(where: Path, identity: RunIdentity = ID, comm=None):
    model, opt = _parts()
    return load_checkpoint(where, model, opt, comm, 0, 1, CPU, identity)


def test_truncated_checkpoint(tmp_path):
    where = _saved(tmp_path)
    shard = where / ckpt.shard_name(0)
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="cannot be read: truncated or corrupt"):
        _load(where)


def test_corrupt_checkpoint(tmp_path):
    where = _saved(tmp_path)
    (where / ckpt.MODEL).write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="truncated or corrupt|not a plain checkpoint"):
        _load(where)


def test_incomplete_checkpoint(tmp_path):
    where = _saved(tmp_path)
    (where / ckpt.COMPLETE).unlink()
    with pytest.raises(CheckpointError, match="is not a complete checkpoint"):
        resume_point.choose_resume(str(where), tmp_path, restarted=False, device=CPU)


class _RunsCode:
    """A pickled object whose loading would create a file (stands for any code)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_checkpoint_carrying_a_pickled_object_is_refused_and_runs_nothing(tmp_path):
    where = _saved(tmp_path)
    marker = tmp_path / "code-ran"
    torch.save({"step": 2, "model": _RunsCode(str(marker))}, where / ckpt.MODEL)
    with pytest.raises(CheckpointError, match="not a plain checkpoint"):
        _load(where)
    assert not marker.exists()


@pytest.mark.parametrize("key,value", [("task", "bert_squad"), ("optim", "birder"), ("scheme", "onebit")])
def test_checkpoint_of_another_task_optimizer_or_scheme(tmp_path, key, value):
    where = _saved(tmp_path)
    with pytest.raises(
        CheckpointError, match=f"checkpoint of {key} '{getattr(ID, key)}'; this run's {key} is '{value}'"
    ):
        _load(where, RunIdentity(**{**ID.__dict__, key: value}))


class _ErrorFeedback:
    """A hook with per-process error feedback (its state is not the baselines' replicated one)."""

    def state_dict(self):
        return {"error": torch.zeros(3)}

    def load_state_dict(self, sd):
        pass


def test_checkpoint_of_another_layout(tmp_path):
    model, opt = _parts()
    where = save_checkpoint(tmp_path, 2, 8.0, model, opt, _ErrorFeedback(), 0, 1, CPU, ID, keep=2)
    other = RunIdentity(**{**ID.__dict__, "nodes": 2, "world_size": 2})
    with pytest.raises(
        CheckpointError,
        match="saved on nodes=1 x gpus_per_node=1; this run is nodes=2 x "
        "gpus_per_node=1.*train.resume_policy=reset_errors",
    ):
        load_checkpoint(where, model, opt, _ErrorFeedback(), 0, 2, CPU, other)


def test_running_out_of_disk_while_checkpointing_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    _saved(tmp_path, step=2)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match="step 4 could not be written.*No space left on device.*earlier"):
        _saved(tmp_path, step=4)
    monkeypatch.undo()
    assert resume_point.choose_resume("auto", tmp_path, restarted=False, device=CPU) == step_dir(tmp_path, 2)
    assert _load(step_dir(tmp_path, 2))[0] == 2
