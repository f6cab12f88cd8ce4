"""Predict one training step on a cluster layout from a one-node profile.

    step = simulate(buckets, compute) (birder_repro.perf.timeline): each DDP bucket is ready during the
           backward pass; its compression (profile seconds/element x schemes.compressed_elements) and its
           collectives (schemes.bucket_collectives, each priced by cluster.op_time) run on one link after the
           previous bucket's; what is not hidden behind the backward pass is exposed. That is the
           ``this`` implementation (birder_repro.perf.implementations); where the processes of an emulated
           cluster have no spare core for their communication thread, the compression takes turns with the
           backward pass (simulate_shared); where an implementation does not
           overlap a scheme, its buckets add their whole time (simulate_sequential), where it overlaps a
           fraction, the step is that mixture of the two (blend), and where it exchanges
           the whole flattened vector in the optimizer's step, the "buckets" are that one vector.
    compute = forward + backward (the profile's: affine in the batch where it holds two batch sizes, else linear)
              + optimizer (with its own collectives, Profile.optimizer_collectives) + the scheme's overhead.

Runs with two stages (1-bit Adam / 1-bit LAMB: warmup uncompressed, in fp16 where the profile's precision is
fp16, then compression; PowerSGD: fp32 before its
start iteration) report the whole run as the paper does (Birder paper, appendix E): the mean step time is
the stages' step times weighted by their share of the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from .cluster import (
    PAIRWISE,
    ClusterSpec,
    exchange_latency,
    host_contention,
    no_spare_core,
    node_contention,
    op_time,
)
from .implementations import ImplementationLike, implementation_of
from .profile import Profile, bucket_matrices
from .schemes import (
    COMPRESSION_BACKEND,
    Collective,
    bucket_collectives,
    compressed_elements,
    counted_bytes,
    sync_collectives,
)
from .timeline import BucketWork, StepTimeline, blend, ready_times, simulate, simulate_sequential, simulate_shared

__all__ = [
    "StepPrediction",
    "LOOP_COLLECTIVES",
    "loop_collectives_s",
    "optimizer_collectives_s",
    "waits_overlap_wire",
    "predict_step",
    "predict_run",
]

# The training loop's own collectives every step (birder_repro.train.loop), outside the timed step: the ranks'
# agreement on a stop signal (two floats) and the divergence check (one), each an all-reduce across every
# process. The training clock counts them (birder_repro.train.target), and with the ranks' waits for each other
# they cost a short step much: DiLoCo's 2 x 2 clock ran 15-27 % above its summed step times.
LOOP_COLLECTIVES = (Collective("allreduce", "world", 8.0), Collective("allreduce", "world", 4.0))


def loop_collectives_s(cluster: ClusterSpec, nodes: int, gpus_per_node: int) -> float:
    """Seconds a step of the training loop spends in :data:`LOOP_COLLECTIVES` (none for one process). They run
    between steps, where no process computes, at the link's latency: a world all-reduce's measured wait for a
    turn on a shared core (perf.cluster, "world") is not charged to them. MEASURED on the 2 x 2 field: the loop
    clock's mean step exceeded the timed step by 6.1-10.7 ms (each method's median), which the profiles' loop
    overhead plus these at the link's latency put at about 7 ms, and at the wait at about 12."""
    if nodes * gpus_per_node <= 1:
        return 0.0
    between = replace(cluster, world_latency_us=[kv for kv in cluster.world_latency_us or () if kv[0] != "allreduce"])
    return sum(op_time(op, nodes, gpus_per_node, between) for op in LOOP_COLLECTIVES)


@dataclass(frozen=True)
class StepPrediction:
    scheme: str
    nodes: int
    gpus_per_node: int
    batch_size: int
    total_s: float
    compute_s: float
    communication_s: float
    compression_s: float
    intra_node_bytes: float  # per process per step, as the hooks count them
    inter_node_bytes: float
    collectives: int  # collectives per step per process
    comm_busy_s: float  # all collectives' time, hidden or not
    compress_busy_s: float  # all compression time, hidden or not
    data_wait_s: float = 0.0  # the wait for the data loader (the profile's), part of total_s

    @property
    def throughput(self) -> float:
        return self.nodes * self.gpus_per_node * self.batch_size / self.total_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throughput_samples_per_s": self.throughput}


def optimizer_collectives_s(profile: Profile, cluster: ClusterSpec, nodes: int, gpus_per_node: int) -> float:
    """The optimizer step's own collectives (Profile.optimizer_collectives: LAMB's global norm, a loss scaler's
    overflow flag), each an all-reduce or exchange over every process, priced on the cluster; none on one
    process. A small one is its latency: on a measured cluster its steps grow with the node count as the
    all-reduce's shape says (perf.shape)."""
    if nodes * gpus_per_node <= 1:
        return 0.0
    ops = [Collective(str(kind), "world", float(nbytes)) for kind, nbytes in profile.optimizer_collectives]
    return sum(op_time(op, nodes, gpus_per_node, cluster) for op in ops)


def waits_overlap_wire(ops: Sequence[Collective], nodes: int, cluster: ClusterSpec) -> bool:
    """Whether a bucket's exchange overlaps its waits with its bytes on the wire: on an emulated cluster's shared
    cores, an exchange over every process that only moves data (all-to-all, all-gather: 1-bit Adam's) posts all
    its sends at once, and the link carries them while the processes wait for their turn on the core. Its waits
    are the per-step latencies mode=probe measured over every process (which are that turn-taking) and the
    1-node profile's leftover, which is the same exchange's turn-taking there (on one node it is the whole
    exchange). The exchange takes the longer of its waits and its wire time, not their sum. MEASURED: the 1-bit
    Adams' 2 x 2 steps were flat from 100 Mbit/s to unshaped (51, 44, 44, 49 ms) while each node's link carried
    185 KB a step, 15 ms at the full 100 Mbit/s; summed, the model put them 20-30 % long on the slow links.
    Not so where a collective reduces (a ring's next send waits for its sum: the fp16 hook's flat all-reduce,
    charged so, came out 27 % short) or where the inter-node exchange is a stage of its own after a node's
    (Birder's and the two-level hooks', whose leftover is their intra-node stages: 19 % short), nor on a real
    cluster, whose latencies are the wire's."""
    return (
        cluster.shared_host
        and nodes > 1
        and bool(ops)
        and all(op.group == "world" and op.kind in PAIRWISE for op in ops)
    )


def predict_step(
    profile: Profile,
    cluster: ClusterSpec,
    nodes: int,
    gpus_per_node: int,
    scheme: str,
    batch_size: int | None = None,
    rank: int = 1,
    implementation: ImplementationLike = "this",
    local_steps: int = 1,
) -> StepPrediction:
    """One step of ``scheme`` (birder_repro.perf.schemes.SCHEMES) on ``nodes`` x ``gpus_per_node``, as
    ``implementation`` (birder_repro.perf.implementations: ``this`` or ``paper``) runs it. ``local_steps``:
    DiLoCo's H; its outer exchange (:func:`~birder_repro.perf.schemes.sync_collectives`, after the optimizer
    step, overlapping nothing) is charged as 1/H of its time and bytes to every step."""
    impl = implementation_of(implementation, scheme)
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes}, {gpus_per_node}")
    batch = profile.batch_size if batch_size is None else int(batch_size)
    # An emulated cluster's nodes share one machine: its cores' time is shared by every process. A profile
    # measured under contention (its node pinned to fewer cores than it has processes) already holds it: only
    # the ratio is charged, not the layout's contention on top of the profile's.
    slow = host_contention(cluster, nodes * gpus_per_node, profile.threads, profile.host_cores, nodes) / (
        node_contention(profile.processes, profile.threads, profile.node_cores) if cluster.shared_host else 1.0
    )
    fb = profile.compute_s(batch) * slow
    forward, backward = fb * (1 - profile.backward_fraction), fb * profile.backward_fraction
    sizes = profile.buckets() if impl.granularity == "bucket" else [profile.parameter_count]
    ready = ready_times(sizes, forward, backward, profile.bucket_ready or None)
    backend = COMPRESSION_BACKEND[scheme]
    per_element = slow * profile.compression_s_per_element.get(backend, 0.0) if backend else 0.0
    if backend and backend not in profile.compression_s_per_element and nodes * gpus_per_node > 1:
        raise ValueError(
            f"profile {profile.name!r} has no compression cost for {backend!r} (scheme {scheme}); "
            f"it has {sorted(profile.compression_s_per_element)}"
        )
    leftover, moved, everything = profile.scheme_overhead_s.get(scheme, 0.0), 0.0, float(sum(sizes)) or 1.0
    work, intra, inter, count = [], 0.0, 0.0, 0
    for size, t_ready, mats in zip(sizes, ready, bucket_matrices(profile.matrices, sizes)):
        ops = bucket_collectives(scheme, size, nodes, gpus_per_node, matrices=mats, rank=rank)
        comm = sum(op_time(op, nodes, gpus_per_node, cluster) for op in ops)
        if waits_overlap_wire(ops, nodes, cluster):
            share = leftover * size / everything  # this bucket's part of the exchange's leftover
            latency = sum(exchange_latency(op, nodes, gpus_per_node, cluster) for op in ops)
            comm, moved = max(share + latency, comm - latency), moved + share  # waits against the wire
        for op in ops:
            a, b = counted_bytes(op, nodes, gpus_per_node)
            intra, inter = intra + a, inter + b
        count += len(ops)
        compress = per_element * compressed_elements(scheme, size, nodes, gpus_per_node, rank, mats)
        work.append(BucketWork(t_ready, compress, comm))
    # The optimizer's arithmetic time-shares the cores like the backward pass; the scheme's leftover does not:
    # on the 1-node profile it is mostly waiting (the intra-node collectives, the hand-offs to the hook's
    # thread), counted once: scaled by the contention, Birder's 2 x 2 step at 200 Mbit/s came out 2x the
    # measured one (docs/performance-model.md, "The 1-node leftover").
    optimizer = (
        slow * profile.optimizer_s + leftover - moved + optimizer_collectives_s(profile, cluster, nodes, gpus_per_node)
    )
    tl: StepTimeline = simulate_sequential(work, fb, optimizer)
    if impl.overlap > 0:
        shared = no_spare_core(cluster, nodes * gpus_per_node, profile.threads, profile.host_cores)
        overlapped = (simulate_shared if shared else simulate)(work, fb, optimizer)
        tl = overlapped if impl.overlap == 1 else blend(overlapped, tl, impl.overlap)
    sync = sync_collectives(scheme, profile.parameter_count, nodes, gpus_per_node)
    sync_s = sum(op_time(op, nodes, gpus_per_node, cluster) for op in sync) / max(int(local_steps), 1)
    for op in sync:
        a, b = counted_bytes(op, nodes, gpus_per_node)
        intra, inter = intra + a / max(int(local_steps), 1), inter + b / max(int(local_steps), 1)
    return StepPrediction(
        scheme=scheme,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        batch_size=batch,
        total_s=tl.total_s + sync_s + profile.data_wait_s,
        compute_s=tl.compute_s,
        communication_s=tl.communication_s + sync_s,
        compression_s=tl.compression_s,
        intra_node_bytes=intra,
        inter_node_bytes=inter,
        collectives=count,
        comm_busy_s=sum(w.comm_s for w in work),
        compress_busy_s=sum(w.compress_s for w in work),
        data_wait_s=profile.data_wait_s,
    )


def predict_run(
    profile: Profile,
    cluster: ClusterSpec,
    nodes: int,
    gpus_per_node: int,
    scheme: str,
    batch_size: int | None = None,
    rank: int = 1,
    warmup_fraction: float = 0.0,
    implementation: ImplementationLike = "this",
    local_steps: int = 1,
) -> dict[str, Any]:
    """The whole run: ``warmup_fraction`` of the steps in fp32 (1-bit Adam's freeze, PowerSGD's start
    iteration), the rest in ``scheme``. Returns the mean step ('run') and each stage's prediction."""
    if not 0 <= warmup_fraction <= 1:
        raise ValueError(f"warmup_fraction must be in [0, 1], got {warmup_fraction}")
    main = predict_step(
        profile, cluster, nodes, gpus_per_node, scheme, batch_size, rank, implementation, local_steps=local_steps
    )
    stages = {scheme: main}
    # the uncompressed exchange of the warmup: a 16-bit all-reduce where the run trains in fp16 (the 1-bit papers')
    warmup = "fsdp_hsdp" if scheme.startswith("fsdp_") else ("fp16" if profile.precision == "fp16" else "fp32")
    if warmup_fraction > 0 and scheme != warmup:
        stages = {
            "warmup": predict_step(
                profile, cluster, nodes, gpus_per_node, warmup, batch_size, implementation=implementation
            ),
            "compression": main,
        }
        weights = {"warmup": warmup_fraction, "compression": 1 - warmup_fraction}
    else:
        weights = {scheme: 1.0}
    keys = (
        "total_s",
        "compute_s",
        "communication_s",
        "compression_s",
        "data_wait_s",
        "intra_node_bytes",
        "inter_node_bytes",
        "collectives",
    )
    mean = {k: sum(weights[s] * getattr(p, k) for s, p in stages.items()) for k in keys}
    world = nodes * gpus_per_node
    mean["throughput_samples_per_s"] = world * main.batch_size / mean["total_s"]
    return {"run": mean, "stages": {s: p.to_dict() for s, p in stages.items()}, "weights": weights}
