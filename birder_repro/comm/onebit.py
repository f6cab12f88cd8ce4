"""1-bit Adam's compressed all-reduce as a DDP communication hook (1-bit Adam paper, Algorithm 1 and
section 6; 1-bit LAMB paper, section 5 and appendix A.5.2), for :class:`birder_repro.optim.OneBitAdam` and
:class:`birder_repro.optim.OneBitLamb`.

Warmup (the optimizer's first ``freeze_step`` steps): DDP's fp32 all-reduce of the bucket, averaged, left
asynchronous as DDP's own so that it overlaps the backward pass (the warmup is "Adam's throughput").

Compression (every later step), for a bucket of P elements padded to P' (a multiple of 8 N, N processes):

    Step I    local momentum m_i = beta1 * m + (1-beta1) * g_i (Algorithm 1, line 6), where m is the averaged
              momentum of the last step, read from the optimizer's ``exp_avg`` (line 13 makes it every
              worker's momentum); 1-bit LAMB multiplies each tensor by its fixed momentum scale (A.5.2);
    Steps II-VI  the error-compensated compressed all-reduce of m_i (lines 7-11): one scale per bucket
              (:mod:`birder_repro.comm.onebit_exchange`) or, with ``scale='tensor'``, one per tensor and per
              piece of a server's chunk, as DeepSpeed's OnebitAdam (:mod:`birder_repro.comm.onebit_scales`);
              its result, the bucket's averaged momentum trimmed to P (divided by LAMB's scales), is returned
              as the "gradient"; the optimizer stores it as its momentum and steps.

The mask is the paper's Sign(0) = 0, which one bit cannot say, put back where the zeros are known: the
padding, and elements whose frozen variance is 0 (the optimizer's ``compression_inputs``; DeepSpeed's
``exp_avg_mask``). The bytes each exchange sends are counted by it, split intra- and inter-node by
``topology``. With one process nothing is sent and the momentum is used as it is (DeepSpeed's OnebitAdam
skips compression at world size 1 too).

The compression stage runs its work on a communication thread beside the backward pass
(:mod:`birder_repro.comm.overlap`; ``overlap=False`` runs it inside the hook, with the same results bit for
bit), timed into ``compress_seconds`` and ``collective_seconds``; DeepSpeed's runs it in the optimizer step,
after the backward pass.

State: the worker error of each bucket (this process's own, the whole bucket) and the server error of this
process's chunk (cut over all processes), in a :class:`~birder_repro.comm.buckets.BucketStore` that follows
DDP's bucket layout: when it changes (after the first iteration; in a resumed run, which starts from DDP's
initial layout again) the errors follow their elements. Padding carries no error (it is masked), so nothing is
lost; only the scales of the step after the change see the new grouping. The optimizer holds the momentum.
"""

# No ``from __future__ import annotations`` here: DDP's register_comm_hook checks the hook's annotations
# against dist.GradBucket and torch.futures.Future[torch.Tensor] as objects, not strings.
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import flat_allreduce_split
from birder_repro.comm.buckets import (
    Bucket,
    BucketStore,
    Field,
    Level,
    bucket_signature,
    parameter_index,
    require_buckets,
)
from birder_repro.comm.nonfinite import NonFiniteGuard, local_flag
from birder_repro.comm.onebit_exchange import compressed_allreduce
from birder_repro.comm.onebit_scales import SCALES, compressed_allreduce_per_tensor, tensor_layout
from birder_repro.comm.overlap import HookRunner
from birder_repro.comm.state import GRADIENT, MOMENTUM, CompressedCommState
from birder_repro.comm.topology import Topology, announce_layout, flat_topology, group_or_world
from birder_repro.optim.onebit_adam import COMPRESSION, WARMUP, OneBitOptimizer

__all__ = [
    "OneBitState",
    "attach_onebit",
    "attach_from_config",
    "onebit_hook",
]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of an FSDP parameter's state (a DTensor's local shard); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


# ------------------------------------------------------------------------------------------- the state
class _Derived:
    """What the hook derives for a bucket from the optimizer, once (fixed in the compression stage; not saved)."""

    __slots__ = ("params", "beta1", "mask", "scale", "layout")

    def __init__(self, params: list, beta1: float, mask: torch.Tensor, scale: torch.Tensor | None):
        self.params, self.beta1, self.mask, self.scale = params, beta1, mask, scale
        self.layout = None  # optim.comm.scale=tensor: where the scales stop (birder_repro.comm.onebit_scales)


class OneBitState(CompressedCommState):
    """State of the 1-bit Adam / 1-bit LAMB hook on one rank. Counters (bytes, seconds) come from CommState.

    ``stage(step)`` is the stage of the next step (what the training loop is about to run), ``last_stage`` that
    of the last bucket communicated; both follow the optimizer's step count, the same on every rank.
    ``layout_changes`` counts the times DDP's bucket layout changed under stored errors (module doc).
    """

    runner: HookRunner
    guard: NonFiniteGuard
    store: BucketStore

    __slots__ = (
        # user settings
        "optimizer",
        "process_group",
        "topology",
        "scale",
        # internal state: per-bucket errors with their layouts; which parameter index each parameter has; the
        # communication thread
        "store",
        "param_index",
        "runner",
        # statistics
        "last_stage",
        # non-finite gradients: this step's flags, the errors' backups, the count of skipped steps
        "guard",
    )

    def __init__(
        self,
        optimizer: OneBitOptimizer,
        process_group: dist.ProcessGroup | None,
        topology: Topology,
        param_index: Mapping[int, int],
        overlap: bool = True,
        nonfinite: str = "skip",
        scale: str = "bucket",
    ):
        super().__init__()
        if scale not in SCALES:
            raise ValueError(f"optim.comm.scale must be one of {', '.join(SCALES)}, got {scale!r}")
        self.optimizer = optimizer
        self.scale = scale  # one scale per bucket, or per tensor as DeepSpeed's OnebitAdam
        self.process_group = process_group
        self.topology = topology
        self.runner = HookRunner(overlap, name=f"onebit-comm-{topology.rank}")
        n = self.world_size
        every = Level(self.group if n > 1 else None, n, dist.get_rank(self.group) if n > 1 else 0)
        # worker error: this process's own, over the whole bucket; server error: chunk k on process k
        self.store = BucketStore([Field("worker_error"), Field("server_error", (every,))], pad_to=8 * n)
        self.param_index = dict(param_index)  # id(parameter) -> its index in the model's parameters()
        self.last_stage: str | None = None
        self.guard = NonFiniteGuard(nonfinite, topology.rank)

    @property
    def group(self) -> dist.ProcessGroup:
        return group_or_world(self.process_group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def stage(self, step: int) -> str:
        """The stage of the step about to run: the optimizer's (its step count is the loop's ``step``)."""
        return self.optimizer.stage

    def grad_holds(self) -> str:
        """In the compression stage the hook hands back the averaged momentum in place of the gradients."""
        return MOMENTUM if self.optimizer.stage == COMPRESSION else GRADIENT

    @property
    def freeze_step(self) -> int:
        return self.optimizer.freeze_step

    # ------------------------------------------------------------------------------------------- warmup
    def allreduce_average(self, buffer: torch.Tensor) -> torch.futures.Future:
        """Warmup: the fp32 average over all processes, asynchronous like DDP's default all-reduce."""
        n = self.world_size
        intra, inter = flat_allreduce_split(buffer.numel() * buffer.element_size(), n, self.topology.gpus_per_node)
        self.add_bytes(intra, inter)
        buffer.div_(n)  # before the sum, as torch's default allreduce_hook does
        fut = dist.all_reduce(buffer, group=self.group, async_op=True).get_future()

        def result(fut: torch.futures.Future) -> torch.Tensor:
            averaged = fut.value()[0]  # the same on every rank: so is its flag
            self.guard.note(local_flag(averaged), -1, self.optimizer.steps_done + 1)
            return averaged

        return fut.then(result)

    # -------------------------------------------------------------------------------------- compression
    def compress_bucket(
        self,
        index: int,
        buffer: torch.Tensor,
        params: Sequence[torch.Tensor],
        signature: tuple,
        node_flag: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Steps I-VI on one bucket; writes the averaged momentum into ``buffer`` and returns it.

        ``node_flag``: the non-finite flag this process sends, when its node agreed on one already (the FSDP
        path, :mod:`birder_repro.comm.fsdp`); None: the bucket's own."""
        with torch.no_grad():
            bucket = self.store.bucket(index, buffer.numel(), signature, buffer.device)
            if bucket.derived is None:
                bucket.derived = self._derive(bucket, params)
            d = bucket.derived
            self.guard.backup(bucket)  # before any update: a skipped step restores it
            with self.timing("compress", buffer.device):
                flag = local_flag(buffer) if node_flag is None else node_flag
                m = self._local_momentum(bucket, self.unscale_(buffer))  # fp16: true gradients (Step I)
            if self.world_size > 1:
                ex = self._exchange(bucket, m, flag)
                m, flag = ex.result, (~torch.isfinite(ex.worker_scales)).any().to(torch.float32)
            else:
                m.mul_(d.mask)  # nothing to send: the exact momentum (DeepSpeed skips compression too)
            self.guard.note(flag, index, self.optimizer.steps_done + 1)
            with self.timing("compress", buffer.device):
                out = m[: bucket.numel]
                if d.scale is not None:
                    out = out.div_(d.scale[: bucket.numel])
                self.rescale_(buffer.copy_(out), flag)  # fp16: what GradScaler divides back (Step II)
            return buffer

    def _exchange(self, bucket: Bucket, m: torch.Tensor, flag: torch.Tensor):
        """Steps II-VI with the bucket's one scale, or a scale per tensor (``scale='tensor'``)."""
        d, errors = bucket.derived, (bucket.state["worker_error"], bucket.state["server_error"])
        if self.scale == "bucket":
            return compressed_allreduce(m, *errors, d.mask, self.group, self, self.topology, nonfinite=flag)
        if d.layout is None:
            d.layout = tensor_layout(
                bucket.signature, bucket.padded, d.mask, self.world_size, dist.get_rank(self.group)
            )
        return compressed_allreduce_per_tensor(
            m, *errors, d.mask, d.layout, self.group, self, self.topology, nonfinite=flag
        )

    def _local_momentum(self, bucket: Bucket, buffer: torch.Tensor) -> torch.Tensor:
        """Step I: beta1 * m + (1-beta1) * g over the bucket, padded with zeros (times LAMB's scales)."""
        d = bucket.derived
        m = torch.zeros(bucket.padded, device=buffer.device, dtype=torch.float32)
        for p, (_, offset, numel, *_) in zip(d.params, bucket.signature):
            prev = self.optimizer.momentum_of(p)
            if prev is not None:
                m[offset : offset + numel] = _local(prev).reshape(-1)
        m[: bucket.numel].mul_(d.beta1).add_(buffer.float(), alpha=1 - d.beta1)
        if d.scale is not None:
            m.mul_(d.scale)
        return m

    def _derive(self, bucket: Bucket, params: Sequence[torch.Tensor]) -> _Derived:
        """Mask, beta1 and momentum scales of a bucket from the optimizer (fixed in the compression stage)."""
        device = bucket.state["worker_error"].device
        # 0/1 floats rather than bools: compress_ multiplies by the mask several times per step
        mask = torch.zeros(bucket.padded, device=device, dtype=torch.float32)  # padding stays 0
        scale = torch.ones(bucket.padded, device=device, dtype=torch.float32)
        betas = set()
        for p, (_, offset, numel, *_) in zip(params, bucket.signature):
            inputs = self.optimizer.compression_inputs(p)
            betas.add(inputs.beta1)
            mask[offset : offset + numel] = _local(inputs.mask).reshape(-1)
            scale[offset : offset + numel] = (
                _local(inputs.scale) if isinstance(inputs.scale, torch.Tensor) else inputs.scale
            )
        if len(betas) > 1:
            raise ValueError(
                f"the parameters of one DDP bucket have different beta1 {sorted(betas)}: the 1-bit "
                "hook forms one momentum per bucket"
            )
        return _Derived(list(params), betas.pop() if betas else 0.0, mask, scale if bool((scale != 1).any()) else None)

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's errors with their layouts, and the counters; process groups are not saved. Taken between
        steps (no bucket in flight on the communication thread)."""
        self.runner.check_idle("OneBitState.state_dict()")
        return {
            "world_size": self.world_size,
            "scale": self.scale,  # informative: the errors are per element, so either setting loads them
            "buckets": self.store.state_dict(),
            "last_stage": self.last_stage,
            "counters": self.snapshot(),
            "nonfinite": self.guard.state_dict(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Load a rank's :meth:`state_dict` into any DDP bucket layout (the first differing bucket migrates it)."""
        if sd["world_size"] != self.world_size:
            raise ValueError(
                f"checkpoint of the 1-bit hook was saved on {sd['world_size']} processes, this run has "
                f"{self.world_size}: its server errors belong to other chunks"
            )
        self.runner.check_idle("OneBitState.load_state_dict()")
        self.store.load_state_dict(sd["buckets"])
        self.last_stage = sd["last_stage"]
        self.load_counters(sd["counters"])
        self.guard.load_state_dict(sd.get("nonfinite"))


def onebit_hook(state: OneBitState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: fp32 average in the warmup, the compressed all-reduce of the momentum after.

    The stage follows the optimizer's step count, the same on every rank. In the compression stage the work
    runs on the state's communication thread (``overlap``) or inside the hook (the future already complete).
    """
    buffer = bucket.buffer()
    stage = state.optimizer.stage
    state.last_stage = stage
    state.calls += 1
    if stage == WARMUP:
        return state.allreduce_average(buffer)
    signature = bucket_signature(state.param_index, bucket)
    index, params = bucket.index(), bucket.parameters()
    return state.runner.run(lambda: state.compress_bucket(index, buffer, params, signature), buffer.device)


def attach_onebit(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: OneBitOptimizer,
    topology: Topology | None = None,
    overlap: bool = True,
    nonfinite: str = "skip",
    scale: str | None = None,
    layout_source: str | None = None,
    grad_scaler=None,
) -> OneBitState:
    """Register the 1-bit hook on ``ddp_model`` and have ``optimizer`` take its averaged momentum.

    Args:
        ddp_model: the DDP-wrapped model; the compressed all-reduce runs over its process group.
        optimizer: a :class:`~birder_repro.optim.OneBitAdam` or :class:`~birder_repro.optim.OneBitLamb`
            (``freeze_step`` >= 2: DDP rebuilds its buckets after the first iteration, so the compression
            stage starts on the final layout; torch's PowerSGD asks the same. Later layout changes, as in a
            resumed run, move the errors with their elements).
        topology: only splits the counted bytes into intra- and inter-node. None: every process its own node.
        overlap: run the compressed all-reduce on a communication thread beside the backward pass (false:
            inside the hook; the same results).
        nonfinite: a NaN or Inf in any rank's gradient skips the whole step on every rank (``skip``: parameters,
            momentum, variance and errors untouched, counted in ``state.nonfinite_steps``) or fails it
            (``raise``).
        scale: ``bucket`` (one worker scale per DDP bucket, one server scale per chunk) or ``tensor`` (one per
            tensor of the bucket and per piece of a tensor in a server's chunk, as DeepSpeed's OnebitAdam;
            :mod:`birder_repro.comm.onebit_scales`). None: the optimizer's ``comm_scale``, the default of its
            ``optim=`` config too (OneBitAdam ``tensor``, OneBitLamb ``bucket``), so that a script and the CLI
            compute alike.
        layout_source: what rank 0's layout line says the layout came from, where a framework knows better
            (Lightning's ``devices``); by default where the attach found it.
        grad_scaler: the ``torch.amp.GradScaler`` the script scales its loss with (fp16), so that the hook
            compresses true gradients and the scaler still finds overflows (``state.use_grad_scaler``); a
            scaler that steps the optimizer without having been passed here is refused at the first step.

    Rank 0 says the layout the counts are split by and where it came from. The state's counters are cumulative
    from the attach on; ``state.bytes_last_step()`` gives one step's bytes.
    """
    require_buckets(ddp_model, "attach_onebit")
    if not isinstance(optimizer, OneBitOptimizer):
        raise TypeError(f"attach_onebit needs a OneBitAdam or OneBitLamb optimizer, got {type(optimizer).__name__}")
    if optimizer.freeze_step < 2:
        raise ValueError(
            f"attach_onebit: freeze_step must be >= 2 with DDP (got {optimizer.freeze_step}): DDP "
            "rebuilds its buckets after the first iteration, so at least two steps run uncompressed"
        )
    source = (
        "topology given"
        if topology is not None
        else ("topology not given: every process its own node, so every byte counts as inter-node")
    )
    topology = topology if topology is not None else flat_topology()
    process_group = getattr(ddp_model, "process_group", None)
    world = dist.get_world_size(process_group if process_group is not None else dist.group.WORLD)
    if topology.world_size != world:
        raise ValueError(f"topology has {topology.world_size} processes but the DDP process group has {world}")
    # Every process is a worker of the compressed all-reduce whatever the layout: it only splits the counts.
    announce_layout("attach_onebit", topology, layout_source or source, between_nodes=False)
    state = OneBitState(
        optimizer,
        process_group,
        topology,
        parameter_index(ddp_model.module),
        overlap=overlap,
        nonfinite=nonfinite,
        scale=optimizer.comm_scale if scale is None else scale,
    )
    state.use_grad_scaler(grad_scaler)
    ddp_model.register_comm_hook(state, onebit_hook)
    optimizer.momentum_by_hook = True
    optimizer.hook_state = state  # its step() asks the hook whether to skip (end_step)
    return state


def attach_from_config(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer: OneBitOptimizer,
    cfg: Mapping[str, Any],
    topology: Topology,
    scheme: str = "onebit",
) -> OneBitState:
    """The runner's entry (birder_repro.comm.attach_comm): ``optim.comm.overlap``, ``.nonfinite`` and ``.scale``
    from the config (``bucket_cap_mb`` is DDP's: the worker builds DDP with it)."""
    if scheme != "onebit":
        raise ValueError(f"birder_repro.comm.onebit handles scheme 'onebit', not {scheme!r}")
    comm = cfg.get("comm") or {}
    return attach_onebit(
        ddp_model,
        optimizer,
        topology=topology,
        overlap=bool(comm.get("overlap", True)),
        nonfinite=str(comm.get("nonfinite", "skip")),
        scale=str(comm.get("scale", optimizer.comm_scale)),
    )
