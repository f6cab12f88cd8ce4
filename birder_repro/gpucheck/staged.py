"""Several ranks on one GPU: a torch.distributed backend that runs each collective of device tensors through gloo
on host copies, so that the hooks run across ranks where NCCL cannot (it refuses two ranks on one GPU).

Why not gloo with CUDA tensors: torch 2.14's ProcessGroupGloo has CUDA paths for all-reduce, broadcast, the
list all-gather and ``all_to_all_single``, but none for ``reduce_scatter_single`` or ``all_gather_single``
(Birder's intra-node reduce-scatter and its all-gathers, FSDP2's own collectives), which it takes only on the
CPU. This backend serves every collective the hooks, DDP and FSDP2 issue, the same way for all of them.

What stays as in training: the hooks' code, unchanged (their Triton kernels on the GPU, the communication
thread and its side stream, the CUDA events, the futures DDP and FSDP wait on); the process group of device
tensors is this backend where it would be NCCL (``init_process_group("cpu:gloo,cuda:staged")``), so DDP,
FSDP2 and the hooks call the same ``torch.distributed`` functions. What differs: a collective copies its
inputs to the host on the calling stream (a stream sync), runs gloo, copies the outputs back on that stream
and returns a completed work whose future is CUDA-aware (``Future(devices=...)``: a waiter on another stream
waits for the copy back). So ordering bugs that need a collective still running on NCCL's own stream are not
exposed here; wrong arithmetic, layouts, ranks, streams that read before the copy back, and the kernels are.

On the CPU (``init_process_group("cpu:staged")``) the copies are host copies: the tests run this same code.

Which torch class it subclasses: c10d's ``Backend``, registered for the device it serves. Torch releases before
that class had a Python constructor (2.11, the first GPU machine this ran on, says "StagedBackend: No
constructor defined!") get ``StagedProcessGroup`` instead: the same collectives as a whole ``ProcessGroup``,
which ``init_process_group`` takes in place of the group it was building (as torch's own multi-threaded test
group is registered), so it serves CPU tensors too. ``BIRDER_STAGED_AS_PROCESS_GROUP=1`` chooses it on any
torch, which is how the tests run that path here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _Backend
from torch._C._distributed_c10d import Work as _Work

__all__ = ["NAME", "register", "backend_string", "StagedBackend", "StagedProcessGroup", "create"]

NAME = "staged"
AS_PROCESS_GROUP_ENV = "BIRDER_STAGED_AS_PROCESS_GROUP"


class _Done(_Work):
    """A collective that has completed on the calling stream; its future holds the outputs (CUDA-aware)."""

    def __init__(self, outputs: list[torch.Tensor]):
        super().__init__()
        devices = sorted({t.device for t in outputs if t.is_cuda}, key=str)
        self._future = torch.futures.Future(devices=devices or None)
        self._future.set_result(outputs)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


class _Staged:
    """Every collective: inputs to the host, gloo, outputs back (see the module docstring). The collectives of
    both classes below, which differ only in the torch class they extend."""

    gloo: dist.ProcessGroupGloo

    def _connect(self, store, rank: int, size: int, timeout: timedelta) -> None:
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore(NAME, store), rank, size, timeout)

    @staticmethod
    def _run(outputs: list[torch.Tensor], inputs: list[torch.Tensor], call: Callable) -> _Work:
        """``call(host_outputs, host_inputs)`` on host copies (in-place collectives pass the same tensors)."""
        host_in = [t.detach().to("cpu", copy=True) for t in inputs]
        host_out = [next((h for i, h in zip(inputs, host_in) if i is t), None) for t in outputs]
        host_out = [h if h is not None else torch.empty(t.shape, dtype=t.dtype) for h, t in zip(host_out, outputs)]
        call(host_out, host_in).wait()
        for t, h in zip(outputs, host_out):
            t.copy_(h)
        return _Done(outputs)

    def allreduce(self, tensors, opts):
        return self._run(tensors, tensors, lambda o, i: self.gloo.allreduce(o, opts))

    def broadcast(self, tensors, opts):
        return self._run(tensors, tensors, lambda o, i: self.gloo.broadcast(o, opts))

    def allgather(self, output_lists, inputs, opts):
        flat = [t for ts in output_lists for t in ts]
        shape = [len(ts) for ts in output_lists]

        def call(o, i):
            it = iter(o)
            return self.gloo.allgather([[next(it) for _ in range(n)] for n in shape], i, opts)

        return self._run(flat, inputs, call)

    def _gloo(self, name: str, old_name: str) -> Callable:
        """Gloo's collective ``name``, or ``old_name`` in torch releases before 2.12, which bind it so."""
        return getattr(self.gloo, name, None) or getattr(self.gloo, old_name)

    def all_gather_single(self, output, input, opts):
        gather = self._gloo("all_gather_single", "_allgather_base")
        return self._run([output], [input], lambda o, i: gather(o[0], i[0], opts))

    def reduce_scatter_single(self, output, input, opts):
        scatter = self._gloo("reduce_scatter_single", "_reduce_scatter_base")
        return self._run([output], [input], lambda o, i: scatter(o[0], i[0], opts))

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        exchange = self._gloo("all_to_all_single", "alltoall_base")
        return self._run([output], [input], lambda o, i: exchange(o[0], i[0], output_splits, input_splits, opts))

    # The names torch releases before 2.12 call these three by (their distributed_c10d calls the group's method of
    # that name, which on StagedProcessGroup is this Python method; torch 2.11 on the first GPU machine did)
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single

    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        return self.all_to_all_single(output, input, output_splits, input_splits, opts)

    def barrier(self, opts):
        self.gloo.barrier(opts).wait()
        return _Done([])


class StagedBackend(_Staged, _Backend):
    """The staged collectives as the backend of one device type of a process group."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        _Backend.__init__(self, rank, size)
        self._connect(store, rank, size, timeout)


class StagedProcessGroup(_Staged, dist.ProcessGroup):
    """The staged collectives as a whole process group, for a torch whose ``Backend`` has no Python constructor."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        dist.ProcessGroup.__init__(self, rank, size)
        self._size = size
        self._connect(store, rank, size, timeout)

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return NAME

    @property
    def group_name(self) -> str:
        """The name ``init_process_group`` gave it (it names a group it builds, not one that replaces it): FSDP2's
        functional collectives look groups up by name."""
        return dist.distributed_c10d._world.pg_names[self]


def create(store, rank: int, size: int, timeout: timedelta) -> StagedBackend | StagedProcessGroup:
    """The backend where this torch lets Python extend c10d's ``Backend``, else the whole process group."""
    if os.environ.get(AS_PROCESS_GROUP_ENV) != "1":
        try:
            return StagedBackend(store, rank, size, timeout)
        except TypeError as e:  # "No constructor defined!": Backend is not extensible from Python in this torch
            if "constructor" not in str(e):
                raise
    return StagedProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Make ``staged`` a backend name for CPU and CUDA tensors (once per process)."""
    if NAME.upper() not in dist.Backend.backend_list and NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])


def backend_string(device_type: str) -> str:
    """The process group's backends: device tensors through this one; CPU tensors (DDP's and FSDP's own
    metadata) through gloo on a GPU, through this one too on the CPU (so the tests run its code)."""
    return f"cpu:gloo,cuda:{NAME}" if device_type == "cuda" else f"cpu:{NAME}"
