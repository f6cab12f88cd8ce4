"""When each DDP bucket became ready during the backward pass, from the calls of its communication hook.

DDP calls a bucket's hook as soon as every gradient of the bucket is computed, so the moment of the call is
the moment the bucket is ready (the performance model's ``Profile.bucket_ready``, birder_repro.perf.profile).
:func:`clocked_registration` wraps every hook registered on a DDP model while it is open (``attach_comm``
opens it around each scheme's ``attach_from_config``), so that each call is timed relative to the start of
the backward pass, which the training loop marks with :meth:`BucketClock.start`.

On CUDA the moments are CUDA events on the current stream (the hook is called when autograd has *launched*
the bucket's last gradient kernel, which may run later on the device); they are resolved after the step,
when the loop has synchronized the device. On the CPU they are wall-clock times.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["BucketClock", "clocked_registration", "bucket_clock"]

CLOCK_ATTR = "bucket_clock"  # where the clock lives on the DDP model


class BucketClock:
    """Per step: (bucket index, elements, seconds since the backward pass started) of every hook call."""

    __slots__ = ("_origin", "_calls")

    def __init__(self) -> None:
        self._origin: Any = None  # perf_counter() or a CUDA event; None: not in a marked backward pass
        self._calls: list = []

    def start(self, device=None) -> None:
        """Mark the start of a backward pass (and forget the previous step's calls)."""
        self._calls = []
        self._origin = _cuda_event() if getattr(device, "type", device) == "cuda" else time.perf_counter()

    def record(self, bucket) -> None:
        if self._origin is None:
            return
        buffer = bucket.buffer()
        moment = _cuda_event() if buffer.is_cuda else time.perf_counter()
        self._calls.append((int(bucket.index()), int(buffer.numel()), moment))

    def take(self) -> list[tuple[int, int, float]]:
        """The calls since :meth:`start`, in call order, as (index, elements, seconds); resets the clock."""
        origin, calls = self._origin, self._calls
        self._origin, self._calls = None, []
        out = []
        for index, numel, moment in calls:
            seconds = origin.elapsed_time(moment) / 1000.0 if hasattr(origin, "elapsed_time") else moment - origin
            out.append((index, numel, seconds))
        return out


def _cuda_event():
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _timed(hook, clock: BucketClock):
    # functools.wraps keeps the hook's signature (inspect follows __wrapped__), which DDP checks.
    @functools.wraps(hook)
    def timed_hook(state, bucket):
        clock.record(bucket)
        return hook(state, bucket)

    return timed_hook


@contextmanager
def clocked_registration(ddp_model) -> Iterator[BucketClock]:
    """While open, ``ddp_model.register_comm_hook`` registers the hook wrapped by a :class:`BucketClock`,
    which stays on the model as ``ddp_model.bucket_clock``."""
    clock = BucketClock()
    register = ddp_model.register_comm_hook

    def register_timed(state, hook):
        setattr(ddp_model, CLOCK_ATTR, clock)
        return register(state, _timed(hook, clock))

    ddp_model.register_comm_hook = register_timed
    try:
        yield clock
    finally:
        del ddp_model.register_comm_hook  # the class's method again


def bucket_clock(model) -> BucketClock | None:
    """The clock of a DDP model whose hook was registered through :func:`clocked_registration`, else None."""
    return getattr(model, CLOCK_ATTR, None)
