"""Resuming a checkpoint on another layout of processes: what moves exactly, what is refused, what is reset.

Same nodes, another ``gpus_per_node``: Birder's hierarchical state is per node (a node is one worker of
Algorithm 1, the Birder paper, section 4; its m, b, e are sharded over the node's processes and e_bar over the
servers), so the worker count is unchanged and the state can move exactly. Each rank reads the old shards, puts
every field of every bucket back together in the padded bucket (the parts in the order
:class:`~birder_repro.comm.buckets.Field` cuts them), slices out each parameter's elements and hands the hook
this per-parameter state, the same form DDP's bucket rebuild goes through
(:mod:`birder_repro.comm.buckets`): each new bucket takes its rank's part of it when it first arrives.

Anything else changes the number of workers of the compressed scheme (another node count; or a scheme whose
workers are processes: Birder's flat and allgather variants, 1-bit Adam / LAMB, PowerSGD), whose error-feedback
buffers then have no exact counterpart: refused, unless ``train.resume_policy=reset_errors``, which starts the
hook's buffers afresh (as DeepSpeed's 1-bit optimizers do when the world size changes) and keeps the model and
the optimizer's state. Optimizer state, RNG states and samples come from old rank ``rank % old world size``;
the baselines' optimizer state is the same on every rank, so theirs moves exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from birder_repro.comm.allreduce import AllReduceState
from birder_repro.comm.birder import BirderState
from birder_repro.comm.two_level import TwoLevelState
from birder_repro.train import checkpoint_files  # the module, not its function: tests replace load_file there
from birder_repro.train.checkpoint_files import CheckpointError, shard_name

__all__ = ["POLICIES", "adapt", "per_node_state", "rebuild_canonical"]

POLICIES = ("strict", "reset_errors")


def per_node_state(comm) -> bool:
    """The hook's state belongs to nodes, not processes: Birder's hierarchical scheme."""
    return isinstance(comm, BirderState) and comm.scheme == "hierarchical"


def _stateless(comm) -> bool:
    """Hooks without error feedback (fp32 / fp16 all-reduce, flat or in two levels: the counters only)."""
    return comm is None or isinstance(comm, (AllReduceState, TwoLevelState)) or not hasattr(comm, "state_dict")


def adapt(
    where: Path,
    manifest: dict,
    change: str,
    comm,
    rank: int,
    world_size: int,
    device: torch.device,
    policy: str,
    identity,
) -> tuple[dict, dict | None]:
    """(this rank's shard, the hook state to load or None) for a checkpoint of another layout."""
    old = manifest.get("layout") or {}
    old_world, old_nodes, old_m = int(old.get("world_size", 0)), old.get("nodes"), old.get("gpus_per_node")
    saved = f"nodes={old_nodes} x gpus_per_node={old_m}" if old_nodes else f"{old_world} processes"
    now = f"nodes={identity.nodes} x gpus_per_node={identity.gpus_per_node}"
    if policy not in POLICIES:
        raise CheckpointError(f"train.resume_policy={policy!r} is not one of: {', '.join(POLICIES)}")
    shard = checkpoint_files.load_file(where / shard_name(rank % old_world), device)
    shard = {**shard, "samples": float(shard["samples"]) * old_world / world_size}  # per process, same total
    if change == "gpus_per_node" and per_node_state(comm):
        shards = [comm_of_shard(where / shard_name(r), device) for r in range(old_world)]
        return shard, _birder_per_node(shards, shard["comm"], comm, int(old_m), int(old_nodes))
    if _stateless(comm):
        return shard, shard["comm"]
    if policy == "reset_errors":
        if rank == 0:
            print(
                f"[birder-repro] resuming {where} ({saved}) on {now}: the communication hook's error-feedback "
                "state starts afresh (train.resume_policy=reset_errors)",
                flush=True,
            )
        return shard, None
    why = (
        "DiLoCo keeps each node's own parameters and AdamW state between outer steps, per process here"
        if str(identity.scheme).startswith("diloco")
        else "another number of nodes changes the number of workers of Algorithm 1"
        if change == "nodes"
        else f"the {identity.scheme} hook keeps its error feedback per process, so another number of processes "
        "changes its workers"
    )
    raise CheckpointError(
        f"{where} was saved on {saved}; this run is {now}: {why}, and its error-feedback "
        f"buffers cannot be moved exactly. Resume on {saved}, or set "
        "train.resume_policy=reset_errors to start those buffers afresh"
    )


def comm_of_shard(path, device):
    """An old rank's hook state (its shard's ``"comm"``) on ``device``: the shard is read on the CPU,
    memory-mapped, so that its parameters and optimizer state are never copied, onto this GPU or at all."""
    return _to(checkpoint_files.load_file(path, torch.device("cpu"), mmap=True)["comm"], device)


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _part_start(sizes: list[int], ranks: list[int], padded: int) -> int:
    start, length = 0, padded
    for size, r in zip(sizes, ranks):
        length //= size
        start += r * length
    return start


def rebuild_canonical(stores: list[dict], level_ranks) -> dict[str, dict[int, Any]]:
    """Per-parameter state (field -> parameter index -> its elements; "step" -> the bucket's step) from every
    old rank's :meth:`BucketStore.state_dict`. ``level_ranks(old_rank)`` is that rank's place in each level."""
    parts = stores[0]["parts"]
    canon: dict[str, dict[int, Any]] = {k: {} for k in (*parts, "step")}
    pending = stores[0].get("canonical") or {}  # a migration in progress: the same on every rank
    for key, per_param in pending.items():
        canon.setdefault(key, {}).update(
            {int(p): t for p, t in per_param.items() if int(p) in set(stores[0]["pending"])}
        )
    for index, bucket in stores[0]["buckets"].items():
        padded = int(bucket["padded"])
        for name, sizes in parts.items():
            part0 = bucket["state"][name]
            full = torch.zeros(padded, dtype=part0.dtype, device=part0.device)
            for r, store in enumerate(stores):
                part = store["buckets"][index]["state"][name]
                start = _part_start(list(sizes), level_ranks(r)[: len(sizes)], padded)
                full[start : start + part.numel()] = part
            for p, offset, numel in bucket["signature"]:
                canon[name][int(p)] = full[offset : offset + numel].clone()
        for p, _, _ in bucket["signature"]:
            canon["step"][int(p)] = int(bucket["step"])
    return canon


def _birder_per_node(old_comms: list[dict], mine: dict, comm, old_m: int, nodes: int) -> dict:
    """The Birder hook's state for this rank: the old shards put together per parameter (module doc)."""
    stores = [c["buckets"] for c in old_comms]
    canon = rebuild_canonical(stores, lambda r: [r % old_m, r // old_m])  # (worker: local rank, server: node)
    store = comm.store
    return {
        **mine,
        "buckets": {
            "parts": {f.name: [level.size for level in f.levels] for f in store.fields},
            "buckets": {},
            "canonical": canon,
            "pending": sorted(canon["step"]),
            "layout_changes": int(stores[0]["layout_changes"]) + 1,
        },
    }
