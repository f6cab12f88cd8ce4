"""Cluster topology: which node a process is on and the process groups that follow from it.

A node is ``rank // gpus_per_node`` (torchrun numbers ranks node by node). Every rank creates every group, in
the same order, because ``new_group`` is collective over the whole world even for ranks outside the group.

What a hook was attached with is said once, on rank 0 (:func:`announce_layout`): the layout and where it came
from, through the ``birder_repro.comm`` logger (printed to stderr where logging is not configured); and a
warning where every process is on one node, so that a hook whose compression runs between nodes compresses
nothing, which ``attach_birder(ddp, opt)`` on one multi-GPU machine would otherwise do silently.

Timeouts: ``dist.new_group`` and ``init_device_mesh`` do not inherit the default group's timeout; without one a
subgroup's collective waits the backend's default (NCCL 10 min, gloo 30 min), whatever ``init_process_group``
was given. Every group built here takes ``timeout``, by default the default group's (:func:`default_timeout`),
and :func:`set_mesh_timeout` gives a device mesh's groups the same.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("birder_repro.comm")


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    gpus_per_node: int  # processes per node (m)
    # Groups are None where they would hold this process alone: there is nothing to communicate in them.
    intra_group: dist.ProcessGroup | None = None  # the m processes of this node
    inter_group: dist.ProcessGroup | None = None  # the n processes with this local rank, one per node

    @property
    def nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def node_rank(self) -> int:
        return self.rank // self.gpus_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.gpus_per_node

    def same_node(self, other_rank: int) -> bool:
        return other_rank // self.gpus_per_node == self.node_rank


def layout_groups(world_size: int, gpus_per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rank lists of the intra-node groups (one per node) and inter-node groups (one per local rank)."""
    if gpus_per_node < 1 or world_size % gpus_per_node:
        raise ValueError(
            f"world size {world_size} is not a whole number of nodes of {gpus_per_node} processes; "
            "set gpus_per_node to a divisor of the number of processes"
        )
    m, n = gpus_per_node, world_size // gpus_per_node
    intra = [[k * m + r for r in range(m)] for k in range(n)]
    inter = [[k * m + r for k in range(n)] for r in range(m)]
    return intra, inter


def group_or_world(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``group``, or the default group when it is None (torch types ``dist.group.WORLD`` as optional: it is None
    until the process group is initialised, which is an error to report, not to pass on)."""
    if group is not None:
        return group
    world = dist.group.WORLD
    if world is None or not isinstance(world, dist.ProcessGroup):
        raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group() first")
    return world


def default_timeout() -> timedelta | None:
    """The default group's timeout (what ``init_process_group`` was given), read from its backend's options;
    None where the backend does not say (a subgroup then takes the backend's default, as before)."""
    world = dist.group.WORLD
    if not dist.is_initialized() or world is None:
        return None
    for device in ("cpu", "cuda"):
        try:
            timeout = world._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):  # no backend for the device, or one without options
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None


def set_group_timeout(group: Any, timeout: timedelta | None) -> None:
    """``group``'s collectives time out after ``timeout`` (None: the default group's; nothing where unknown).
    ``dist.set_timeout`` where torch has it, its older name ``_set_pg_timeout`` before."""
    timeout = timeout if timeout is not None else default_timeout()
    if timeout is None or group is None:
        return
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    try:
        setter(timeout, group)
    except (RuntimeError, NotImplementedError, ValueError) as exc:  # a backend without timeouts (a custom one)
        warnings.warn(f"a process group keeps its backend's timeout: {exc}", stacklevel=2)


def set_mesh_timeout(mesh: Any, timeout: timedelta | None = None) -> None:
    """Every group of a ``DeviceMesh`` (one a dimension) given ``timeout`` (None: the default group's):
    ``init_device_mesh`` takes no timeout."""
    for dim in range(mesh.ndim):
        set_group_timeout(mesh.get_group(dim), timeout)


def build_topology(
    gpus_per_node: int, group: dist.ProcessGroup | None = None, timeout: timedelta | None = None
) -> Topology:
    """Create the intra- and inter-node groups, each with ``timeout`` (None: the default group's). Collective:
    every rank of the default group must call it."""
    if not dist.is_initialized():
        return Topology(rank=0, world_size=1, gpus_per_node=1)
    if group is not None and group is not dist.group.WORLD:
        raise NotImplementedError("topologies are built over the default (world) process group")
    rank, world = dist.get_rank(), dist.get_world_size()
    intra_ranks, inter_ranks = layout_groups(world, gpus_per_node)
    timeout = timeout if timeout is not None else default_timeout()
    intra = _my_group(intra_ranks, rank, timeout)
    inter = _my_group(inter_ranks, rank, timeout)
    return Topology(rank=rank, world_size=world, gpus_per_node=gpus_per_node, intra_group=intra, inter_group=inter)


def flat_topology() -> Topology:
    """Every process its own node: what 'flat' schemes (and 1-bit Adam's compressed all-reduce) use."""
    if not dist.is_initialized():
        return Topology(rank=0, world_size=1, gpus_per_node=1)
    world = dist.get_world_size()
    return Topology(
        rank=dist.get_rank(), world_size=world, gpus_per_node=1, inter_group=dist.group.WORLD if world > 1 else None
    )


def group_peers(group: dist.ProcessGroup | None, rank: int) -> list[int]:
    """The global ranks of ``group`` other than ``rank`` (none for a missing group: this process alone)."""
    if group is None:
        return []
    return [r for r in dist.get_process_group_ranks(group) if r != rank]


def _my_group(rank_lists: list[list[int]], rank: int, timeout: timedelta | None = None) -> dist.ProcessGroup | None:
    mine = None
    for ranks in rank_lists:
        if len(ranks) == 1:  # single-process groups are never created: nothing to communicate
            continue
        g: dist.ProcessGroup | int
        if len(ranks) == dist.get_world_size():
            g = group_or_world(None)
        else:  # collective: every rank creates every group, in this order (a non-member gets a placeholder)
            g = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            if not isinstance(g, dist.ProcessGroup):
                raise RuntimeError(f"rank {rank} was not made a member of the process group of ranks {ranks}")
            mine = g
    return mine


# --------------------------------------------------------------------------- saying what was assumed
def gpus_per_node_from(gpus_per_node: int | None, env: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """Processes per node for an attach without a topology, and where that number came from: the argument, or
    torchrun's ``LOCAL_WORLD_SIZE`` (the processes it started on this machine), or 1 without either."""
    if gpus_per_node is not None:
        return int(gpus_per_node), f"gpus_per_node={gpus_per_node} as given"
    local = env.get("LOCAL_WORLD_SIZE")
    if local is not None:
        return int(local), (
            f"gpus_per_node not given: LOCAL_WORLD_SIZE={local}, the processes torchrun started on this machine"
        )
    return 1, "gpus_per_node not given and LOCAL_WORLD_SIZE unset: 1 process per node"


def layout_line(topology: Topology) -> str:
    """``2 nodes x 4 processes per node``."""
    n, m = topology.nodes, topology.gpus_per_node
    return f"{n} node{'' if n == 1 else 's'} x {m} process{'' if m == 1 else 'es'} per node"


def announce_layout(
    hook: str, topology: Topology, source: str, between_nodes: bool = True, guessed: bool = True
) -> None:
    """On rank 0: one line saying the layout ``hook`` uses and ``source`` (where it came from); and where every
    process is on one node while the hook compresses only ``between_nodes``, that nothing is compressed. The
    line goes to the ``birder_repro.comm`` logger at INFO, or to stderr where no logging handler is configured
    (a script that set none still sees it). The one-node case is also a ``UserWarning`` where the layout was
    ``guessed`` (from ``gpus_per_node`` or the environment, not a topology or device mesh the caller built),
    naming the setting to change."""
    if topology.rank != 0:
        return
    world = topology.world_size
    line = f"{hook}: {layout_line(topology)} ({source})"
    one_node = topology.nodes == 1 and world > 1
    if one_node:
        line += (
            ": one node, so nothing is compressed between nodes (inter-node bytes 0)"
            if between_nodes
            else ": one node, so every byte counts as intra-node"
        )
    if log.hasHandlers():
        log.info(line)
    else:
        print(f"[birder_repro.comm] {line}", file=sys.stderr, flush=True)
    if one_node and between_nodes and guessed:
        warnings.warn(
            f"{hook}: all {world} processes form one node ({source}), so nothing is compressed between "
            "nodes (inter-node bytes 0). On several machines pass gpus_per_node=<processes per machine> "
            "(or a topology from birder_repro.comm.build_topology); on one machine, scheme='flat' "
            "makes every process a worker",
            UserWarning,
            stacklevel=3,
        )


def resolve_topology(gpus_per_node: int | None, topology: Topology | None) -> tuple[Topology, str, bool]:
    """An attach's layout: ``topology`` where given, else one built from ``gpus_per_node`` (or torchrun's
    LOCAL_WORLD_SIZE, :func:`gpus_per_node_from`). Returns (topology, where it came from, whether it was
    guessed rather than given: :func:`announce_layout` warns only then). Collective when it builds one."""
    if topology is not None:
        return topology, "topology given", False
    gpus_per_node, source = gpus_per_node_from(gpus_per_node)
    return build_topology(gpus_per_node), source, True
