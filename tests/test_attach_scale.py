"""``attach_onebit`` and ``attach_onebit_fsdp`` without ``scale=``: the optimizer's ``comm_scale`` (OneBitAdam one
scale per tensor, as DeepSpeed's OnebitAdam; OneBitLamb one per bucket), so that a script computes as the CLI's
``optim=`` config does. Both optimizers: a hook that took either constant instead would pass with one of them."""

from __future__ import annotations

from dist_utils import run_distributed
from torch import nn


def _scales(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from birder_repro.comm import attach_onebit, attach_onebit_fsdp
    from birder_repro.optim import OneBitAdam, OneBitLamb

    found = {}
    for optim in (OneBitAdam, OneBitLamb):
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 3))
        opt = optim(ddp.parameters(), lr=1e-3, freeze_step=2)
        found[f"ddp {optim.__name__}"] = (attach_onebit(ddp, opt, overlap=False).scale, opt.comm_scale)
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        for layer in model:
            fully_shard(layer, mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
        opt = optim(model.parameters(), lr=1e-3, freeze_step=2)
        found[f"fsdp {optim.__name__}"] = (attach_onebit_fsdp(model, opt, mesh, overlap=False).scale, opt.comm_scale)
    return found


def test_the_attaches_take_the_optimizers_scale_by_default():
    found = run_distributed(_scales, 1)[0]
    assert found == {
        "ddp OneBitAdam": ("tensor", "tensor"),
        "ddp OneBitLamb": ("bucket", "bucket"),
        "fsdp OneBitAdam": ("tensor", "tensor"),
        "fsdp OneBitLamb": ("bucket", "bucket"),
    }
