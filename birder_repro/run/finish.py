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

import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from birder_repro.run import record
from birder_repro.run.directory import RunDir, attempt_entry
from birder_repro.run.failures import final_line, write_signal_deaths
from birder_repro.run.summary import format_summary

__all__ = [
    "SIGNALLED",
    "SIGNAL_NAMES",
    "DIVERGED",
    "Teller",
    "finish_run",
    "print_summary",
    "interrupted",
    "failed",
    "other_node",
]

SIGNAL_NAMES = {129: "SIGHUP", 130: "SIGINT", 143: "SIGTERM"}  # 128 + the signal: the CLI passed it on
SIGNALLED = tuple(SIGNAL_NAMES)  # (launch.process)
WAIT_FOR_NODES_S = 10.0
DIVERGED = 3  # the exit code of a run stopped as diverged (train.diverge_after): not a crash, and no result either


@dataclass(frozen=True)
class Teller:
    """Who tells the run's end, as its launcher knows it (birder_repro.launch.ending builds it; handed in, so
    that this module, below the launchers, never asks them): ``node`` (``launcher.node_rank``; 0 for every
    launcher but torchrun) writes the record where it is 0; ``multi_node``: one torchrun per node, several
    nodes; ``relayed``: one node's CLI of ``cluster=emulated``, whose lines the user's CLI relays and which
    leaves the summary to it; ``log_name``: this node's own log of its torchrun; ``summarize``: the record's
    summary (``mode=probe`` has its own)."""

    node: int = 0
    multi_node: bool = False
    relayed: bool = False
    log_name: str = record.LOG_FILE
    summarize: Callable[[Mapping], str] = format_summary


def finish_run(
    cfg: DictConfig, run_dir: Path, code: int, started: str, teller: Teller = Teller(), command_line: str = ""
) -> int:
    """After the workers: an interrupted run ends with the command that resumes it, last; a failed or diverged
    run in one line (its record's ``error``), last; a completed one in its summary. Only a record written
    since this launch ``started`` counts (a resumed run's directory holds the previous attempt's). The CLIs of
    nodes other than 0 (``teller.node``) only say where rank 0's record is."""
    run = RunDir(run_dir)
    rec = run.fresh_record(started)
    if teller.node != 0:
        return other_node(run, code, rec, command_line or record.read_command(run_dir) or "", teller)
    status = (rec or {}).get("status")
    if status == "diverged":
        _say(f"record: {run.record_file}")
        _say(str(rec["error"]))
        return DIVERGED
    if status == "interrupted" or (code in SIGNALLED and status != "completed"):
        return interrupted(cfg, run, code, started, rec, teller)
    if code != 0 and status != "completed":
        return failed(cfg, run, code, started, rec, run.log_tail(record.LOG_FILE, 20000), teller)
    if rec is None:
        print(f"[birder-repro] the workers finished; no {record.RECORD_FILE} in {run_dir}", flush=True)
        return code
    if teller.relayed:  # the user's CLI, which relays this node's lines prefixed, tells the summary once
        return code
    print_summary(rec, teller.summarize)
    print(f"[birder-repro] record: {run.record_file}", flush=True)
    return code


def print_summary(rec: dict, summarize: Callable[[Mapping], str] = format_summary) -> None:
    """The run's summary (``summarize``: mode=probe's is the collectives' table and the cluster spec)."""
    try:
        print(summarize(rec), flush=True)
    except Exception:  # noqa: BLE001 - the run is done and recorded; a summary bug must not stop a sweep
        print(f"[birder-repro] could not summarise the record:\n{traceback.format_exc()}", file=sys.stderr)


def _say(line: str) -> None:
    print(f"[birder-repro] {line}", file=sys.stderr, flush=True)


def _this_attempt(run: RunDir, status: str, started: str) -> dict:
    return attempt_entry(status, started, record.now(), None, run.reached_step())


def interrupted(cfg: DictConfig, run: RunDir, code: int, started: str, rec: dict | None, teller: Teller) -> int:
    """A run a signal stopped: its record (the CLI's where rank 0 wrote none), then the resume command, last."""
    if rec is None or rec.get("status") != "interrupted":  # the workers did not get to write it in time
        signal = SIGNAL_NAMES.get(code, "SIGINT")  # a stop without a signal's code: the CLI's own Ctrl-C
        rec = record.interrupted_record(
            cfg,
            run.path,
            run.reached_step(),
            signal,
            run.newest_checkpoint(),
            started=started,
            attempts=[*run.previous_attempts(), _this_attempt(run, "interrupted", started)],
        )
        run.write(rec)
    _say(f"{rec['error'].split('; resume: ')[0]}; record: {run.record_file}")
    if teller.multi_node:
        _say("resume: run on every node its own command with this hydra.run.dir (node 0's below)")
    _say(f"resume: {rec['resume_command']}")
    return code if code in SIGNALLED else 130


def failed(
    cfg: DictConfig, run: RunDir, code: int, started: str, rec: dict | None, log_text: str, teller: Teller
) -> int:
    """A failed run: the first failing rank (every node's failure files), the record, one line last."""
    if teller.multi_node:
        _wait_for_other_nodes(cfg, run)
    line, trace = final_line(run.path, code, log_text)
    if rec is None:  # the workers died before rank 0 could write (killed, crashed)
        rec = record.failed_record(
            cfg,
            run.path,
            line,
            started=started,
            attempts=[*run.previous_attempts(), _this_attempt(run, "failed", started)],
        )
    rec.update(status="failed", error=line, traceback=trace or rec.get("traceback"))
    run.write(rec)
    _say(f"run failed (exit code {code}); record: {run.record_file}")
    _say(line)
    return code


def _wait_for_other_nodes(cfg: DictConfig, run: RunDir) -> None:
    """Give the other nodes' CLIs a few seconds to report their ranks' deaths (their ``.done`` markers)."""
    deadline = time.monotonic() + WAIT_FOR_NODES_S
    others = [run.done_marker(k) for k in range(1, int(cfg.nodes))]
    while time.monotonic() < deadline and not all(m.is_file() for m in others):
        time.sleep(0.2)


def other_node(run: RunDir, code: int, rec: dict | None, command: str, teller: Teller) -> int:
    """A node other than 0 (``launcher.node_rank`` > 0): never a record of its own; where the run's is, and
    what its own torchrun saw, for node 0's CLI to name."""
    node, where = teller.node, run.record_file
    own_log = run.log_tail(teller.log_name, 20000)
    if code != 0 and code not in SIGNALLED:
        write_signal_deaths(run.path, own_log, node)
    run.mark_done(node, code)
    status = (rec or {}).get("status")
    if status == "interrupted" or code in SIGNALLED:
        what = rec["error"].split("; resume: ")[0] if status == "interrupted" else "interrupted"
        _say(f"node {node}: {what}; the run's record (rank 0 writes it): {where}")
        _say(f"resume (this node): {run.resume_command(command)}")  # this node's own CLI command
        return code if code in SIGNALLED else 130
    if code != 0:  # the first failure this node sees (all of them, where the run directory is shared), last
        _say(
            f"node {node}: the workers exited with code {code}; the run's record (rank 0's, or node 0's CLI's): {where}"
        )
        _say(final_line(run.path, code, own_log)[0])
        return code
    print(f"[birder-repro] node {node}: the workers finished; the run's record: {where}", flush=True)
    return code
