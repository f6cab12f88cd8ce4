"""DiLoCo's communication (:class:`birder_repro.optim.DiLoCo`): every step inside the node, every H steps across.

DiLoCo (Douillard et al. 2023) makes each node a worker that takes H inner steps on its own. On this project's
topology (n nodes of m processes):

    every step  the DDP hook averages the bucket over the node's m processes only (fp32 all-reduce on the
                node's group, each process's gradient times 1/m; nothing at all for m = 1), so the node's
                processes stay one worker;
    every H     the optimizer's outer step asks :meth:`DiLoCoState.sync` for the nodes' average
                pseudo-gradient: the m processes of a node hold the same vector, so each all-reduces one m-th
                of it with its peers of the same local rank on the other nodes (a shard of P/m elements, the
                m exchanges of a node side by side) and the node all-gathers the shards back. Then the
                module's floating buffers (BatchNorm's running statistics, B elements: each process's own, since
                the DDP model broadcasts no buffers) are averaged exactly, in fp32, over all n m processes: in
                the node first (an all-reduce), then across the nodes as the pseudo-gradient was (a subclass
                that compresses the pseudo-gradient leaves them exact). :attr:`DiLoCoState.synced_buffers` keeps
                them: the buffers of the model a user would deploy (:meth:`birder_repro.optim.DiLoCo.synchronised`).

Bytes per process: every step 2 (m-1)/m 4P inside the node; every H steps 2 (n-1)/n 4P/m across nodes and
(m-1)/m 4P inside it (the all-gather), and for the buffers 2 (m-1)/m 4B + (m-1)/m 4B inside the node and
2 (n-1)/n 4B/m across (each m-th rounded up). Each node's link carries 2 (n-1)/n 4(P+B) every H steps: a flat
fp32 all-reduce's bytes, H times less often. Nothing else
crosses: DDP's broadcast of rank 0's buffers before every forward pass, which would tie the nodes together
between syncs and go uncounted, is off. The outer step's seconds are in ``collective_seconds`` (the
all-reduce) like every hook's; ``outer_steps`` counts them. The record's bytes per step are the averages over
the run, so the sync every H steps is in them; the performance model charges it per H steps.

Nothing is compressed here: DiLoCo's own saving is the H. Its relatives build on this state:
:mod:`birder_repro.comm.diloco_onebit` sends the outer average through Birder's 1-bit exchange, and
:mod:`birder_repro.comm.streaming` (Streaming DiLoCo) syncs fragments in turn, overlapped with the inner steps.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's annotations as objects.

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import all_gather_bytes, allreduce_bytes
from birder_repro.comm.buckets import require_buckets
from birder_repro.comm.collectives import all_gather_flat, completed_future
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, announce_layout, resolve_topology

__all__ = ["DiLoCoState", "attach_diloco", "attach_from_config"]


class DiLoCoState(CommState):
    """The hook's state: the topology and the :class:`CommState` counters, ``outer_steps``, and the module's
    floating buffers: ``buffers`` (the module's own tensors, each process's) and ``synced_buffers`` (their
    average at the last sync, or their value at the attach before any)."""

    __slots__ = ("topology", "outer_steps", "buffers", "synced_buffers")

    def __init__(self, topology: Topology, buffers: Sequence[torch.Tensor] = ()):
        super().__init__()
        self.topology = topology
        self.outer_steps = 0
        self.buffers = list(buffers)
        self.synced_buffers = [b.detach().clone() for b in self.buffers]

    def sync(self, deltas: list[torch.Tensor]) -> None:
        """The outer step's exchange (collective, every rank): ``deltas`` (the same on every process of a node)
        replaced by their average over the nodes (:meth:`average_over_nodes`, which a subclass may compress),
        then the module's buffers by their exact fp32 average over every process, in place; the averaged buffers
        kept as :attr:`synced_buffers`."""
        self.average_over_nodes(deltas)
        self.average_everywhere(self.buffers)
        self.synced_buffers = [b.detach().clone() for b in self.buffers]

    def average_over_nodes(self, tensors: list[torch.Tensor]) -> None:
        """Replace ``tensors`` (the same on every process of a node) by their average over the nodes, in place.
        Counts one outer step."""
        self.outer_steps += 1
        self._across_nodes(tensors)

    def average_everywhere(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace ``tensors`` (each process's own) by their fp32 average over every process, in place: the
        node's mean first (an all-reduce in the node), which the node's processes then share across the nodes
        as :meth:`average_over_nodes` does. Collective."""
        topo = self.topology
        tensors = [t for t in tensors if t.numel()]
        if not tensors or topo.world_size == 1:
            return
        if topo.intra_group is not None:
            m, device = topo.gpus_per_node, tensors[0].device
            flat = torch.cat([t.reshape(-1).float() for t in tensors])
            with self.timing("comm", device):
                dist.all_reduce(flat, group=topo.intra_group)
            self.add_bytes(allreduce_bytes(flat.numel() * 4, m), 0.0)
            _unflatten(flat.div_(m), tensors)
        self._across_nodes(tensors)

    def _across_nodes(self, tensors: list[torch.Tensor]) -> None:
        """The nodes' fp32 average of ``tensors`` (the same on every process of a node), in place: each local
        rank all-reduces its m-th with its peers on the other nodes, the node all-gathers the m-ths."""
        topo = self.topology
        m, n = topo.gpus_per_node, topo.nodes
        if n == 1 or not tensors:
            return
        device = tensors[0].device
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        numel, shard = flat.numel(), -(-flat.numel() // m)
        padded = torch.zeros(shard * m, device=device)
        padded[:numel] = flat
        piece = padded[topo.rank % m * shard : (topo.rank % m + 1) * shard].clone()  # this local rank's m-th
        with self.timing("comm", device):
            dist.all_reduce(piece, group=topo.inter_group)
        self.add_bytes(0.0, allreduce_bytes(piece.numel() * 4, n))
        piece.div_(n)
        if topo.intra_group is not None:
            with self.timing("comm", device):
                all_gather_flat(padded, piece, group=topo.intra_group)
            self.add_bytes(all_gather_bytes(piece.numel() * 4, m), 0.0)
        else:
            padded = piece
        _unflatten(padded, tensors)

    def state_dict(self) -> dict[str, Any]:
        """The counters, and this process's buffers and the synced ones: between syncs every process's buffers
        are its own, and a checkpoint's model is rank 0's only, so each rank resumes its own."""
        return {
            "scheme": "diloco",
            "outer_steps": self.outer_steps,
            "stats": self.snapshot(),
            "buffers": [b.detach().clone() for b in self.buffers],
            "synced_buffers": [b.clone() for b in self.synced_buffers],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.outer_steps = int(state_dict.get("outer_steps", 0))
        self.load_counters(state_dict["stats"])
        saved, synced = state_dict.get("buffers"), state_dict.get("synced_buffers")
        if saved is None or synced is None:  # a checkpoint from before buffers were kept: rank 0's, as loaded
            self.synced_buffers = [b.detach().clone() for b in self.buffers]
            return
        if len(saved) != len(self.buffers) or len(synced) != len(self.buffers):
            raise ValueError(
                f"DiLoCo checkpoint holds {len(saved)} buffers, the model has {len(self.buffers)} floating buffers"
            )
        with torch.no_grad():
            for b, t in zip(self.buffers, saved):
                b.copy_(t)
        self.synced_buffers = [t.to(b.device).clone() for b, t in zip(self.buffers, synced)]


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy the consecutive pieces of ``flat`` into ``tensors`` (cast to each one's dtype), in place."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def diloco_hook(state: DiLoCoState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's average over the node's processes (module doc)."""
    buffer = bucket.buffer()
    group, m = state.topology.intra_group, state.topology.gpus_per_node
    if group is None:
        state.calls += 1
        return completed_future(buffer)
    buffer.mul_(1.0 / m)  # as DDP's reducer scales: multiplied, not divided
    state.add_bytes(allreduce_bytes(buffer.numel() * buffer.element_size(), m), 0.0)
    state.calls += 1
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def worker_buffers(ddp_model: torch.nn.parallel.DistributedDataParallel, topology: Topology, who: str):
    """The module's floating buffers, each worker's own between syncs and averaged at each (DiLoCo and the methods
    built on it); a DDP model that broadcasts rank 0's buffers before every forward pass is refused, since that
    would tie the nodes together between outer steps, uncounted."""
    if ddp_model.broadcast_buffers and any(True for _ in ddp_model.module.buffers()) and topology.world_size > 1:
        raise ValueError(
            f"{who}: build the DDP model with broadcast_buffers=False (forward_sync_buffers=False from torch "
            "2.14): DDP would send rank 0's buffers to every process before each forward pass, tying the nodes "
            "together between outer steps"
        )
    return [b for b in ddp_model.module.buffers() if b.is_floating_point()]


def attach_diloco(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
) -> DiLoCoState:
    """Make ``ddp_model`` average inside the node only and have ``optimizer`` (a
    :class:`birder_repro.optim.DiLoCo`) average its outer step over the nodes, the module's floating buffers
    with it. ``gpus_per_node`` (default: torchrun's LOCAL_WORLD_SIZE) builds the topology when none is given.
    Build ``ddp_model`` with ``broadcast_buffers=False`` (``forward_sync_buffers=False`` from torch 2.14; DDP's
    broadcast of rank 0's buffers before every forward would cross the nodes between syncs, uncounted); a DDP
    model that broadcasts them is refused.
    Collective: call it on every rank."""
    from birder_repro.optim.diloco import DiLoCo  # at call time: optim.diloco imports this module

    require_buckets(ddp_model, "attach_diloco")
    if not isinstance(optimizer, DiLoCo):
        raise TypeError(f"attach_diloco needs a birder_repro.optim.DiLoCo optimizer, got {type(optimizer).__name__}")
    topology, source, guessed = resolve_topology(gpus_per_node, topology)
    buffers = worker_buffers(ddp_model, topology, "attach_diloco")
    announce_layout(f"attach_diloco (H={optimizer.local_steps})", topology, source, between_nodes=True, guessed=guessed)
    state = DiLoCoState(topology, buffers)
    ddp_model.register_comm_hook(state, diloco_hook)
    optimizer.hook_state = state
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "diloco"):
    """The runner's entry (birder_repro.comm.attach_comm): the layout is the run's topology."""
    if scheme != "diloco":
        raise ValueError(f"birder_repro.comm.diloco handles scheme 'diloco', not {scheme!r}")
    return attach_diloco(ddp_model, optimizer, topology=topology)
