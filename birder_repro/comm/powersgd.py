"""torch's PowerSGD hook (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019), with bytes counted per process: a peer for the benchmarks.

The hook is ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook`` itself, with its
``PowerSGDState`` (warm start, error feedback, fp32 all-reduce before ``start_powerSGD_iter``); this module
only wraps it to count bytes and time the compression work it does before returning its future.

Bytes, exactly: before the start iteration the hook all-reduces the bucket (``bucket.buffer().numel()``
elements). From then on it runs three all-reduces per bucket: the uncompressed tensors (vectors, and matrices
that would not compress by ``min_compression_rate``), P (n x r per compressed n x m matrix) and Q (m x r).
torch's state adds exactly those elements to ``total_numel_after_compression`` for the bucket in the hook's
synchronous part (``_should_compress``: (n + m) r for a compressed matrix, n m otherwise), so the increase of
that counter during the call is the number of elements all-reduced; each all-reduce is counted as a flat ring
(:func:`birder_repro.comm.accounting.flat_allreduce_split`, linear in bytes, so the three add up).
tests/test_comm_hooks.py checks the count against the parameter shapes independently.

Resuming: torch's error, P and Q are kept per DDP bucket index, and a new DDP model's first iteration uses
other buckets (parameter order, a 1 MiB first bucket) than the ones it rebuilds to after that iteration, which
the saved state belongs to. So the first iteration after ``load_state_dict`` all-reduces in fp32, as torch's
hook does before ``start_powerSGD_iter`` for the same reason, and the saved state is used from the second on.
A resumed run therefore differs from an uninterrupted one by that one uncompressed step.

fp16 with ``torch.amp.GradScaler``: the hook receives S x the gradient. torch's hook writes its new error
(``error_dict``) and its new Q (``q_memory_dict``) in the future's callbacks, before the scaler looks at the
gradients; an overflow makes both Inf / NaN, and since every later step adds that error and orthogonalizes that
Q, every later step would be non-finite and skipped (a run that "completes" having trained once). So under a
scaler (:meth:`PowerSGDCommState.track_loss_scale`, which the training loop's ``Precision`` calls):

    Step I    before torch's hook touches a bucket, its error tensor is kept (torch replaces it rather than
              writing into it, so a reference is the backup) and its Q copied (m x r per matrix: small);
    Step II   after GradScaler's step and update (:meth:`PowerSGDCommState.after_scaler_step`), on the device and
              without a host read: where the scale fell (GradScaler skipped the step) the old error and Q come
              back, and the error, held in units of the scale it was made at, is multiplied by new scale / old
              scale (exact: a power of two), so that it stays the same true-gradient error when the scale halves
              at a skip or doubles at GradScaler's growth. A bucket whose first compressed step is skipped loses
              its P and Q, so that the next step draws them afresh as torch's first step does (one host read, once).
"""


# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] as objects, and rejects them as strings.

import contextlib
import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from birder_repro.comm.accounting import flat_allreduce_split
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, flat_topology, group_or_world
from birder_repro.optim.schedule import steps_of

__all__ = ["PowerSGDCommState", "attach_powersgd", "attach_from_config", "start_iter_from_config"]

# PowerSGDState's slots that are its algorithm's state and settings: all but the process group, which cannot be
# saved (the same choice as PowerSGDState.__getstate__).
_SAVED_SLOTS = tuple(s for s in PowerSGDState.__slots__ if s != "process_group")


class PowerSGDCommState(CommState):
    """torch's :class:`PowerSGDState` with the :class:`CommState` counters; ``.grad`` holds the (approximated)
    averaged gradients.

    ``compress_seconds`` is the time of the hook's synchronous part once it compresses: error feedback,
    splitting the bucket, orthogonalizing Q and P = M Q. The rest of PowerSGD's arithmetic (orthogonalizing P,
    Q = M^T P, the decompression P Q^T and the new error) runs in the future's callbacks, between its
    all-reduces, which the callbacks wait on; it cannot be told apart from communication there and is in the
    training loop's communication time.
    """

    __slots__ = (
        # torch's state: settings (rank, start iteration, warm start, error feedback) and internal state
        # (error, P and Q per bucket, rng, iteration).
        "torch_state",
        # How bytes split into intra- and inter-node.
        "topology",
        # Wait for each compressed bucket inside the hook (backends whose futures complete on another thread).
        "serialize_buckets",
        # Iterations still to all-reduce in fp32 after a load, while DDP's buckets are not yet its rebuilt ones.
        "fp32_iters_after_load",
        # Under a GradScaler: bucket index -> (its error, a copy of its Q) from before this step; None: no scaler.
        "undo",
    )

    def __init__(self, torch_state: PowerSGDState, topology: Topology, serialize_buckets: bool) -> None:
        super().__init__()
        self.torch_state = torch_state
        self.topology = topology
        self.serialize_buckets = serialize_buckets
        self.fp32_iters_after_load = 0
        self.undo: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] | None = None

    def track_loss_scale(self) -> None:
        """A GradScaler scales the gradients this hook receives: keep each bucket's error and Q from before the
        step, so that :meth:`after_scaler_step` can restore them (Step I of the module docstring)."""
        if self.undo is None:
            self.undo = {}

    def keep_bucket(self, index: int) -> None:
        """Step I for bucket ``index``, before torch's hook runs on it."""
        if self.undo is None:
            return
        ts = self.torch_state
        q = ts.q_memory_dict.get(index)
        self.undo[index] = (ts.error_dict.get(index), None if q is None else q.detach().clone())

    def after_scaler_step(self, scale_before: torch.Tensor, scale_after: torch.Tensor) -> None:
        """Step II: GradScaler's step and update are done; ``scale_before`` / ``scale_after`` are its scale
        tensors around them (the scale falls only where it found an Inf or NaN and skipped the step)."""
        if self.undo is None:
            return
        ts = self.torch_state
        skipped = scale_after < scale_before
        ratio = scale_after / scale_before
        for index, (error, q) in self.undo.items():
            new_error = ts.error_dict.get(index)
            if new_error is not None:
                old = torch.zeros_like(new_error) if error is None else error.to(new_error.device)
                ts.error_dict[index] = torch.where(skipped.to(new_error.device), old, new_error).mul_(
                    ratio.to(new_error.device)
                )
            new_q = ts.q_memory_dict.get(index)
            if new_q is None:
                continue
            if q is None:  # this bucket's first compressed step: skipped, its P and Q are drawn again next step
                if bool(skipped):
                    ts.p_memory_dict.pop(index, None)
                    ts.q_memory_dict.pop(index, None)
            else:
                new_q.copy_(torch.where(skipped.to(new_q.device), q, new_q))
        self.undo.clear()

    @property
    def compressing(self) -> bool:
        """Whether the next bucket is compressed (torch's hook tests the same before it counts the step)."""
        return self.fp32_iters_after_load == 0 and self.torch_state.iter >= self.torch_state.start_powerSGD_iter

    def stage(self, step: int) -> str:
        """The stage of the step about to run, from torch's iteration count (which follows the loop's ``step``),
        for throughput per stage in the run record: ``warmup`` while PowerSGD all-reduces in fp32,
        ``compression`` once it compresses (1-bit Adam's names for its two stages)."""
        return "compression" if self.compressing else "warmup"

    def count_allreduce(self, numel: int, element_size: int) -> None:
        intra, inter = flat_allreduce_split(
            numel * element_size, _group_size(self.torch_state.process_group), self.topology.gpus_per_node
        )
        self.intra_node_bytes += intra
        self.inter_node_bytes += inter
        self.calls += 1

    def state_dict(self) -> dict[str, Any]:
        """torch's state (what ``PowerSGDState.__getstate__`` returns, copied so later steps do not change it,
        and without its warning on every save) and the counters."""
        torch_state = {slot: copy.deepcopy(getattr(self.torch_state, slot)) for slot in _SAVED_SLOTS}
        return {"powersgd": torch_state, "stats": self.snapshot()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore torch's state, keeping this hook's process group (``PowerSGDState.__setstate__`` would reset
        it to the default group, wrong for a DDP model on a subgroup). Load before the first step: that step
        all-reduces in fp32 while DDP rebuilds its buckets (see the module docstring)."""
        for slot, value in state_dict["powersgd"].items():
            setattr(self.torch_state, slot, copy.deepcopy(value))
        self.load_counters(state_dict["stats"])
        self.fp32_iters_after_load = 1


def _group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return group_or_world(process_group)


def _group_size(process_group: dist.ProcessGroup | None) -> int:
    return _group(process_group).size()


def _check_bucket_state(torch_state: PowerSGDState, bucket: dist.GradBucket) -> None:
    """Fail, rather than add an error to the wrong elements, if the state kept for this bucket index belongs to
    a bucket of another size (DDP's buckets changed after a resume in a way the fp32 iteration did not cover,
    e.g. another ``bucket_cap_mb``)."""
    error = torch_state.error_dict.get(bucket.index())
    if error is not None and error.numel() != bucket.buffer().numel():
        raise RuntimeError(
            f"PowerSGD: DDP bucket {bucket.index()} holds {bucket.buffer().numel()} elements but "
            f"its saved error {error.numel()}: resume with the DDP settings of the saved run"
        )


def _fp32_allreduce(state: PowerSGDCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The average of the bucket by a plain fp32 all-reduce (torch's path before ``start_powerSGD_iter``)."""
    group = _group(state.torch_state.process_group)
    buffer = bucket.buffer().div_(group.size())

    def averaged(fut: torch.futures.Future) -> torch.Tensor:
        return fut.value()[0]

    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(averaged)


def _powersgd_hook(state: PowerSGDCommState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``powerSGD_hook`` on ``state.torch_state``, counted.

    1. decide, as torch's hook will, whether this bucket is compressed (before the call: the call may
       advance the iteration); right after a load, all-reduce in fp32 instead, for one iteration;
    2. run torch's hook; its synchronous part starts the first all-reduce and, when compressing, adds the
       elements of its three all-reduces to ``total_numel_after_compression``;
    3. count the bytes: the whole bucket when not compressing, that counter's increase when compressing.
    """
    torch_state = state.torch_state
    buffer = bucket.buffer()
    # Step I: which path this bucket takes.
    if state.fp32_iters_after_load:
        state.count_allreduce(buffer.numel(), buffer.element_size())
        fut = _fp32_allreduce(state, bucket)
        torch_state.maybe_increase_iter(bucket)  # the iteration counts, as torch's own fp32 iterations do
        if bucket.is_last():
            state.fp32_iters_after_load -= 1
        return fut
    compressing = state.compressing
    before = torch_state.total_numel_after_compression
    if compressing:
        _check_bucket_state(torch_state, bucket)
        state.keep_bucket(bucket.index())  # under a GradScaler: what a skipped step restores

    # Step II: torch's hook (it returns without waiting on the communication).
    # Timed on the stream it runs on (CUDA events) or by the wall clock (CPU): CommState.timing. The part before
    # its first all-reduce is compression; torch's hook also starts that all-reduce inside this block, which
    # on CUDA costs only its launch on this stream.
    with state.timing("compress", buffer.device) if compressing else contextlib.nullcontext():
        fut = powerSGD_hook(torch_state, bucket)
    if compressing:
        if state.serialize_buckets:
            # torch's hook starts its P and Q all-reduces from the future's callbacks. On gloo those run on the
            # communication thread while the autograd thread starts the next bucket's all-reduces, so ranks can
            # issue collectives in different orders and gloo aborts ("Received data size doesn't match";
            # pytorch/pytorch#58467: torch's PowerSGD tests skip gloo). Waiting here keeps bucket order on every
            # rank at the cost of overlap. NCCL futures run their callbacks inline, in order, and are not
            # waited on.
            fut.wait()

    # Step III: count.
    numel = torch_state.total_numel_after_compression - before if compressing else buffer.numel()
    state.count_allreduce(numel, buffer.element_size())
    return fut


def attach_powersgd(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer | None = None,
    topology: Topology | None = None,
    matrix_approximation_rank: int = 1,
    start_powerSGD_iter: int = 1_000,
    min_compression_rate: float = 2,
    use_error_feedback: bool = True,
    warm_start: bool = True,
    orthogonalization_epsilon: float = 0.0,
    random_seed: int = 0,
) -> PowerSGDCommState:
    """Register torch's PowerSGD hook (counted) on ``ddp_model`` and return its state.

    The arguments after ``topology`` are :class:`PowerSGDState`'s, with its defaults; torch requires
    ``start_powerSGD_iter`` >= 2 with warm start or error feedback (DDP rebuilds its buckets after the first
    iteration). ``optimizer`` is unused (the update is the optimizer's own); ``topology`` None: every process
    is its own node, so every byte counts as inter-node.
    """
    del optimizer
    topology = topology if topology is not None else flat_topology()
    process_group = getattr(ddp_model, "process_group", None)
    world = _group_size(process_group)
    if topology.world_size != world:
        raise ValueError(f"topology has {topology.world_size} processes but the DDP process group has {world}")
    if matrix_approximation_rank < 1:
        raise ValueError(f"attach_powersgd: matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
    torch_state = PowerSGDState(
        process_group,
        matrix_approximation_rank=matrix_approximation_rank,
        start_powerSGD_iter=start_powerSGD_iter,
        min_compression_rate=min_compression_rate,
        use_error_feedback=use_error_feedback,
        warm_start=warm_start,
        orthogonalization_epsilon=orthogonalization_epsilon,
        random_seed=random_seed,
    )
    serialize = dist.get_backend(process_group) != dist.Backend.NCCL
    state = PowerSGDCommState(torch_state, topology, serialize_buckets=serialize)
    ddp_model.register_comm_hook(state, _powersgd_hook)
    return state


def start_iter_from_config(cfg: Mapping[str, Any]) -> int:
    """``optim.comm.start_iter`` in steps (:func:`birder_repro.optim.schedule.steps_of`: a value below 1 is a fraction
    of the run, which needs ``optim.total_steps``). At least 2, as torch requires with warm start or error
    feedback (DDP rebuilds its buckets after the first iteration)."""
    return max(2, steps_of(cfg["comm"]["start_iter"], cfg.get("total_steps"), "optim.comm.start_iter"))


def attach_from_config(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    cfg: Mapping[str, Any],
    topology: Topology,
    scheme: str = "powersgd",
) -> PowerSGDCommState:
    """Scheme ``powersgd`` from the ``optim`` node: ``comm.rank``, ``comm.start_iter`` (steps, or a fraction
    of ``total_steps``), ``comm.min_compression_rate``, ``comm.warm_start``, ``comm.use_error_feedback``."""
    if scheme != "powersgd":
        raise ValueError(f"birder_repro.comm.powersgd handles scheme 'powersgd', not {scheme!r}")
    comm = cfg["comm"]
    start = start_iter_from_config(cfg)
    return attach_powersgd(
        ddp_model,
        optimizer,
        topology,
        matrix_approximation_rank=comm["rank"],
        start_powerSGD_iter=start,
        min_compression_rate=comm.get("min_compression_rate", 2),
        use_error_feedback=comm.get("use_error_feedback", True),
        warm_start=comm.get("warm_start", True),
        random_seed=cfg.get("seed", 0),
    )
