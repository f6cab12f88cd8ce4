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

This module holds the attaches. The hooks' driver, with the streams and order it keeps and FSDP's divide it
undoes: :mod:`birder_repro.comm.fsdp_hooks`; the units and the mesh: :mod:`birder_repro.comm.fsdp_units`;
FSDP's own bytes: :mod:`birder_repro.comm.fsdp_traffic`.

Bytes: the hooks count what they send (:mod:`birder_repro.comm.accounting`), :class:`FsdpTraffic` what FSDP
sends. Per-process inter-node bytes per step of Birder under FSDP: sum over units of 2 (n-1)/n * S'/8 + (n-1),
with S' the unit's shard padded to a multiple of 8 n (the extra byte per peer carries the node's non-finite
flag).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import allreduce_bytes
from birder_repro.comm.buckets import parameter_index
from birder_repro.comm.fsdp_hooks import UnitHooks
from birder_repro.comm.fsdp_traffic import FsdpTraffic
from birder_repro.comm.fsdp_units import Unit, check_mesh_and_units, fsdp_units, mesh_topology
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import announce_layout

__all__ = [
    "attach_birder_fsdp",
    "attach_onebit_fsdp",
    "attach_hsdp",
    "attach_from_config",
    "HsdpState",
    "FsdpAttachment",
    "FSDP_SCHEMES",
]

# The communication schemes that have an FSDP path (birder_repro.comm.SCHEMES names).
FSDP_SCHEMES = ("allreduce", "birder", "onebit")
MESH_SOURCE = "the device mesh's (replicate, shard) sizes"  # where an FSDP attach's layout comes from


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
    topology, units = check_mesh_and_units(model, mesh)
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
    hooks = UnitHooks(
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
    topology, units = check_mesh_and_units(model, mesh)
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

    hooks = UnitHooks(state, units, topology, traffic, work)
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
    hooks: UnitHooks | None
    traffic: FsdpTraffic


def _remember(state: CommState, model, mesh, units, hooks, traffic) -> None:
    state.fsdp = FsdpAttachment(model, mesh, list(units), hooks, traffic)
