"""What the launchers know about who tells a run's end: this CLI's node, whether the run spans nodes, this
node's own log, whether the user's CLI relays it (``cluster=emulated``), and how a record is summarised.

birder_repro.run.finish tells the end of a run, one layer below the launchers; the CLI and the SLURM job's end
(birder_repro.launch.job_end) hand it these facts as one :class:`~birder_repro.run.finish.Teller`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from birder_repro.launch import choose_launcher, emulated_nodes, torchrun
from birder_repro.run.finish import Teller
from birder_repro.run.record import LOG_FILE
from birder_repro.run.summary import format_summary

__all__ = ["node_of", "teller", "summarize"]


def node_of(cfg: DictConfig) -> int:
    """This CLI's node: ``launcher.node_rank`` under torchrun, else 0 (one CLI starts every process); 0 for a
    config the launcher refuses, whose failure is this CLI's to report. Node 0's CLI may write the record."""
    try:
        return torchrun.node_rank(cfg) if choose_launcher(cfg) == "torchrun" else 0
    except Exception:  # noqa: BLE001 - a config the launcher refuses: that failure is this CLI's to report
        return 0


def teller(cfg: DictConfig) -> Teller:
    """The facts birder_repro.run.finish needs to tell this run's end from this CLI."""
    node = node_of(cfg)
    per_node = choose_launcher(cfg) == "torchrun"
    return Teller(
        node=node,
        multi_node=per_node and int(cfg.nodes) > 1,
        relayed=emulated_nodes.node_index() is not None,
        log_name=torchrun.log_name(cfg) if per_node else LOG_FILE,
        summarize=summarize,
    )


def summarize(rec: Mapping[str, Any]) -> str:
    """A record's summary: ``mode=probe``'s (the collectives' table and the cluster spec), else a run's."""
    if rec.get("probe"):
        from birder_repro.perf.probe import format_probe  # in the function: perf.probe imports torch, the CLI not

        return format_probe(rec)
    return format_summary(rec)
