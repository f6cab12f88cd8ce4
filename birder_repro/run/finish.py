"""How a run's end is told, once, by the CLI after its workers and by a SLURM job's batch script after srun
(:func:`finish_run`): a completed run's summary; interrupted, the command that resumes it, last; failed or
diverged, one line, last; and what the CLIs of nodes other than 0 say.

One record per run: rank 0's worker writes it, whichever node it runs on. Node 0's CLI (``launcher.node_rank``
0) writes it only where the workers could not (killed before rank 0 wrote, a SIGKILL after the stop grace), and
improves a failed record's line from every rank's failure files. The CLIs of the other nodes never write the
record: they print where it is, and hand node 0's CLI what only they saw, the ranks their torchrun reports dead
by a signal, as failure files (birder_repro.run.failures), then say they are done (``nodes/cli-node<k>.done``), which
node 0's CLI waits for a few seconds before it names the failing rank.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.run import record

__all__ = [
    "SIGNALLED",
    "SIGNAL_NAMES",
    "DIVERGED",
    "finish_run",
    "print_summary",
    "fresh_record",
    "interrupted",
    "failed",
    "other_node",
]

SIGNAL_NAMES = {129: "SIGHUP", 130: "SIGINT", 143: "SIGTERM"}  # 128 + the signal: the CLI passed it on
SIGNALLED = tuple(SIGNAL_NAMES)  # (launch.process)
WAIT_FOR_NODES_S = 10.0
DIVERGED = 3  # the exit code of a run stopped as diverged (train.diverge_after): not a crash, and no result either


def finish_run(
    cfg: DictConfig, run_dir: Path, code: int, started: str, writes_record: bool = True, command_line: str = ""
) -> int:
    """After the workers: an interrupted run ends with the command that resumes it, last; a failed or diverged
    run in one line (its record's ``error``), last; a completed one in its summary. Only a record written
    since this launch ``started`` counts (a resumed run's directory holds the previous attempt's).
    ``writes_record``: false on the CLIs of nodes other than 0, which only say where rank 0's record is."""
    from birder_repro.launch import log_tail

    rec = fresh_record(run_dir, started)
    if not writes_record:
        return other_node(cfg, run_dir, code, rec, command_line or record.read_command(run_dir) or "")
    status = (rec or {}).get("status")
    if status == "diverged":
        _say(f"record: {run_dir / record.RECORD_FILE}")
        _say(str(rec["error"]))
        return DIVERGED
    if status == "interrupted" or (code in SIGNALLED and status != "completed"):
        return interrupted(cfg, run_dir, code, started, rec)
    if code != 0 and status != "completed":
        return failed(cfg, run_dir, code, started, rec, log_tail(run_dir / record.LOG_FILE, 20000))
    if rec is None:
        print(f"[birder-repro] the workers finished; no {record.RECORD_FILE} in {run_dir}", flush=True)
        return code
    if _emulated_node():  # the user's CLI, which relays this node's lines prefixed, tells the summary once
        return code
    print_summary(rec)
    print(f"[birder-repro] record: {run_dir / record.RECORD_FILE}", flush=True)
    return code


def _emulated_node() -> bool:
    """Whether this CLI is one node's of ``cluster=emulated``, started by the user's CLI (launch.emulated)."""
    from birder_repro.launch.emulated import node_index

    return node_index() is not None


def print_summary(rec: dict) -> None:
    """The run's summary (mode=probe: the collectives' table and the cluster spec)."""
    import traceback

    from birder_repro.run.summary import format_summary

    if rec.get("probe"):
        from birder_repro.perf.probe import format_probe as format_summary

    try:
        print(format_summary(rec), flush=True)
    except Exception:  # noqa: BLE001 - the run is done and recorded; a summary bug must not stop a sweep
        print(f"[birder-repro] could not summarise the record:\n{traceback.format_exc()}", file=sys.stderr)


def _say(line: str) -> None:
    print(f"[birder-repro] {line}", file=sys.stderr, flush=True)


def fresh_record(run_dir: Path, started: str) -> dict | None:
    """The run directory's record if it was written since this launch ``started``, else None."""
    rec = record.read_record(run_dir)
    try:
        ended = _dt.datetime.fromisoformat(str((rec or {}).get("ended")))
        return rec if ended >= _dt.datetime.fromisoformat(started) else None
    except ValueError:
        return None


def _stale_attempts(run_dir: Path) -> list:
    from birder_repro.train.restarts import previous_attempts

    return previous_attempts(record.read_record(run_dir))


def _this_attempt(run_dir: Path, status: str, started: str) -> dict:
    from birder_repro.train.restarts import attempt_entry, reached_step

    return attempt_entry(status, started, record.now(), None, reached_step(run_dir))


def _multi_node(cfg: DictConfig) -> bool:
    from birder_repro.launch import choose_launcher

    return choose_launcher(cfg) == "torchrun" and int(cfg.nodes) > 1


def interrupted(cfg: DictConfig, run_dir: Path, code: int, started: str, rec: dict | None) -> int:
    """A run a signal stopped: its record (the CLI's where rank 0 wrote none), then the resume command, last."""
    from birder_repro.train.checkpoint import CHECKPOINTS, complete_checkpoints
    from birder_repro.train.restarts import reached_step

    if rec is None or rec.get("status") != "interrupted":  # the workers did not get to write it in time
        found = complete_checkpoints(Path(run_dir) / CHECKPOINTS)
        signal = SIGNAL_NAMES.get(code, "SIGINT")  # a stop without a signal's code: the CLI's own Ctrl-C
        rec = record.interrupted_record(
            cfg,
            run_dir,
            reached_step(run_dir),
            signal,
            found[-1][1] if found else None,
            started=started,
            attempts=[*_stale_attempts(run_dir), _this_attempt(run_dir, "interrupted", started)],
        )
        record.write_record(run_dir, rec)
    _say(f"{rec['error'].split('; resume: ')[0]}; record: {Path(run_dir) / record.RECORD_FILE}")
    if _multi_node(cfg):
        _say("resume: run on every node its own command with this hydra.run.dir (node 0's below)")
    _say(f"resume: {rec['resume_command']}")
    return code if code in SIGNALLED else 130


def failed(cfg: DictConfig, run_dir: Path, code: int, started: str, rec: dict | None, log_text: str) -> int:
    """A failed run: the first failing rank (every node's failure files), the record, one line last."""
    from birder_repro.run.failures import final_line

    if _multi_node(cfg):
        _wait_for_other_nodes(cfg, run_dir)
    line, trace = final_line(run_dir, code, log_text)
    if rec is None:  # the workers died before rank 0 could write (killed, crashed)
        rec = record.failed_record(
            cfg,
            run_dir,
            line,
            started=started,
            attempts=[*_stale_attempts(run_dir), _this_attempt(run_dir, "failed", started)],
        )
    rec.update(status="failed", error=line, traceback=trace or rec.get("traceback"))
    record.write_record(run_dir, rec)
    _say(f"run failed (exit code {code}); record: {Path(run_dir) / record.RECORD_FILE}")
    _say(line)
    return code


def _done_marker(run_dir: Path, node: int) -> Path:
    from birder_repro.run.digest import NODES_DIR

    return Path(run_dir) / NODES_DIR / f"cli-node{node}.done"


def _wait_for_other_nodes(cfg: DictConfig, run_dir: Path) -> None:
    """Give the other nodes' CLIs a few seconds to report their ranks' deaths (their ``.done`` markers)."""
    deadline = time.monotonic() + WAIT_FOR_NODES_S
    others = [_done_marker(run_dir, k) for k in range(1, int(cfg.nodes))]
    while time.monotonic() < deadline and not all(m.is_file() for m in others):
        time.sleep(0.2)


def other_node(cfg: DictConfig, run_dir: Path, code: int, rec: dict | None, command: str) -> int:
    """A node other than 0 (``launcher.node_rank`` > 0): never a record of its own; where the run's is, and
    what its own torchrun saw, for node 0's CLI to name."""
    from birder_repro.launch import log_tail, torchrun
    from birder_repro.run.failures import final_line, write_signal_deaths

    node = torchrun.node_rank(cfg)
    where = Path(run_dir) / record.RECORD_FILE
    own_log = log_tail(Path(run_dir) / torchrun.log_name(cfg), 20000)
    if code != 0 and code not in SIGNALLED:
        write_signal_deaths(run_dir, own_log, node)
    marker = _done_marker(run_dir, node)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{code}\n")
    status = (rec or {}).get("status")
    if status == "interrupted" or code in SIGNALLED:
        what = rec["error"].split("; resume: ")[0] if status == "interrupted" else "interrupted"
        _say(f"node {node}: {what}; the run's record (rank 0 writes it): {where}")
        _say(f"resume (this node): {record.resume_command(run_dir, command)}")  # this node's own CLI command
        return code if code in SIGNALLED else 130
    if code != 0:  # the first failure this node sees (all of them, where the run directory is shared), last
        _say(
            f"node {node}: the workers exited with code {code}; the run's record (rank 0's, or node 0's CLI's): {where}"
        )
        _say(final_line(run_dir, code, own_log)[0])
        return code
    print(f"[birder-repro] node {node}: the workers finished; the run's record: {where}", flush=True)
    return code
