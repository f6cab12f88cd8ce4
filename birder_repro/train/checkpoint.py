"""Crash-safe checkpoints (every ``train.checkpoint_every`` steps) and resuming from one (``train.resume``).

One directory per checkpointed step, marked complete only once everything in it is written::

    run_dir/checkpoints/step-000040/
        rank00000.pt ...   every rank: its optimizer state, hook state (Birder's shards of m, b, e, e_bar;
                           1-bit Adam's errors), RNG states, samples so far, and what a resumed run carries
                           on (``carry``: the time-to-target clock, the last steps' losses)
        model.pt           rank 0: the model
        manifest.json      step, layout (nodes, gpus_per_node, world size), scheme, task, optim, config digest,
                           versions
        COMPLETE           written last, atomically, by rank 0, once every rank has reported its file written
                           and rank 0 sees every file the manifest lists (:func:`mark_complete`)

A crash (or a full disk) while writing leaves a directory without ``COMPLETE``, which resume ignores; the
earlier complete checkpoints are untouched: older ones are removed only after a newer one is complete, keeping
``train.keep_checkpoints``. Every file goes to a temporary name first and is renamed into place. The run
directory is one directory every node shares (the worker checks it at start, birder_repro.train.shared_dir), so a
checkpoint whose files rank 0 does not all see is refused rather than marked complete.

The rank files and ``model.pt`` hold tensors and plain values only and load with
``torch.load(weights_only=True)``: they never run code. An FSDP run's ``dcp/`` is read by
``torch.distributed.checkpoint``, which unpickles its ``.metadata`` and loads its non-tensor values with
``weights_only=False`` (docs/checkpoints.md). Shards load with ``map_location`` set to this rank's device.

Which checkpoint a run starts from: :mod:`birder_repro.train.resume_point`.

Compatibility (:func:`check_manifest`): task, optimizer and communication scheme must be the run's; the layout
may differ only where :mod:`birder_repro.train.relayout` can move the state exactly (same nodes, another
gpus_per_node, for a state kept per node), or where ``train.resume_policy=reset_errors`` allows starting the
error-feedback buffers afresh.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.optim import get_optim_info
from birder_repro.run import record
from birder_repro.run.checkpoint_dirs import (
    CHECKPOINTS,
    COMPLETE,
    MANIFEST,
    complete_checkpoints,
    step_dir,
)
from birder_repro.run.checkpoint_dirs import STEP_DIR as _STEP_DIR
from birder_repro.run.checkpoint_dirs import is_complete as _is_complete
from birder_repro.train import fsdp_checkpoint, relayout
from birder_repro.train.checkpoint_files import CheckpointError, load_file, shard_name
from birder_repro.train.collectives import allreduce_sum, barrier
from birder_repro.train.rng import rng_state, set_rng_state

__all__ = [
    "CHECKPOINTS",
    "COMPLETE",
    "MANIFEST",
    "MODEL",
    "CheckpointError",
    "RunIdentity",
    "step_dir",
    "save_checkpoint",
    "mark_complete",
    "load_checkpoint",
    "complete_checkpoints",
    "read_manifest",
    "check_manifest",
    "load_file",
    "shard_name",
    "settle_ddp_buckets",
]

MODEL = "model.pt"  # rank 0's copy of the model (CHECKPOINTS, COMPLETE, MANIFEST: birder_repro.run.checkpoint_dirs)


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must share with the run resuming it (the manifest's identity part)."""

    task: str
    optim: str
    scheme: str  # the communication scheme, with its variant (e.g. birder/hierarchical)
    nodes: int
    gpus_per_node: int
    world_size: int
    config_digest: str = ""

    @classmethod
    def from_config(cls, cfg, comm, world_size: int) -> RunIdentity:
        from omegaconf import OmegaConf

        comm_cfg = cfg.optim.get("comm") or {}
        try:
            scheme = get_optim_info(cfg.optim.name).comm
        except KeyError:  # an optimizer of the user's own, outside the registry
            scheme = type(comm).__name__
        variant = getattr(comm, "scheme", None) or comm_cfg.get("scheme")
        if variant and variant != scheme:
            scheme = f"{scheme}/{variant}"
        text = OmegaConf.to_yaml(cfg, resolve=True) if OmegaConf.is_config(cfg) else json.dumps(cfg, default=str)
        return cls(
            task=str(cfg.task.name),
            optim=str(cfg.optim.name),
            scheme=scheme,
            nodes=int(cfg.nodes),
            gpus_per_node=int(cfg.gpus_per_node),
            world_size=world_size,
            config_digest=hashlib.sha256(text.encode()).hexdigest()[:16],
        )


# ----------------------------------------------------------------------------------------------- saving
def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)  # a crash while writing never leaves a half file under the real name


def _atomic_json(obj: Any, path: Path) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())

    _atomic(path, write)


def save_checkpoint(
    run_dir,
    step: int,
    samples: float,
    model,
    optimizer,
    comm,
    rank: int,
    world_size: int,
    device: torch.device,
    identity: RunIdentity | None = None,
    keep: int = 2,
    precision=None,
    carry: dict | None = None,
) -> Path:
    """Write the checkpoint of ``step`` and mark it complete; keep the newest ``keep``. Collective.

    A rank that fails to write (a full disk), or a file rank 0 cannot see, makes every rank raise
    :class:`CheckpointError` alike, with the checkpoint left incomplete and the earlier ones untouched.
    ``carry``: plain values this rank's shard keeps for a resumed run (:func:`load_checkpoint` gives them back).
    """
    where = step_dir(run_dir, step)
    leader = rank == 0
    if leader:  # a leftover of a crashed attempt at this step: make it incomplete before anyone writes into it
        (where / COMPLETE).unlink(missing_ok=True)
        where.mkdir(parents=True, exist_ok=True)
    barrier()
    error = ""

    sharded = fsdp_checkpoint.is_fsdp(comm)  # parallel=fsdp: model, optimizer and hook state through DCP
    try:
        where.mkdir(parents=True, exist_ok=True)
        if sharded:
            fsdp_checkpoint.save_sharded(where, model, optimizer, comm, device)
        shard = {
            "step": step,
            "world_size": world_size,
            "samples": samples,
            "optimizer": None if sharded else optimizer.state_dict(),
            "comm": fsdp_checkpoint.hook_meta(comm, optimizer, model)
            if sharded
            else (comm.state_dict() if hasattr(comm, "state_dict") else None),
            "rng": rng_state(device),
            "scaler": precision.state_dict() if precision is not None else None,  # fp16's loss scale
            "carry": carry,
        }
        _atomic(where / shard_name(rank), lambda tmp: torch.save(shard, tmp))
        if rank == 0 and not sharded:
            module = getattr(model, "module", model)
            _atomic(where / MODEL, lambda tmp: torch.save({"step": step, "model": module.state_dict()}, tmp))
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    failed = allreduce_sum([1.0 if error else 0.0], device)[0]  # also the barrier: every shard is written
    if failed:
        what = f"rank {rank}: {error}" if error else "another rank could not write its shard"
        raise CheckpointError(
            f"checkpoint of step {step} could not be written in {where} ({what}); it is left "
            "incomplete and the earlier checkpoints are kept"
        )
    refused = ""
    if leader:
        manifest = {
            "step": step,
            "files": [shard_name(r) for r in range(world_size)] + [fsdp_checkpoint.DCP_DIR if sharded else MODEL],
            "sharded": sharded,
            **(_identity_dict(identity) if identity else {"world_size": world_size}),
            "versions": _versions(),
        }
        try:
            mark_complete(where, manifest)
            _remove_old(Path(run_dir) / CHECKPOINTS, step, keep)
        except CheckpointError as exc:
            refused = str(exc)
    if allreduce_sum([1.0 if refused else 0.0], device)[0]:  # every rank learns it, none waits in vain
        raise CheckpointError(
            refused
            or f"checkpoint of step {step} in {where} was refused by rank 0 (a rank's "
            "file is missing there); it is left incomplete"
        )
    return where


def mark_complete(where: Path, manifest: dict) -> None:
    """Write the manifest, then ``COMPLETE``, but only if every file the manifest lists is there: a rank whose
    file went elsewhere (a run directory that is not shared) must never leave a checkpoint that resumes
    without it. Raises :class:`CheckpointError` naming the first missing file."""
    missing = [name for name in manifest["files"] if not (where / name).exists()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(
            f"checkpoint of step {manifest['step']} is not complete: {where / missing[0]}{more} "
            "is missing (the ranks wrote their files where rank 0 cannot see them: BIRDER_RUNS or "
            "hydra.run.dir must be on a file system every node shares); it is left incomplete"
        )
    _atomic_json(manifest, where / MANIFEST)
    _atomic_json({"step": manifest["step"]}, where / COMPLETE)  # last: from here on resume may take it


def _identity_dict(identity: RunIdentity) -> dict:
    return {
        "task": identity.task,
        "optim": identity.optim,
        "scheme": identity.scheme,
        "layout": {"nodes": identity.nodes, "gpus_per_node": identity.gpus_per_node, "world_size": identity.world_size},
        "world_size": identity.world_size,
        "config_digest": identity.config_digest,
    }


def _versions() -> dict:
    try:
        return record.versions()
    except Exception:  # noqa: BLE001 - the versions are informative; a checkpoint must not fail for them
        return {"torch": torch.__version__}


def _remove_old(root: Path, newest: int, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints; remove older ones and incomplete ones older than ``newest``."""
    complete = complete_checkpoints(root)
    doomed = [p for _, p in complete[:-keep]] if keep > 0 else []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and int(match.group(1)) < newest and not _is_complete(child):
            doomed.append(child)
    for path in doomed:
        (path / COMPLETE).unlink(missing_ok=True)  # first, so that a half-removed directory is never taken
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- loading
def read_manifest(where: Path) -> dict:
    try:
        return json.loads((where / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{where / MANIFEST} cannot be read: {exc}") from None


def check_manifest(manifest: dict, identity: RunIdentity, where: Path) -> str:
    """Refuse a checkpoint of another task, optimizer or scheme (naming both); return how its layout compares:
    ``same``, ``gpus_per_node`` (same nodes, other processes per node) or ``nodes`` (another node count)."""
    for key in ("task", "optim", "scheme"):
        saved = manifest.get(key)
        if saved is not None and saved != getattr(identity, key):
            raise CheckpointError(
                f"{where} is a checkpoint of {key} {saved!r}; this run's {key} is "
                f"{getattr(identity, key)!r}: resume it with {key} {saved!r}, or start afresh"
            )
    layout = manifest.get("layout") or {"world_size": manifest.get("world_size")}
    if layout.get("nodes") not in (None, identity.nodes):
        return "nodes"
    if layout.get("world_size") != identity.world_size or layout.get("gpus_per_node") not in (
        None,
        identity.gpus_per_node,
    ):
        return "gpus_per_node" if layout.get("nodes") is not None else "nodes"
    return "same"


def settle_ddp_buckets(task, model, data, device: torch.device) -> None:
    """One forward + backward through DDP (hook included) before a checkpoint is loaded, so that DDP rebuilds
    its buckets at the next forward, as the saved run had: the resumed run then cuts its gradients into the
    same buckets as the uninterrupted one from its first step on, and a hook whose randomness follows the
    buckets' order (Birder's quantizer draws) continues bit-exactly. Everything this pass touches (gradients,
    hook state, generators, RNG, buffers) is replaced by the checkpoint right after. Collective."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel) or data.train is None:
        return
    batch = next(iter(data.train))
    loss, _ = task.loss(model, batch, device)
    loss.backward()
    for p in model.module.parameters():
        p.grad = None


def load_checkpoint(
    where,
    model,
    optimizer,
    comm,
    rank: int,
    world_size: int,
    device: torch.device,
    identity: RunIdentity | None = None,
    policy: str = "strict",
    precision=None,
    carry: dict | None = None,
) -> tuple[int, float]:
    """Restore the checkpoint in directory ``where``; returns (step, this process's samples so far). Collective.

    Rank 0 reads the model and broadcasts it. ``carry``, if given, is filled with what the shard carries on
    (empty for a checkpoint written before it did).
    """
    where = Path(where)
    manifest = read_manifest(where)
    change = (
        check_manifest(manifest, identity, where)
        if identity
        else ("same" if manifest.get("world_size") == world_size else "nodes")
    )

    if fsdp_checkpoint.is_fsdp(comm) or manifest.get("sharded"):
        return _load_sharded(where, manifest, change, model, optimizer, comm, rank, device, carry)
    if change == "same":
        shard = load_file(where / shard_name(rank), device)
        comm_sd = shard["comm"]
    else:
        shard, comm_sd = relayout.adapt(where, manifest, change, comm, rank, world_size, device, policy, identity)
    module = getattr(model, "module", model)
    if rank == 0:
        saved = load_file(where / MODEL, device)
        module.load_state_dict(saved["model"])
    step = int(manifest["step"])
    if dist.is_initialized() and world_size > 1:
        for t in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(t.data, src=0)
    if int(shard["step"]) != step:
        raise CheckpointError(f"{where}: shard of rank {rank} is of step {shard['step']}, the manifest of {step}")
    optimizer.load_state_dict(_steps_on_cpu(shard["optimizer"]))
    if comm_sd is not None and hasattr(comm, "load_state_dict"):
        comm.load_state_dict(comm_sd)
    set_rng_state(shard["rng"], device)
    if precision is not None:
        precision.load_state_dict(shard.get("scaler"))
    if carry is not None:
        carry.update(shard.get("carry") or {})
    return step, float(shard["samples"])


def _steps_on_cpu(optimizer_sd: dict) -> dict:
    """The optimizer's ``step`` counters back on the CPU, as torch keeps them: the shard was loaded onto this
    rank's device, and ``Optimizer.load_state_dict`` leaves ``step`` where it finds it (it moves it to the
    parameter's device only for capturable or fused optimizers), so a GPU ``step`` would make foreach Adam(W)
    read it back to the host twice per parameter per step after every resume."""
    for state in optimizer_sd.get("state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor) and step.device.type != "cpu":
            state["step"] = step.cpu()
    return optimizer_sd


def _load_sharded(
    where: Path,
    manifest: dict,
    change: str,
    model,
    optimizer,
    comm,
    rank: int,
    device: torch.device,
    carry: dict | None = None,
) -> tuple[int, float]:
    """A ``parallel=fsdp`` checkpoint (birder_repro.train.fsdp_checkpoint): DCP reshards it to this run's
    gpus_per_node; another node count is refused (the nodes are Algorithm 1's workers)."""
    if not (fsdp_checkpoint.is_fsdp(comm) and manifest.get("sharded")):
        saved, now = ("fsdp", "ddp") if manifest.get("sharded") else ("ddp", "fsdp")
        raise CheckpointError(
            f"{where} is a checkpoint of parallel={saved}; this run is parallel={now}: resume it "
            f"with parallel={saved}, or start afresh"
        )
    if change == "nodes":
        layout = manifest.get("layout", {})
        raise CheckpointError(
            f"{where} was saved on nodes={layout.get('nodes')} x gpus_per_node="
            f"{layout.get('gpus_per_node')}; under parallel=fsdp a checkpoint resumes only on "
            "the same number of nodes (any gpus_per_node): use that many nodes, or start afresh"
        )
    own = where / shard_name(rank)
    shard = load_file(own if own.is_file() else where / shard_name(0), device)  # another gpus_per_node: rank 0's
    step = int(manifest["step"])
    if int(shard["step"]) != step:
        raise CheckpointError(f"{where}: shard of rank {rank} is of step {shard['step']}, the manifest of {step}")
    fsdp_checkpoint.load_sharded(where, model, optimizer, comm, shard["comm"], device)
    set_rng_state(shard["rng"], device)
    if carry is not None:
        carry.update(shard.get("carry") or {})
    return step, float(shard["samples"])
