"""What the training loop reads from every communication hook's state: one small interface.

Every scheme's state (:mod:`~birder_repro.comm.allreduce`, :mod:`~birder_repro.comm.powersgd`,
:mod:`~birder_repro.comm.birder`, :mod:`~birder_repro.comm.onebit`) subclasses :class:`CommState`:

- the counters: payload bytes this rank sent within its node and across nodes, seconds of compression work
  (``compress_seconds``) and of collectives (``collective_seconds``), bucket calls. They are CUMULATIVE: they
  only grow, from the attach on (a checkpoint restores them); the loop reads their differences per step, and
  ``bytes_last_step()`` gives one step's bytes to a script that calls it once a step;
- ``stage(step)``: the name of the stage the step about to run is in (``warmup`` / ``compression`` for the
  schemes with two stages, for throughput per stage in the run record), None for single-stage schemes;
- ``grad_holds()``: what the parameters' ``.grad`` hold once this step's hook has run and before
  ``optimizer.step()``: :data:`GRADIENT` (averaged gradients, which clipping may rescale), or something the
  hook computed instead (:data:`UPDATE`: Birder's +-1; :data:`MOMENTUM`: 1-bit Adam's averaged momentum);
- ``overlaps()``: whether the hook's compression and collectives run beside the backward pass (on a
  communication thread, :mod:`~birder_repro.comm.overlap`) rather than inside it, so that their seconds are
  not all exposed in the step time (the loop's split of the step, ``birder_repro.train.split_step_time``).

Timing (:meth:`CommState.timing`): on CPU tensors, wall clock around the block. On CUDA tensors, a pair of CUDA
events recorded on the current stream around the block (the stream the block's kernels run on: the training
stream in a hook, the side stream on a communication thread), so that the seconds are the kernels' and not their
launch, and nothing is synchronized in the hook. The pairs are resolved when a counter is read (after the step,
when the loop has synchronized the device): reading ``compress_seconds`` or ``collective_seconds`` waits for
the events still pending.

The loop asks these of the hook state and never of the optimizer (``birder_repro.train``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["CommState", "StepBytes", "GRADIENT", "UPDATE", "MOMENTUM"]

GRADIENT = "gradient"  # the average of the processes' gradients (exact, or approximated as by fp16 or PowerSGD)
UPDATE = "update"  # the update itself, e.g. Birder's u_bar in {-1, +1}
MOMENTUM = "momentum"  # an averaged momentum, e.g. 1-bit Adam's in its compression stage

_KINDS = {"compress": "compress_seconds", "comm": "collective_seconds"}


class StepBytes(NamedTuple):
    """Payload bytes one rank sent in one step (:meth:`CommState.bytes_last_step`)."""

    intra_node: float
    inter_node: float


class CommState:
    """Counters, stage and the meaning of ``.grad``: what every scheme's state has, on each rank.

    ``intra_node_bytes`` / ``inter_node_bytes`` count what this rank sent in collectives within its node and
    across nodes; ``compress_seconds`` the time in quantize / pack / unpack work, ``collective_seconds`` the
    time in collectives (``comm_seconds`` is its former name). All are cumulative from the attach on, never reset;
    :meth:`bytes_last_step` gives the bytes of one step. The counters may grow on a communication thread
    or in a future's callback while the hook runs on the autograd thread: additions take a lock. Subclasses
    override :meth:`stage`, :meth:`grad_holds` and :meth:`overlaps` where they differ from a plain all-reduce
    (one stage, gradients, DDP's own asynchronous collective).
    """

    __slots__ = (
        "intra_node_bytes",
        "inter_node_bytes",
        "_seconds",
        "calls",
        "_pending",
        "_counter_lock",
        "fsdp",
        "_step_mark",
    )
    COUNTERS = ("intra_node_bytes", "inter_node_bytes", "compress_seconds", "collective_seconds", "calls")

    def __init__(self) -> None:
        self.intra_node_bytes = 0.0
        self.inter_node_bytes = 0.0
        self._seconds = {"compress_seconds": 0.0, "collective_seconds": 0.0}
        self.calls = 0
        self._pending: list = []  # (counter, start event, end event) of CUDA blocks not yet resolved
        self._counter_lock = threading.Lock()
        # an FSDP attachment's units and hooks (birder_repro.comm.fsdp.FsdpAttachment, a layer above); None under DDP
        self.fsdp: Any = None
        self._step_mark = (0.0, 0.0)  # the byte counters at the last bytes_last_step()

    # ------------------------------------------------------------------------------------ the interface
    def stage(self, step: int) -> str | None:
        """The stage of step ``step`` (0-based, about to run); None: the scheme has a single stage."""
        return None

    def grad_holds(self) -> str:
        """What ``.grad`` holds after this step's hook: :data:`GRADIENT`, :data:`UPDATE` or :data:`MOMENTUM`."""
        return GRADIENT

    def overlaps(self) -> bool:
        """Whether the hook's compression and collectives run beside the backward pass (a communication
        thread) rather than inside the hook on the autograd thread."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this rank's hook (every scheme's state defines it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoint state")

    def load_state_dict(self, sd: Any) -> None:
        """Continue from a :meth:`state_dict` (every scheme's state defines it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoint state")

    # ------------------------------------------------------------------------------------- the counters
    @property
    def compress_seconds(self) -> float:
        self._resolve_events()
        return self._seconds["compress_seconds"]

    @compress_seconds.setter
    def compress_seconds(self, value: float) -> None:
        self._seconds["compress_seconds"] = float(value)

    @property
    def collective_seconds(self) -> float:
        self._resolve_events()
        return self._seconds["collective_seconds"]

    @collective_seconds.setter
    def collective_seconds(self, value: float) -> None:
        self._seconds["collective_seconds"] = float(value)

    comm_seconds = collective_seconds  # its former name

    def snapshot(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in CommState.COUNTERS}

    def load_counters(self, snapshot: dict[str, float]) -> None:
        """Continue from a :meth:`snapshot` (a checkpoint's, also one that still says ``comm_seconds``)."""
        for key, value in snapshot.items():
            key = "collective_seconds" if key == "comm_seconds" else key
            setattr(self, key, type(getattr(self, key))(value))
        self._step_mark = (self.intra_node_bytes, self.inter_node_bytes)

    def bytes_last_step(self) -> StepBytes:
        """The bytes this rank sent since the previous call (or since the attach, or a :meth:`load_counters`):
        called once a step, after ``optimizer.step()``, that step's ``(intra_node, inter_node)``. The counters
        themselves stay cumulative (the training loop reads them around each step instead)."""
        with self._counter_lock:
            now = (self.intra_node_bytes, self.inter_node_bytes)
            before, self._step_mark = self._step_mark, now
        return StepBytes(now[0] - before[0], now[1] - before[1])

    def add_bytes(self, intra: float, inter: float) -> None:
        with self._counter_lock:
            self.intra_node_bytes += intra
            self.inter_node_bytes += inter

    def add_seconds(self, what: str, seconds: float) -> None:
        """Add ``seconds`` of ``what`` ("compress" or "comm") measured elsewhere."""
        with self._counter_lock:
            self._seconds[_counter(what)] += seconds

    @contextmanager
    def timing(self, what: str, device=None) -> Iterator[None]:
        """Add the time of the block to ``compress_seconds`` ("compress") or ``collective_seconds`` ("comm").

        ``device``: where the block's tensors live. On CUDA the block is timed by CUDA events on the current
        stream, resolved when the counter is read (module docstring); elsewhere by the wall clock.
        """
        counter = _counter(what)
        if getattr(device, "type", device) == "cuda":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                with self._counter_lock:
                    self._pending.append((counter, start, end))
                self._fold_finished()
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            with self._counter_lock:
                self._seconds[counter] += dt

    def _fold_finished(self) -> None:
        """Add the seconds of the pending CUDA blocks that have finished, oldest first, without waiting
        (``Event.query``): a script that never reads the counters keeps only the pairs still in flight, not two
        events per timed block of every step (7 blocks a bucket a step for Birder)."""
        with self._counter_lock:
            while self._pending and self._pending[0][2].query():
                counter, start, end = self._pending.pop(0)
                self._seconds[counter] += start.elapsed_time(end) / 1000.0

    def _resolve_events(self) -> None:
        """Wait for the CUDA blocks still pending and add their seconds."""
        if not self._pending:
            return
        with self._counter_lock:
            ends = [end for _, _, end in self._pending]
        for end in ends:  # waited for outside the lock: the communication thread may be adding pairs meanwhile
            end.synchronize()
        self._fold_finished()


def _counter(what: str) -> str:
    if what not in _KINDS:
        raise ValueError(f"unknown timing kind {what!r}; choices: {', '.join(_KINDS)}")
    return _KINDS[what]


class _Runner(Protocol):
    """What :class:`CompressedCommState` asks of its runner (:class:`~birder_repro.comm.overlap.HookRunner`)."""

    @property
    def overlap(self) -> bool: ...

    def check_idle(self, what: str) -> None: ...

    def close(self) -> None: ...


class _Guard(Protocol):
    """... of its guard (:class:`~birder_repro.comm.nonfinite.NonFiniteGuard`)."""

    @property
    def pending(self) -> bool: ...

    @property
    def skip_step(self) -> bool: ...

    @property
    def nonfinite_steps(self) -> int: ...

    @property
    def mode(self) -> str: ...

    def end_step(self, found_inf: torch.Tensor | None = None) -> bool: ...


class _Store(Protocol):
    """... of its store (:class:`~birder_repro.comm.buckets.BucketStore`)."""

    @property
    def layout_changes(self) -> int: ...


class CompressedCommState(CommState):
    """What the compressed hooks (Birder, 1-bit Adam / LAMB) add to :class:`CommState`, written once.

    Subclasses hold ``runner`` (:class:`~birder_repro.comm.overlap.HookRunner`: the communication thread, or
    none), ``guard`` (:class:`~birder_repro.comm.nonfinite.NonFiniteGuard`) and ``store``
    (:class:`~birder_repro.comm.buckets.BucketStore`).
    """

    # fp16 loss scaling: the GradScaler whose scale the gradients carry (use_grad_scaler), or its scale tensor
    # handed over directly (birder_repro.train.precision)
    __slots__ = ("_loss_scale", "grad_scaler")
    # set by each subclass (the modules that define them sit above this one: typed by what is used here)
    runner: _Runner
    guard: _Guard
    store: _Store

    def __init__(self):
        super().__init__()
        self._loss_scale: torch.Tensor | None = None
        self.grad_scaler: Any = None

    def overlaps(self) -> bool:
        return self.runner.overlap

    # ------------------------------------------------ fp16 loss scaling (train/precision.py, Steps I-III)
    def use_grad_scaler(self, scaler: Any) -> None:
        """Compress the true gradients of a script that scales its loss with ``scaler`` (a
        ``torch.amp.GradScaler``: yours, or Accelerate's, the Trainer's, Lightning's), and hand it back what it
        expects: Step I divides each bucket by the scale, Step II multiplies the result by it (NaN where a
        bucket overflowed, so that the scaler skips the step and backs off). The scale is read from the scaler
        at every bucket, so its growth, back-off and checkpoint load are followed; a disabled scaler (``enabled=
        False``, or fp16 off) scales nothing. None: no scaler."""
        if scaler is not None:
            if not (hasattr(scaler, "is_enabled") and hasattr(scaler, "unscale_")):
                raise TypeError(f"grad_scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
            if self.guard.mode == "raise":
                raise ValueError(
                    "nonfinite='raise' with a GradScaler: its loss scale overflows routinely (the scaler then "
                    "skips the step and lowers the scale) and raise would end the run there: use nonfinite='skip'"
                )
        self.grad_scaler = scaler

    @property
    def loss_scale(self) -> torch.Tensor | None:
        """The loss scale S the gradients carry, as the 1-element tensor GradScaler keeps on the device (reading
        it needs no sync); None: unscaled gradients. ``_scale`` is not public but is what ``scale()`` multiplies
        by, updated in place by ``update()`` and ``load_state_dict()``, created by the first ``scale()``."""
        scaler = self.grad_scaler
        if scaler is not None:
            return getattr(scaler, "_scale", None) if scaler.is_enabled() else None
        return self._loss_scale

    @loss_scale.setter
    def loss_scale(self, scale: torch.Tensor | None) -> None:
        self._loss_scale = scale

    def unscale_(self, g: torch.Tensor) -> torch.Tensor:
        """Step I of loss scaling: the true gradient from the scaled one, in place, before any state update."""
        scale = self.loss_scale
        if scale is not None:
            g.div_(scale)
        return g

    def rescale_(self, result: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        """Step II: the bucket's result times the scale (GradScaler divides it back), or NaN where the bucket's
        agreed non-finite ``flag`` is set, so that GradScaler skips the step on every rank alike."""
        scale = self.loss_scale
        if scale is not None:
            import torch

            result.mul_(torch.where(flag > 0, torch.full_like(scale, float("nan")), scale))
        return result

    def settle_step(self) -> None:
        """Step III: close a step whose optimizer step did not run (GradScaler skipped it): restore the state."""
        if self.guard.pending:
            self.end_step()

    def close(self) -> None:
        """Stop the communication thread (it restarts with the next bucket)."""
        self.runner.close()

    @property
    def nonfinite_steps(self) -> int:
        """Steps skipped because some rank's gradient held a NaN or Inf (:mod:`birder_repro.comm.nonfinite`)."""
        return self.guard.nonfinite_steps

    @property
    def skip_step(self) -> bool:
        """Whether the step in progress is to be skipped (read after backward, before the optimizer's step)."""
        return self.guard.skip_step

    def end_step(self, found_inf: torch.Tensor | None = None) -> bool:
        """Called by the optimizer's step(): undo this step's state updates if it is skipped; True if so.
        ``found_inf``: GradScaler's verdict on the step (> 0: it found an Inf or NaN), read with the hook's own
        flags in one device-to-host copy; either skips the step."""
        self.runner.check_idle(f"{type(self).__name__}.end_step()")
        return self.guard.end_step(found_inf)

    @property
    def layout_changes(self) -> int:
        """How often DDP's bucket layout changed under stored state (:mod:`birder_repro.comm.buckets`)."""
        return self.store.layout_changes
