"""The two-level all-reduce (birder_repro.comm.two_level) against DDP's own all-reduce, on gloo processes.

Every rank computes its gradients of one model on its own batch; DDP without a hook averages them over a flat
ring, the hook in two levels (reduce-scatter in the node, all-reduce across nodes, all-gather in the node).
Tolerance: fp32 sums in another order, a few ulps of gradients of order 1 (atol 1e-6); bf16 rounds the wire
values and every partial sum to 8 significant bits (rtol 2^-6 of the largest gradient, after 2 additions).
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.accounting import all_gather_bytes, allreduce_bytes, reduce_scatter_bytes


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 7))


def _grads(ddp, rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 12, generator=gen), torch.randint(0, 7, (16,), generator=gen)
    nn.functional.cross_entropy(ddp(x), y).backward()
    return [p.grad.detach().clone() for p in ddp.parameters()]


def _case(rank: int, world: int, gpus_per_node: int) -> dict:
    from birder_repro.comm.topology import build_topology
    from birder_repro.comm.two_level import attach_two_level

    topology = build_topology(gpus_per_node)
    out = {"plain": _grads(nn.parallel.DistributedDataParallel(_net(), bucket_cap_mb=0.001), rank)}
    for dtype in (torch.float32, torch.bfloat16):
        for overlap in (True, False):
            ddp = nn.parallel.DistributedDataParallel(_net(), bucket_cap_mb=0.001)  # several buckets
            state = attach_two_level(ddp, topology=topology, dtype=dtype, overlap=overlap)
            out[(dtype, overlap)] = _grads(ddp, rank)
            out[(dtype, overlap, "bytes")] = (state.intra_node_bytes, state.inter_node_bytes, state.calls)
            state.close()
    return out


def _all(rank: int, world: int) -> dict:
    return {m: _case(rank, world, m) for m in (2, 1, 4)}


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_all, 4)


@pytest.mark.parametrize("m", [2, 1, 4])
def test_two_levels_average_as_ddps_flat_ring_does(runs, m):
    for rank, run in enumerate(runs):
        got, want = run[m][(torch.float32, True)], run[m]["plain"]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=lambda s: f"{m} per node, rank {rank}: {s}")
        top = max(float(b.abs().max()) for b in want)
        for a, b in zip(run[m][(torch.bfloat16, True)], want):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a, b, rtol=0, atol=top * 2**-6, msg=lambda s: f"bf16 rank {rank}: {s}")
        assert not all(torch.equal(a, b) for a, b in zip(run[m][(torch.bfloat16, True)], want))  # bf16 rounds
        for dtype in (torch.float32, torch.bfloat16):  # the thread and the hook compute alike
            assert all(torch.equal(a, b) for a, b in zip(run[m][(dtype, True)], run[m][(dtype, False)]))
        assert all(torch.equal(a, b) for a, b in zip(run[m][(torch.float32, True)], runs[0][m][(torch.float32, True)]))


@pytest.mark.parametrize("m", [2, 1, 4])
def test_the_bytes_are_a_node_reduce_scatter_an_inter_node_all_reduce_and_a_node_all_gather(runs, m):
    n, numel = 4 // m, sum(p.numel() for p in _net().parameters())
    shard = -(-numel // m)  # DDP's first iteration: one bucket of every parameter, padded to a multiple of m
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        intra, inter, calls = runs[0][m][(dtype, True, "bytes")]
        assert calls == 1
        want_intra = reduce_scatter_bytes(shard * m * size, m) + all_gather_bytes(shard * size, m)
        assert intra == pytest.approx(want_intra if m > 1 else 0.0)
        assert inter == pytest.approx(allreduce_bytes(shard * size, n) if n > 1 else 0.0)
        # each node's m processes put 2 (n-1)/n of the bucket's bytes on its link, once (a flat ring: more)
        assert m * inter == pytest.approx(2 * (n - 1) / n * shard * m * size)
