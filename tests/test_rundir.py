"""What a run directory decides on its own (birder_repro.run.rundir): which statuses are finished, which run
``train.resume=auto`` continues, and what makes two runs the same cell. Pure functions over files written as runs
write them: no process is started."""

from __future__ import annotations

import json
import os
from pathlib import Path

from birder_repro.run import rundir
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
        decision = rundir.decide(_run(tmp_path / status, status, checkpoint=False), cell="cell")
        assert decision.action == "stop" and f"already holds a {status} run" in decision.line, decision
    assert rundir.decide(_run(tmp_path / "stopped", "interrupted"), cell="cell").action == "resume"


def test_resume_auto_continues_the_newest_run_by_its_records_end_not_its_files_time(tmp_path):
    older = _run(tmp_path / "a", "interrupted", ended="2026-01-01T10:00:00")
    newer = _run(tmp_path / "b", "interrupted", ended="2026-01-02T10:00:00")
    os.utime(newer / "record.json", (1_000_000, 1_000_000))  # copied, touched: file times say nothing
    os.utime(older / "record.json", (2_000_000, 2_000_000))
    assert rundir.find_resumable(tmp_path, "cell") == newer
    _run(tmp_path / "other", "interrupted", digest="another cell", ended="2026-01-03T10:00:00")
    assert rundir.find_resumable(tmp_path, "cell") == newer  # another configuration is never continued


def test_the_seed_is_part_of_the_cell_with_any_optimizer(compose):
    """Every seed test used Birder, whose optim.seed follows seed: with SGDM seeds 0 and 3 must still be two
    cells, or resume=auto would continue the other seed's run."""
    for optim in ("sgdm", "birder"):
        digests = {rundir.cell_digest(compose([f"optim={optim}", f"seed={s}"])) for s in (0, 3)}
        assert len(digests) == 2, optim
    same = {rundir.cell_digest(compose(["optim=sgdm", "seed=0", f"logger={x}"])) for x in ("none", "wandb")}
    assert len(same) == 1  # a setting that cannot change the result does not make another cell
