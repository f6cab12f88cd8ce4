"""A run's identity as digests of its resolved config, and the names every layer shares for a run directory.

:func:`run_digest` leaves out only what differs between the nodes of one run (``launcher.node_rank``) or starts
nothing (``dry_run``): it names the default rendezvous id, hence the run directory every node of a torchrun run
derives alike (birder_repro.launch.torchrun). :func:`cell_digest` also leaves out what cannot change a result
(:data:`NO_RESULT`, each with why; a table's rows leave the same out): runs with the same cell digest are the same
experiment, seed included; the record carries it as ``config_digest`` and ``train.resume=auto`` continues only
such a run (birder_repro.run.directory).

Plain data in (birder_repro.config.plain), hex out: this module sits near the bottom of the layers
(docs/architecture.md), so that the record, the launchers and the training loop can all name a run the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from birder_repro.config.plain import plain_config

__all__ = ["PER_NODE", "NO_RESULT", "NODES_DIR", "LAUNCH_ENV", "digest", "run_digest", "cell_digest"]

# Settings that differ between the nodes of one run, or that start nothing.
PER_NODE = ("launcher.node_rank", "dry_run")
# The settings that cannot change what a run computes, each with why: where and how it is launched and logged,
# how often it checkpoints and how it resumes. The one list: the cell digest (here) and a table's rows
# (birder_repro.report.identity, which leaves out the seed besides) both leave these out; everything else (the
# seed included, here) makes another cell.
NO_RESULT: dict[str, str] = {
    "logger": "where metrics are written (W&B or metrics.jsonl only)",
    "launcher": "how the processes are started (local, torchrun per node, SLURM) and the rendezvous; the "
    "network is the cluster config's, which stays in",
    "dry_run": "a dry run writes no record",
    "train.resume": "which checkpoint a run resumed from: a resumed run is the same run (its record counts "
    "every attempt)",
    "train.resume_policy": "whether a resume may take a checkpoint of another layout: a run that resumes is the "
    "same run",
    "train.log_every": "log lines between steps, outside the timed steps and the training clock",
    "train.checkpoint_every": "checkpoints are left out of the clock, and restarts end bit-equal",
    "train.keep_checkpoints": "how many checkpoints stay on disk",
    "train.checkpoint_on_stop": "whether a stopped run saves a checkpoint",
    "train.max_restarts": "fault handling: a restarted run ends bit-equal to one that never failed",
    "train.timeout_s": "how long a collective waits for a peer before the run fails",
    "train.stop_timeout_s": "how long the workers get to stop after a signal",
    "task.target.ladder": "further levels the tables read from a run's evaluations (report.ladder); the run "
    "trains and stops the same",
}
NODES_DIR = "nodes"
LAUNCH_ENV = "BIRDER_LAUNCH"  # set by the CLI for its workers: the id of this launch (attempt) of the directory


def digest(cfg: Any, leave_out: Iterable[str]) -> str:
    """16 hex digits of sha256 over the config (plain data, keys sorted) less the dotted keys ``leave_out``."""
    data = plain_config(cfg)
    for dotted in leave_out:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_digest(cfg: Any) -> str:
    """The same on every node of one run, different for any other config (the default rendezvous id's)."""
    return digest(cfg, PER_NODE)


def cell_digest(cfg: Any) -> str:
    """The experiment this config runs, less the settings that cannot change its results (:data:`NO_RESULT`)."""
    return digest(cfg, NO_RESULT)
