"""One run, one directory, one record: :class:`RunDir`, the one owner of a run directory, and where a run goes.

A run directory holds ``config.yaml``, ``command.txt``, ``output.log`` (birder_repro.run.record writes the
first two), ``record.json``, ``checkpoints/step-*/``, ``failures/`` (each rank's one-line failure), ``nodes/``
(the markers of the shared-file-system check and the done markers of the CLIs of nodes other than 0) and
``progress.json`` (the step rank 0 reached). :class:`RunDir` is the one module that writes ``record.json``
(:meth:`RunDir.write`; tests/test_rundir.py holds it): the CLI, the worker, a run's end, the emulated launcher and
``mode=predict`` build a record (birder_repro.run.record) and hand it here.

- What a directory holds decides what a run started in it does (:meth:`RunDir.decide`): nothing yet (or only
  the files another node's CLI has just written): start, or join; a completed or diverged run: stop; an
  interrupted or failed run with a complete checkpoint: resume it in place, as its next attempt.
- Attempts: every launch of a run directory (the CLI's, ``BIRDER_LAUNCH``; torchrun's restarts within it are
  one attempt) is one entry of the record's ``attempts``; the earlier ones come from the record already there
  (:meth:`RunDir.previous_attempts`), this one's is :func:`attempt_entry`.
- Where a run goes (:func:`job_dir`): ``hydra.run.dir`` where given; else the run ``train.resume=auto``
  continues (:func:`find_resumable`), or a torchrun run's directory named after its rendezvous id (the same on
  every node); else Hydra's own. The launcher's facts (the rendezvous id, this node's rank) are handed in.
- The shared file system is a fact to check, not to assume: the first process of every node writes a marker
  (:meth:`RunDir.write_marker`), and after a barrier rank 0 must see all of them (the collective part is the
  worker's, birder_repro.train.shared_dir).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from birder_repro.run import record, schema
from birder_repro.run.checkpoint_dirs import CHECKPOINTS, complete_checkpoints
from birder_repro.run.digest import LAUNCH_ENV, NODES_DIR, cell_digest
from birder_repro.run.failures import FAILURES_DIR

__all__ = [
    "RESUMABLE",
    "FINISHED",
    "PROGRESS",
    "Decision",
    "RunDir",
    "RunDirNotShared",
    "attempt_entry",
    "previous_attempts",
    "find_resumable",
    "job_dir",
    "chosen_dir",
    "remove_if_unused",
    "prepare_in_place",
]

RESUMABLE = ("interrupted", "failed")  # statuses a run directory can be continued from (with a checkpoint)
FINISHED = ("completed", "diverged")  # ... and those it cannot: running it again would redo the same run
PROGRESS = "progress.json"  # the step rank 0 has reached (birder_repro.train.restarts rewrites it every step)


@dataclass(frozen=True)
class Decision:
    """What a run started in a directory does: ``start`` (afresh), ``resume`` (from ``checkpoint``, in place)
    or ``stop`` (``line`` says why); ``record`` is the directory's record, if any."""

    action: str
    line: str = ""
    checkpoint: Path | None = None
    record: dict | None = None


class RunDirNotShared(RuntimeError):
    """Some node's marker is missing in rank 0's view of the run directory."""


class RunDir:
    """A run directory: its files by name, its record (read, merged, written), its checkpoints, what a run
    started in it does, the command that resumes it, its failure files and its node markers."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    # -------------------------------------------------------------------------------------------- files
    @property
    def record_file(self) -> Path:
        return self.path / record.RECORD_FILE

    @property
    def log_file(self) -> Path:
        return self.path / record.LOG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def log_tail(self, name: str = record.LOG_FILE, max_chars: int = 4000) -> str:
        """The end of what the processes printed into the log ``name`` (empty when nothing was)."""
        path = self.path / name
        if not path.is_file():
            return ""
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_chars))
            return f.read().decode("utf-8", errors="replace")

    # ------------------------------------------------------------------------------------------- record
    def read(self) -> dict[str, Any] | None:
        """The directory's record; None where it has none or it cannot be read (birder_repro.run.record)."""
        return record.read_record(self.path)

    def write(self, rec: Mapping[str, Any]) -> Path:
        """Write ``record.json`` atomically (a reader sees the old record or the new one, never half of one):
        the one writer of a run's record. Every key must be documented in birder_repro.run.schema (a
        ValueError names any that is not)."""
        schema.check(rec)
        self.path.mkdir(parents=True, exist_ok=True)  # a run refused before its files were written has none yet
        record.atomic_write(self.record_file, json.dumps(rec, indent=2, default=record.json_default) + "\n")
        return self.record_file

    def write_failed(self, cfg: DictConfig, error: str, **fields: Any) -> dict[str, Any]:
        """Write the record of a run that failed (``error``: one line; ``fields`` may add the ``traceback``)."""
        rec = record.failed_record(cfg, self.path, error, **fields)
        self.write(rec)
        return rec

    def fresh_record(self, started: str) -> dict[str, Any] | None:
        """The record if it was written since the launch that ``started`` then (a resumed run's directory holds
        the previous attempt's), else None."""
        rec = self.read()
        try:
            ended = _dt.datetime.fromisoformat(str((rec or {}).get("ended")))
            return rec if ended >= _dt.datetime.fromisoformat(started) else None
        except ValueError:
            return None

    def relay_user_command(self, cfg: DictConfig, files: Mapping[str, str]) -> None:
        """Put the user's command and launcher back into the record that one node's CLI wrote (cluster=emulated:
        each node ran its own share), so that the record describes, and resumes, what the user typed."""
        rec = self.read()
        if rec is None or not isinstance(rec.get("config"), dict):
            return
        rec["command"] = files.get(record.COMMAND_FILE, "").strip() or rec.get("command")
        rec["config"]["launcher"] = OmegaConf.to_container(cfg.launcher, resolve=True)
        if rec.get("resume_command"):  # an interrupted run: resumed by the user's command, not node 0's
            users = self.resume_command()
            rec["error"] = str(rec.get("error") or "").replace(rec["resume_command"], users)
            rec["resume_command"] = users
        self.write(rec)

    def resume_command(self, command: str | None = None) -> str:
        """The command that continues the run in this directory (birder_repro.run.record.resume_command)."""
        return record.resume_command(self.path, command)

    # ----------------------------------------------------------------------------------------- attempts
    def previous_attempts(self, env: Mapping[str, str] = os.environ) -> list[dict]:
        """The attempts before this launch, from the record already here (:func:`previous_attempts`)."""
        return previous_attempts(self.read(), env)

    def reached_step(self) -> int | None:
        """The last step rank 0 completed here (its ``progress.json``), None where unknown."""
        try:
            return int(json.loads((self.path / PROGRESS).read_text())["step"])
        except (OSError, ValueError, KeyError):
            return None

    # -------------------------------------------------------------------------------------- checkpoints
    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, directory) of every complete checkpoint here, oldest first."""
        return complete_checkpoints(self.checkpoints)

    def newest_checkpoint(self) -> Path | None:
        found = self.complete_checkpoints()
        return found[-1][1] if found else None

    def newest_step(self) -> int:
        """The step of the newest complete checkpoint (0: none)."""
        found = self.complete_checkpoints()
        return found[-1][0] if found else 0

    # ------------------------------------------------------------------------------------------ deciding
    def decide(self, cell: str | None = None) -> Decision:
        """What the record (and checkpoints) say a run of cell digest ``cell`` started here should do (module
        docstring). A directory with config files but no record is a run another node's CLI has just started:
        join it. A finished run, or one with a checkpoint, of another configuration is never continued or
        overwritten."""
        rec = self.read()
        if rec is None:
            return Decision("start")
        status, checkpoint = rec.get("status"), self.newest_checkpoint()
        keeps = status in FINISHED or (status in RESUMABLE and checkpoint is not None)  # something not to lose
        if keeps and cell and rec.get("config_digest") not in (None, cell):
            return Decision(
                "stop",
                f"{self.path} holds a {status} run of another configuration (config digest "
                f"{rec.get('config_digest')}, this one {cell}): resume it with its own settings "
                f"(its command.txt), or choose another hydra.run.dir or launcher.rdzv_id",
                record=rec,
            )
        if status in FINISHED:
            return Decision(
                "stop",
                f"{self.path} already holds a {status} run: set launcher.rdzv_id=<a new name> (or "
                "hydra.run.dir=<a new directory>) for a new run",
                record=rec,
            )
        if keeps:
            return Decision("resume", checkpoint=checkpoint, record=rec)
        return Decision("start", record=rec)  # nothing to continue from: the same run, afresh, in the same place

    # ------------------------------------------------------------------------------------------ failures
    def clear_failures(self) -> None:
        """Forget the failure files of earlier launches (a run's end names this launch's failures only)."""
        shutil.rmtree(self.path / FAILURES_DIR, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ node markers
    def marker(self, token: int, node: int) -> Path:
        """Node ``node``'s marker of the start ``token`` (the shared-file-system check)."""
        return self.path / NODES_DIR / f"{token:x}-node{node:05d}"

    def write_marker(self, token: int, node: int) -> None:
        path = self.marker(token, node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{socket.gethostname()} pid {os.getpid()}\n")

    def missing_nodes(self, token: int, nodes: int) -> list[int]:
        """The nodes whose marker of this start (``token``) is not seen here."""
        return [k for k in range(nodes) if not self.marker(token, k).is_file()]

    def remove_markers(self, token: int, nodes: int) -> None:
        for k in range(nodes):
            self.marker(token, k).unlink(missing_ok=True)

    def not_shared_line(self, missing: list[int], token: int) -> str:
        """The one line every rank stops with when the directory is not on a file system every node shares."""
        first = self.marker(token, missing[0]) if missing else self.path / NODES_DIR
        nodes = ", ".join(map(str, missing)) or "some node"
        return (
            f"the run directory {self.path.resolve()} is not shared by every node: rank 0 does not see the "
            f"marker of node(s) {nodes} ({first.name} in {first.parent}); BIRDER_RUNS or hydra.run.dir must be on "
            "a file system every node shares, the same path on every node"
        )

    def done_marker(self, node: int) -> Path:
        """Where the CLI of node ``node`` (> 0) says it has reported its ranks' deaths (birder_repro.run.finish)."""
        return self.path / NODES_DIR / f"cli-node{node}.done"

    def mark_done(self, node: int, code: int) -> None:
        marker = self.done_marker(node)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{code}\n")


# ------------------------------------------------------------------------------------------ attempts
def previous_attempts(rec: Mapping | None, env: Mapping[str, str] = os.environ) -> list[dict]:
    """The attempts before this launch, from the record already in the run directory (None: a new run). A record
    from before attempts were kept counts as one attempt."""
    if not rec:
        return []
    launch = env.get(LAUNCH_ENV)
    attempts = list(rec.get("attempts") or [])
    if not attempts and rec.get("status") in RESUMABLE:
        attempts = [
            {
                "launch": None,
                "started": rec.get("started"),
                "ended": rec.get("ended"),
                "status": rec["status"],
                "from_step": rec.get("resumed_from_step"),
                "to_step": rec.get("stopped_at_step"),
                "restarts": rec.get("restarts"),
            }
        ]
    return [a for a in attempts if launch is None or a.get("launch") != launch]


def attempt_entry(
    status: str,
    started: str | None,
    ended: str | None,
    from_step: int | None,
    to_step: int | None,
    restarts: int = 0,
    env: Mapping[str, str] = os.environ,
) -> dict:
    """This launch's entry of the record's ``attempts``."""
    return {
        "launch": env.get(LAUNCH_ENV),
        "started": started,
        "ended": ended,
        "status": status,
        "from_step": from_step,
        "to_step": to_step,
        "restarts": restarts,
    }


# ------------------------------------------------------------------------------------------ where a run goes
def find_resumable(root: Path, cell: str) -> Path | None:
    """The newest run directory under ``root`` whose record is interrupted or failed, of cell digest ``cell``,
    and that has a complete checkpoint; None if there is none. Newest: the record's ``ended`` time."""
    found = []
    for path in record.find_records(Path(root)):
        run = RunDir(path.parent)
        rec = run.read()
        if not rec or rec.get("status") not in RESUMABLE or rec.get("config_digest") != cell:
            continue
        if run.newest_checkpoint() is not None:
            found.append((str(rec.get("ended") or ""), path.stat().st_mtime, path.parent))
    return max(found)[2] if found else None


RdzvId = Callable[[DictConfig], "str | None"]  # a torchrun run's rendezvous id; None for the other launchers


def job_dir(cfg: DictConfig, resolved: DictConfig | None, hydra_dir: Path | None, given: bool, rdzv_id: RdzvId) -> Path:
    """The run directory: ``hydra.run.dir`` where ``given`` (the same on every node); else, once the config is
    ``resolved``, the run ``train.resume=auto`` continues, or a torchrun run's directory named after its
    rendezvous id (every node derives the same one, in a sweep too: each cell has its own id); else Hydra's
    (``hydra_dir``: run.dir, or sweep.dir/subdir in a sweep); a fresh one outside Hydra. Hydra's own directory is
    removed where another is chosen and it holds nothing but Hydra's files."""
    if resolved is None or (hydra_dir is not None and given):
        return hydra_dir or record.new_run_dir(cfg)
    chosen = chosen_dir(resolved, rdzv_id)
    if chosen is None:
        return hydra_dir or record.new_run_dir(cfg)
    if hydra_dir is not None and hydra_dir.resolve() != chosen.resolve():
        remove_if_unused(hydra_dir)
    return chosen


def chosen_dir(cfg: DictConfig, rdzv_id: RdzvId) -> Path | None:
    """``train.resume=auto``'s run (saying in one line when there is none), else a torchrun run's directory
    under the runs root named by its rendezvous id; None: the caller's (Hydra's) directory."""
    if OmegaConf.select(cfg, "train.resume", default=None) == "auto" and not cfg.get("dry_run"):
        cell = cell_digest(cfg)
        found = find_resumable(record.runs_root(), cell)
        if found is not None:
            print(f"[birder-repro] train.resume=auto: continuing {found}", flush=True)
            return found
        print(
            f"[birder-repro] train.resume=auto: no interrupted or failed run of this configuration (config digest "
            f"{cell}) with a complete checkpoint under {record.runs_root()}: starting afresh",
            flush=True,
        )
    name = rdzv_id(cfg)
    return record.runs_root() / name if name is not None else None


def remove_if_unused(path: Path) -> None:
    """Remove Hydra's directory for this job where it holds only Hydra's own files (.hydra/, an empty log)."""
    if not path.is_dir():
        return
    if any(
        p.name != ".hydra" and not (p.suffix == ".log" and p.is_file() and p.stat().st_size == 0)
        for p in path.iterdir()
    ):
        return
    shutil.rmtree(path, ignore_errors=True)
    try:
        path.parent.rmdir()  # the day's directory, if this was its only run
    except OSError:
        pass


def prepare_in_place(cfg: DictConfig, run_dir: Path, node: int) -> bool:
    """What the run directory already holds decides (:meth:`RunDir.decide`): a completed or diverged run stops
    here in one line (False); an interrupted or failed one with a checkpoint is resumed in place, as its next
    attempt (``train.resume=auto`` set in ``cfg``). ``node``: this CLI's node (``launcher.node_rank``; 0 for
    every launcher but torchrun): node 0's CLI writes the record, the others only their done markers."""
    if cfg.get("dry_run"):
        return True
    run = RunDir(run_dir)
    decision = run.decide(cell_digest(cfg))
    if decision.action == "stop":
        print(f"[birder-repro] {decision.line}", file=sys.stderr, flush=True)
        return False
    if decision.record is not None and node == 0:  # this launch's failures only (birder_repro.run.failures)
        run.clear_failures()
    if node != 0:  # this node's CLI says it is done afresh (birder_repro.run.finish)
        run.done_marker(node).unlink(missing_ok=True)
    status = (decision.record or {}).get("status")
    held = f"{run_dir} holds {'an' if status == 'interrupted' else 'a'} {status} run"
    if decision.action == "resume":
        cfg.train.resume = "auto"  # the workers take the directory's newest complete checkpoint
        print(f"[birder-repro] {held}: resuming it from {decision.checkpoint.name}", flush=True)
    elif decision.record is not None:
        print(f"[birder-repro] {held} without a complete checkpoint: running it again from step 0", flush=True)
    return True
