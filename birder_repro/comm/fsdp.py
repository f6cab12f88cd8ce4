"""Birder and 1-bit Adam / 1-bit LAMB under sharded training (FSDP2, HSDP): the inter-node 1-bit exchange in
FSDP2's all-reduce hook (Birder paper, section 4: the Hierarchical-1-bit-All-Reduce is HSDP with a 1-bit step
between the nodes).

With a device mesh ("replicate", "shard") = (nodes, processes per node) and every unit sharded on the 1-D
intra-node mesh (``fully_shard(unit, mesh=mesh["shard"])``), FSDP2 reduce-scatters each unit's gradients inside
the node and hands the unit's shard to ``FSDPModule.set_all_reduce_hook`` before it becomes the parameters'
sharded gradients. That shard is the node average, step I of the DDP hook (:mod:`birder_repro.comm.birder`),
so per unit and per step:

    Step I    (FSDP) intra-node reduce-scatter (average): this process's shard of the unit, laid out as each of
              the unit's parameters' dim-0 shard in turn, every one padded to ceil(rows / m) rows;
    Step II   (hook, autograd thread) the shard's non-finite flag, summed over the node's processes (one fp32,
              on the node's group), so that the ranks of a node agree before the flag travels between the nodes;
    Step III  (hook on CUDA; the communication thread on CPU) Birder's steps II-III on the shard
              (``BirderState.reduce_node_shard``: worker step, all-to-all among the processes with this local
              rank, server step, all-gather) and the +-1 written into the shard in place; 1-bit Adam's warmup
              all-reduce or compressed all-reduce among them likewise (``OneBitState.compress_bucket`` with the
              replicate group);
    Step IV   (FSDP) the shard becomes the parameters' sharded gradients (views of it), which the optimizer
              applies to its shards; the DDP hook's step IV (intra-node all-gather) is not needed: parameters
              stay sharded and FSDP all-gathers them in forward.

A unit is a "bucket" of the shared bucket-state layer (:class:`~birder_repro.comm.buckets.BucketStore`): its
signature lists each parameter's piece of the shard with the position of the piece's first element within the
parameter (rank r holds rows [r ceil(d0/m), ...)), so every element's random draws sit at its position among
all the model's parameters, as in the DDP hook, and are keyed by the node. Birder's state and draws are per
element, so with an exact node average (2 processes per node: (a + b) / 2 rounds like a / 2 + b / 2) the
result equals the DDP hook's (``scheme=hierarchical``) bit for bit, whatever the units and DDP's buckets
(tests/test_fsdp.py). 1-bit Adam's scales are norms over the whole exchanged vector, here a unit's shard, so
its result depends on the units (as it depends on DDP's buckets).

Streams and order (:func:`runs_in_hook`). On CUDA the whole work of a unit runs inside the hook, on the
stream FSDP runs it on (its all-reduce stream, beside the compute stream: that is the overlap). So:

- every collective of a step is launched from the autograd thread, in FSDP's order (its reduce-scatters and
  all-gathers on the node's group; per unit, after its reduce-scatter, the flag's all-reduce on the node's
  group, then the all-to-all and all-gather, or 1-bit Adam's collectives, on the replicate group), the same
  on every rank: NCCL asks that collectives on several communicators be launched in one order on every rank
  (a device-wide synchronisation, e.g. the caching allocator's ``cudaFree`` under memory pressure, can
  otherwise wait on a collective whose peers wait on this rank: a cycle across ranks);
- the node's flag is made and read on that one stream (no other stream reads it, so no ``record_stream``
  is needed; made there and read on a side stream, its block could be handed to the next unit's flag while
  the side stream still waits behind the inter-node exchange);
- what FSDP does with the shard after the hook (the gradients' views, adding to existing gradients, the event
  the optimizer waits on) is ordered after the work on that stream.

The hook blocks the host for nothing: NCCL collectives and Triton kernels are queued, and the flags are read
once per step (:mod:`birder_repro.comm.nonfinite`). On CPU (gloo's collectives block the host) with
``overlap=True`` the hook queues the work on the state's communication thread and returns; the shard's memory
is the gradients' (FSDP makes them views of it), so the work writes them in place later, and the first hook of
a backward pass queues an autograd callback that waits for every queued unit when backward ends
(``loss.backward()`` returns with the gradients final and raises any failure of the thread). Each group is then
used from one thread, in the same order on every rank: the node's group by the autograd thread (FSDP and the
flags), the replicate group by the communication thread (tests/test_fsdp_order.py records them); gloo has no
device-wide synchronisation to tie the two groups together.

FSDP's divide (:func:`fsdp_postdivide`). With an fp32 or bf16 reduce dtype FSDP averages in its
reduce-scatter and the hook gets the node average. With an fp16 reduce dtype (or ``set_force_sum_reduction_for_
comms(True)``, or a ``set_gradient_divide_factor``) it sums instead, dividing by a pre-factor before and a
post-factor after the hook: the hook would see post x the node average and its +-1 would come out divided by
post. So the hook divides the shard by FSDP's post-factor before its work and multiplies the result by it after,
and FSDP's own divide then leaves the node average in and the +-1 (1-bit Adam: the averaged momentum) out.

Bytes: the hooks count what they send (:mod:`birder_repro.comm.accounting`); :class:`FsdpTraffic` counts
FSDP's own collectives inside the node (the reduce-scatter and the parameters' all-gathers in forward and, for
units resharded after forward, in backward) and, for native HSDP (the baselines), its fp32 all-reduce across
the nodes.

Per-process inter-node bytes per step of Birder under FSDP: sum over units of 2 (n-1)/n * S'/8 + (n-1), with
S' the unit's shard padded to a multiple of 8 n (the extra byte per peer carries the node's non-finite flag).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

from birder_repro.comm.accounting import allreduce_bytes, reduce_scatter_bytes
from birder_repro.comm.buckets import parameter_index
from birder_repro.comm.nonfinite import local_flag
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, announce_layout

__all__ = [
    "Unit",
    "fsdp_units",
    "mesh_topology",
    "FsdpTraffic",
    "attach_birder_fsdp",
    "attach_onebit_fsdp",
    "attach_hsdp",
    "HsdpState",
    "FSDP_SCHEMES",
    "runs_in_hook",
]

# The communication schemes that have an FSDP path (birder_repro.comm.SCHEMES names).
FSDP_SCHEMES = ("allreduce", "birder", "onebit")
MESH_SOURCE = "the device mesh's (replicate, shard) sizes"  # where an FSDP attach's layout comes from


# ------------------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class Unit:
    """One FSDP unit (a module given to ``fully_shard`` that owns parameters) as this rank sees it.

    ``signature``: ((parameter index, offset in this rank's shard, numel of its real elements, position of
    the first of them within the parameter), ...), the parameters in FSDP's order; ``numel``: the shard's
    length (padding included); ``gathered``: the bytes this rank sends in one all-gather of its parameters.
    """

    index: int
    module: torch.nn.Module  # an FSDPModule too (fully_shard makes the module an instance of both)
    params: tuple  # the sharded parameters (DTensors), in the shard's order
    signature: tuple
    numel: int
    gather_nbytes: int


def _as_fsdp(module: torch.nn.Module) -> FSDPModule:
    """``module`` as the FSDPModule fully_shard made it (typed so: its FSDP methods are not nn.Module's; the
    attach checked each unit when it collected them)."""
    return cast("FSDPModule", module)


def _param_group(module: torch.nn.Module):
    state = _as_fsdp(module)._get_fsdp_state()  # FSDPModule's own accessor
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # older layout: one group or none
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    if len(groups) > 1:
        raise ValueError(
            f"FSDP unit {type(module).__name__} has {len(groups)} parameter groups (a per-parameter "
            "mesh): the 1-bit hooks need one group per unit"
        )
    return groups[0] if groups else None


def fsdp_units(model: torch.nn.Module) -> list[Unit]:
    """Every FSDP unit of ``model`` that owns parameters, in ``model.modules()`` order (the same on every rank).

    Raises where ``model`` was not given to ``fully_shard`` or a unit's shard is not the dim-0 row layout.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        raise TypeError(f"{type(model).__name__} is not an FSDP2 module: call fully_shard(model, mesh=...) first")
    index = parameter_index(model)
    units: list[Unit] = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = _param_group(module)
        if group is None or not group.fsdp_params:
            continue
        signature, offset, gather = [], 0, 0
        for fp in group.fsdp_params:
            if fp.fsdp_placement.dim != 0:
                raise ValueError("the 1-bit FSDP hooks need parameters sharded on dim 0 (FSDP's default Shard(0))")
            padded = fp.padded_sharded_param_size.numel()
            real = fp.sharded_size.numel()
            rank = fp.mesh_info.shard_mesh_rank  # this process's dim-0 chunk of the parameter
            signature.append((index[id(fp.sharded_param)], offset, real, rank * padded if real else 0))
            offset += padded
            dtype = fp.param_dtype if getattr(fp, "param_dtype", None) is not None else fp.sharded_param.dtype
            gather += padded * torch.empty((), dtype=dtype).element_size()
        units.append(
            Unit(
                len(units),
                module,
                tuple(fp.sharded_param for fp in group.fsdp_params),
                tuple(signature),
                offset,
                gather,
            )
        )
    return units


def mesh_topology(mesh) -> Topology:
    """The :class:`Topology` of a ("replicate", "shard") device mesh: a node is a row of the mesh."""
    if mesh.ndim != 2:
        raise ValueError(
            f'the FSDP hooks need a 2-D device mesh ("replicate", "shard") = (nodes, processes '
            f"per node), got {mesh.ndim}-D"
        )
    nodes, per_node = mesh.shape
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != nodes * per_node or mesh.mesh.flatten().tolist() != list(range(world)):
        raise ValueError(
            "the device mesh must hold ranks 0..world-1 node by node (init_device_mesh(device, "
            '(nodes, gpus_per_node), mesh_dim_names=("replicate", "shard")))'
        )
    names = mesh.mesh_dim_names or ("replicate", "shard")
    intra = mesh.get_group(names[1]) if per_node > 1 else None
    inter = mesh.get_group(names[0]) if nodes > 1 else None
    return Topology(rank=rank, world_size=world, gpus_per_node=per_node, intra_group=intra, inter_group=inter)


# ----------------------------------------------------------------------------------------- FSDP's bytes
class FsdpTraffic:
    """Counts FSDP's own collectives into a hook state's counters (what FSDP sends; the hooks count theirs).

    Per unit and training step: one all-gather of the parameters in forward and one more in backward when the
    unit is resharded after forward (every unit but the root, by FSDP2's default), ``(m-1) * shard bytes``
    each; one reduce-scatter of the gradients, ``(m-1)/m * padded unit bytes``; with ``native_hsdp``, FSDP's
    fp32 all-reduce of the shard across the nodes, ``2 (n-1)/n * shard bytes``. Forward passes without grad
    (evaluation) or without reduction (the loop's compute calibration) are not counted: the counters are per
    training step.
    """

    def __init__(self, state: CommState, units: Sequence[Unit], topology: Topology, native_hsdp: bool = False):
        self.state, self.topology, self.native_hsdp = state, topology, native_hsdp
        self.handles = []
        for unit in units:
            self.handles.append(unit.module.register_forward_pre_hook(self._gathered(unit)))
            if native_hsdp:  # no all-reduce hook to count in: FSDP calls this after the unit's reduction
                first = unit.params[0]
                self.handles.append(first.register_post_accumulate_grad_hook(lambda _, u=unit: self.reduced(u)))

    def _gathered(self, unit: Unit):
        def count(module, args):
            group = _param_group(unit.module)
            # not a training step's: evaluation, or compute calibration without reduction (model.no_sync())
            if not torch.is_grad_enabled() or self.topology.gpus_per_node == 1 or not group.reduce_grads:
                return
            times = 2 if getattr(group, "post_forward_mesh_info", None) is not None else 1
            self.state.add_bytes(times * (self.topology.gpus_per_node - 1) * unit.gather_nbytes, 0.0)

        return count

    def reduced(self, unit: Unit, shard_nbytes: int | None = None) -> None:
        """One unit's reduction: FSDP's reduce-scatter inside the node (and its HSDP all-reduce across)."""
        m = self.topology.gpus_per_node
        nbytes = shard_nbytes if shard_nbytes is not None else unit.numel * 4
        inter = allreduce_bytes(nbytes, self.topology.nodes) if self.native_hsdp else 0.0
        self.state.add_bytes(reduce_scatter_bytes(nbytes * m, m), inter)


# ---------------------------------------------------------------------------------- the hooks' driver
def runs_in_hook(device, overlap: bool) -> bool:
    """Whether a unit's work runs inside FSDP's all-reduce hook (True) or on the state's communication thread.

    On CUDA always inside (module doc, Streams and order): every collective of a step is then launched from
    the autograd thread in FSDP's order, the same on every rank, as NCCL asks of several communicators; the
    node's flag is made and read on the one stream the hook runs on; and FSDP orders what it does with the
    shard after the hook (the gradients' views, their accumulation, the event the optimizer waits on) after
    the work. Nothing there blocks the host: NCCL collectives and Triton kernels are queued, the flags are read
    once per step. On CPU (gloo, whose collectives block the host) the thread keeps backward going."""
    return not overlap or torch.device(device).type == "cuda"


class _UnitHooks:
    """Installs ``work(unit, shard, node_flag)`` as every unit's all-reduce hook, run inside the hook or by
    ``state.runner`` (:func:`runs_in_hook`); the thread's work is waited for when backward ends (module doc,
    Streams and order)."""

    def __init__(self, state, units: Sequence[Unit], topology: Topology, traffic: FsdpTraffic, work):
        self.state, self.topology, self.traffic, self.work = state, topology, traffic, work
        self.pending: list[torch.futures.Future] = []
        self.callback_queued = False
        for unit in units:
            _as_fsdp(unit.module).set_all_reduce_hook(self._hook_of(unit))

    def _hook_of(self, unit: Unit) -> Callable[[torch.Tensor], None]:
        return lambda shard: self.hook(unit, shard)

    def hook(self, unit: Unit, shard: torch.Tensor) -> None:
        if shard.numel() != unit.numel:
            raise RuntimeError(
                f"FSDP unit {unit.index} ({type(unit.module).__name__}) reduced {shard.numel()} "
                f"elements, its parameters' shards hold {unit.numel}: every parameter of a unit "
                "must get a gradient in every step with the 1-bit FSDP hooks"
            )
        # FSDP summed (module doc, FSDP's divide): the work then runs here, between FSDP's two divides; on the
        # thread it would race the divide FSDP applies to the shard as soon as this hook returns.
        post = fsdp_postdivide(unit, shard)
        inside = runs_in_hook(shard.device, self.state.runner.overlap) or post != 1.0
        if not inside and any(p.grad is not None for p in unit.params):
            raise RuntimeError(
                f"FSDP unit {unit.index} ({type(unit.module).__name__}) already has gradients: FSDP "
                "would add the shard to them before the communication thread writes it; call "
                "optimizer.zero_grad(set_to_none=True) before each backward, or set overlap=False"
            )
        self.traffic.reduced(unit, shard.numel() * shard.element_size())
        flag, work = self._node_flag(shard)
        if inside:  # Step III now, on the hook's stream
            self._drain()  # units still queued on the thread first: one thread at a time on a group
            with torch.no_grad():
                if work is not None:
                    work.wait()
                if post != 1.0:
                    shard.div_(post)  # the node average in
                self.work(unit, shard, flag)
                if post != 1.0:
                    shard.mul_(post)  # FSDP's divide leaves the result
            return

        def run() -> torch.Tensor:
            if work is not None:
                work.wait()
            self.work(unit, shard, flag)
            return shard

        self.pending.append(self.state.runner.run(run, shard.device))
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.wait)

    def _node_flag(self, shard: torch.Tensor):
        """Step II: this process's non-finite flag for the shard and, with several processes per node, their
        sum over the node under way (the work to wait for; None: nothing to wait for). Issued here, on the
        autograd thread, on the node's group, which FSDP's own collectives use from this thread too."""
        flag = local_flag(shard)
        if self.topology.intra_group is None:
            return flag, None
        work = dist.all_reduce(flag, group=self.topology.intra_group, async_op=True)
        self.state.add_bytes(allreduce_bytes(4, self.topology.gpus_per_node), 0.0)
        return flag, work

    def wait(self) -> None:
        """Every unit's work of this backward pass done (re-raises a failure of the communication thread)."""
        self.callback_queued = False
        self._drain()

    def _drain(self) -> None:
        pending, self.pending = self.pending, []
        for fut in pending:
            fut.wait()


def fsdp_postdivide(unit: Unit, shard: torch.Tensor) -> float:
    """The factor FSDP2 divides ``unit``'s reduce-scatter output by after its all-reduce hook (1.0: none; it
    averaged in the collective). Asked of FSDP's own rule (its private ``_get_gradient_divide_factors``, with
    the unit's reduce dtype, divide factor and forced-sum setting), so that it follows the torch in use."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    group = _param_group(unit.module)
    factor = getattr(group, "gradient_divide_factor", None)
    force_sum = bool(getattr(group, "force_sum_reduction_for_comms", False))
    if shard.dtype in (torch.float32, torch.bfloat16) and factor is None and not force_sum:
        return 1.0  # FSDP's AVG reduce-scatter (every torch with set_all_reduce_hook)
    try:
        rule = _fsdp_collectives._get_gradient_divide_factors
        _, post, _, _ = rule(
            group.mesh_info.shard_process_group, None, shard.dtype, shard.device.type, factor, force_sum
        )
    except Exception as err:  # any change of the private rule: refuse in one line, naming the setting
        raise RuntimeError(
            f"FSDP unit {unit.index} reduces in {shard.dtype} with a sum (fp16 reduce dtype, a gradient divide "
            "factor or forced sum reduction): this torch's FSDP does not say what it divides by after the hook "
            f"({type(err).__name__}: {err}); reduce in float32 (MixedPrecisionPolicy(reduce_dtype=torch.float32))"
        ) from err
    return float(post) if post else 1.0


def _check_mesh_and_units(model: torch.nn.Module, mesh) -> tuple[Topology, list[Unit]]:
    topology = mesh_topology(mesh)
    units = fsdp_units(model)
    for unit in units:
        group = _param_group(unit.module)
        if type(group.mesh_info).__name__ == "HSDPMeshInfo" or group.mesh_info.mesh.ndim != 1:
            raise ValueError(
                "shard every unit on the intra-node mesh (fully_shard(unit, mesh=mesh['shard'])): "
                "with native HSDP FSDP's own all-reduce across nodes would run before the hook"
            )
    return topology, units


# ------------------------------------------------------------------------------------------------ Birder
def attach_birder_fsdp(
    model: torch.nn.Module,
    optimizer,
    mesh,
    kernel_backend: str = "auto",
    overlap: bool = True,
    nonfinite: str = "skip",
    grad_scaler=None,
):
    """Birder's Hierarchical-1-bit-All-Reduce on an FSDP2 model: the same state as :func:`attach_birder`
    (counters, ``stage()``, ``nonfinite_steps``, ``state_dict()``), its inter-node exchange in every unit's
    all-reduce hook. Collective: call it on every rank, after ``fully_shard`` and before the first backward.

    ``mesh``: the ("replicate", "shard") device mesh whose "shard" dimension every unit is sharded on; rank 0
    says the layout it gives (nodes x processes per node). ``grad_scaler``: as :func:`attach_birder`'s. The
    counters are cumulative from the attach on; ``state.bytes_last_step()`` gives one step's bytes.
    """
    from birder_repro.comm import kernels
    from birder_repro.comm.birder import BirderState
    from birder_repro.optim.birder import Birder

    if not isinstance(optimizer, Birder):
        raise TypeError(
            f"attach_birder_fsdp needs a birder_repro.optim.Birder optimizer, got {type(optimizer).__name__}"
        )
    # Resolved and, for Triton, self-tested here (compiles, tl.rand draws the CPU backends' numbers), as
    # attach_birder does: a broken backend is refused in one line now, not inside the first backward.
    kernel_backend = kernels.check_backend(kernel_backend, next(model.parameters()).device)
    topology, units = _check_mesh_and_units(model, mesh)
    groups = optimizer.param_groups
    for key in ("beta", "eps", "amsgrad_after"):
        if len({g[key] for g in groups}) != 1:
            raise ValueError(f"attach_birder_fsdp: every parameter group must share {key}: the hook works per unit")
    announce_layout("attach_birder_fsdp", topology, MESH_SOURCE, guessed=False)
    state = BirderState(
        topology,
        scheme="hierarchical",
        beta=groups[0]["beta"],
        eps=groups[0]["eps"],
        amsgrad_after=groups[0]["amsgrad_after"],
        seed=optimizer.seed,
        param_numels=[p.numel() for p in model.parameters()],
        kernel_backend=kernel_backend,
        overlap=overlap,
        nonfinite=nonfinite,
        node_averaged=True,
    )
    state.use_grad_scaler(grad_scaler)
    state.param_index = parameter_index(model)
    traffic = FsdpTraffic(state, units, topology)
    hooks = _UnitHooks(
        state,
        units,
        topology,
        traffic,
        lambda unit, shard, flag: state.reduce_node_shard(unit.index, shard, unit.signature, flag),
    )
    _remember(state, model, mesh, units, hooks, traffic)
    optimizer.compressed_by_hook = True
    optimizer.hook_state = state
    return state


# ----------------------------------------------------------------------------------- 1-bit Adam / LAMB
def attach_onebit_fsdp(
    model: torch.nn.Module,
    optimizer,
    mesh,
    overlap: bool = True,
    nonfinite: str = "skip",
    scale: str | None = None,
    grad_scaler=None,
):
    """1-bit Adam / 1-bit LAMB on an FSDP2 model, hierarchically: FSDP's reduce-scatter averages inside the
    node, and the error-compensated 1-bit all-reduce (or the fp32 all-reduce of the warmup) runs among the
    processes with the same local rank, one per node, on each unit's shard. The state is :func:`attach_onebit`'s.

    ``scale``: as :func:`attach_onebit`'s (None: the optimizer's ``comm_scale``); with ``tensor`` the scales
    stop where each parameter's piece of the unit's shard stops (the shard is the "bucket": a worker scale per
    parameter shard, a server scale per piece of one in a server's chunk). ``grad_scaler``: as
    :func:`attach_onebit`'s.
    """
    from birder_repro.comm.onebit import OneBitState
    from birder_repro.optim.onebit_adam import WARMUP, OneBitOptimizer

    if not isinstance(optimizer, OneBitOptimizer):
        raise TypeError(
            f"attach_onebit_fsdp needs a OneBitAdam or OneBitLamb optimizer, got {type(optimizer).__name__}"
        )
    topology, units = _check_mesh_and_units(model, mesh)
    names = mesh.mesh_dim_names or ("replicate", "shard")
    announce_layout("attach_onebit_fsdp", topology, MESH_SOURCE, guessed=False)
    state = OneBitState(
        optimizer,
        mesh.get_group(names[0]),
        topology,
        parameter_index(model),
        overlap=overlap,
        nonfinite=nonfinite,
        scale=optimizer.comm_scale if scale is None else scale,
    )
    state.use_grad_scaler(grad_scaler)
    traffic = FsdpTraffic(state, units, topology)

    def work(unit: Unit, shard: torch.Tensor, flag: torch.Tensor) -> None:
        stage = optimizer.stage
        state.last_stage = stage
        state.calls += 1
        if stage == WARMUP:
            _warmup_allreduce(state, unit, shard, flag)
        else:
            state.compress_bucket(unit.index, shard, unit.params, unit.signature, node_flag=flag)

    hooks = _UnitHooks(state, units, topology, traffic, work)
    _remember(state, model, mesh, units, hooks, traffic)
    optimizer.momentum_by_hook = True
    optimizer.hook_state = state
    return state


def _warmup_allreduce(state, unit: Unit, shard: torch.Tensor, flag: torch.Tensor) -> None:
    """1-bit Adam's warmup on a unit's shard: the fp32 average across the nodes, with the node's non-finite
    flag as one more element, so that every rank learns every node's flag with the payload."""
    n = state.world_size
    buf = torch.empty(shard.numel() + 1, dtype=torch.float32, device=shard.device)
    buf[:-1] = shard
    buf[-1] = flag
    if n > 1:
        with state.timing("comm", shard.device):
            dist.all_reduce(buf, group=state.group)
        state.add_bytes(0.0, allreduce_bytes(buf.numel() * 4, n))
    shard.copy_(buf[:-1].div_(n))
    state.guard.note(buf[-1], unit.index, state.optimizer.steps_done + 1)


def attach_from_config(model: torch.nn.Module, optimizer, mesh, cfg, scheme: str):
    """The runner's entry (``parallel=fsdp``): ``optim.comm``'s ``overlap``, ``nonfinite``, Birder's
    ``kernel_backend`` and 1-bit Adam's ``scale`` (None: the optimizer's default), as the DDP path's
    ``attach_from_config`` of each scheme reads them."""
    comm = cfg.get("comm") or {}
    overlap, nonfinite = bool(comm.get("overlap", True)), str(comm.get("nonfinite", "skip"))
    if scheme == "birder":
        backend = str(comm.get("kernel_backend", "auto"))
        return attach_birder_fsdp(model, optimizer, mesh, kernel_backend=backend, overlap=overlap, nonfinite=nonfinite)
    scale = comm.get("scale")
    scale = None if scale is None else str(scale)
    return attach_onebit_fsdp(model, optimizer, mesh, overlap=overlap, nonfinite=nonfinite, scale=scale)


# ------------------------------------------------------------------------------------ baselines: HSDP
class HsdpState(CommState):
    """The baselines under ``parallel=fsdp``: FSDP2's native HSDP (reduce-scatter inside the node, fp32
    all-reduce across the nodes), counted by :class:`FsdpTraffic`; no hook."""

    __slots__ = ()


def attach_hsdp(model: torch.nn.Module, mesh) -> HsdpState:
    """Count the collectives of a model sharded with native HSDP (``fully_shard(unit, mesh=mesh)``, 2-D)."""
    topology = mesh_topology(mesh)
    state = HsdpState()
    units = fsdp_units(model)
    traffic = FsdpTraffic(state, units, topology, native_hsdp=topology.nodes > 1)
    _remember(state, model, mesh, units, None, traffic)
    return state


@dataclass
class FsdpAttachment:
    """What an FSDP attach leaves on its state (``state.fsdp``): the units, the hooks' driver, the counter."""

    model: torch.nn.Module
    mesh: Any  # the ("replicate", "shard") device mesh
    units: list
    hooks: _UnitHooks | None
    traffic: FsdpTraffic


def _remember(state: CommState, model, mesh, units, hooks, traffic) -> None:
    state.fsdp = FsdpAttachment(model, mesh, list(units), hooks, traffic)
