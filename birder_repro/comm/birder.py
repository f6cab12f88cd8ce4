"""Hierarchical-1-bit-All-Reduce: Birder as a DDP communication hook (papers/birder.txt, section 4).

A node is one worker of Algorithm 1 and its m processes share the work. With n nodes, for each DDP gradient
bucket of P elements, padded to P' (a multiple of 8 * m * n, so that every chunk at every level is whole bytes):

    Step I    intra-node reduce-scatter (sum / m): this process gets the node-average gradient g of its shard
              (P'/m elements);
    Step II   on the shard, Algorithm 1 lines 4-9: m, b, u = Q(m/(b+eps) + e), e; pack u to 1 bit per element;
    Step III  inter-node all-to-all among the n processes with this local rank: each receives chunk k (its node
              rank) of its shard from every node; mean over nodes; lines 11-12: u_bar = Q(mean + e_bar),
              e_bar; pack; inter-node all-gather of the packed chunks;
    Step IV   intra-node all-gather of the packed shards; unpack to +-1: the bucket's result on every rank.

The optimizer (:class:`birder_repro.optim.Birder`) then applies x = x - lr * (u_bar + weight_decay * x).
The worker state (m, b, e) of a shard lives on the process that owns the shard and the server error e_bar of
chunk k of shard r on the process (node k, local rank r): a node's state is sharded over its processes.

Variants share this one code path:
    ``hierarchical``  workers are nodes (m = gpus_per_node); the paper's scheme;
    ``flat``          every process is a worker (m = 1, n = world size): what the paper compares against;
    ``allgather``     every process is a worker and all-gathers every other worker's bits, averaging them
                      locally with no server re-quantization (the update is a multiple of 1/n, not +-1);
                      inter-node volume grows with the number of workers (section 4's "original All-Gather").

Per-process inter-node bytes per step of ``hierarchical``: 2 (n-1)/n * P'/(8m).

Conventions: bits are packed LSB first, bit 1 is +1 (:mod:`birder_repro.comm.pack`). Each rank draws its
quantizer's uniforms from its own ``torch.Generator`` seeded with ``seed * 1_000_003 + rank``: per bucket
call, first the shard's P'/m worker draws, then the chunk's P'/(m n) server draws. The generator state is part
of ``state_dict()``.

State and DDP's bucket layout: the fields m, b, e (and b_hat) of a shard, cut over the node's processes, and
e_bar of a chunk, cut over the node's and then the servers' processes, live in a
:class:`~birder_repro.comm.buckets.BucketStore`, which follows DDP's bucket rebuilds and loads a checkpoint into
any bucket layout. The generator's draws follow the buckets' order and sizes, so a run resumed into another
bucket layout than the uninterrupted run had draws other uniforms for the same elements (from the same
distribution); the state itself (m, b, e, e_bar, the generator's position) continues exactly.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import peer_bytes, reduce_scatter_bytes
from birder_repro.comm.buckets import Bucket, BucketStore, Field, Level, bucket_signature, parameter_index
from birder_repro.comm.collectives import all_gather_flat, completed_future
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.comm.state import UPDATE, CommState
from birder_repro.comm.topology import Topology, build_topology, group_peers
from birder_repro.optim.birder import Birder, server_step_, worker_step_

SCHEMES = ("hierarchical", "flat", "allgather")


class BirderState(CommState):
    """State of the Birder hook on one rank. Counters (bytes, seconds) come from :class:`CommState`."""

    __slots__ = (
        # user settings
        "scheme", "beta", "eps", "amsgrad_after", "seed", "sync_timing",
        # topology: the physical layout, the worker (intra) and server (inter) groups of the scheme
        "topology", "worker_group", "server_group", "worker_size", "server_size", "worker_rank", "server_rank",
        "worker_peers", "server_peers",
        # internal state: the per-bucket shards (and their layout), which parameter index each parameter has,
        # and the quantizer's generator
        "store", "param_index", "generator",
    )

    def __init__(self, topology: Topology, scheme: str = "hierarchical", beta: float = 0.95, eps: float = 1e-8,
                 amsgrad_after: Optional[int] = None, seed: int = 0, sync_timing: bool = False):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"Birder scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        self.scheme, self.beta, self.eps, self.amsgrad_after, self.seed = scheme, beta, eps, amsgrad_after, seed
        self.sync_timing = sync_timing
        self.topology = topology
        if scheme == "hierarchical":
            self.worker_group, self.server_group = topology.intra_group, topology.inter_group
            self.worker_size, self.server_size = topology.gpus_per_node, topology.nodes
            self.worker_rank, self.server_rank = topology.local_rank, topology.node_rank
        else:  # every process is a worker; the servers are the whole world
            self.worker_group = None
            self.server_group = dist.group.WORLD if topology.world_size > 1 else None
            self.worker_size, self.server_size = 1, topology.world_size
            self.worker_rank, self.server_rank = 0, topology.rank
        self.worker_peers = group_peers(self.worker_group, topology.rank)
        self.server_peers = group_peers(self.server_group, topology.rank)
        worker = Level(self.worker_group, self.worker_size, self.worker_rank)
        server = Level(self.server_group, self.server_size, self.server_rank)
        fields = [Field(k, (worker,)) for k in ("m", "b", "e")]
        if amsgrad_after is not None:
            fields.append(Field("b_hat", (worker,)))
        if scheme != "allgather":  # e_bar of chunk k (node k) of shard r (local rank r)
            fields.append(Field("e_bar", (worker, server)))
        self.store = BucketStore(fields, self.padding_multiple())
        self.param_index: dict[int, int] = {}  # id(parameter) -> its index in model.parameters()
        self.generator: Optional[torch.Generator] = None

    def grad_holds(self) -> str:
        """The hook hands every rank u_bar (+-1), the update itself, in place of the gradients."""
        return UPDATE

    @property
    def layout_changes(self) -> int:
        """How often DDP's bucket layout changed under stored state (:mod:`birder_repro.comm.buckets`)."""
        return self.store.layout_changes

    # ----------------------------------------------------------------------------------------------- sizes
    def padding_multiple(self) -> int:
        """Every chunk at every level holds whole bytes: P' is a multiple of 8 * m * n."""
        return 8 * self.worker_size * (1 if self.scheme == "allgather" else self.server_size)

    # ------------------------------------------------------------------------------------------ randomness
    def _rand(self, n: int, device: torch.device) -> torch.Tensor:
        if self.generator is None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed * 1_000_003 + self.topology.rank)
        return torch.rand(n, generator=self.generator, device=device, dtype=torch.float32)

    # ------------------------------------------------------------------------------------------ the bucket
    def allreduce_bucket(self, index: int, buffer: torch.Tensor, signature: tuple) -> torch.Tensor:
        """Steps I-IV on one bucket; writes the result into ``buffer`` and returns it.

        ``signature`` names the bucket's contents, ((parameter index, offset, numel), ...): what the state of
        its elements belongs to. The DDP hook derives it from the bucket; tests may pass their own.
        """
        with torch.no_grad():
            bucket = self.store.bucket(index, buffer.numel(), signature, buffer.device)
            st = bucket.state
            bucket.step += 1
            sync = buffer.device if self.sync_timing else None
            g = self._step1_node_average(buffer, bucket, sync)
            with self.timing("compress", sync):
                b_hat = None
                if self.amsgrad_after is not None and bucket.step > self.amsgrad_after:
                    b_hat = st["b_hat"]
                bits = worker_step_(g, st["m"], st["b"], st["e"], self._rand(st["m"].numel(), g.device),
                                    self.beta, self.eps, b_hat=b_hat)
                if "b_hat" in st and b_hat is None:
                    st["b_hat"].copy_(st["b"])  # until T0, b is the EMA itself (Algorithm 1, line 6)
                packed = pack_bits(bits)
            if self.scheme == "allgather":
                result = self._gather_and_average(packed, sync)
            else:
                shard_packed = self._step3_server(packed, bucket, sync)
                result = self._step4_gather_node(shard_packed, bucket, sync)
            buffer.copy_(result[: bucket.numel])
            self.calls += 1
            return buffer

    def _step1_node_average(self, buffer: torch.Tensor, bucket: Bucket, sync) -> torch.Tensor:
        """Step I: the node-average gradient of this rank's shard, fp32, padded with zeros."""
        # Only read until the result is written back at the end, so no copy unless it needs padding.
        flat = buffer.float()
        if bucket.padded != bucket.numel:
            padded = torch.zeros(bucket.padded, device=buffer.device, dtype=torch.float32)
            padded[: bucket.numel] = flat
            flat = padded
        if self.worker_group is None:
            return flat
        shard = torch.empty(bucket.padded // self.worker_size, device=flat.device, dtype=torch.float32)
        with self.timing("comm", sync):
            # gloo has no AVG reduce-scatter: sum, then divide (exact for m = 2, and the same on every rank)
            dist.reduce_scatter_tensor(shard, flat, op=dist.ReduceOp.SUM, group=self.worker_group)
        self.intra_node_bytes += reduce_scatter_bytes(flat.numel() * 4, self.worker_size)
        return shard.div_(self.worker_size)

    def _step3_server(self, packed: torch.Tensor, bucket: Bucket, sync) -> torch.Tensor:
        """Step III: all-to-all of chunks, server average + re-quantization (lines 11-12), all-gather."""
        e_bar = bucket.state["e_bar"]
        n, chunk_bytes = self.server_size, e_bar.numel() // 8
        received = torch.empty_like(packed)
        with self.timing("comm", sync):
            if self.server_group is not None:
                dist.all_to_all_single(received, packed, group=self.server_group)
            else:
                received.copy_(packed)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, chunk_bytes))
        with self.timing("compress", sync):
            mean = unpack_signs(received.view(n, chunk_bytes)).mean(dim=0)
            server_bits = server_step_(mean, e_bar, self._rand(e_bar.numel(), mean.device))
            chunk_packed = pack_bits(server_bits)
        shard_packed = torch.empty(packed.numel(), device=packed.device, dtype=torch.uint8)
        with self.timing("comm", sync):
            if self.server_group is not None:
                all_gather_flat(shard_packed, chunk_packed, group=self.server_group)
            else:
                shard_packed.copy_(chunk_packed)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, chunk_bytes))
        return shard_packed

    def _step4_gather_node(self, shard_packed: torch.Tensor, bucket: Bucket, sync) -> torch.Tensor:
        """Step IV: intra-node all-gather of the packed shards, unpacked to +-1."""
        if self.worker_group is not None:
            full = torch.empty(bucket.padded // 8, device=shard_packed.device, dtype=torch.uint8)
            with self.timing("comm", sync):
                all_gather_flat(full, shard_packed, group=self.worker_group)
            self.add_bytes(*peer_bytes(self.topology, self.worker_peers, shard_packed.numel()))
        else:
            full = shard_packed
        with self.timing("compress", sync):
            return unpack_signs(full)

    def _gather_and_average(self, packed: torch.Tensor, sync) -> torch.Tensor:
        """``allgather``: every worker's bits to every worker, averaged locally (no server step)."""
        n = self.server_size
        gathered = torch.empty(n * packed.numel(), device=packed.device, dtype=torch.uint8)
        with self.timing("comm", sync):
            if self.server_group is not None:
                all_gather_flat(gathered, packed, group=self.server_group)
            else:
                gathered.copy_(packed)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, packed.numel()))
        with self.timing("compress", sync):
            return unpack_signs(gathered.view(n, -1)).mean(dim=0)

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards, their layouts and its generator; process groups are not saved."""
        return {
            "scheme": self.scheme,
            "seed": self.seed,
            "generator": self.generator.get_state() if self.generator is not None else None,
            "generator_device": str(self.generator.device) if self.generator is not None else None,
            "buckets": self.store.state_dict(),
            "counters": self.snapshot(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Load a rank's :meth:`state_dict` into any DDP bucket layout (the first differing bucket migrates it)."""
        if sd["scheme"] != self.scheme:
            raise ValueError(f"checkpoint is of Birder scheme {sd['scheme']!r}, this hook runs {self.scheme!r}")
        self.store.load_state_dict(sd["buckets"])
        self.seed = sd["seed"]
        self.generator = None
        if sd["generator"] is not None:
            self.generator = torch.Generator(device=sd["generator_device"])
            self.generator.set_state(sd["generator"])
        self.load_counters(sd["counters"])


def birder_hook(state: BirderState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the Hierarchical-1-bit-All-Reduce of one bucket (steps in the module doc).

    The collectives run synchronously inside the hook; the returned future is already complete.
    """
    signature = bucket_signature(state.param_index, bucket)
    return completed_future(state.allreduce_bucket(bucket.index(), bucket.buffer(), signature))


# DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation).
birder_hook.__annotations__.update(bucket=dist.GradBucket, state=BirderState, return_=None)
birder_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
del birder_hook.__annotations__["return_"]


def attach_birder(ddp_model: torch.nn.parallel.DistributedDataParallel, optimizer: Birder,
                  gpus_per_node: Optional[int] = None, scheme: str = "hierarchical",
                  topology: Optional[Topology] = None, sync_timing: bool = False) -> BirderState:
    """Register the Birder hook on ``ddp_model`` and hand the optimizer its update: three lines in a script.

    ``gpus_per_node`` (processes per node; default: LOCAL_WORLD_SIZE from torchrun) builds the topology when
    none is given. Collective: call it on every rank. beta, eps, amsgrad_after and seed come from the
    optimizer, which from then on only applies the hook's +-1 (see :class:`birder_repro.optim.Birder`).
    """
    if not isinstance(optimizer, Birder):
        raise TypeError(f"attach_birder needs a birder_repro.optim.Birder optimizer, got {type(optimizer).__name__}")
    groups = optimizer.param_groups
    for key in ("beta", "eps", "amsgrad_after"):
        if len({g[key] for g in groups}) != 1:
            raise ValueError(f"attach_birder: every parameter group must share {key}: the hook works per bucket")
    if topology is None:
        if gpus_per_node is None:
            gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        topology = build_topology(gpus_per_node)
    state = BirderState(topology, scheme=scheme, beta=groups[0]["beta"], eps=groups[0]["eps"],
                        amsgrad_after=groups[0]["amsgrad_after"], seed=optimizer.seed, sync_timing=sync_timing)
    state.param_index = parameter_index(ddp_model.module)
    ddp_model.register_comm_hook(state, birder_hook)
    optimizer.compressed_by_hook = True
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "birder"):
    """The runner's entry (birder_repro.comm.attach_comm): scheme and timing from the ``optim`` config node."""
    comm = cfg.get("comm") or {}
    return attach_birder(ddp_model, optimizer, scheme=comm.get("scheme", "hierarchical"), topology=topology,
                         sync_timing=bool(comm.get("sync_timing", False)))
