"""Every process group the runner builds waits the run's timeout (``train.timeout_s``, the default group's), not
the backend's default (NCCL 10 min, gloo 30 min): the topology's subgroups and a device mesh's groups."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from dist_utils import run_distributed

RUN_TIMEOUT = timedelta(seconds=42)


def _timeout_of(group) -> timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def _groups_and_mesh(rank: int, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    from birder_repro.comm.topology import build_topology, default_timeout, set_mesh_timeout

    # as the worker's init_process_group(timeout=train.timeout_s) leaves it (dist_utils starts with gloo's default)
    dist.distributed_c10d._set_pg_timeout(RUN_TIMEOUT, dist.group.WORLD)
    topology = build_topology(2)  # 2 nodes x 2: intra- and inter-node groups of 2 of the 4 ranks
    explicit = build_topology(2, timeout=timedelta(seconds=7))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    before = [_timeout_of(mesh.get_group(d)) for d in range(2)]
    set_mesh_timeout(mesh)
    return {
        "default": default_timeout(),
        "topology": [_timeout_of(topology.intra_group), _timeout_of(topology.inter_group)],
        "explicit": [_timeout_of(explicit.intra_group), _timeout_of(explicit.inter_group)],
        "mesh_before": before,
        "mesh": [_timeout_of(mesh.get_group(d)) for d in range(2)],
    }


def test_subgroups_and_mesh_groups_take_the_default_groups_timeout():
    for rank, got in enumerate(run_distributed(_groups_and_mesh, 4)):
        assert got["default"] == RUN_TIMEOUT, rank
        assert got["topology"] == [RUN_TIMEOUT] * 2, rank
        assert got["explicit"] == [timedelta(seconds=7)] * 2, rank
        assert got["mesh_before"] != [RUN_TIMEOUT] * 2, "init_device_mesh now inherits it: set_mesh_timeout is moot"
        assert got["mesh"] == [RUN_TIMEOUT] * 2, rank
