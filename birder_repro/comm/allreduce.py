"""DDP's default fp32 all-reduce and torch's fp16 compression hook, with bytes counted per process.

The hooks do what ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks`` does:

- ``allreduce_hook``: scale the bucket by 1/world size, all-reduce it asynchronously, return the result. DDP
  without a hook scales each gradient by 1/n as it copies it into the bucket (a multiplication, not a
  division); this hook multiplies too, so its results equal DDP's bit for bit for any n (x / 3 and x * (1/3)
  round differently: torch's own ``allreduce_hook`` divides and differs from DDP unless n is a power of two).
  tests/test_comm_hooks.py checks equality on 3, 4 and 6 processes;
- ``fp16_compress_hook``: cast the bucket to fp16 and divide, all-reduce the fp16 tensor, copy it back into the
  bucket (in place, for peak memory: https://github.com/pytorch/pytorch/issues/45968).

They are re-implemented here rather than called, so that the state can count the bytes and time the casts; both
are one line over :func:`_allreduce_hook` (default_hooks.py's ``_compress_hook`` pattern). The counted bytes are
a flat ring all-reduce's (:func:`birder_repro.comm.accounting.flat_allreduce_split`). Communication time is
the training loop's to measure: the hook never waits on its future, which would end DDP's overlap of
backward computation with communication.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] as objects, and rejects them as strings.

import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import flat_allreduce_split
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, flat_topology, group_or_world

__all__ = ["AllReduceState", "attach_allreduce", "attach_from_config"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class AllReduceState(CommState):
    """State of the counted all-reduce hook: its settings and the :class:`CommState` counters (one stage;
    ``.grad`` holds the averaged gradients).

    There is no algorithmic state (no error feedback, no buffers), so ``state_dict()`` holds the wire dtype,
    to check that a checkpoint is resumed with the same scheme, and the counters, so that cumulative figures
    continue across a resume.
    """

    __slots__ = (
        # User settings.
        "process_group",
        "dtype",  # the dtype on the wire: float32 (DDP's default) or float16 (torch's fp16 compression hook)
        "topology",
        # Internal: the byte counters grow from the hook on the autograd thread; the seconds (CommState.timing,
        # which takes its own lock) also from the decompression callback on the communication thread.
        "_lock",
    )

    def __init__(
        self, process_group: dist.ProcessGroup | None, topology: Topology, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES.values():
            raise ValueError(f"attach_allreduce: dtype must be one of {sorted(_DTYPES)}, got {dtype}")
        self.process_group = process_group
        self.dtype = dtype
        self.topology = topology
        self._lock = threading.Lock()

    @property
    def world_size(self) -> int:
        return _group(self.process_group).size()

    def count_allreduce(self, numel: int) -> None:
        """Add one flat ring all-reduce of ``numel`` elements of the wire dtype to the byte counters."""
        nbytes = numel * torch.empty((), dtype=self.dtype).element_size()
        intra, inter = flat_allreduce_split(nbytes, self.world_size, self.topology.gpus_per_node)
        with self._lock:
            self.intra_node_bytes += intra
            self.inter_node_bytes += inter
            self.calls += 1

    def state_dict(self) -> dict[str, Any]:
        """Settings and counters; the process group and topology are rebuilt by whoever attaches the hook."""
        return {"dtype": str(self.dtype).removeprefix("torch."), "stats": self.snapshot()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict["dtype"]
        if _DTYPES[saved] != self.dtype:
            raise ValueError(f"checkpoint was saved with an all-reduce in {saved}, this hook sends {self.dtype}")
        self.load_counters(state_dict["stats"])


def _group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return group_or_world(process_group)


def _allreduce_hook(state: AllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over all processes in ``state.dtype``; returns the future DDP waits on.

    1. (fp16 only) compress: cast the bucket to the wire dtype;
    2. average first, so that fp16 sums do not overflow: fp32 multiplies by 1/n as DDP's own reducer does (bit
       for bit DDP's result for any n), fp16 divides as torch's ``fp16_compress_hook`` does;
    3. start the asynchronous all-reduce and count its bytes;
    4. (fp16 only) decompress: copy the result back into the bucket, in place, when the future completes.
    """
    group = _group(state.process_group)
    buffer = bucket.buffer()
    compressing = state.dtype != buffer.dtype

    # Step I: compress (a no-op for fp32, which all-reduces DDP's bucket itself as DDP does). Timed on the
    # stream it runs on (CUDA events) or by the wall clock (CPU): CommState.timing.
    if compressing:
        with state.timing("compress", buffer.device):
            tensor = buffer.to(state.dtype).div_(group.size())
    else:
        tensor = buffer.mul_(1.0 / group.size())  # DDP's reducer: grad * (1/n), which x / n is not for n = 3

    # Step II: all-reduce, without waiting on it.
    state.count_allreduce(tensor.numel())
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    # Step III: decompress into DDP's bucket.
    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        with state.timing("compress", buffer.device):
            buffer.copy_(fut.value()[0])
        return buffer

    def result(fut: torch.futures.Future) -> torch.Tensor:
        return fut.value()[0]

    return fut.then(decompress if compressing else result)


def attach_allreduce(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer | None = None,
    topology: Topology | None = None,
    dtype: torch.dtype = torch.float32,
) -> AllReduceState:
    """Register the counted all-reduce hook on ``ddp_model`` and return its state.

    Args:
        ddp_model: the DDP-wrapped model; its process group is the one all-reduced over.
        optimizer: unused (the update is the optimizer's own); accepted so that every scheme attaches alike.
        topology: splits the counted bytes into intra- and inter-node. None: every process is its own node
            (:func:`birder_repro.comm.flat_topology`), so every byte counts as inter-node.
        dtype: ``torch.float32`` for DDP's default all-reduce, ``torch.float16`` for torch's fp16 compression.
    """
    del optimizer
    topology = topology if topology is not None else flat_topology()
    process_group = getattr(ddp_model, "process_group", None)
    world = _group(process_group).size()
    if topology.world_size != world:
        raise ValueError(f"topology has {topology.world_size} processes but the DDP process group has {world}")
    state = AllReduceState(process_group, topology, dtype)
    ddp_model.register_comm_hook(state, _allreduce_hook)
    return state


def attach_from_config(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    cfg: Mapping[str, Any],
    topology: Topology,
    scheme: str = "allreduce",
) -> AllReduceState:
    """Scheme ``allreduce`` (fp32, DDP's default) or ``fp16`` (torch's fp16 compression hook)."""
    dtypes = {"allreduce": torch.float32, "fp16": torch.float16}
    if scheme not in dtypes:
        raise ValueError(f"birder_repro.comm.allreduce handles schemes {sorted(dtypes)}, not {scheme!r}")
    return attach_allreduce(ddp_model, optimizer, topology, dtype=dtypes[scheme])
