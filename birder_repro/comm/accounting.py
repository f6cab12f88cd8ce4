"""Bytes a process sends in each collective (the counters that hold them: :mod:`birder_repro.comm.state`).

Per-process payload bytes of the standard algorithms (Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005): a ring all-reduce of B bytes over g processes
sends 2(g-1)/g * B, a ring reduce-scatter or all-gather (g-1)/g of its output, an all-to-all (g-1)/g of its
input. Headers and padding of the transport are not counted here; the emulated cluster's kernel counters
see them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, group_peers


def allreduce_bytes(nbytes: int, group_size: int) -> float:
    return 2.0 * (group_size - 1) / group_size * nbytes if group_size > 1 else 0.0


def reduce_scatter_bytes(input_nbytes: int, group_size: int) -> float:
    return (group_size - 1) / group_size * input_nbytes if group_size > 1 else 0.0


def all_gather_bytes(input_nbytes: int, group_size: int) -> float:
    """Bytes sent for an all-gather whose per-process contribution is ``input_nbytes``."""
    return (group_size - 1) * input_nbytes if group_size > 1 else 0.0


def all_to_all_bytes(input_nbytes: int, group_size: int) -> float:
    return (group_size - 1) / group_size * input_nbytes if group_size > 1 else 0.0


def flat_allreduce_split(nbytes: int, world_size: int, gpus_per_node: int) -> tuple[float, float]:
    """(intra-node, inter-node) bytes per process of one flat ring all-reduce over the whole world.

    A ring ordered by rank leaves each node over one link, so of the 2(N-1)/N * B bytes every process sends,
    a node sends that amount once across nodes; averaged over its m processes, 1/m of each process's bytes
    cross nodes. With one node nothing does.
    """
    total = allreduce_bytes(nbytes, world_size)
    nodes = world_size // gpus_per_node
    if nodes <= 1:
        return total, 0.0
    inter = total / gpus_per_node
    return total - inter, inter


def peer_bytes(topology: Topology, peers: Sequence[int], nbytes_each: float) -> tuple[float, float]:
    """(intra-node, inter-node) bytes of sending ``nbytes_each`` to every rank in ``peers``, split by whether the
    peer is on this process's node: how the 1-bit schemes count their all-to-alls and all-gathers."""
    same = sum(1 for peer in peers if topology.same_node(peer))
    return same * nbytes_each, (len(peers) - same) * nbytes_each


def count_peer_bytes(
    stats: CommState | None, topology: Topology | None, group: dist.ProcessGroup, nbytes_each: int
) -> None:
    """Add ``nbytes_each`` sent to every other process of ``group`` to ``stats``, split by whether it is on this
    node (:func:`peer_bytes`); nothing without ``stats`` or ``topology``."""
    if stats is not None and topology is not None:
        stats.add_bytes(*peer_bytes(topology, group_peers(group, topology.rank), nbytes_each))


# The counters' class under its former name (scripts and the training loop import it from here).
CommStats = CommState
