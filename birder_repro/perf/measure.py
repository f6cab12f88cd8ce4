"""Time collectives as NVIDIA's nccl-tests do, and fit the performance model's cost of each to the times.

One job, used by both measurements of a link: ``birder-repro mode=probe`` (birder_repro.perf.probe: any
launcher, the cluster spec the model reads) and the emulated link probe (birder_repro.perf.linkprobe: a
fabric of its own on this machine). Both call :func:`measure` in a process group already joined, then
:func:`table_rows` (nccl-tests' table) and :func:`fit_level` / :func:`fit_alpha_beta` (the model's
t = steps alpha + factor S / bandwidth, Thakur, Rabenseifner and Gropp 2005, birder_repro.perf.collectives).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COLLECTIVES",
    "WARMUP",
    "REPEATS",
    "bus_factor",
    "latency_steps",
    "fit_alpha_beta",
    "call_points",
    "slowest_rank",
    "known_values",
    "measure",
    "measure_reduce_cost",
    "REDUCE_DTYPES",
    "table_rows",
    "fit_level",
]

WARMUP, REPEATS = 3, 9
# NCCL-tests' bus-bandwidth factors (its doc/PERFORMANCE.md), the same as the cost model's per-byte factors
# (Thakur, Rabenseifner and Gropp 2005; birder_repro.perf.collectives): busbw = algbw x factor, where algbw is
# "size" / time and "size" is the all-reduced vector, the reduce-scatter's input, the all-gather's output and
# each process's all-to-all input.
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "all_to_all")


def bus_factor(kind: str, p: int) -> float:
    """busbw / algbw for ``kind`` over ``p`` processes: 2(p-1)/p for all-reduce, (p-1)/p for the others."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
    return (2.0 if kind == "allreduce" else 1.0) * (p - 1) / p


def latency_steps(kind: str, p: int) -> int:
    """Network steps of ``kind`` (the alpha terms of its cost): 2(p-1) for the ring all-reduce, p-1 else."""
    return (2 if kind == "allreduce" else 1) * (p - 1)


def fit_alpha_beta(
    sizes: Sequence[float], seconds: Sequence[float], n: int, kind: str = "all_to_all", robust: bool = False
) -> tuple[float, float]:
    """Fit t = steps alpha + factor S beta (:func:`latency_steps`, :func:`bus_factor`: the model's cost of
    ``kind``, S its size as NCCL-tests counts it) over the points; returns (alpha s, beta s/byte), each at
    least 0, so 1/beta is the bus bandwidth. A size may come several times (one point per call). Least squares
    of the seconds, or with ``robust`` the Hockney fit of :func:`_fit_two_regimes`: beta from the larger half
    of the sizes (the rate three calls in four reach), alpha from the smaller half (the median), so neither a
    call slowed by a busy machine nor a spell of fast calls bends them."""
    xs = [bus_factor(kind, n) * s for s in sizes]
    k = latency_steps(kind, n)
    if robust:
        return _fit_two_regimes(xs, list(seconds), k)
    mx, my = statistics.fmean(xs), statistics.fmean(seconds)
    sxx = sum((x - mx) ** 2 for x in xs)
    beta = max(sum((x - mx) * (y - my) for x, y in zip(xs, seconds)) / sxx, 0.0) if sxx > 0 else 0.0
    alpha = max((my - beta * mx) / k, 0.0)
    return alpha, beta


def call_points(by_size: Mapping[int, Sequence[float]]) -> tuple[list[int], list[float]]:
    """(sizes, seconds) of every call of :func:`measure`'s ``{size: [seconds of each call]}``, for
    :func:`fit_alpha_beta`."""
    pairs = [(size, t) for size in sorted(by_size) for t in by_size[size]]
    return [size for size, _ in pairs], [t for _, t in pairs]


def _fit_two_regimes(xs: Sequence[float], ts: Sequence[float], k: int, rounds: int = 100) -> tuple[float, float]:
    """(alpha, beta) >= 0 of t = k alpha + x beta, each from the sizes where it dominates (Hockney's model as
    nccl-tests reads it: the bus bandwidth is the large messages' plateau, the latency the small messages'
    floor). beta is the upper quartile over the calls of the larger half of the sizes of (t - k alpha) / x: the
    rate three calls in four reach; alpha is the median over the smaller half's calls of (t - x beta) / k. The
    two alternate until they settle (alpha's share of a large message is small, so a few rounds do).

    Why not one line through every size: small messages can beat the link's rate. Between emulated nodes at
    100 Mbit/s, calls of 4-256 KiB fit in the tbf's burst and the sockets' buffers and ran at 60-190 Mbit/s of
    bus bandwidth while the all-to-all's calls of 1-16 MiB mostly ran at 48; a line fitted to all seven sizes
    by relative deviations came out at 69 Mbit/s, 1.4x the rate the model's megabyte-sized buckets meet.

    Why a quartile, not the median: the same exchanges ran in spells at about twice that rate (both directions
    at the line rate, where usually each direction's ACKs queue behind the other's data), from none to over
    half of a probe's calls, so a median wandered between the two (exchange efficiency 0.58-0.77 over three
    probes). A training step's exchanges ran at the lower rate (the link-byte counters of the emulated sweep's
    Birder runs: 51-56 of 100 Mbit/s), and the upper quartile of the times keeps to it while the spells stay
    under three calls in four. A link without spells gives its typical rate either way."""
    distinct = sorted(set(xs))
    cut = distinct[len(distinct) // 2]  # the larger half of the sizes, the middle one with them
    small, large = [i for i, x in enumerate(xs) if x < cut], [i for i, x in enumerate(xs) if x >= cut]
    alpha = beta = 0.0
    for _ in range(rounds):
        beta = max(0.0, _upper_quartile([(ts[i] - k * alpha) / xs[i] for i in large]))
        previous, alpha = (
            alpha,
            max(0.0, statistics.median((ts[i] - xs[i] * beta) / k for i in small) if small else 0.0),
        )
        if abs(alpha - previous) <= 1e-12 * max(alpha, 1e-30):
            break
    return alpha, beta


def _upper_quartile(values: Sequence[float]) -> float:
    """The 75th percentile (linear between order statistics, as numpy's default)."""
    return values[0] if len(values) == 1 else statistics.quantiles(values, n=4, method="inclusive")[2]


def slowest_rank(times: Sequence[float], group=None) -> list[float]:
    """Each call's time as the slowest rank saw it (an all-reduce MAX over ``group``, the default group if
    None, elementwise): a collective is done when it is done everywhere, and a training step waits for that.
    Between two nodes the two sides of one all-to-all finish up to 2x apart (measured: 29 and 55 ms for 339 KB
    each way at 100 Mbit/s), so a single rank's clock can make the link look twice as fast as the step finds it."""
    import torch
    import torch.distributed as dist

    slowest = torch.tensor(list(times), dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.tolist()


def _call(kind: str, send, recv, p: int, group) -> None:
    import torch.distributed as dist

    from birder_repro.comm.collectives import all_gather_flat, reduce_scatter_flat

    if kind == "allreduce":
        dist.all_reduce(send, group=group)
    elif kind == "reduce_scatter":
        reduce_scatter_flat(recv[: send.numel() // p], send, group=group)
    elif kind == "all_gather":
        all_gather_flat(recv, send[: recv.numel() // p], group=group)
    else:
        dist.all_to_all_single(recv, send, group=group)


def known_values(kind: str, p: int, rank: int, device=None, numel: int = 16):
    """(input, the output it must give) of ``kind`` for the process ``rank`` of a group of ``p``, ``numel``
    elements a chunk: :func:`measure` checks one call of each collective on them first, as nccl-tests checks
    its results, so that a collective returning wrong data fails the probe instead of timing it."""
    import torch

    n = numel * p
    expected = {
        "allreduce": torch.full((n,), p * (p + 1) / 2),  # every rank sends rank + 1
        "reduce_scatter": torch.full((n,), p * (p + 1) / 2),  # its chunk of that sum
        "all_gather": torch.arange(1, p + 1).repeat_interleave(numel).float(),
        "all_to_all": (torch.arange(p) * p + rank).repeat_interleave(numel).float(),
    }[kind]
    if kind == "all_to_all":  # chunk j of rank r holds r p + j, so chunk i received here holds i p + rank
        send = (rank * p + torch.arange(p)).repeat_interleave(numel).float()
    else:
        send = torch.full((n,), float(rank + 1))
    return send.to(device), expected[: numel if kind == "reduce_scatter" else n].to(device)


def measure(
    kinds: Sequence[str],
    sizes: Sequence[int],
    group=None,
    device=None,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    dtype: str = "float32",
) -> dict[str, dict[int, list[float]]]:
    """The seconds of each of ``repeats`` calls (after ``warmup``) of each collective of ``kinds`` at each size
    in bytes (rounded up to whole ``dtype`` elements on every process of ``group``: float32, or float16 as a 16-bit
    run's all-reduce sends them, its sums included); each call after a barrier
    and taken at its slowest rank. Every call is kept, not only a median: between emulated nodes an exchange
    runs for several calls in a row at twice its usual rate, so a size's median can land on either mode, and
    a fit over all the calls of several sizes is steadier than one over their medians. Collective over
    ``group`` (the default group if None). Each kind's result is first checked on known values
    (:func:`known_values`): a wrong one raises, naming the collective."""
    import torch
    import torch.distributed as dist

    p = dist.get_world_size(group)
    element = {"float32": 4, "float16": 2}[dtype]
    torch_dtype = getattr(torch, dtype)
    for kind in kinds:
        send, expected = (t.to(torch_dtype) for t in known_values(kind, p, dist.get_rank(group), device))
        recv = torch.empty_like(send)
        _call(kind, send, recv, p, group)
        got = send if kind == "allreduce" else recv[: expected.numel()]
        if not torch.equal(got, expected):
            raise RuntimeError(
                f"probe: {kind} over {p} processes returned wrong values (rank "
                f"{dist.get_rank(group)}: {got[:4].tolist()}..., expected {expected[:4].tolist()}...)"
            )
    results: dict[str, dict[int, list[float]]] = {k: {} for k in kinds}
    for size in sizes:
        size = -(-int(size) // (element * p)) * element * p
        send = torch.zeros(size // element, dtype=torch_dtype, device=device)
        recv = torch.empty_like(send)
        for kind in kinds:
            times = [_timed(lambda: _call(kind, send, recv, p, group), send, group) for _ in range(warmup + repeats)]
            results[kind][size] = slowest_rank(times[warmup:], group)
    return results


def _timed(call, tensor, group) -> float:
    """Seconds of one ``call`` after a barrier over ``group``, its device's work included (``tensor``'s)."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=group)
    t0 = time.perf_counter()
    call()
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - t0


REDUCE_DTYPES = ("float16", "bfloat16")


def measure_reduce_cost(
    numel: int, group=None, device=None, warmup: int = WARMUP, repeats: int = REPEATS, dtypes=REDUCE_DTYPES
) -> dict[str, dict[str, float]]:
    """What a 16-bit sum costs beyond its bytes: per dtype of ``dtypes``, all-reduces of ``numel`` elements in it
    and of ``numel / 2`` fp32 elements (the same bytes on the wire), taken in turns (so a busy spell slows
    both), each at its slowest rank; ``extra_ns_per_element`` is the difference of the medians over the
    elements each process adds, (p-1)/p of the vector in a ring (perf.cluster.reduce_time). gloo sums fp16
    element by element through fp32 (measured on loopback, 2 processes, 670,730 elements: 3.94 ms against fp32's
    3.08), so half the bytes do not halve the time. Collective over ``group``."""
    import torch
    import torch.distributed as dist

    p = dist.get_world_size(group)
    numel = -(-int(numel) // (2 * p)) * 2 * p
    wide = torch.zeros(numel // 2, dtype=torch.float32, device=device)
    out: dict[str, dict[str, float]] = {}
    for name in dtypes:
        narrow = torch.zeros(numel, dtype=getattr(torch, name), device=device)
        times: dict[str, list[float]] = {"narrow": [], "wide": []}
        for _ in range(warmup + repeats):
            for key, tensor in (("narrow", narrow), ("wide", wide)):
                times[key].append(_timed(lambda t=tensor: dist.all_reduce(t, group=group), tensor, group))
        narrow_s = statistics.median(slowest_rank(times["narrow"][warmup:], group))
        wide_s = statistics.median(slowest_rank(times["wide"][warmup:], group))
        added = (p - 1) / p * numel if p > 1 else float("nan")
        out[name] = {
            "elements": float(numel),
            "seconds": narrow_s,
            "fp32_same_bytes_s": wide_s,
            "extra_ns_per_element": 1e9 * (narrow_s - wide_s) / added,
        }
    return out


# ------------------------------------------------------------------------------------------- the fits
def table_rows(results: Mapping[str, Mapping[int, Sequence[float]]], p: int) -> list[dict[str, Any]]:
    """nccl-tests' table: one row per collective and size: bytes, the median call's seconds, algbw and busbw in
    bytes/s, and every call's seconds (``calls_s``, what the fit takes)."""
    rows = []
    for kind, by_size in results.items():
        for size, calls in sorted(by_size.items()):
            seconds = statistics.median(calls)
            algbw = size / seconds
            rows.append(
                {
                    "kind": kind,
                    "bytes": int(size),
                    "seconds": seconds,
                    "algbw_Bps": algbw,
                    "busbw_Bps": algbw * bus_factor(kind, p),
                    "calls_s": [float(t) for t in calls],
                }
            )
    return rows


def fit_level(results: Mapping[str, Mapping[int, Sequence[float]]], p: int) -> dict[str, dict[str, float]]:
    """Each collective's (alpha seconds, bus bandwidth bytes/s) fitted to the model's cost of it over every
    call (``{kind: {size: [seconds of each call]}}``, :func:`measure`'s). Where the times did not grow with
    the size (messages too small for the link, or noise), the fit has no bandwidth: the largest bus bandwidth
    measured stands for it, a lower bound (raise ``probe.max_bytes`` for more)."""
    fits = {}
    for kind, by_size in results.items():
        alpha, beta = fit_alpha_beta(*call_points(by_size), p, kind, robust=True)
        measured = max(r["busbw_Bps"] for r in table_rows({kind: by_size}, p))
        fits[kind] = {"alpha_s": alpha, "bandwidth_Bps": 1.0 / beta if beta > 0 else measured}
    return fits
