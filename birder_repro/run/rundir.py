"""One run, one directory, however it is launched: the run's identity, what a directory already holds, the check
that every node sees it, and the run that ``train.resume=auto`` continues.

- Two digests of the resolved config (birder_repro.run.digest): :func:`run_digest` leaves out only what differs between
  the nodes of one run (``launcher.node_rank``) or starts nothing (``dry_run``); it names the default rendezvous
  id, hence the run directory every node of a torchrun run derives alike (birder_repro.launch.torchrun).
  :func:`cell_digest` also leaves out what cannot change a result (:data:`NO_RESULT`): runs with the same cell
  digest are the same experiment, seed included, and ``train.resume=auto`` continues only such a run.
- What a directory holds decides what a run started in it does (:func:`decide`): nothing yet (or only the files
  another node's CLI has just written): start, or join; a completed or diverged run: stop; an interrupted or
  failed run with a complete checkpoint: resume it in place, as its next attempt.
- The shared file system is a fact to check, not to assume (:func:`check_shared`): the first process of every
  node writes a marker into ``nodes/``, and after a barrier rank 0 must see all of them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PER_NODE",
    "NO_RESULT",
    "digest",
    "run_digest",
    "cell_digest",
    "Decision",
    "decide",
    "find_resumable",
    "LAUNCH_ENV",
    "NODES_DIR",
    "RunDirNotShared",
    "missing_nodes",
    "not_shared_line",
    "check_shared",
]

# The run's identity (digests) and the shared names live one layer down, where the record and the launchers
# can import them too; re-exported here for the callers that decide about a directory.
from birder_repro.run.digest import LAUNCH_ENV, NO_RESULT, NODES_DIR, PER_NODE, cell_digest, digest, run_digest

RESUMABLE = ("interrupted", "failed")  # statuses a run directory can be continued from (with a checkpoint)
FINISHED = ("completed", "diverged")  # ... and those it cannot: running it again would redo the same run


# ------------------------------------------------------------------------------ what a directory holds
@dataclass(frozen=True)
class Decision:
    """What a run started in ``run_dir`` does: ``start`` (afresh), ``resume`` (from ``checkpoint``, in place)
    or ``stop`` (``line`` says why); ``record`` is the directory's record, if any."""

    action: str
    line: str = ""
    checkpoint: Path | None = None
    record: dict | None = None


def _newest_checkpoint(run_dir: Path) -> Path | None:
    from birder_repro.train.checkpoint import CHECKPOINTS, complete_checkpoints

    found = complete_checkpoints(Path(run_dir) / CHECKPOINTS)
    return found[-1][1] if found else None


def decide(run_dir: Path, cell: str | None = None) -> Decision:
    """What the directory's record (and checkpoints) say a run of cell digest ``cell`` started there should do
    (module docstring). A directory with config files but no record is a run another node's CLI has just
    started: join it. A finished run, or one with a checkpoint, of another configuration is never continued
    or overwritten."""
    from birder_repro.run import record

    rec = record.read_record(run_dir)
    if rec is None:
        return Decision("start")
    status, checkpoint = rec.get("status"), _newest_checkpoint(run_dir)
    keeps = status in FINISHED or (status in RESUMABLE and checkpoint is not None)  # something not to lose
    if keeps and cell and rec.get("config_digest") not in (None, cell):
        return Decision(
            "stop",
            f"{run_dir} holds a {status} run of another configuration (config digest "
            f"{rec.get('config_digest')}, this one {cell}): resume it with its own settings "
            f"(its command.txt), or choose another hydra.run.dir or launcher.rdzv_id",
            record=rec,
        )
    if status in FINISHED:
        return Decision(
            "stop",
            f"{run_dir} already holds a {status} run: set launcher.rdzv_id=<a new name> (or "
            "hydra.run.dir=<a new directory>) for a new run",
            record=rec,
        )
    if keeps:
        return Decision("resume", checkpoint=checkpoint, record=rec)
    return Decision("start", record=rec)  # nothing to continue from: the same run, afresh, in the same place


def find_resumable(root: Path, cell: str) -> Path | None:
    """The newest run directory under ``root`` whose record is interrupted or failed, of cell digest ``cell``,
    and that has a complete checkpoint; None if there is none. Newest: the record's ``ended`` time."""
    from birder_repro.run import record

    found = []
    for path in record.find_records(Path(root)):
        rec = record.read_record(path.parent)
        if not rec or rec.get("status") not in RESUMABLE or rec.get("config_digest") != cell:
            continue
        if _newest_checkpoint(path.parent) is not None:
            found.append((str(rec.get("ended") or ""), path.stat().st_mtime, path.parent))
    return max(found)[2] if found else None


# ------------------------------------------------------------------------------ every node sees it
class RunDirNotShared(RuntimeError):
    """Some node's marker is missing in rank 0's view of the run directory."""


def _marker(run_dir: Path, token: int, node: int) -> Path:
    return Path(run_dir) / NODES_DIR / f"{token:x}-node{node:05d}"


def missing_nodes(run_dir: Path, token: int, nodes: int) -> list[int]:
    """The nodes whose marker of this start (``token``) rank 0 does not see."""
    return [k for k in range(nodes) if not _marker(run_dir, token, k).is_file()]


def not_shared_line(run_dir: Path, missing: list[int], token: int) -> str:
    """The one line every rank stops with when the run directory is not on a file system every node shares."""
    first = _marker(run_dir, token, missing[0]) if missing else Path(run_dir) / NODES_DIR
    nodes = ", ".join(map(str, missing)) or "some node"
    return (
        f"the run directory {Path(run_dir).resolve()} is not shared by every node: rank 0 does not see the "
        f"marker of node(s) {nodes} ({first.name} in {first.parent}); BIRDER_RUNS or hydra.run.dir must be on "
        "a file system every node shares, the same path on every node"
    )


def check_shared(run_dir: Path, rank: int, local_rank: int, local_world: int, world: int, device) -> None:
    """Every node's first process writes a marker; rank 0 must see them all, else every rank raises
    :class:`RunDirNotShared` with the same line. Collective; a fresh token per start, so that markers of an
    earlier attempt never count."""
    import random

    from birder_repro.train.collectives import allreduce_sum, barrier, broadcast_from_rank0

    nodes = max(1, world // max(1, local_world))
    token = int(broadcast_from_rank0([float(random.getrandbits(48)) if rank == 0 else 0.0], device)[0])
    if local_rank == 0:
        path = _marker(run_dir, token, rank // max(1, local_world))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{socket.gethostname()} pid {os.getpid()}\n")
    barrier()
    missing = missing_nodes(run_dir, token, nodes) if rank == 0 else []
    flags = allreduce_sum([1.0 if k in missing else 0.0 for k in range(nodes)], device)
    missing = [k for k, flag in enumerate(flags) if flag]
    if missing:
        raise RunDirNotShared(not_shared_line(run_dir, missing, token))
    if rank == 0:  # seen: the markers have done their job
        for k in range(nodes):
            _marker(run_dir, token, k).unlink(missing_ok=True)
