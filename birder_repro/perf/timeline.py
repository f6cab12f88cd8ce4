"""One training step: the buckets' communication overlapped with the backward pass (wait-free backprop), or not.

After Espresso's simulator (Wang et al., "Espresso: Revisiting Gradient Compression from the System
Perspective", 2023) and the wait-free backpropagation of Poseidon (Zhang et al., USENIX ATC 2017): the
buckets are communicated one after another on one link, in the order DDP fires them (reverse parameter
order); bucket k starts at max(ready_k, done_{k-1}), is compressed, then its collectives run; the step ends
when both the backward pass and the last bucket are done, and the optimizer has stepped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BucketWork", "StepTimeline", "simulate", "simulate_shared", "simulate_sequential", "blend", "ready_times"]


@dataclass(frozen=True)
class BucketWork:
    ready_s: float  # when its gradients are all computed, from the start of the step
    compress_s: float  # compression and decompression on this rank
    comm_s: float  # its collectives, one after another


@dataclass(frozen=True)
class StepTimeline:
    total_s: float
    compute_s: float  # forward + backward + optimizer step
    communication_s: float  # exposed communication: not hidden behind the backward pass
    compression_s: float  # exposed compression
    starts: tuple[float, ...]
    ends: tuple[float, ...]


def ready_times(
    sizes: Sequence[float], forward_s: float, backward_s: float, fractions: Sequence[float] | None = None
) -> list[float]:
    """When each bucket is ready: ``fractions`` of the backward pass if measured, else spread over the
    backward pass in proportion to the buckets' sizes (bucket k ready once its share and all before it are)."""
    if fractions is not None:
        if len(fractions) != len(sizes):
            raise ValueError(f"{len(fractions)} bucket ready fractions for {len(sizes)} buckets")
        return [forward_s + backward_s * float(f) for f in fractions]
    total = float(sum(sizes)) or 1.0
    out, done = [], 0.0
    for size in sizes:
        done += size
        out.append(forward_s + backward_s * done / total)
    return out


def simulate(buckets: Sequence[BucketWork], forward_backward_s: float, optimizer_s: float) -> StepTimeline:
    """Run the buckets through one link; the exposed time (the step beyond the compute) is split between
    compression and communication in proportion to their totals."""
    free, starts, ends = 0.0, [], []
    for b in buckets:
        start = max(b.ready_s, free)
        free = start + b.compress_s + b.comm_s
        starts.append(start)
        ends.append(free)
    exposed = max(free - forward_backward_s, 0.0)
    compress = sum(b.compress_s for b in buckets)
    comm = sum(b.comm_s for b in buckets)
    share = compress / (compress + comm) if compress + comm > 0 else 0.0
    return StepTimeline(
        total_s=forward_backward_s + exposed + optimizer_s,
        compute_s=forward_backward_s + optimizer_s,
        communication_s=exposed * (1 - share),
        compression_s=exposed * share,
        starts=tuple(starts),
        ends=tuple(ends),
    )


def simulate_shared(buckets: Sequence[BucketWork], forward_backward_s: float, optimizer_s: float) -> StepTimeline:
    """As :func:`simulate`, but the compression runs on the cores that compute (a CPU process with no spare
    core: its communication thread takes turns with the backward pass): compression done while the backward
    pass runs delays it by as much; only the collectives overlap. The communication thread still takes the
    buckets in order, so a bucket's compression waits for the previous bucket's collectives."""
    delay, free, starts, ends = 0.0, 0.0, [], []
    for b in buckets:
        start = max(b.ready_s + delay, free)
        if start < forward_backward_s + delay:  # inside the backward pass: it waits for the compression
            delay += b.compress_s
        free = start + b.compress_s + b.comm_s
        starts.append(start)
        ends.append(free)
    compute_end = forward_backward_s + delay
    compress = sum(b.compress_s for b in buckets)
    after = max(free - compute_end, 0.0)  # beyond the (delayed) backward: the rest of the compression, and waits
    return StepTimeline(
        total_s=compute_end + after + optimizer_s,
        compute_s=forward_backward_s + optimizer_s,
        communication_s=max(after - (compress - delay), 0.0),
        compression_s=compress,
        starts=tuple(starts),
        ends=tuple(ends),
    )


def simulate_sequential(buckets: Sequence[BucketWork], forward_backward_s: float, optimizer_s: float) -> StepTimeline:
    """The buckets' compression and collectives in the compute stream's order (not overlapped): each adds its
    whole time to the step, as Figure 4 of the Birder paper stacks computation, communication and
    compression. Whether they stall the backward pass bucket by bucket (a blocking comm hook) or run after
    it (an optimizer's step), the step is the same sum."""
    compress = sum(b.compress_s for b in buckets)
    comm = sum(b.comm_s for b in buckets)
    free, starts, ends = forward_backward_s, [], []
    for b in buckets:
        starts.append(free)
        free += b.compress_s + b.comm_s
        ends.append(free)
    return StepTimeline(
        total_s=forward_backward_s + compress + comm + optimizer_s,
        compute_s=forward_backward_s + optimizer_s,
        communication_s=comm,
        compression_s=compress,
        starts=tuple(starts),
        ends=tuple(ends),
    )


def blend(overlapped: StepTimeline, sequential: StepTimeline, overlap: float) -> StepTimeline:
    """A partial overlap: ``overlap`` of what :func:`simulate` hides beyond :func:`simulate_sequential` is
    hidden (1: the overlapped step, 0: the sequential one); every exposed part in the same proportion, so the
    parts still add up to the step. The buckets' times are the overlapped timeline's."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")

    def mix(a: float, b: float) -> float:
        return overlap * a + (1 - overlap) * b

    return StepTimeline(
        total_s=mix(overlapped.total_s, sequential.total_s),
        compute_s=overlapped.compute_s,
        communication_s=mix(overlapped.communication_s, sequential.communication_s),
        compression_s=mix(overlapped.compression_s, sequential.compression_s),
        starts=overlapped.starts,
        ends=overlapped.ends,
    )
