"""The run's profile for the performance model (record key ``profile``; birder_repro.perf.profile.Profile),
measured on the run's own device, so that ``load_profile(run_dir)`` works on any completed run.

    forward_backward_s, backward_fraction   the compute calibration (forward and backward timed apart)
    optimizer_s                              the optimizer step's own computation, per step
    bucket_elements, bucket_ready_s          each hook call on the timed steps (birder_repro.comm.readiness):
                                             the buckets in the order they fired, the median moment of each
                                             from the start of backward; bucket_ready is that over the
                                             calibrated backward pass, capped at 1
    compression_s_per_element                the hook's compression seconds per step over the elements the
                                             performance model says its scheme compresses per step
                                             (perf.schemes.compressed_elements), for the scheme's backend;
                                             1-bit Adam alone (one process compresses nothing): its
                                             compressed all-reduce timed on the run's largest bucket
    link_mbit_measured                       emulated clusters: the busiest node's link bytes per step (the
                                             kernel's count) over the step's exposed communication time
    data_wait_s, threads, host_cores         the data loader's wait, torch's threads, this machine's cores
    processes, node_cores                    this node's processes and the cores they may run on (an emulated
                                             node's pinning), the contention the times were measured under
    scheme_overhead_s                        1-node runs: the measured step beyond the model's prediction of
                                             that same step (DDP's own work, a lone process's hook)
    loop_overhead_s                          1-node runs: the training loop's pass a step (loop_step_s) beyond
                                             the step and the loop's own collectives as the model prices them

Rank 0's own measurements (every rank runs the same buckets); times are per process.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from birder_repro.comm.kernels import process_cores
from birder_repro.comm.onebit_exchange import compressed_allreduce
from birder_repro.comm.state import CommState
from birder_repro.perf.advice_methods import comm_rank
from birder_repro.perf.cluster import ClusterSpec
from birder_repro.perf.model import loop_collectives_s, predict_step
from birder_repro.perf.profile import Profile, bucket_matrices
from birder_repro.perf.schemes import COMPRESSION_BACKEND, compressed_elements, scheme_for_optim

__all__ = ["bucket_timings", "measured_profile"]


def bucket_timings(steps: Sequence[Sequence[tuple[int, int, float]]]) -> tuple[list[int], list[float]]:
    """(elements, median seconds from the start of backward) of each bucket, in the order the last timed
    step fired them, from the hook calls of every timed step (index, elements, seconds)."""
    steps = [s for s in steps if s]
    if not steps:
        return [], []
    order = [(index, numel) for index, numel, _ in steps[-1]]
    moments: dict[int, list[float]] = {index: [] for index, _ in order}
    for calls in steps:
        for index, _, seconds in calls:
            if index in moments:
                moments[index].append(seconds)
    return [numel for _, numel in order], [statistics.median(moments[index]) for index, _ in order]


def _scheme(cfg) -> str:
    comm = cfg.optim.get("comm") if hasattr(cfg.optim, "get") else None
    quantize = cfg.optim.get("quantize") if hasattr(cfg.optim, "get") else None  # Streaming DiLoCo's stream width
    return scheme_for_optim(
        str(cfg.optim.name), (comm or {}).get("scheme") if comm is not None else None, quantize=quantize
    )


def _per_element(
    scheme: str, buckets: list[int], nodes: int, gpus: int, compress_s: float, rank: int, matrices: list
) -> dict[str, float]:
    """The hook's compression seconds a step over the elements the model counts for them, at the run's own
    PowerSGD ``rank`` and over its ``matrices`` (a bucket's each, or None), as perf.model.predict_step counts
    them: counted at rank 1 over square buckets, a rank-4 run's cost came out 3.3x its measured seconds."""
    backend = COMPRESSION_BACKEND.get(scheme)
    if not backend or not buckets or not compress_s > 0:
        return {}
    elements = sum(
        compressed_elements(scheme, b, nodes, gpus, rank=rank, matrices=mats, alone=True)
        for b, mats in zip(buckets, matrices)
    )
    return {backend: compress_s / elements} if elements else {}


def parameter_matrices(parameters) -> list[list[int]]:
    """Every trainable parameter as PowerSGD sees it (torch's powerSGD_hook: a tensor of 2 or more dimensions
    as shape[0] rows by the rest, a vector as itself), in parameter order: Profile.matrices."""
    out = []
    for q in parameters:
        if q.requires_grad:
            out.append([int(q.shape[0]), int(q.numel() // q.shape[0])] if q.dim() > 1 else [int(q.numel())])
    return out


def _lone_onebit(buckets: list[int], device, repeats: int = 3) -> dict[str, float]:
    """1-bit Adam's compression cost per element, for a process that is alone. Alone, its hook (as DeepSpeed's)
    compresses nothing, so the run's own compression seconds price nothing; here the compressed all-reduce runs
    on the largest bucket of the run through the 1-process group (its collectives copy locally) and its
    compression seconds, the median of ``repeats``, are divided by the elements the model counts for it
    (perf.schemes.compressed_elements with n = m = 1). ``device``: the run's torch device (not its display
    name, which the profile records)."""
    import torch
    import torch.distributed as dist

    if not buckets or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != 1:
        return {}
    size = -(-max(buckets) // 8) * 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, generator=gen).to(device)
    worker_error, server_error = torch.zeros_like(x), torch.zeros_like(x)
    mask = torch.ones_like(x)
    times = []
    for _ in range(repeats):
        stats = CommState()
        compressed_allreduce(x.clone(), worker_error, server_error, mask, stats=stats)
        times.append(stats.compress_seconds)
    return {"onebit": statistics.median(times) / compressed_elements("onebit", size, 1, 1, alone=True)}


def _link_mbit(record: dict[str, Any]) -> float | None:
    per_node = [v for v in (record.get("link_bytes_per_step") or []) if v is not None]
    comm = (record.get("step_time_s") or {}).get("communication") or 0.0
    if not per_node or not max(per_node) > 0 or not comm > 0:
        return None
    return max(per_node) * 8 / comm / 1e6


def measured_profile(
    cfg,
    record: dict[str, Any],
    *,
    bucket_steps: Sequence,
    backward_s: float,
    optimizer_s: float,
    compress_s: float,
    nodes: int,
    gpus_per_node: int,
    device: str,
    threads: int,
    torch_device=None,
    matrices: list[list[int]] | None = None,
) -> dict[str, Any] | None:
    """The profile (a dict of Profile's fields) from the run's figures ``record`` (the loop's and the probes'
    keys), the hook calls of its timed steps, and per step of its main stage (1-bit Adam's compression stage,
    else the whole run) the optimizer's own seconds and the hook's compression seconds; None where the run
    measured no compute. ``device`` is the display name the profile records ("cuda (NVIDIA H100 ...)"),
    ``torch_device`` the device the run computed on (default: the CPU), ``matrices`` its trainable
    parameters' shapes (:func:`parameter_matrices`)."""
    fb = record.get("forward_backward_s")
    params = record.get("parameters")
    if not fb or not fb > 0 or not params:
        return None
    buckets, ready_s = bucket_timings(bucket_steps)
    if buckets and sum(buckets) != params:  # buckets hold only what DDP reduces; trust what it reduced
        params = sum(buckets)
    timed = max(int(record.get("timed_steps") or 0), 1)
    scheme = _scheme(cfg)
    rank = comm_rank(cfg)  # PowerSGD's: the profile's seconds per element are counted at it
    backward = min(max(backward_s, 1e-9), fb)
    profile = Profile(
        name=f"run:{cfg.task.name}/{cfg.optim.name}/{nodes}x{gpus_per_node}",
        device=device,
        task=str(cfg.task.name),
        forward_backward_s=float(fb),  # fb: all micro-batches of a step (train.accumulate)
        batch_size=int(record["batch_size"]) * int(record.get("accumulate") or 1),
        parameter_count=int(params),
        optimizer_s=max(optimizer_s, 0.0),
        backward_fraction=backward / fb,
        bucket_elements=buckets,
        bucket_ready=[min(t / backward, 1.0) for t in ready_s],
        compression_s_per_element=(
            _lone_onebit(buckets, torch_device or "cpu")
            if scheme == "onebit" and nodes * gpus_per_node == 1
            else _per_element(
                scheme, buckets, nodes, gpus_per_node, compress_s, rank, bucket_matrices(matrices or [], buckets)
            )
        ),
        matrices=list(matrices or []),
        bucket_ready_s=ready_s,
        data_wait_s=float(record.get("data_wait_s_per_step") or 0.0),
        threads=int(threads),
        host_cores=os.cpu_count(),
        processes=int(gpus_per_node),
        node_cores=process_cores(),
        link_mbit_measured=_link_mbit(record),
        notes=f"measured by the run itself ({timed} timed steps; scheme {scheme} on {nodes} x {gpus_per_node})",
    )
    if nodes == 1:
        _add_overhead(profile, cfg, record, scheme, gpus_per_node, rank)
    return profile.to_dict()


def _add_overhead(profile, cfg, record: dict[str, Any], scheme: str, gpus_per_node: int, rank: int = 1) -> None:
    """On one node, what the step measured beyond the model's own prediction of it (DDP's bucket copies, a
    hook's work on one process that the model does not count) goes into ``scheme_overhead_s``, as the paper
    profiles derive it from the paper's 1-node rows (birder_repro.perf.paper_profiles, step 4). The prediction
    is of the run as it ran: PowerSGD at its ``rank``."""
    measured = (record.get("step_time_s") or {}).get("total")
    cluster = cfg.get("cluster") if hasattr(cfg, "get") else None
    try:
        spec = ClusterSpec.from_config(cluster)
    except (ValueError, TypeError, KeyError, AttributeError):  # no cluster config, or no perf block
        return
    if not measured:
        return
    predicted = predict_step(profile, spec, 1, gpus_per_node, scheme, rank=rank).total_s
    if gpus_per_node == 1:  # a lone process: the model counts no compression, the per-element cost has it
        predicted += float((record.get("step_time_s") or {}).get("compression") or 0.0)
    profile.scheme_overhead_s[scheme] = max(measured - predicted, 0.0)
    profile.unexplained_share[scheme] = profile.scheme_overhead_s[scheme] / float(measured)
    loop = record.get("loop_step_s")
    if loop:  # the loop's own work a step, measured: beyond the step and the collectives the model prices
        profile.loop_overhead_s = max(float(loop) - measured - loop_collectives_s(spec, 1, gpus_per_node), 0.0)
