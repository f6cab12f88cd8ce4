"""What ``mode=probe`` times over the first k nodes (:func:`time_scaling`) and writes for the pairwise exchanges
across nodes (all-to-all, all-gather: the 1-bit exchanges):
their times over the first k nodes, k = 2, 4, ... (:func:`scaling_counts`), as the cluster spec's measured
``exchange_shape`` per group (perf.exchange_shape), so that the model prices them at their own rate and shape,
not at the all-reduce's.

    world   every process of the first k nodes at once: 1-bit Adam's / 1-bit LAMB's compressed all-reduce
            (1-bit Adam paper, section 6: an all-to-all, then an all-gather, over every GPU);
    inter   one process a node over the first k nodes, every local rank's group at once: Birder's
            Hierarchical-1-bit-All-Reduce step (iii) (Birder paper, section 4).

Each call is one sample of its group (its median over the repeats); an all-to-all's bytes are each process's input,
an all-gather's its gathered output (perf.schemes' convention), as perf.measure.measure sizes them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .exchange_shape import ExchangeSample, rank_exchange_shapes
from .measure import measure

__all__ = ["EXCHANGE_KINDS", "exchange_spec", "scaling_counts", "time_scaling"]

EXCHANGE_KINDS = ("all_gather", "all_to_all")

# {group: {k nodes: {kind: {bytes: [seconds, ...]}}}}
ExchangeCalls = Mapping[str, Mapping[int, Mapping[str, Mapping[int, Sequence[float]]]]]


def exchange_spec(calls: ExchangeCalls, gpus_per_node: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec's ``exchange_shape`` ({group: {shape, alpha_us, bytes_per_s}}) from the exchanges' calls per group
    and node count, each group with two node counts or more; and for the record, per group, the shape found and
    the runner-up with their residuals, or why there is none (one node count: the exchange is then priced by the
    links' formula, uncalibrated)."""
    perf: dict[str, Any] = {}
    record: dict[str, Any] = {}
    for group, by_nodes in calls.items():
        samples = [
            ExchangeSample(int(k), gpus_per_node, ((group, float(nbytes)),), float(statistics.median(ts)))
            for k, kinds in by_nodes.items()
            for kind, by_size in kinds.items()
            if kind in EXCHANGE_KINDS
            for nbytes, ts in by_size.items()
            if ts
        ]
        if len({s.nodes for s in samples}) < 2:
            record[group] = {"note": "measured at one node count: no shape, priced by the links (uncalibrated)"}
            continue
        ranked = rank_exchange_shapes(samples)
        perf[group] = ranked[0].to_dict()
        record[group] = {
            "found": {**ranked[0].to_dict(), "residual": ranked[0].residual},
            "runner_up": {**ranked[1].to_dict(), "residual": ranked[1].residual},
        }
    return ({"exchange_shape": perf} if perf else {}), record


def scaling_counts(nodes: int) -> list[int]:
    """The node counts the all-reduce's growth is timed at: 2, 4, 8, ... below ``nodes``, and ``nodes``."""
    counts, k = [], 2
    while k < nodes:
        counts.append(k)
        k *= 2
    return [*counts, nodes] if nodes >= 2 else []


def time_scaling(nodes: int, m: int, sizes: Sequence[int], timing: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """On every process of the job: the world all-reduce over the first k nodes' processes, k = 2, 4, ..., n
    (:func:`scaling_counts`): how it grows with the node count; the exchanges (all-gather, all-to-all) over the
    same world, and among the first k nodes with every local rank's group at once (perf.exchange_probe).
    Returns this process's calls: the all-reduce's {k: {bytes: [s]}} in fp32 and in fp16 (sums included), and the
    exchanges' {"world"|"inter": {k: {kind: {bytes: [s]}}}}; rank 0's hold every group it is in (local rank 0's
    inter-node ones)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    scaling: dict[int, Any] = {}
    scaling16: dict[int, Any] = {}
    exchanges: dict[str, dict[int, Any]] = {"world": {}, "inter": {}}
    for k in scaling_counts(nodes):
        group = dist.new_group(list(range(k * m)))  # every rank creates every group
        if rank < k * m:
            calls = measure(("allreduce", *EXCHANGE_KINDS), sizes, group, **timing)
            scaling[k] = calls.pop("allreduce")
            exchanges["world"][k] = calls
            # a 16-bit run's all-reduce (fp16 DDP hook, DeepSpeed's fp16 buffer, a 1-bit run's warmup), sums included
            scaling16[k] = measure(("allreduce",), sizes, group, **{**timing, "dtype": "float16"})["allreduce"]
        dist.barrier()
        inter_k = [dist.new_group([j + i * m for i in range(k)]) for j in range(m)] if m > 1 else []
        if inter_k and rank < k * m:
            exchanges["inter"][k] = measure(EXCHANGE_KINDS, sizes, inter_k[rank % m], **timing)
        dist.barrier()
    return scaling, scaling16, exchanges
