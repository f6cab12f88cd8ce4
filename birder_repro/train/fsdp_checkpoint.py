"""Checkpoints of ``parallel=fsdp`` runs: the sharded state through ``torch.distributed.checkpoint`` (DCP).

Inside the checkpoint directory of :mod:`birder_repro.train.checkpoint` (same manifest, same ``COMPLETE``
marker written last, same per-rank file for the RNG states and counters), ``dcp/`` holds, as DTensors that
DCP can reshard:

    model       the model's sharded parameters and buffers (``get_model_state_dict``);
    optimizer   the optimizer's state, sharded like the parameters (``get_optimizer_state_dict``);
    hook        the hook's per-element state, per parameter: a node's own fields (Birder's m, b, e, b_hat;
                1-bit Adam's worker error) as a tensor of shape (nodes, *parameter shape) sharded over the mesh
                as (Shard(0), Shard(1)) (each node its own row, each process its rows of the parameter); the
                server fields (Birder's e_bar, 1-bit Adam's server error), cut over the nodes in chunks of a
                unit's shard, gathered across the nodes first and kept as (Replicate(), Shard(0)) of the
                parameter's shape.

So a checkpoint resumes into another ``gpus_per_node`` with the same number of nodes (DCP reshards every
DTensor; each element's state follows it: Birder continues as if the layout had been the new one from the
start). What is not kept: the state of FSDP's padding rows, which no real element ever reads (every Birder
step is per element; 1-bit Adam masks padding), so a resumed run continues bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from birder_repro.comm.collectives import all_gather_flat

__all__ = ["DCP_DIR", "is_fsdp", "save_sharded", "load_sharded", "hook_meta"]

DCP_DIR = "dcp"


def is_fsdp(comm) -> bool:
    return getattr(comm, "fsdp", None) is not None


def _hook_fields(store):
    """(node fields, server fields) of a hook's bucket store under FSDP (module doc)."""
    node = [f.name for f in store.fields if f.parts == 1]
    server = [f.name for f in store.fields if f.parts > 1]
    return node, server


def _hook_state(comm, device: torch.device) -> dict[str, Any]:
    """The hook's per-element state as DTensors keyed ``<field>.<parameter index>``. Collective."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    store, att = getattr(comm, "store", None), comm.fsdp
    if store is None:
        return {}
    n = comm.topology.nodes
    mesh2d = att.mesh  # the node fields are sharded over both of its dimensions
    node_fields, server_fields = _hook_fields(store)
    out = {}
    for unit in att.units:
        bucket = store.buckets.get(unit.index)
        for p, (index, offset, numel, _first) in zip(unit.params, unit.signature):
            local_shape = p.to_local().shape
            for name in node_fields + server_fields:
                if bucket is None:  # a unit never communicated yet (1-bit Adam's warmup): zeros
                    full = torch.zeros(unit.numel, device=device)
                elif name in node_fields:
                    full = bucket.state[name]
                else:
                    full = _gather_server(bucket.state[name], comm, n)
                piece = full[offset : offset + numel].reshape(local_shape).clone()
                if name in node_fields:
                    out[f"{name}.{index}"] = DTensor.from_local(
                        piece.unsqueeze(0),
                        mesh2d,
                        [Shard(0), Shard(1)],
                        run_check=False,
                        shape=torch.Size((n, *p.shape)),
                        stride=_contiguous((n, *p.shape)),
                    )
                else:
                    out[f"{name}.{index}"] = DTensor.from_local(
                        piece,
                        mesh2d,
                        [Replicate(), Shard(0)],
                        run_check=False,
                        shape=p.shape,
                        stride=_contiguous(tuple(p.shape)),
                    )
    return out


def _contiguous(shape) -> tuple:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= int(d)
    return tuple(reversed(stride))


def _gather_server(part: torch.Tensor, comm, n: int) -> torch.Tensor:
    """A server field's chunks of every node (the whole padded shard). Collective over the replicate group."""
    if n == 1:
        return part

    full = torch.empty(part.numel() * n, device=part.device, dtype=part.dtype)
    all_gather_flat(full, part.contiguous(), group=_server_group(comm))
    return full


def _server_group(comm):
    return comm.server_group if hasattr(comm, "server_group") else comm.group


def hook_meta(comm, optimizer=None, model=None) -> dict:
    """What goes into the per-rank file: each unit's step, the counters, the optimizer's own entries beside
    its state and param groups (1-bit Adam's step count), which DCP's optimizer state dict leaves out, and this
    rank's buffers: FSDP does not keep them equal across ranks (BatchNorm's running statistics are each rank's
    own, where DDP broadcasts rank 0's), and DCP saves a plain tensor once, as if every rank had it."""
    store = getattr(comm, "store", None)
    steps = {int(i): int(b.step) for i, b in store.buckets.items()} if store is not None else {}
    extra = (
        {}
        if optimizer is None
        else {k: v for k, v in optimizer.state_dict().items() if k not in ("state", "param_groups")}
    )
    buffers = {} if model is None else {k: b.detach().clone() for k, b in model.named_buffers()}
    return {
        "unit_steps": steps,
        "counters": comm.snapshot(),
        "optimizer_extra": extra,
        "buffers": buffers,
        "nonfinite": comm.guard.state_dict() if hasattr(comm, "guard") else None,
        "last_stage": getattr(comm, "last_stage", None),
    }


def _states(model, optimizer, comm, device):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
        "hook": _hook_state(comm, device),
    }


def save_sharded(where: Path, model, optimizer, comm, device: torch.device) -> None:
    """DCP save of the model, optimizer and hook state into ``where/dcp``. Collective."""
    import torch.distributed.checkpoint as dcp

    if hasattr(comm, "runner"):
        comm.runner.check_idle("checkpoint")
    dcp.save(_states(model, optimizer, comm, device), checkpoint_id=str(Path(where) / DCP_DIR))


def load_sharded(where: Path, model, optimizer, comm, meta: dict, device: torch.device) -> None:
    """DCP load (resharding to this run's layout), then the hook state put back into its units. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    states = _states(model, optimizer, comm, device)
    dcp.load(states, checkpoint_id=str(Path(where) / DCP_DIR))
    set_model_state_dict(model, states["model"])
    set_optimizer_state_dict(model, optimizer, states["optimizer"])
    if meta.get("optimizer_extra"):  # through the optimizer's own load, which knows its entries
        optimizer.load_state_dict({**optimizer.state_dict(), **meta["optimizer_extra"]})
    _put_hook_state(comm, states["hook"], meta, device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in meta.get("buffers", {}):
                b.copy_(meta["buffers"][name])
    comm.load_counters(meta["counters"])
    if hasattr(comm, "guard"):
        comm.guard.load_state_dict(meta.get("nonfinite"))
    if hasattr(comm, "last_stage"):
        comm.last_stage = meta.get("last_stage")


def _put_hook_state(comm, hook: dict, meta: dict, device: torch.device) -> None:
    store = getattr(comm, "store", None)
    if store is None:
        return
    topo = comm.topology
    node_fields, server_fields = _hook_fields(store)
    steps = {int(k): int(v) for k, v in meta.get("unit_steps", {}).items()}
    for unit in comm.fsdp.units:
        if unit.index not in steps:
            continue  # never communicated before the checkpoint
        bucket = store.bucket(unit.index, unit.numel, unit.signature, device)
        bucket.step = steps[unit.index]
        for name in node_fields + server_fields:
            full = torch.zeros(bucket.padded, device=device)
            for index, offset, numel, _first in unit.signature:
                local = hook[f"{name}.{index}"].to_local()
                full[offset : offset + numel] = local.reshape(-1)
            if name in node_fields:
                bucket.state[name].copy_(full[: bucket.state[name].numel()])
            else:
                part = bucket.state[name]
                start = part.numel() * topo.node_rank
                part.copy_(full[start : start + part.numel()])
