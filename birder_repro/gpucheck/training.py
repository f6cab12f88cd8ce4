"""The hooks as training runs them, across ranks: Birder and 1-bit Adam under DDP and under FSDP2, in fp32, bf16
and fp16 (autocast around forward and loss, GradScaler for fp16: :class:`birder_repro.train.precision.Precision`,
the training loop's own), each process saving what :mod:`birder_repro.gpucheck.hooks` compares:

- Birder, DDP: every bucket call (this rank's gradient and the hook's result, both divided by the loss scale,
  a power of two, so exactly) for the single-process reference, the parameters after every step;
- Birder, FSDP2 (one unit per layer and the root): every unit call likewise, and in fp32 the parameters after
  every step, which must equal DDP's bit for bit (Birder's state and draws are per element; DESIGN.md "Sharded
  training");
- 1-bit Adam, DDP and FSDP2 (the root as its one unit): this rank's own gradient of every step (from a plain
  copy of the model, under the same autocast and loss scale) and the parameters, for
  :class:`~birder_repro.references.onebit.OneBitAdamReference`.

FSDP2 runs as the runner builds it (birder_repro.train.parallel): bf16 is ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)`` (with the loop's autocast), and fp16 is refused under FSDP (:data:`FSDP_PRECISIONS`).
GradScaler starts at 2^10 here, where none of these tiny steps overflows fp16 (its default 2^16 skips the first
steps; the skip path has its own tests, tests/test_precision.py): every step is compared.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from birder_repro.comm import attach_birder_fsdp, attach_onebit, attach_onebit_fsdp
from birder_repro.comm.birder import BirderState, attach_birder
from birder_repro.comm.topology import set_mesh_timeout
from birder_repro.optim import OneBitAdam
from birder_repro.optim.birder import Birder
from birder_repro.train.precision import Precision

__all__ = ["PRECISIONS", "FSDP_PRECISIONS", "TRAIN_STEPS", "LR", "ONEBIT", "FREEZE", "Layers", "TRAINING"]

PRECISIONS = ("fp32", "bf16", "fp16")
FSDP_PRECISIONS = ("fp32", "bf16")  # train/parallel.py refuses fp16 under FSDP (the FSDP hooks ignore the scale)
TRAIN_STEPS, LR, FREEZE, INIT_SCALE = 4, 1e-2, 2, 2.0**10
ONEBIT = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
KERNELS_ENV = "BIRDER_GPUCHECK_KERNELS"  # Birder's kernel backend here (auto; the tests: triton, interpreted)
_MESHES: dict = {}  # one device mesh per layout: each new mesh would rendezvous its groups again


def _kernels() -> str:
    return os.environ.get(KERNELS_ENV, "auto")


class Layers(nn.Module):
    """Row counts that do not split evenly (FSDP pads each parameter's dim-0 shard)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 13), nn.Linear(13, 7), nn.Linear(7, 5)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = torch.tanh(x) if i < len(self.layers) - 1 else x
        return x


def _batch(rank: int, step: int, device: torch.device):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=gen).to(device), torch.randn(16, 5, generator=gen).to(device)


def _precision(name: str, device: torch.device, comm):
    precision = Precision(name, device, comm)
    if precision.scaler is not None:
        precision.scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE)
    return precision


def _loss(model, x, y, precision) -> torch.Tensor:
    with precision.autocast():
        return nn.functional.mse_loss(model(x).float(), y)


def _flat(model) -> torch.Tensor:
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]
    return torch.cat([p.reshape(-1) for p in full]).detach().to("cpu", copy=True)


def _same_on_every_rank(flat: torch.Tensor) -> bool:
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], t) for t in everyone)


def _train(model, opt, state, device, name: str, shadow_grads: bool = False, compute_dtype=None) -> dict:
    """TRAIN_STEPS steps as the training loop takes them; the parameters after each, this rank's own gradients."""
    precision, rank = _precision(name, device, state), dist.get_rank()
    out = {"params": [], "grads": [], "identical": [], "scales": []}
    for step in range(TRAIN_STEPS):
        x, y = _batch(rank, step, device)
        scale = precision.loss_scale or 1.0
        if shadow_grads:
            out["grads"].append(_own_gradient(model, x, y, precision, scale, compute_dtype))
        precision.backward(_loss(model, x, y, precision))
        precision.step(opt)
        opt.zero_grad()
        out["params"].append(_flat(model))
        out["identical"].append(_same_on_every_rank(out["params"][-1].to(device)))
        out["scales"].append(scale)
    out["skipped"] = precision.skipped_steps
    state.close()
    return out


def _own_gradient(model, x, y, precision, scale: float, dtype=None) -> list[torch.Tensor]:
    """This rank's gradient of every parameter, as the hook receives it before averaging (divided by the scale;
    computed in ``dtype`` where FSDP2 computes in it, then fp32 as FSDP2 reduces)."""
    plain = Layers().to(x.device, dtype=dtype)
    with torch.no_grad():
        for q, p in zip(plain.parameters(), model.parameters()):
            q.copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
    (_loss(plain, x, y, precision) * scale).backward()
    return [(q.grad.float() / scale).to("cpu") for q in plain.parameters()]


def _sharded(device: torch.device, topology, per_layer: bool, precision: str):
    """The model as train/parallel.py shards it: a ("replicate", "shard") mesh, bf16 as a mixed-precision policy."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Layers().to(device)
    shape = (device.type, topology.nodes, topology.gpus_per_node)
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh(device.type, shape[1:], mesh_dim_names=("replicate", "shard"))
        set_mesh_timeout(_MESHES[shape])  # the section's PG_TIMEOUT_S, not the backend's default
    mesh = _MESHES[shape]
    kwargs = {"mesh": mesh["shard"]}
    if precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers if per_layer else []:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model, mesh


def _birder_ddp(topology, device) -> dict:
    out, original = {}, BirderState.allreduce_bucket
    for name in PRECISIONS:
        calls = []
        recording = _recorder(original, calls, lambda buffer: buffer)
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(
            Layers().to(device), bucket_cap_mb=0.0003, device_ids=[device] if device.type == "cuda" else None
        )
        opt = Birder(ddp.parameters(), lr=LR, beta=0.9, weight_decay=0.0)
        state = attach_birder(ddp, opt, topology=topology, kernel_backend=_kernels())
        BirderState.allreduce_bucket = recording
        try:
            out[name] = _train(ddp, opt, state, device, name)
        finally:
            BirderState.allreduce_bucket = original
        out[name].update(calls=calls, numels=[p.numel() for p in ddp.parameters()])
    return out


def _recorder(original, calls: list, grad_of):
    """A stand-in for a BirderState method that records (signature, gradient, result) of every call, both divided
    by the loss scale (a power of two: exact)."""

    def recording(self, index, buffer, signature, *rest):
        scale = float(self.loss_scale) if self.loss_scale is not None else 1.0
        grad = grad_of(buffer).detach().to("cpu", copy=True) / scale
        result = original(self, index, buffer, signature, *rest)
        # FSDP's unit signature also gives each piece's position within its parameter: the reference's layout
        # (parameter, offset, numel) holds where every piece starts its parameter (one process a node)
        if signature and len(signature[0]) == 4:
            signature = tuple((p, off, n) for p, off, n, pos in signature) if not any(s[3] for s in signature) else None
        calls.append((signature, grad, result.detach().to("cpu", copy=True) / scale))
        return result

    return recording


def _birder_fsdp(topology, device) -> dict:
    out, original = {}, BirderState.reduce_node_shard
    for name in FSDP_PRECISIONS:
        model, mesh = _sharded(device, topology, per_layer=True, precision=name)
        opt = Birder(model.parameters(), lr=LR, beta=0.9, weight_decay=0.0)
        state, calls = attach_birder_fsdp(model, opt, mesh, kernel_backend=_kernels()), []
        BirderState.reduce_node_shard = _recorder(original, calls, lambda shard: shard.float())
        try:
            out[name] = _train(model, opt, state, device, name)
        finally:
            BirderState.reduce_node_shard = original
        out[name].update(calls=calls, numels=[p.numel() for p in _initial()])
    return out


def _onebit(topology, device, sharded: bool) -> dict:
    out = {}
    for name in FSDP_PRECISIONS if sharded else PRECISIONS:
        if sharded:
            model, mesh = _sharded(device, topology, per_layer=False, precision=name)
        else:
            torch.manual_seed(0)
            model = nn.parallel.DistributedDataParallel(
                Layers().to(device), bucket_cap_mb=0.0003, device_ids=[device] if device.type == "cuda" else None
            )
        initial = _initial()
        opt = OneBitAdam(model.parameters(), freeze_step=FREEZE, **ONEBIT)
        # one scale per bucket and per unit shard (the reference's), so that the two compare
        state = (
            attach_onebit_fsdp(model, opt, mesh, scale="bucket")
            if sharded
            else attach_onebit(model, opt, topology=topology, scale="bucket")
        )
        layouts = []
        if not sharded:  # the bucket layout of every step, read after its backward
            opt_step = opt.step

            def step(*args, **kwargs):
                layouts.append({i: b.signature for i, b in state.store.buckets.items()})
                return opt_step(*args, **kwargs)

            opt.step = step
        bf16_params = sharded and name == "bf16"  # FSDP2 computes in its param_dtype
        out[name] = _train(
            model, opt, state, device, name, shadow_grads=True, compute_dtype=torch.bfloat16 if bf16_params else None
        )
        out[name].update(initial=initial, layouts=layouts)
    return out


def _initial() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [p.detach().clone() for p in Layers().parameters()]


TRAINING = {
    "birder_ddp_precisions": _birder_ddp,
    "birder_fsdp_precisions": _birder_fsdp,
    "onebit_ddp_precisions": lambda t, d: _onebit(t, d, sharded=False),
    "onebit_fsdp_precisions": lambda t, d: _onebit(t, d, sharded=True),
}
