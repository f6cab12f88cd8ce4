"""A communication thread for the compressed hooks, so that their work overlaps the backward pass.

DDP's own all-reduce is asynchronous: the hook returns a future and backward goes on computing the gradients
of the next buckets while the collective runs. Birder's and 1-bit Adam's hooks compress, run several blocking
collectives and decompress per bucket; run inside the hook they would hold up backward for all of it. So each
such hook state owns one :class:`CommThread`, and its hook returns at once:

    Step I    (autograd thread, in the hook) enqueue the bucket's work and return a fresh future; on CUDA,
              record an event on the training stream first, so that the work sees the finished gradients;
    Step II   (communication thread, buckets in FIFO order) on CUDA, make its own side stream wait for that
              event; run the work: compression, the blocking collectives, decompression into DDP's buffer;
    Step III  complete the future with the buffer, as the LAST thing done for the bucket (the counters, the
              state and the buffer are written by then); on CUDA the future was created with the device, so
              DDP's wait makes the training stream wait for the side stream's work.

Why one thread and not future callbacks: a gloo future's callback that waits on another future can deadlock
(pytorch/pytorch#48478), and an exception raised in a callback can leave its future unresolved (a hang). One
thread per state runs every bucket's collectives in the order DDP hands the buckets over, which is the same on
every rank, so the collectives of all ranks match; nothing else issues collectives on those groups while it
works (DDP issues none during backward when a hook is registered; the training loop's own collectives come
after ``backward()``, when DDP has waited on every future; a bucket-layout migration runs inside the work).

Failures never hang this process: an exception in a bucket's work is set on that bucket's future and on every
future still queued or submitted later (the thread's collectives are out of step from then on), and DDP's
wait re-raises it on the training thread. (A rank whose peers fail while it is inside a collective waits for
the backend's timeout, as it would without a thread.)

Lifetime: the thread is a daemon, started with the first bucket; :meth:`CommThread.close` (also at interpreter
exit) stops it once the queue is empty. ``overlap=False`` runs the same work inside the hook and returns a
completed future: the same results bit for bit (tests/test_overlap.py).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable

import torch

from birder_repro.comm.collectives import completed_future

__all__ = ["CommThread", "HookRunner"]

_STOP = object()


class CommThread:
    """One daemon thread running bucket work in FIFO order, each completing its own future."""

    def __init__(self, name: str = "birder-comm"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._queued: list[torch.futures.Future] = []  # submitted futures not yet completed, in order
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------------------ the autograd thread
    def submit(self, work: Callable[[], torch.Tensor], device: torch.device) -> torch.futures.Future:
        """Step I: queue ``work`` (which returns the bucket's result) and return the future of its result."""
        cuda = device.type == "cuda"
        fut: torch.futures.Future = torch.futures.Future(devices=[device] if cuda else None)
        with self._lock:
            if self._error is not None:
                fut.set_exception(_failure(self._error))
                return fut
            ready = None
            if cuda:  # the gradients of the bucket are written on the training stream
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(device))
            self._start()
            self._queued.append(fut)
            self._queue.put((work, fut, ready, device))
        return fut

    @property
    def busy(self) -> bool:
        """Whether buckets are queued or in progress."""
        with self._lock:
            return bool(self._queued)

    def close(self, timeout: float | None = 60.0) -> None:
        """Stop the thread once the buckets queued so far are done (a no-op if it never started)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    # ------------------------------------------------------------------------- the communication thread
    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            work, fut, ready, device = item
            try:
                # Grad mode is per thread: this one starts with it on.
                with torch.no_grad(), self._stream(device, ready):
                    result = work()
                    with self._lock:
                        if fut in self._queued:
                            self._queued.remove(fut)
                    # Step III, last: on CUDA the future records the side stream's position here.
                    if not fut.done():
                        fut.set_result(result)
            except BaseException as exc:  # noqa: BLE001 - any failure goes to the futures, never a hang
                self._fail(exc, fut)

    def _stream(self, device: torch.device, ready) -> contextlib.AbstractContextManager:
        """Step II on CUDA: this thread's side stream, after the training stream's event."""
        if device.type != "cuda":
            return contextlib.nullcontext()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        stream.wait_event(ready)
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(device))
        stack.enter_context(torch.cuda.stream(stream))
        return stack

    def _fail(self, exc: BaseException, fut: torch.futures.Future) -> None:
        """Set the failure on this future and on every one queued; later submissions fail at once."""
        with self._lock:
            self._error = exc
            futures = [f for f in [fut, *self._queued] if not f.done()]
            self._queued.clear()
            while True:  # drop the queued work: its futures fail below
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._queue.put(_STOP)
                    break
        error = _failure(exc)
        for f in dict.fromkeys(futures):
            if not f.done():
                f.set_exception(error)


def _failure(exc: BaseException) -> BaseException:
    error = RuntimeError(f"the communication thread failed on a bucket: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _close_at_exit(ref: weakref.ref[CommThread]) -> None:
    thread = ref()
    if thread is not None:
        thread.close(timeout=5.0)


class HookRunner:
    """Runs a hook's bucket work on a :class:`CommThread` (``overlap=True``) or inside the hook."""

    __slots__ = ("overlap", "_thread", "name", "__weakref__")

    def __init__(self, overlap: bool = True, name: str = "birder-comm"):
        self.overlap = bool(overlap)
        self.name = name
        self._thread: CommThread | None = None

    def run(self, work: Callable[[], torch.Tensor], device: torch.device) -> torch.futures.Future:
        """The future of ``work()``: queued on the thread, or computed now and returned completed."""
        if not self.overlap:
            with torch.no_grad():
                return completed_future(work())
        if self._thread is None:
            self._thread = CommThread(self.name)
        return self._thread.submit(work, torch.device(device))

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.busy

    def check_idle(self, what: str) -> None:
        if self.busy:
            raise RuntimeError(f"{what} while buckets are still being communicated: call it between steps")

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None
