"""A two-level all-reduce in fp32 or bf16: the 16-bit baseline a careful reviewer asks Birder to beat.

On a real cluster NCCL's topology-aware collectives reduce inside the node over its fast links and send only
the node's sum over the slow one; a flat ring over every process instead puts each node's share of a ring of
all N processes on its link. This hook is that two-level exchange, written with the project's topology
(:class:`~birder_repro.comm.topology.Topology`), so that the field compares Birder's hierarchical 1-bit
exchange with a hierarchical 16-bit one, byte for byte on the same layout. Per DDP bucket of P elements, n
nodes of m processes, wire dtype of d bytes:

    Step I    scale by 1 / (n m) (fp32: a multiplication, as DDP's reducer; bf16: before the cast, as torch's
              fp16 hook divides before it) and cast to the wire dtype; pad to a multiple of m;
    Step II   intra-node reduce-scatter (sum): each process holds its node's sum of one shard of P/m elements;
    Step III  inter-node all-reduce (sum) of the shard among the n processes with this local rank (one per
              node): the node sums added up, every process of the group gets the total of its shard;
    Step IV   intra-node all-gather of the shards, cast back into DDP's bucket.

This is NCCL's reduce-scatter / all-reduce / all-gather hierarchy rather than the reduce / all-reduce /
broadcast through one leader per node: both put 2 (n-1)/n P d bytes on each node's link, and here all m
processes share the work (for m = 1 they are the same exchange). Bytes per process: 2 (m-1)/m P d inside the
node, 2 (n-1)/n P d / m across nodes. The sums run in another order than a flat ring's, so the result equals a
flat all-reduce within float rounding (fp32: a few ulps; bf16: bf16 rounding of each partial sum), which
tests/test_two_level.py checks on 2 x 2 gloo processes.

The work runs on the state's communication thread beside the backward pass (``overlap=True``, as Birder's
hook: three dependent collectives per bucket), or inside the hook.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import all_gather_bytes, allreduce_bytes, reduce_scatter_bytes
from birder_repro.comm.buckets import require_buckets
from birder_repro.comm.collectives import all_gather_flat, reduce_scatter_flat
from birder_repro.comm.overlap import HookRunner
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, announce_layout, resolve_topology

__all__ = ["TwoLevelState", "attach_two_level", "attach_from_config", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TwoLevelState(CommState):
    """State of the two-level all-reduce hook: its topology, wire dtype, communication thread and the
    :class:`CommState` counters. No algorithmic state: ``state_dict()`` holds the dtype (a resume with another
    scheme is refused) and the counters."""

    __slots__ = ("topology", "dtype", "runner")

    def __init__(self, topology: Topology, dtype: torch.dtype = torch.float32, overlap: bool = True):
        super().__init__()
        if dtype not in DTYPES.values():
            raise ValueError(f"attach_two_level: dtype must be one of {sorted(DTYPES)}, got {dtype}")
        self.topology, self.dtype = topology, dtype
        self.runner = HookRunner(overlap, name=f"two-level-comm-{topology.rank}")

    def overlaps(self) -> bool:
        return self.runner.overlap

    def allreduce_bucket(self, buffer: torch.Tensor) -> torch.Tensor:
        """Steps I-IV on one bucket; writes the average into ``buffer`` and returns it."""
        topo = self.topology
        m, n, numel = topo.gpus_per_node, topo.nodes, buffer.numel()
        size = self.dtype.itemsize
        shard = -(-numel // m)
        with torch.no_grad():
            with self.timing("compress", buffer.device):
                wire = torch.zeros(shard * m, dtype=self.dtype, device=buffer.device)
                wire[:numel] = buffer * (1.0 / topo.world_size)  # Step I (cast on the copy)
            piece = wire
            if topo.intra_group is not None:  # Step II
                piece = torch.empty(shard, dtype=self.dtype, device=buffer.device)
                with self.timing("comm", buffer.device):
                    reduce_scatter_flat(piece, wire, op=dist.ReduceOp.SUM, group=topo.intra_group)
                self.add_bytes(reduce_scatter_bytes(wire.numel() * size, m), 0.0)
            if topo.inter_group is not None:  # Step III
                with self.timing("comm", buffer.device):
                    dist.all_reduce(piece, op=dist.ReduceOp.SUM, group=topo.inter_group)
                self.add_bytes(0.0, allreduce_bytes(piece.numel() * size, n))
            if topo.intra_group is not None:  # Step IV
                with self.timing("comm", buffer.device):
                    all_gather_flat(wire, piece, group=topo.intra_group)
                self.add_bytes(all_gather_bytes(piece.numel() * size, m), 0.0)
            with self.timing("compress", buffer.device):
                buffer.copy_(wire[:numel])
            self.calls += 1
        return buffer

    def close(self) -> None:
        """Stop the communication thread (it restarts with the next bucket)."""
        self.runner.close()

    def state_dict(self) -> dict[str, Any]:
        self.runner.check_idle("TwoLevelState.state_dict()")
        return {"dtype": str(self.dtype).removeprefix("torch."), "stats": self.snapshot()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict["dtype"]
        if DTYPES.get(saved) != self.dtype:
            raise ValueError(
                f"checkpoint was saved with a two-level all-reduce in {saved}, this hook sends {self.dtype}"
            )
        self.load_counters(state_dict["stats"])


def two_level_hook(state: TwoLevelState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's average over every process, in two levels (module doc)."""
    buffer = bucket.buffer()
    return state.runner.run(lambda: state.allreduce_bucket(buffer), buffer.device)


def attach_two_level(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer | None = None,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
    dtype: torch.dtype = torch.float32,
    overlap: bool = True,
) -> TwoLevelState:
    """Register the two-level all-reduce on ``ddp_model`` (over the default process group) and return its state.

    ``gpus_per_node`` (processes per node; default: torchrun's LOCAL_WORLD_SIZE) builds the topology when none
    is given; ``dtype``: ``torch.float32`` or ``torch.bfloat16`` on the wire; ``overlap``: run the exchange on a
    communication thread beside the backward pass (false: inside the hook). ``optimizer`` is unused (the update
    is the optimizer's own): accepted so that every scheme attaches alike. Collective: call it on every rank.
    """
    del optimizer
    require_buckets(ddp_model, "attach_two_level")
    topology, source, _ = resolve_topology(gpus_per_node, topology)
    wire = str(dtype).removeprefix("torch.")
    announce_layout(f"attach_two_level ({wire})", topology, source, between_nodes=False, guessed=False)
    state = TwoLevelState(topology, dtype, overlap)
    ddp_model.register_comm_hook(state, two_level_hook)
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "two_level"):
    """Schemes ``two_level`` (fp32) and ``two_level_bf16``; ``optim.comm.overlap`` as the other hooks read it."""
    dtypes = {"two_level": torch.float32, "two_level_bf16": torch.bfloat16}
    if scheme not in dtypes:
        raise ValueError(f"birder_repro.comm.two_level handles schemes {sorted(dtypes)}, not {scheme!r}")
    comm = cfg.get("comm") or {}
    return attach_two_level(
        ddp_model, optimizer, topology=topology, dtype=dtypes[scheme], overlap=bool(comm.get("overlap", True))
    )
