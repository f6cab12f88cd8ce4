"""Probes of the timed steps: measurements that start right before the first timed step and stop right after
the last one, whose figures go into the run record.

A probe has ``start()`` and ``stop(timed_steps) -> dict`` (record keys, :mod:`birder_repro.run.schema`); ``stop``
may be collective, so every rank calls it at the same point. The training loop starts them after the timing
warm-up and the compute calibration (which sends nothing) and stops them before evaluation.

The one probe so far counts what a node's link really carried: the launcher of an emulated cluster names the
node's interface in ``BIRDER_LINK_IFACE``, and the worker on each node's local rank 0 reads the kernel's
counters of it (bytes and packets sent, with TCP's retransmitted segments) at the start and at the end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from birder_repro.netns import counters

__all__ = ["LINK_IFACE_ENV", "LinkCounters", "link_probe", "probes_for", "start_probes", "stop_probes"]

LINK_IFACE_ENV = "BIRDER_LINK_IFACE"  # set by the launcher: the interface whose counters a node's local rank 0 reads


def start_probes(probes: Sequence) -> None:
    for probe in probes:
        probe.start()


def stop_probes(probes: Sequence, timed_steps: int) -> dict[str, Any]:
    """Every probe's figures, merged (collective where a probe's ``stop`` is)."""
    fields: dict[str, Any] = {}
    for probe in probes:
        fields.update(probe.stop(timed_steps))
    return fields


def _read_counters(iface: str) -> dict[str, int]:
    return counters.read_counters(iface)  # the reader lives with the fabric whose interfaces it reads


def _header_bytes() -> int:
    return counters.FRAME_HEADER_BYTES


class LinkCounters:
    """This node's link counters over exactly the timed steps.

    The worker on each node's local rank 0 reads the kernel counters of the node's interface when the timed
    steps begin and when they end; :meth:`stop` (collective) gathers the per-step figures of every node,
    in node order (node = rank // gpus_per_node), for the record.
    """

    def __init__(self, iface: str, node: int, nodes: int, reader: bool) -> None:
        self.iface, self.node, self.nodes, self.reader = iface, node, nodes, reader
        self._start: dict[str, int] | None = None

    def start(self) -> None:
        if self.reader:
            self._start = _read_counters(self.iface)

    def stop(self, timed_steps: int) -> dict[str, Any]:
        import torch.distributed as dist

        mine = None
        if self.reader and self._start is not None:
            end = _read_counters(self.iface)
            mine = {
                "node": self.node,
                "iface": self.iface,
                **{k: (end[k] - self._start[k]) / max(timed_steps, 1) for k in end},
            }
        gathered = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        per_node = {g["node"]: g for g in gathered if g is not None}
        figure = lambda key: [per_node[k][key] if k in per_node else None for k in range(self.nodes)]  # noqa: E731
        return {
            "link_bytes_per_step": figure("tx_bytes"),
            "link_packets_per_step": figure("tx_packets"),
            "link_tcp_retransmits_per_step": figure("retrans_segs"),
            "link_interfaces": figure("iface"),
            "link_header_bytes_per_packet": _header_bytes(),
        }


def link_probe(topology, env: Mapping[str, str] = os.environ) -> LinkCounters | None:
    """The probe for this worker when its launcher named a link to count (``BIRDER_LINK_IFACE``), else None."""
    iface = env.get(LINK_IFACE_ENV)
    if not iface:
        return None
    return LinkCounters(iface, node=topology.node_rank, nodes=topology.nodes, reader=topology.local_rank == 0)


def probes_for(topology, env: Mapping[str, str] = os.environ) -> list:
    """Every probe this worker's launcher asked for."""
    probe = link_probe(topology, env)
    return [probe] if probe is not None else []
