"""Birder's (or 1-bit Adam's) hook on a model that Hugging Face Accelerate prepared (docs/integrations.md).

    model, optimizer = accelerator.prepare(model, optimizer)
    state = attach_accelerate(accelerator, model, optimizer, gpus_per_node=8)

``accelerator.prepare`` wraps the model in DDP and the optimizer in an ``AcceleratedOptimizer``; the hook goes on
that DDP module and hands its result to the Birder / OneBitAdam inside. Accelerate's own way to a hook,
``DistributedDataParallelKwargs(comm_hook=...)``, takes only its built-in ``DDPCommunicationHookType`` values
(fp16, bf16, PowerSGD), hence a helper for after ``prepare``.

Gradient accumulation needs nothing more: under ``accelerator.accumulate(model)`` the micro-batches before the
last run inside DDP's ``no_sync``, which does not call the hook, and ``accelerator.backward`` divides the loss by
the number of micro-batches, so the hook runs once per optimizer step on the mean of the accumulated gradients.

Checkpoints: ``accelerator.save_state`` writes the objects of ``register_for_checkpointing`` from the main
process only, but the hook's state is per rank (each process holds its shard of Birder's m, b, e; 1-bit Adam's
error buffers differ per rank). So the attach registers a save-state and a load-state pre-hook, which
Accelerate runs on every process with the checkpoint directory, and each rank writes and reads its own
``birder_hook_rank{r:05d}.pt`` there. Before ``load_state`` in a fresh process, :func:`regroup_buckets` (one
backward, gradients dropped) gives DDP the saved run's bucket grouping, which 1-bit Adam's scales depend on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from torch.nn.parallel import DistributedDataParallel

from birder_repro.comm import CommState, attach_birder, attach_onebit, build_topology
from birder_repro.integrations.settle import buffers_kept
from birder_repro.optim import Birder
from birder_repro.optim.onebit_adam import OneBitOptimizer

__all__ = [
    "attach_accelerate",
    "attach_hook",
    "regroup_buckets",
    "hook_state_path",
    "save_hook_state",
    "load_hook_state",
]

log = logging.getLogger(__name__)
HOOK_FILE = "birder_hook_rank{rank:05d}.pt"


def hook_state_path(directory: str, rank: int) -> str:
    """Where rank ``rank`` keeps its hook state in a checkpoint directory."""
    return os.path.join(directory, HOOK_FILE.format(rank=rank))


def save_hook_state(state: CommState, directory: str, rank: int) -> str:
    """Write this rank's hook state into ``directory`` (every rank calls it: the state is per rank)."""
    os.makedirs(directory, exist_ok=True)
    path = hook_state_path(directory, rank)
    torch.save(state.state_dict(), path)
    return path


def load_hook_state(state: CommState, directory: str, rank: int) -> None:
    """Read this rank's hook state back; a missing file is an error that names it (a run must not go on with
    a fresh hook state under restored parameters: Birder's m, b, e would restart from zero)."""
    path = hook_state_path(directory, rank)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this checkpoint holds no hook state for rank {rank}; resume "
            "from a checkpoint written by a run with the hook attached, with as many processes"
        )
    state.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))


def inner_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer an ``AcceleratedOptimizer`` wraps (the optimizer itself otherwise)."""
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


def attach_hook(
    ddp_model: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    gpus_per_node: int | None = None,
    scheme: str = "hierarchical",
    **kwargs,
) -> CommState:
    """``attach_birder`` for a Birder, ``attach_onebit`` for a OneBitAdam / OneBitLamb (with the topology of
    ``gpus_per_node`` processes per node, which only splits 1-bit Adam's byte counts); ``kwargs`` go to them."""
    if isinstance(optimizer, Birder):
        return attach_birder(ddp_model, optimizer, gpus_per_node=gpus_per_node, scheme=scheme, **kwargs)
    if isinstance(optimizer, OneBitOptimizer):
        topology = build_topology(gpus_per_node) if gpus_per_node is not None else None
        return attach_onebit(ddp_model, optimizer, topology=topology, **kwargs)
    raise TypeError(
        f"the optimizer is a {type(optimizer).__name__}: the hook needs birder_repro.optim's Birder, "
        "OneBitAdam or OneBitLamb (other optimizers need no hook: use DDP's own all-reduce)"
    )


def report_skips_to_accelerate(wrapper: AcceleratedOptimizer, opt: torch.optim.Optimizer) -> None:
    """Accelerate tells a skipped step (``step_was_skipped``, read by its schedulers) by whether GradScaler
    called ``optimizer.step`` at all; this package's optimizers take GradScaler's handover, so their step is
    always called, and they say themselves whether they skipped (``step_skipped``). Its private step patch
    (``_optimizer_patched_step_method``, Accelerate 1.x) is told that instead."""
    original = getattr(wrapper, "_optimizer_original_step_method", None)
    if original is None or not hasattr(wrapper, "_optimizer_patched_step_method"):
        log.warning("this Accelerate has no step patch: step_was_skipped stays False on a skipped step")
        return

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        wrapper._accelerate_step_called = not getattr(opt, "step_skipped", False)
        return out

    wrapper._optimizer_patched_step_method = patched


def regroup_buckets(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor]) -> None:
    """Before loading a checkpoint into a fresh process: one forward and backward (``loss_fn()``) through the DDP
    module, its gradients dropped and the random state kept. Collective (every rank).

    Why: DDP regroups its buckets after its first backward (by the order the gradients became ready), and a fresh
    process starts from its initial grouping again. 1-bit Adam's scales are per bucket (and per chunk of one),
    so a resumed run's first step would scale other groups of elements than the run left alone did; after this
    backward the buckets are the saved run's and the resumed run continues bit for bit. (Birder's state and
    draws follow each element, so it resumes bit for bit either way.) The hook runs once here; what it changed,
    the loaded hook state replaces. A no-op where there is no DDP module.
    """
    ddp = model if isinstance(model, DistributedDataParallel) else getattr(model, "_orig_mod", None)
    if not isinstance(ddp, DistributedDataParallel):
        return
    devices = [torch.cuda.current_device()] if next(ddp.parameters()).is_cuda else []
    sync = ddp.require_backward_grad_sync
    ddp.require_backward_grad_sync = True  # inside no_sync too: only a synced backward records the order
    try:
        with torch.random.fork_rng(devices=devices), buffers_kept(ddp.module):
            loss_fn().backward()
    finally:
        ddp.require_backward_grad_sync = sync
    for p in ddp.parameters():
        p.grad = None


def ddp_module(accelerator: Accelerator, model: torch.nn.Module) -> DistributedDataParallel | None:
    """The DDP module ``accelerator.prepare`` built around ``model`` (None in a single process)."""
    if isinstance(model, DistributedDataParallel):
        return model
    if accelerator.num_processes == 1:
        return None
    # prepare() may wrap the DDP module again (torch.compile's OptimizedModule): find it by unwrapping.
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, DistributedDataParallel):
        return inner
    raise TypeError(
        f"accelerator.prepare made a {type(model).__name__}, not DistributedDataParallel "
        f"(distributed_type={accelerator.distributed_type}): the hook needs DDP; under FSDP use "
        "birder_repro.comm.attach_birder_fsdp, DeepSpeed is not supported"
    )


def attach_accelerate(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    gpus_per_node: int | None = None,
    scheme: str = "hierarchical",
    checkpoint: bool = True,
    **kwargs,
) -> CommState | None:
    """Attach the hook to the model and optimizer ``accelerator.prepare`` returned; collective (every rank).

    ``gpus_per_node``: processes per node (default: torchrun's LOCAL_WORLD_SIZE, see docs/api.md);
    ``scheme``: Birder's (hierarchical, flat, allgather); ``kwargs``: the attach's others (overlap, ...).
    ``checkpoint``: have ``accelerator.save_state`` / ``load_state`` write and read every rank's hook state.
    With ``mixed_precision="fp16"`` (on a GPU: Accelerate makes no scaler on the CPU) the hook is given
    Accelerate's GradScaler (``grad_scaler=``), and a step the hook or the scaler skipped is reported as skipped
    (``optimizer.step_was_skipped``, which Accelerate's schedulers read).
    Returns the hook's state, or None in a single process, where there is no DDP and the optimizer runs alone.
    """
    ddp = ddp_module(accelerator, model)
    opt = inner_optimizer(optimizer)
    if ddp is None:
        log.info("attach_accelerate: one process, no DDP module: %s runs on its own, no hook", type(opt).__name__)
        return None
    kwargs.setdefault("grad_scaler", accelerator.scaler)
    state = attach_hook(ddp, opt, gpus_per_node=gpus_per_node, scheme=scheme, **kwargs)
    if isinstance(optimizer, AcceleratedOptimizer) and optimizer.scaler is not None:
        report_skips_to_accelerate(optimizer, opt)
    if checkpoint:
        rank = accelerator.process_index
        accelerator.register_save_state_pre_hook(
            lambda models, weights, output_dir: save_hook_state(state, output_dir, rank)
        )
        accelerator.register_load_state_pre_hook(lambda models, input_dir: load_hook_state(state, input_dir, rank))
    return state
