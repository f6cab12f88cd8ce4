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

State and DDP's bucket layout: DDP rebuilds its buckets after the first iteration (and a resumed run starts
from DDP's initial layout again), so a shard of "bucket i" is not a fixed set of parameter elements. The
state keeps each bucket's layout (which parameters at which offsets); when the layout changes, every rank
gathers the state into per-parameter form once (collectives over the node and over the servers, in the same
order on every rank since DDP's layout is the same everywhere) and re-shards it lazily as the new buckets
arrive. The padding positions' state is dropped then: it never touches a real element.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import CommStats, reduce_scatter_bytes
from birder_repro.comm.collectives import all_gather_flat
from birder_repro.comm.pack import pack_bits, padded_size, unpack_signs
from birder_repro.comm.topology import Topology, build_topology
from birder_repro.optim.birder import Birder, server_step_, worker_step_

SCHEMES = ("hierarchical", "flat", "allgather")
_WORKER_KEYS = ("m", "b", "e", "b_hat")


class _Bucket:
    """One bucket's shard of the state on this rank, and the layout it was made for."""

    __slots__ = ("signature", "numel", "padded", "shard", "chunk", "step", "m", "b", "e", "b_hat", "e_bar")

    def __init__(self, signature: tuple, numel: int, padded: int, shard: int, chunk: int, device, amsgrad: bool,
                 server: bool):
        self.signature = signature  # ((param index, offset, numel), ...)
        self.numel, self.padded, self.shard, self.chunk = numel, padded, shard, chunk
        self.step = 0
        z = lambda k: torch.zeros(k, device=device, dtype=torch.float32)  # noqa: E731
        self.m, self.b, self.e = z(shard), z(shard), z(shard)
        self.b_hat = z(shard) if amsgrad else None
        self.e_bar = z(chunk) if server else None


class BirderState(CommStats):
    """State of the Birder hook on one rank. Counters (bytes, seconds) come from :class:`CommStats`."""

    __slots__ = (
        # user settings
        "scheme", "beta", "eps", "amsgrad_after", "seed", "sync_timing",
        # topology: the physical layout, the worker (intra) and server (inter) groups of the scheme
        "topology", "worker_group", "server_group", "worker_size", "server_size", "worker_rank", "server_rank",
        "worker_peers", "server_peers",
        # internal state
        "buckets", "owner", "param_index", "generator", "_canonical", "_pending", "layout_changes",
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
        self.worker_peers = _peers(self.worker_group, topology.rank)
        self.server_peers = _peers(self.server_group, topology.rank)
        self.buckets: dict[int, _Bucket] = {}
        self.owner: dict[int, int] = {}  # parameter index -> bucket index holding its state
        self.param_index: dict[int, int] = {}  # data_ptr of a parameter -> its index in model.parameters()
        self.generator: Optional[torch.Generator] = None
        self._canonical: Optional[dict[str, dict[int, torch.Tensor]]] = None  # per-parameter state in migration
        self._pending: set[int] = set()  # parameters still to re-shard from _canonical
        self.layout_changes = 0

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
            bucket = self._bucket_for(index, buffer, signature)
            bucket.step += 1
            sync = buffer.device if self.sync_timing else None
            g = self._step1_node_average(buffer, bucket, sync)
            with self.timing("compress", sync):
                b_hat = None
                if self.amsgrad_after is not None and bucket.step > self.amsgrad_after:
                    b_hat = bucket.b_hat
                bits = worker_step_(g, bucket.m, bucket.b, bucket.e, self._rand(bucket.shard, g.device),
                                    self.beta, self.eps, b_hat=b_hat)
                if bucket.b_hat is not None and b_hat is None:
                    bucket.b_hat.copy_(bucket.b)  # until T0, b is the EMA itself (Algorithm 1, line 6)
                packed = pack_bits(bits)
            if self.scheme == "allgather":
                result = self._gather_and_average(packed, bucket, sync)
            else:
                shard_packed = self._step3_server(packed, bucket, sync)
                result = self._step4_gather_node(shard_packed, bucket, sync)
            buffer.copy_(result[: bucket.numel])
            self.calls += 1
            return buffer

    def _step1_node_average(self, buffer: torch.Tensor, bucket: _Bucket, sync) -> torch.Tensor:
        """Step I: the node-average gradient of this rank's shard, fp32, padded with zeros."""
        # Only read until the result is written back at the end, so no copy unless it needs padding.
        flat = buffer.float()
        if bucket.padded != bucket.numel:
            padded = torch.zeros(bucket.padded, device=buffer.device, dtype=torch.float32)
            padded[: bucket.numel] = flat
            flat = padded
        if self.worker_group is None:
            return flat
        shard = torch.empty(bucket.shard, device=flat.device, dtype=torch.float32)
        with self.timing("comm", sync):
            # gloo has no AVG reduce-scatter: sum, then divide (exact for m = 2, and the same on every rank)
            dist.reduce_scatter_tensor(shard, flat, op=dist.ReduceOp.SUM, group=self.worker_group)
        self.intra_node_bytes += reduce_scatter_bytes(flat.numel() * 4, self.worker_size)
        return shard.div_(self.worker_size)

    def _step3_server(self, packed: torch.Tensor, bucket: _Bucket, sync) -> torch.Tensor:
        """Step III: all-to-all of chunks, server average + re-quantization (lines 11-12), all-gather."""
        n, chunk_bytes = self.server_size, bucket.chunk // 8
        received = torch.empty_like(packed)
        with self.timing("comm", sync):
            if self.server_group is not None:
                dist.all_to_all_single(received, packed, group=self.server_group)
            else:
                received.copy_(packed)
        self._count_peers(self.server_peers, chunk_bytes)
        with self.timing("compress", sync):
            mean = unpack_signs(received.view(n, chunk_bytes)).mean(dim=0)
            server_bits = server_step_(mean, bucket.e_bar, self._rand(bucket.chunk, mean.device))
            chunk_packed = pack_bits(server_bits)
        shard_packed = torch.empty(bucket.shard // 8, device=packed.device, dtype=torch.uint8)
        with self.timing("comm", sync):
            if self.server_group is not None:
                all_gather_flat(shard_packed, chunk_packed, group=self.server_group)
            else:
                shard_packed.copy_(chunk_packed)
        self._count_peers(self.server_peers, chunk_bytes)
        return shard_packed

    def _step4_gather_node(self, shard_packed: torch.Tensor, bucket: _Bucket, sync) -> torch.Tensor:
        """Step IV: intra-node all-gather of the packed shards, unpacked to +-1."""
        if self.worker_group is not None:
            full = torch.empty(bucket.padded // 8, device=shard_packed.device, dtype=torch.uint8)
            with self.timing("comm", sync):
                all_gather_flat(full, shard_packed, group=self.worker_group)
            self._count_peers(self.worker_peers, shard_packed.numel())
        else:
            full = shard_packed
        with self.timing("compress", sync):
            return unpack_signs(full)

    def _gather_and_average(self, packed: torch.Tensor, bucket: _Bucket, sync) -> torch.Tensor:
        """``allgather``: every worker's bits to every worker, averaged locally (no server step)."""
        n = self.server_size
        gathered = torch.empty(n * packed.numel(), device=packed.device, dtype=torch.uint8)
        with self.timing("comm", sync):
            if self.server_group is not None:
                all_gather_flat(gathered, packed, group=self.server_group)
            else:
                gathered.copy_(packed)
        self._count_peers(self.server_peers, packed.numel())
        with self.timing("compress", sync):
            return unpack_signs(gathered.view(n, -1)).mean(dim=0)

    def _count_peers(self, peers: list[int], nbytes_each: int) -> None:
        """Bytes sent to each peer, split by whether the peer is on this node."""
        for peer in peers:
            if self.topology.same_node(peer):
                self.intra_node_bytes += nbytes_each
            else:
                self.inter_node_bytes += nbytes_each

    # ------------------------------------------------------------------------------ layout and migration
    def _bucket_for(self, index: int, buffer: torch.Tensor, signature: tuple) -> _Bucket:
        bucket = self.buckets.get(index)
        if bucket is not None and bucket.signature == signature:
            return bucket
        params = [p for p, _, _ in signature]
        if bucket is not None or any(p in self.owner for p in params):
            self._begin_migration()  # collective; every rank sees the same layout change at the same bucket
        numel = buffer.numel()
        padded = padded_size(numel, self.padding_multiple())
        shard = padded // self.worker_size
        chunk = shard // (1 if self.scheme == "allgather" else self.server_size)
        bucket = _Bucket(signature, numel, padded, shard, chunk, buffer.device,
                         amsgrad=self.amsgrad_after is not None, server=self.scheme != "allgather")
        if self._canonical is not None:
            self._fill_from_canonical(bucket)
        self.buckets[index] = bucket
        for p in params:
            self.owner[p] = index
        return bucket

    def _begin_migration(self) -> None:
        """Gather every stored bucket's state into per-parameter form, then forget the old layout."""
        self.layout_changes += 1
        canonical = self._gather_canonical()
        self.buckets.clear()
        self.owner.clear()
        self._canonical = canonical
        self._pending = set(canonical["step"])

    def _gather_canonical(self) -> dict[str, dict[int, torch.Tensor]]:
        """Per-parameter full (node-level) state from the sharded buckets. Collective, bucket by bucket."""
        out: dict[str, dict[int, torch.Tensor]] = {k: {} for k in (*_WORKER_KEYS, "e_bar", "step")}
        if self._canonical is not None:  # a migration still in progress: keep what was not re-sharded yet
            for k, per_param in self._canonical.items():
                out[k].update({p: t for p, t in per_param.items() if p in self._pending})
        for index in sorted(self.buckets):
            bucket = self.buckets[index]
            full = {k: self._gather_worker(getattr(bucket, k), bucket) for k in _WORKER_KEYS
                    if getattr(bucket, k) is not None}
            if bucket.e_bar is not None:
                full["e_bar"] = self._gather_server(bucket)
            for p, offset, numel in bucket.signature:
                for k, t in full.items():
                    out[k][p] = t[offset: offset + numel].clone()
                out["step"][p] = torch.tensor(bucket.step)
        return out

    def _gather_worker(self, shard: torch.Tensor, bucket: _Bucket) -> torch.Tensor:
        if self.worker_group is None:
            return shard
        full = torch.empty(bucket.padded, device=shard.device, dtype=shard.dtype)
        all_gather_flat(full, shard.contiguous(), group=self.worker_group)
        return full

    def _gather_server(self, bucket: _Bucket) -> torch.Tensor:
        """e_bar of chunk k of shard r lives on (node k, local rank r): gather over servers, then the node."""
        shard = bucket.e_bar
        if self.server_group is not None:
            shard = torch.empty(bucket.shard, device=bucket.e_bar.device, dtype=torch.float32)
            all_gather_flat(shard, bucket.e_bar, group=self.server_group)
        return self._gather_worker(shard, bucket)

    def _fill_from_canonical(self, bucket: _Bucket) -> None:
        """Slice this rank's shard (and server chunk) of a new bucket out of the per-parameter state."""
        canon = self._canonical
        lo, hi = self.worker_rank * bucket.shard, (self.worker_rank + 1) * bucket.shard
        c_lo = lo + self.server_rank * bucket.chunk
        steps = []
        for key in (*_WORKER_KEYS, "e_bar"):
            target = getattr(bucket, key)
            if target is None:
                continue
            start = c_lo if key == "e_bar" else lo
            for p, offset, numel in bucket.signature:
                src = canon[key].get(p)
                if src is None:
                    continue
                a, b = max(offset, start), min(offset + numel, start + target.numel())
                if a < b:
                    target[a - start: b - start] = src[a - offset: b - offset].to(target.device)
        for p, _, _ in bucket.signature:
            if p in canon["step"]:
                steps.append(int(canon["step"][p]))
            self._pending.discard(p)
        bucket.step = max(steps, default=0)
        if not self._pending:
            self._canonical = None

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards, their layouts and its generator; process groups are not saved."""
        return {
            "scheme": self.scheme,
            "seed": self.seed,
            "generator": self.generator.get_state() if self.generator is not None else None,
            "generator_device": str(self.generator.device) if self.generator is not None else None,
            "buckets": {i: {k: getattr(b, k) for k in _Bucket.__slots__} for i, b in self.buckets.items()},
            "canonical": self._canonical,
            "pending": sorted(self._pending),
            "layout_changes": self.layout_changes,
            "counters": self.snapshot(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if sd["scheme"] != self.scheme:
            raise ValueError(f"checkpoint is of Birder scheme {sd['scheme']!r}, this hook runs {self.scheme!r}")
        self.seed = sd["seed"]
        self.generator = None
        if sd["generator"] is not None:
            self.generator = torch.Generator(device=sd["generator_device"])
            self.generator.set_state(sd["generator"])
        self.buckets.clear()
        self.owner.clear()
        for i, fields in sd["buckets"].items():
            bucket = _Bucket.__new__(_Bucket)
            for k in _Bucket.__slots__:
                setattr(bucket, k, fields[k])
            self.buckets[int(i)] = bucket
            for p, _, _ in bucket.signature:
                self.owner[p] = int(i)
        self._canonical = sd["canonical"]
        self._pending = set(sd["pending"])
        self.layout_changes = sd["layout_changes"]
        for k, v in sd["counters"].items():
            setattr(self, k, v)


def _peers(group: Optional[dist.ProcessGroup], rank: int) -> list[int]:
    if group is None:
        return []
    return [r for r in dist.get_process_group_ranks(group) if r != rank]


def bucket_signature(state: BirderState, bucket: dist.GradBucket) -> tuple:
    """((parameter index, offset in the bucket, numel), ...) from the bucket's gradient views."""
    buffer = bucket.buffer()
    base, size = buffer.data_ptr(), buffer.element_size()
    sig = []
    for p, grad in zip(bucket.parameters(), bucket.gradients()):
        sig.append((state.param_index[p.data_ptr()], (grad.data_ptr() - base) // size, grad.numel()))
    return tuple(sig)


def birder_hook(state: BirderState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the Hierarchical-1-bit-All-Reduce of one bucket (steps in the module doc).

    The collectives run synchronously inside the hook; the returned future is already complete.
    """
    buffer = bucket.buffer()
    result = state.allreduce_bucket(bucket.index(), buffer, bucket_signature(state, bucket))
    fut: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
    fut.set_result(result)
    return fut


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
            import os

            gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        topology = build_topology(gpus_per_node)
    state = BirderState(topology, scheme=scheme, beta=groups[0]["beta"], eps=groups[0]["eps"],
                        amsgrad_after=groups[0]["amsgrad_after"], seed=optimizer.seed, sync_timing=sync_timing)
    state.param_index = {p.data_ptr(): i for i, p in enumerate(ddp_model.module.parameters())}
    ddp_model.register_comm_hook(state, birder_hook)
    optimizer.compressed_by_hook = True
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "birder"):
    """The runner's entry (birder_repro.comm.attach_comm): scheme and timing from the ``optim`` config node."""
    comm = cfg.get("comm") or {}
    return attach_birder(ddp_model, optimizer, scheme=comm.get("scheme", "hierarchical"), topology=topology,
                         sync_timing=bool(comm.get("sync_timing", False)))
