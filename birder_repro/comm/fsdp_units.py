"""FSDP2's units as the 1-bit FSDP hooks see them (:mod:`birder_repro.comm.fsdp`): each unit's parameters, its
shard's layout (the "bucket" signature of :class:`~birder_repro.comm.buckets.BucketStore`), the device mesh's
topology, and the checks that the model is sharded as the hooks need (one parameter group per unit, dim-0
shards on the intra-node mesh).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

from birder_repro.comm.buckets import parameter_index
from birder_repro.comm.topology import Topology

__all__ = ["Unit", "as_fsdp_module", "param_group", "fsdp_units", "mesh_topology", "check_mesh_and_units"]


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


def as_fsdp_module(module: torch.nn.Module) -> FSDPModule:
    """``module`` as the FSDPModule fully_shard made it (typed so: its FSDP methods are not nn.Module's; the
    attach checked each unit when it collected them)."""
    return cast("FSDPModule", module)


def param_group(module: torch.nn.Module):
    state = as_fsdp_module(module)._get_fsdp_state()  # FSDPModule's own accessor
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
        group = param_group(module)
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


def check_mesh_and_units(model: torch.nn.Module, mesh) -> tuple[Topology, list[Unit]]:
    topology = mesh_topology(mesh)
    units = fsdp_units(model)
    for unit in units:
        group = param_group(unit.module)
        if type(group.mesh_info).__name__ == "HSDPMeshInfo" or group.mesh_info.mesh.ndim != 1:
            raise ValueError(
                "shard every unit on the intra-node mesh (fully_shard(unit, mesh=mesh['shard'])): "
                "with native HSDP FSDP's own all-reduce across nodes would run before the hook"
            )
    return topology, units
