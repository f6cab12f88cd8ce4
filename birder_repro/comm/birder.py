"""Hierarchical-1-bit-All-Reduce: Birder as a DDP communication hook (Birder paper, section 4).

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

Conventions: bits are packed LSB first, bit 1 is +1 (:mod:`birder_repro.comm.pack`). The quantizer's uniforms
are counter-based (:mod:`birder_repro.comm.kernels`: Philox, Triton's ``tl.rand``): element j's draw is a pure
function of a key and j's position among all the model's parameters
(:class:`~birder_repro.comm.buckets.ElementPositions`; padding past the end), so it does not depend on how DDP
cut the buckets, on the process layout of a node, or on the order of the calls. The keys
(:func:`~birder_repro.comm.kernels.derive_seed`): the worker's quantization (Algorithm 1, line 7) of worker w
at the bucket's step t draws with ``derive_seed(seed, t, "worker", w)`` (w: the node for ``hierarchical``, the
process for the others), so the workers' draws are independent; the server's (line 11) with
``derive_seed(seed, t, "server", 0)``: each element is re-quantized by exactly one server, at its own position,
so one server key per step gives independent draws without naming the server, and the draws do not depend on
which process serves the chunk (which changes with the bucket layout). There is no generator state to save.

State and DDP's bucket layout: the fields m, b, e (and b_hat) of a shard, cut over the node's processes, and
e_bar of a chunk, cut over the node's and then the servers' processes, live in a
:class:`~birder_repro.comm.buckets.BucketStore`, which follows DDP's bucket rebuilds and loads a checkpoint into
any bucket layout; a run resumed into another bucket layout continues exactly as the uninterrupted run would
(the same draws for the same elements: tests/test_birder.py).

Speed: the compression runs in one pass per quantization (:mod:`birder_repro.comm.kernels`, setting
``optim.comm.kernel_backend``), and the hook's work runs on a communication thread beside the backward pass
(:mod:`birder_repro.comm.overlap`, setting ``optim.comm.overlap``; false runs it inside the hook, with the same
results bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm import kernels
from birder_repro.comm.accounting import peer_bytes, reduce_scatter_bytes
from birder_repro.comm.buckets import (
    Bucket,
    BucketStore,
    ElementPositions,
    Field,
    Level,
    bucket_signature,
    parameter_index,
    require_buckets,
)
from birder_repro.comm.collectives import all_gather_flat, reduce_scatter_flat
from birder_repro.comm.nonfinite import NonFiniteGuard, local_flag
from birder_repro.comm.overlap import HookRunner
from birder_repro.comm.state import UPDATE, CompressedCommState
from birder_repro.comm.topology import Topology, announce_layout, group_peers, resolve_topology
from birder_repro.optim.birder import Birder

SCHEMES = ("hierarchical", "flat", "allgather")


class BirderState(CompressedCommState):
    """State of the Birder hook on one rank. Counters (bytes, seconds) come from :class:`CommState`."""

    runner: HookRunner
    guard: NonFiniteGuard
    store: BucketStore

    __slots__ = (
        # user settings
        "scheme",
        "beta",
        "eps",
        "amsgrad_after",
        "seed",
        "kernel_backend",
        # topology: the physical layout, the worker (intra) and server (inter) groups of the scheme
        "topology",
        "worker_group",
        "server_group",
        "worker_size",
        "server_size",
        "worker_rank",
        "server_rank",
        "worker_peers",
        "server_peers",
        "worker_id",
        # internal state: the per-bucket shards (and their layout), which parameter index each parameter has,
        # where each parameter's elements sit (the counters of the random draws), the communication thread
        "store",
        "param_index",
        "positions",
        "runner",
        # non-finite gradients: the flags of this step's buckets, their backups, the count of skipped steps
        "guard",
    )

    def __init__(
        self,
        topology: Topology,
        scheme: str = "hierarchical",
        beta: float = 0.95,
        eps: float = 1e-8,
        amsgrad_after: int | None = None,
        seed: int = 0,
        param_numels: Sequence[int] = (),
        kernel_backend: str = "auto",
        overlap: bool = True,
        nonfinite: str = "skip",
        node_averaged: bool = False,
    ):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"Birder scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"Birder's seed must be a non-negative int, got {seed!r}")
        self.scheme, self.beta, self.eps, self.amsgrad_after, self.seed = scheme, beta, eps, amsgrad_after, seed
        self.kernel_backend = kernel_backend
        self.topology = topology
        if node_averaged and scheme != "hierarchical":
            raise ValueError(f"node_averaged (FSDP's shards) needs Birder scheme 'hierarchical', not {scheme!r}")
        if node_averaged:  # the node average of a shard comes from elsewhere (FSDP): this process is the worker
            self.worker_group, self.server_group = None, topology.inter_group
            self.worker_size, self.server_size = 1, topology.nodes
            self.worker_rank, self.server_rank = 0, topology.node_rank
            self.worker_id = topology.node_rank  # still keyed by the node: the same draws as the DDP hook's
        elif scheme == "hierarchical":
            self.worker_group, self.server_group = topology.intra_group, topology.inter_group
            self.worker_size, self.server_size = topology.gpus_per_node, topology.nodes
            self.worker_rank, self.server_rank = topology.local_rank, topology.node_rank
            self.worker_id = topology.node_rank  # a node is one worker of Algorithm 1
        else:  # every process is a worker; the servers are the whole world
            self.worker_group = None
            self.server_group = dist.group.WORLD if topology.world_size > 1 else None
            self.worker_size, self.server_size = 1, topology.world_size
            self.worker_rank, self.server_rank = 0, topology.rank
            self.worker_id = topology.rank
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
        self.positions = ElementPositions(param_numels)
        self.runner = HookRunner(overlap, name=f"birder-comm-{topology.rank}")
        self.guard = NonFiniteGuard(nonfinite, topology.rank)

    def grad_holds(self) -> str:
        """The hook hands every rank u_bar (+-1), the update itself, in place of the gradients."""
        return UPDATE

    # ----------------------------------------------------------------------------------------------- sizes
    def padding_multiple(self) -> int:
        """Every chunk at every level holds whole bytes: P' is a multiple of 8 * m * n."""
        return 8 * self.worker_size * (1 if self.scheme == "allgather" else self.server_size)

    # ------------------------------------------------------------------------------------------ randomness
    def _draws(self, bucket: Bucket, role: str, lo: int, hi: int) -> tuple[int, kernels.Segments]:
        """(Philox key, positions) of the padded bucket's elements [lo, hi) in ``role``'s quantization."""
        rank = self.worker_id if role == "worker" else 0
        seed = kernels.derive_seed(self.seed, bucket.step, role, rank)
        return seed, bucket.cached(("segments", lo, hi), lambda: self._segments(bucket, lo, hi))

    def _segments(self, bucket: Bucket, lo: int, hi: int) -> kernels.Segments:
        starts, positions = self.positions.segments(bucket.signature, bucket.padded, lo, hi)
        return kernels.Segments(torch.tensor(starts, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64))

    # ------------------------------------------------------------------------------------------ the bucket
    def allreduce_bucket(self, index: int, buffer: torch.Tensor, signature: tuple) -> torch.Tensor:
        """Steps I-IV on one bucket; writes the result into ``buffer`` and returns it.

        ``signature`` names the bucket's contents, ((parameter index, offset, numel), ...): what the state of
        its elements belongs to and where they sit among the parameters. The DDP hook derives it from the
        bucket; tests may pass their own.
        """
        with torch.no_grad():
            bucket = self.store.bucket(index, buffer.numel(), signature, buffer.device)
            self.guard.begin(bucket)  # before any update: a skipped step restores the bucket
            bucket.step += 1
            g, node_flag = self._step1_node_average(buffer, bucket)
            self.unscale_(g)  # fp16: the true node-average gradient (train/precision.py, Step I)
            if self.scheme == "allgather":
                result, flag = self._gather_and_average(self._step2_worker(bucket, g), node_flag)
                buffer.copy_(result[: bucket.numel])
            else:
                shard_packed, flag = self.exchange_shard(bucket, g, node_flag)
                self._step4_gather_node(shard_packed, bucket, buffer)
            self.rescale_(buffer, flag)  # fp16: what GradScaler divides back, or NaN on a skip (Step II)
            self.guard.note(flag, index, bucket.step)
            self.calls += 1
            return buffer

    def reduce_node_shard(
        self, index: int, shard: torch.Tensor, signature: tuple, node_flag: torch.Tensor
    ) -> torch.Tensor:
        """Steps II-III on a shard whose node average (step I) was already taken elsewhere: FSDP's
        reduce-scatter inside the node (:mod:`birder_repro.comm.fsdp`). Writes the +-1 result into ``shard``.

        Needs a state built with ``node_averaged=True`` (the worker level is this process alone: the shard is
        the "bucket"). ``node_flag``: the node's agreed non-finite flag for the shard (> 0: some process of the
        node had a NaN or Inf), which travels with the all-to-all as in the DDP path, so every rank agrees.
        """
        if self.worker_size != 1 or self.scheme != "hierarchical":
            raise RuntimeError("reduce_node_shard needs a hierarchical BirderState built with node_averaged=True")
        with torch.no_grad():
            bucket = self.store.bucket(index, shard.numel(), signature, shard.device)
            self.guard.begin(bucket)
            bucket.step += 1
            g = self.unscale_(shard.float())  # fp16: the true node-average gradient (Step I)
            if bucket.padded != bucket.numel:
                padded = bucket.workspace("padded", numel=bucket.padded, device=g.device)
                padded[: bucket.numel] = g  # the tail was zeroed when the workspace was made and stays zero
                g = padded
            shard_packed, flag = self.exchange_shard(bucket, g, node_flag)
            with self.timing("compress", shard.device):
                self._unpack_into(shard_packed, bucket.numel, shard)
            self.rescale_(shard, flag)  # fp16: what GradScaler divides back, or NaN on a skip (Step II)
            self.guard.note(flag, index, bucket.step)
            self.calls += 1
            return shard

    def exchange_shard(
        self, bucket: Bucket, g: torch.Tensor, node_flag: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps II-III on this rank's node-average shard ``g`` of ``bucket`` (padded): the worker step, the
        all-to-all among the processes with this local rank, the server step and the all-gather. Returns the
        packed +-1 of the shard and the agreed non-finite flag. Shared by the DDP hook and the FSDP path."""
        return self._step3_server(self._step2_worker(bucket, g), bucket, node_flag)

    def _step2_worker(self, bucket: Bucket, g: torch.Tensor) -> torch.Tensor:
        """Step II (Algorithm 1, lines 4-9) on the shard: m, b, e updated; returns u packed to 1 bit each."""
        st = bucket.state
        with self.timing("compress", g.device):
            amsgrad = self.amsgrad_after is not None and bucket.step > self.amsgrad_after
            fields = ("m", "b", "e") + (("b_hat",) if "b_hat" in st else ())
            # Skip mode: the kernel writes the new state beside the old, which stays whole for a skipped
            # step (no copy); raise mode: in place.
            new = self.guard.fresh(bucket, *fields)
            out = st if new is None else new
            shard = st["m"].numel()
            seed, where = self._draws(bucket, "worker", self.worker_rank * shard, (self.worker_rank + 1) * shard)
            packed = kernels.worker_compress(
                g,
                st["m"],
                st["b"],
                st["e"],
                self.beta,
                self.eps,
                seed,
                where,
                self.kernel_backend,
                b_hat=st["b_hat"] if amsgrad else None,
                state_out=tuple(out[k] for k in fields[: 4 if amsgrad else 3]) if new is not None else None,
            )
            if "b_hat" in st and not amsgrad:
                out["b_hat"].copy_(out["b"])  # until T0, b is the EMA itself (Algorithm 1, line 6)
            self.guard.commit(bucket, new)
        return packed

    def _step1_node_average(self, buffer: torch.Tensor, bucket: Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        """Step I: the node-average gradient of this rank's shard, fp32, padded with zeros; and the node's
        non-finite flag (how many of its processes had a NaN or Inf in the bucket), which travels as one extra
        element after each shard of the reduce-scatter (:mod:`birder_repro.comm.nonfinite`)."""
        flat = buffer.float()
        flag = local_flag(flat)
        numel = bucket.numel
        if self.worker_group is None:
            # Only read until the result is written back at the end, so no copy unless it needs padding.
            if bucket.padded != numel:
                padded = bucket.workspace("padded", numel=bucket.padded, device=flat.device)
                padded[:numel] = flat  # the tail was zeroed when the workspace was made and stays zero
                flat = padded
            return flat, flag
        m, shard_size = self.worker_size, bucket.padded // self.worker_size
        # Row r: shard r of the zero-padded gradient, then the flag. Whole rows are copied; the last partial
        # row's tail is padding, zero since the workspace was made (nothing else writes there).
        rows = bucket.workspace("rows", numel=m * (shard_size + 1), device=flat.device).view(m, shard_size + 1)
        whole, rest = divmod(numel, shard_size)
        rows[:whole, :shard_size] = flat[: whole * shard_size].view(whole, shard_size)
        if rest:
            rows[whole, :rest] = flat[whole * shard_size :]
        rows[:, shard_size] = flag
        shard = bucket.workspace("shard", numel=shard_size + 1, device=flat.device)
        with self.timing("comm", flat.device):
            # gloo has no AVG reduce-scatter: sum, then divide (exact for m = 2, and the same on every rank)
            reduce_scatter_flat(shard, rows.view(-1), op=dist.ReduceOp.SUM, group=self.worker_group)
        self.add_bytes(reduce_scatter_bytes(rows.numel() * 4, self.worker_size), 0.0)
        return shard[:shard_size].div_(m), shard[shard_size]

    def _step3_server(
        self, packed: torch.Tensor, bucket: Bucket, node_flag: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step III: all-to-all of chunks, server average + re-quantization (lines 11-12), all-gather.

        Each chunk carries one more byte, its node's non-finite flag, so every rank learns every node's flag
        for the bucket with the payload (returned second: > 0 if any process had a NaN or Inf)."""
        e_bar = bucket.state["e_bar"]
        n, chunk_bytes = self.server_size, e_bar.numel() // 8
        send = torch.empty(n, chunk_bytes + 1, device=packed.device, dtype=torch.uint8)
        send[:, :chunk_bytes] = packed.view(n, chunk_bytes)
        send[:, chunk_bytes] = (node_flag > 0).to(torch.uint8)
        received = torch.empty_like(send)
        with self.timing("comm", packed.device):
            if self.server_group is not None:
                dist.all_to_all_single(received.view(-1), send.view(-1), group=self.server_group)
            else:
                received.copy_(send)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, chunk_bytes + 1))
        flag = received[:, chunk_bytes].sum().to(torch.float32)
        with self.timing("compress", packed.device):
            lo = e_bar.numel() * (self.worker_rank * self.server_size + self.server_rank)  # chunk k of shard r
            seed, where = self._draws(bucket, "server", lo, lo + e_bar.numel())
            new = self.guard.fresh(bucket, "e_bar")
            chunk_packed = self._server_compress(
                received[:, :chunk_bytes].contiguous(), e_bar, seed, where, None if new is None else new["e_bar"]
            )
            self.guard.commit(bucket, new)
        shard_packed = torch.empty(packed.numel(), device=packed.device, dtype=torch.uint8)
        with self.timing("comm", packed.device):
            if self.server_group is not None:
                all_gather_flat(shard_packed, chunk_packed, group=self.server_group)
            else:
                shard_packed.copy_(chunk_packed)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, chunk_bytes))
        return shard_packed, flag

    def _server_compress(
        self, received: torch.Tensor, e_bar: torch.Tensor, seed: int, where: kernels.Segments, e_bar_out
    ) -> torch.Tensor:
        """Algorithm 1, lines 11-12 on this server's chunk (the kernel); a seam for the 1-bit DiLoCo's rounding."""
        return kernels.server_compress(received, e_bar, seed, where, self.kernel_backend, e_bar_out=e_bar_out)

    def _step4_gather_node(self, shard_packed: torch.Tensor, bucket: Bucket, buffer: torch.Tensor) -> None:
        """Step IV: intra-node all-gather of the packed shards, unpacked to +-1 into ``buffer``."""
        if self.worker_group is not None:
            full = torch.empty(bucket.padded // 8, device=shard_packed.device, dtype=torch.uint8)
            with self.timing("comm", full.device):
                all_gather_flat(full, shard_packed, group=self.worker_group)
            self.add_bytes(*peer_bytes(self.topology, self.worker_peers, shard_packed.numel()))
        else:
            full = shard_packed
        with self.timing("compress", full.device):
            self._unpack_into(full, bucket.numel, buffer)

    def _unpack_into(self, packed: torch.Tensor, numel: int, buffer: torch.Tensor) -> None:
        """The first ``numel`` signs of ``packed`` into DDP's bucket ``buffer``: the whole bytes straight into
        it (no temporary of the bucket's size), the last partial byte through a small one."""
        whole = numel // 8
        if buffer.dtype == torch.float32 and buffer.is_contiguous():
            kernels.unpack(packed[:whole], self.kernel_backend, out=buffer[: whole * 8])
        else:
            buffer[: whole * 8].copy_(kernels.unpack(packed[:whole], self.kernel_backend))
        if numel > whole * 8:
            buffer[whole * 8 :].copy_(
                kernels.unpack(packed[whole : whole + 1], self.kernel_backend)[: numel - whole * 8]
            )

    def _gather_and_average(self, packed: torch.Tensor, flag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``allgather``: every worker's bits (and, in one more byte, its non-finite flag) to every worker,
        averaged locally (no server step); returns the average and the agreed flag."""
        n, size = self.server_size, packed.numel()
        send = torch.empty(size + 1, device=packed.device, dtype=torch.uint8)
        send[:size] = packed
        send[size] = (flag > 0).to(torch.uint8)
        gathered = torch.empty(n * (size + 1), device=packed.device, dtype=torch.uint8)
        with self.timing("comm", packed.device):
            if self.server_group is not None:
                all_gather_flat(gathered, send, group=self.server_group)
            else:
                gathered.copy_(send)
        self.add_bytes(*peer_bytes(self.topology, self.server_peers, size + 1))
        rows = gathered.view(n, size + 1)
        with self.timing("compress", packed.device):
            return (
                kernels.unpack(rows[:, :size].contiguous(), self.kernel_backend).mean(dim=0),
                rows[:, size].sum().to(torch.float32),
            )

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards and their layouts; process groups are not saved. Taken between steps (no bucket
        in flight on the communication thread). The draws are counter-based: there is no generator to save."""
        self.runner.check_idle("BirderState.state_dict()")
        return {
            "scheme": self.scheme,
            "seed": self.seed,
            "buckets": self.store.state_dict(),
            "counters": self.snapshot(),
            "nonfinite": self.guard.state_dict(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Load a rank's :meth:`state_dict` into any DDP bucket layout (the first differing bucket migrates it)."""
        if sd["scheme"] != self.scheme:
            raise ValueError(f"checkpoint is of Birder scheme {sd['scheme']!r}, this hook runs {self.scheme!r}")
        self.runner.check_idle("BirderState.load_state_dict()")
        self.store.load_state_dict(sd["buckets"])
        self.seed = sd["seed"]  # (a checkpoint's "generator", from before counter-based draws, is not used)
        self.load_counters(sd["counters"])
        self.guard.load_state_dict(sd.get("nonfinite"))


def birder_hook(state: BirderState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the Hierarchical-1-bit-All-Reduce of one bucket (steps in the module doc).

    With ``overlap`` (the default) the work runs on the state's communication thread and the future completes
    when the bucket's result is in its buffer; without, it runs here and the future is already complete.
    """
    signature = bucket_signature(state.param_index, bucket)
    index, buffer = bucket.index(), bucket.buffer()
    return state.runner.run(lambda: state.allreduce_bucket(index, buffer, signature), buffer.device)


# DDP checks the hook's annotations as objects; this module's are strings (postponed evaluation).
birder_hook.__annotations__.update(bucket=dist.GradBucket, state=BirderState, return_=None)
birder_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
del birder_hook.__annotations__["return_"]


def attach_birder(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: Birder,
    gpus_per_node: int | None = None,
    scheme: str = "hierarchical",
    topology: Topology | None = None,
    kernel_backend: str = "auto",
    overlap: bool = True,
    nonfinite: str = "skip",
    layout_source: str | None = None,
    grad_scaler=None,
) -> BirderState:
    """Register the Birder hook on ``ddp_model`` and hand the optimizer its update: three lines in a script.

    ``gpus_per_node`` (processes per node; default: LOCAL_WORLD_SIZE from torchrun, which is every process of
    this machine) builds the topology when none is given. Rank 0 says the layout and where it came from, and
    warns where all processes form one node: the hierarchical scheme then compresses nothing between nodes
    (:func:`~birder_repro.comm.topology.announce_layout`). Collective: call it on every rank. beta, eps,
    amsgrad_after and seed come from the optimizer, which from then on only applies the hook's +-1 (see
    :class:`birder_repro.optim.Birder`).
    ``kernel_backend``: the compression kernels' (:mod:`birder_repro.comm.kernels`; auto: the fastest here);
    ``overlap``: run the hook's work on a communication thread beside the backward pass (false: inside it).
    ``nonfinite``: a NaN or Inf in any rank's gradient skips the whole step on every rank (``skip``: parameters
    and hook state untouched, ``state.nonfinite_steps`` counts it) or fails it (``raise``).
    ``layout_source``: what rank 0's layout line says the layout came from, where a framework knows better
    (Lightning's ``devices``); by default where the attach found it.
    ``grad_scaler``: the ``torch.amp.GradScaler`` the script scales its loss with (fp16), so that the hook
    compresses true gradients and the scaler still finds overflows (``state.use_grad_scaler``); a scaler that
    steps the optimizer without having been passed here is refused at the first step.

    The state's counters (``intra_node_bytes``, ``inter_node_bytes``, ``compress_seconds``,
    ``collective_seconds``) are cumulative from the attach on; ``state.bytes_last_step()`` gives one step's
    bytes (:class:`~birder_repro.comm.state.CommState`).
    """
    # Resolved and, on a GPU, self-tested here: a broken backend fails in one line now, not on the thread later.
    kernel_backend = kernels.check_backend(kernel_backend, next(ddp_model.module.parameters()).device)
    require_buckets(ddp_model, "attach_birder")
    if not isinstance(optimizer, Birder):
        raise TypeError(f"attach_birder needs a birder_repro.optim.Birder optimizer, got {type(optimizer).__name__}")
    groups = optimizer.param_groups
    for key in ("beta", "eps", "amsgrad_after"):
        if len({g[key] for g in groups}) != 1:
            raise ValueError(f"attach_birder: every parameter group must share {key}: the hook works per bucket")
    topology, source, guessed = resolve_topology(gpus_per_node, topology)
    # Workers are nodes only in the hierarchical scheme; flat and allgather compress between all processes.
    announce_layout(
        f"attach_birder (scheme={scheme})",
        topology,
        layout_source or source,
        between_nodes=scheme == "hierarchical",
        guessed=guessed,
    )
    state = BirderState(
        topology,
        scheme=scheme,
        beta=groups[0]["beta"],
        eps=groups[0]["eps"],
        amsgrad_after=groups[0]["amsgrad_after"],
        seed=optimizer.seed,
        param_numels=[p.numel() for p in ddp_model.module.parameters()],
        kernel_backend=kernel_backend,
        overlap=overlap,
        nonfinite=nonfinite,
    )
    state.use_grad_scaler(grad_scaler)
    state.param_index = parameter_index(ddp_model.module)
    ddp_model.register_comm_hook(state, birder_hook)
    optimizer.compressed_by_hook = True
    optimizer.hook_state = state  # its step() asks the hook whether to skip (end_step)
    return state


def attach_from_config(ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "birder"):
    """The runner's entry (birder_repro.comm.attach_comm): ``optim.comm.scheme``, ``kernel_backend`` and
    ``overlap`` from the ``optim`` config node (``bucket_cap_mb`` is DDP's: the worker builds DDP with it)."""
    comm = cfg.get("comm") or {}
    return attach_birder(
        ddp_model,
        optimizer,
        scheme=comm.get("scheme", "hierarchical"),
        topology=topology,
        kernel_backend=str(comm.get("kernel_backend", "auto")),
        overlap=bool(comm.get("overlap", True)),
        nonfinite=str(comm.get("nonfinite", "skip")),
    )
