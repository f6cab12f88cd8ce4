"""How a run's model is made data-parallel: ``parallel=ddp`` (DDP and a communication hook, the default) or
``parallel=fsdp`` (FSDP2: parameters, gradients and optimizer state sharded inside each node).

Under ``fsdp`` (:mod:`birder_repro.comm.fsdp`):

    Step I    a device mesh ("replicate", "shard") = (nodes, gpus_per_node);
    Step II   every unit the task declares (``Task.fsdp_units``: ResNet blocks, BERT layers, ViT blocks, the
              LSTM's layers, the digits CNN's conv blocks), then the root, given to ``fully_shard``: on the
              intra-node mesh for Birder and 1-bit Adam / LAMB (their 1-bit exchange between the nodes runs in
              every unit's all-reduce hook), on the whole 2-D mesh for the baselines (FSDP2's native HSDP: its
              fp32 all-reduce across the nodes);
    Step III  the optimizer over the sharded parameters, and the scheme's state (the counters the loop reads).

``train.precision=bf16`` maps to ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: bf16
compute and all-gathers, fp32 reduction, so the hooks' input stays fp32. fp16 is refused under ``fsdp``.
The schemes without an FSDP path (torch's PowerSGD and fp16 compression hooks) are refused in one line.

What the loop needs of the model besides forward is kept as under DDP: ``model.no_sync()`` for the compute
calibration passes (FSDP's ``set_requires_gradient_sync(False)``; the gradients those passes leave unreduced
are dropped), ``model.accumulating()`` for gradient accumulation (the same switch, the gradients kept), and
``model.eval_module()`` for evaluation: a plain copy of the model with the whole parameters, since the ranks'
evaluation shards may differ by a batch and an FSDP forward is collective.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from birder_repro import comm, optim
from birder_repro.comm import fsdp
from birder_repro.comm.fsdp import FSDP_SCHEMES
from birder_repro.comm.fsdp_units import param_group
from birder_repro.comm.topology import set_mesh_timeout

__all__ = ["PARALLEL", "parallel_of", "check_parallel", "build_parallel", "no_buffer_broadcast"]

PARALLEL = ("ddp", "fsdp")


def parallel_of(cfg) -> str:
    """The run's ``parallel`` setting (``ddp`` where a config predates it)."""
    return str(OmegaConf.select(cfg, "parallel", default="ddp"))


def precision_of(cfg) -> str:
    """``train.precision`` (fp32 where the config has none)."""
    return str(OmegaConf.select(cfg, "train.precision", default="fp32"))


def check_parallel(cfg, scheme: str) -> None:
    """Raise ValueError (one line naming the setting) where ``parallel`` cannot run with this config."""
    mode = parallel_of(cfg)
    if mode not in PARALLEL:
        raise ValueError(f"parallel={mode!r}: use one of {', '.join(PARALLEL)}")
    if mode == "ddp":
        return
    if scheme not in FSDP_SCHEMES:
        raise ValueError(
            f"parallel=fsdp: optim={cfg.optim.name} communicates with scheme {scheme!r}, which has "
            f"no FSDP path; the schemes that have one: {', '.join(FSDP_SCHEMES)} (e.g. optim=birder, "
            "onebit_adam, onebit_lamb, sgdm, adamw, bertadam), or use parallel=ddp"
        )
    birder_scheme = OmegaConf.select(cfg, "optim.comm.scheme", default="hierarchical")
    if scheme == "birder" and birder_scheme != "hierarchical":
        raise ValueError(
            f"parallel=fsdp: optim.comm.scheme={birder_scheme!r} has no FSDP path; under FSDP Birder "
            "runs hierarchical (set optim.comm.scheme=hierarchical or parallel=ddp)"
        )
    if precision_of(cfg) == "fp16":
        raise ValueError(
            "parallel=fsdp: train.precision=fp16 is not supported under FSDP (its loss scaler is "
            "DDP's); use train.precision=bf16 or fp32, or parallel=ddp"
        )


def build_parallel(
    cfg: DictConfig, task, model: torch.nn.Module, device: torch.device, topology, ocfg, is_main: bool = False
) -> tuple[torch.nn.Module, Any, Any]:
    """(the model the loop trains, its optimizer, the communication state) for the run's ``parallel``."""
    scheme = optim.get_optim_info(cfg.optim.name).comm
    check_parallel(cfg, scheme)
    if parallel_of(cfg) == "ddp":
        cap = OmegaConf.select(cfg, "optim.comm.bucket_cap_mb", default=None)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            **no_buffer_broadcast(),
            **({"bucket_cap_mb": float(cap)} if cap else {}),
        )
        opt = optim.build_optimizer(ddp.parameters(), ocfg)
        return ddp, opt, comm.attach_comm(scheme, ddp, opt, ocfg, topology)
    return _build_fsdp(cfg, task, model, device, topology, ocfg, scheme, is_main)


def no_buffer_broadcast() -> dict[str, bool]:
    """DDP's keyword that turns off its broadcast of rank 0's buffers before every forward pass (its default):
    ``forward_sync_buffers=False`` where torch has it (2.14 on; buffers still synced once at construction),
    ``broadcast_buffers=False`` before. No algorithm here exchanges buffers (BatchNorm's running statistics reach
    no gradient); a local-step one (DiLoCo) averages them at its sync, counted; for the others the model's
    buffers are rank 0's (checkpoints, birder_repro.train.evaluate.rank0_buffers). So nothing crosses uncounted."""
    import inspect

    keywords = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in keywords else {"broadcast_buffers": False}


def _build_fsdp(cfg, task, model, device, topology, ocfg, scheme: str, is_main: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    nodes, per_node = topology.nodes, topology.gpus_per_node
    if is_main and per_node == 1:
        print(
            "[birder-repro] parallel=fsdp with gpus_per_node=1: nothing to shard inside a node, so every process "
            "holds whole parameters; FSDP and the hooks run as usual",
            flush=True,
        )
    mesh = init_device_mesh(device.type, (nodes, per_node), mesh_dim_names=("replicate", "shard"))
    set_mesh_timeout(mesh)  # the run's train.timeout_s (the default group's): a mesh's groups take none of their own
    # Baselines: native HSDP on the 2-D mesh. The 1-bit schemes: the intra-node mesh, their hooks between nodes.
    shard_mesh = mesh if scheme == "allreduce" else mesh["shard"]
    kwargs: dict[str, Any] = {"mesh": shard_mesh}
    if precision_of(cfg) == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # BatchNorm keeps fp32 parameters, as its running statistics are (bf16 weights beside fp32 statistics
        # fail: "expected scalar type BFloat16 but found Float"); it normalises the bf16 activations in fp32.
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for norm in [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]:
            fully_shard(norm, mesh=shard_mesh, mp_policy=fp32)
    for unit in task.fsdp_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    opt = optim.build_optimizer(model.parameters(), ocfg)
    if scheme in ("birder", "onebit"):
        state = fsdp.attach_from_config(model, opt, mesh, ocfg, scheme)
    else:
        state = fsdp.attach_hsdp(model, mesh)
    model.no_sync = lambda: _no_sync(model)  # what the loop's compute calibration uses (DDP's name)
    model.accumulating = lambda: _accumulating(model)  # train.accumulate: the micro-batches before the last
    model.eval_module = _EvalCopy(task, cfg, model, device)
    return model, opt, state


@contextlib.contextmanager
def _accumulating(model):
    """Backward without FSDP's reduction (so without the hooks), its unreduced gradients kept: the next backward
    with the sync switched back on reduces (and hands the hooks) their sum, once (``train.accumulate``)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@contextlib.contextmanager
def _no_sync(model):
    """Forward and backward without FSDP's reduction (so without the hooks); the unreduced gradients that FSDP
    keeps for the next reduction are dropped afterwards, so training continues as if nothing had run."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)

        for module in model.modules():
            group = param_group(module) if hasattr(module, "_get_fsdp_state") else None
            for fp in group.fsdp_params if group is not None else ():
                fp.unsharded_accumulated_grad = None
                if hasattr(fp, "_unsharded_param"):
                    fp._unsharded_param.grad = None


class _EvalCopy:
    """``model.eval_module()``: a plain (unsharded) copy of the model with the current whole parameters and
    this rank's buffers. Collective (every rank gathers every parameter, in the same order)."""

    def __init__(self, task, cfg, model: torch.nn.Module, device: torch.device):
        self.task, self.cfg, self.model, self.device = task, cfg, model, device
        self.plain: torch.nn.Module | None = None

    def __call__(self) -> torch.nn.Module:
        if self.plain is None:
            # Built under a forked RNG: its initial weights are overwritten, and training's draws stay as they were.
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                self.plain = self.task.build_model(self.cfg).to(self.device)
        params = dict(self.plain.named_parameters())
        buffers = dict(self.plain.named_buffers())
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                whole = p.full_tensor() if hasattr(p, "full_tensor") else p
                params[name].copy_(whole)
            for name, b in self.model.named_buffers():
                buffers[name].copy_(b)
        self.plain.train(self.model.training)
        return self.plain


def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _state_bytes(obj) -> int:
    """Bytes of the tensors (this process's parts) in a nested state."""
    if isinstance(obj, torch.Tensor):
        return _local_bytes(obj)
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    return 0


def peak_memory(device: torch.device) -> int:
    """This process's peak memory so far: allocated on CUDA, resident (ru_maxrss) elsewhere."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def memory_report(model: torch.nn.Module, optimizer, comm, device: torch.device) -> list[dict[str, int]]:
    """Per rank (gathered: collective): the bytes of the parameters, gradients and optimizer state this process
    holds, and its peak memory. Gradients: what a step holds, this process's parameter elements in fp32 (DDP's
    buckets hold all of them, FSDP's sharded gradients this process's shard); optimizer state: the optimizer's
    tensors and the hook's per-bucket state (Birder's m, b, e, e_bar; 1-bit Adam's errors)."""
    import torch.distributed as dist

    params = sum(_local_bytes(p) for p in model.parameters())
    grads = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * 4 for p in model.parameters())
    store = getattr(comm, "store", None)
    hook = sum(_state_bytes(b.state) for b in store.buckets.values()) if store is not None else 0
    mine = {
        "parameters": params,
        "gradients": grads,
        # DiLoCo keeps its outer parameters and momentum beside AdamW's state (held_tensors)
        "optimizer_state": _state_bytes([*optimizer.state.values(), *getattr(optimizer, "held_tensors", list)()])
        + hook,
        "peak": peak_memory(device),
    }
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every
