"""The compressed hooks' communication thread (birder_repro/comm/overlap.py): the same results as inside the
hook, bit for bit, and failures that surface on the training thread instead of hanging it.

Multi-process checks run 4 gloo processes as 2 nodes x 2 in one spawn, DDP with several small buckets.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.birder import attach_birder
from birder_repro.comm.onebit import attach_onebit
from birder_repro.comm.overlap import CommThread, HookRunner
from birder_repro.comm.topology import build_topology, flat_topology
from birder_repro.optim.birder import Birder
from birder_repro.optim.onebit_adam import OneBitAdam

NODES, GPUS = 2, 2
STEPS = 4


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 24)
        self.b = nn.Linear(24, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _ddp():
    torch.manual_seed(0)
    return nn.parallel.DistributedDataParallel(_Net(), bucket_cap_mb=0.0008)  # several buckets


def _step(ddp, opt, rank, step):
    gen = torch.Generator().manual_seed(100 * step + rank)
    loss = nn.functional.mse_loss(ddp(torch.randn(16, 8, generator=gen)), torch.randn(16, 4, generator=gen))
    loss.backward()
    opt.step()
    opt.zero_grad()


def _params(ddp) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone()


def _birder(overlap: bool, rank: int):
    ddp = _ddp()
    opt = Birder(ddp.parameters(), lr=1e-2, beta=0.9, weight_decay=1e-3)
    state = attach_birder(ddp, opt, gpus_per_node=GPUS, overlap=overlap)
    t0 = time.perf_counter()
    for step in range(STEPS):
        _step(ddp, opt, rank, step)
    state.close()
    counters = {**state.snapshot(), "wall_s": time.perf_counter() - t0}
    return _params(ddp), counters, state.store.state_dict()["buckets"]


def _onebit(overlap: bool, rank: int):
    ddp = _ddp()
    opt = OneBitAdam(ddp.parameters(), lr=1e-2, freeze_step=2)
    state = attach_onebit(ddp, opt, topology=flat_topology(), overlap=overlap)
    t0 = time.perf_counter()
    for step in range(STEPS):
        _step(ddp, opt, rank, step)
    state.close()
    counters = {**state.snapshot(), "wall_s": time.perf_counter() - t0}
    return (
        _params(ddp),
        counters,
        {k: v.clone() for k, v in opt.state_dict()["state"][0].items() if isinstance(v, torch.Tensor)},
    )


def _failing(rank: int) -> dict:
    """An exception on the communication path (every rank, the same bucket): the training thread must get it."""
    from birder_repro.comm import birder as birder_module

    ddp = _ddp()
    opt = Birder(ddp.parameters(), lr=1e-2)
    attach_birder(ddp, opt, topology=build_topology(GPUS))
    original, calls = birder_module.kernels.server_compress, []

    def server_compress(*args, **kwargs):
        calls.append(1)
        # DDP's first iteration has one bucket (its first bucket holds 1 MiB); from the second on, several: the
        # second call is the first bucket after the rebuild, with later buckets queued behind it
        if len(calls) == 2:
            raise ValueError("injected failure")
        return original(*args, **kwargs)

    birder_module.kernels.server_compress = server_compress
    errors = []
    try:
        for step in range(3):
            try:
                _step(ddp, opt, rank, step)
            except RuntimeError as exc:
                errors.append(str(exc))
    finally:
        birder_module.kernels.server_compress = original
    return {
        "errors": errors,
        "thread_alive": any(t.name.startswith("birder-comm") and t.is_alive() for t in threading.enumerate()),
    }


def _all(rank: int, world: int) -> dict:
    return {
        "birder": [_birder(o, rank) for o in (False, True)],
        "onebit": [_onebit(o, rank) for o in (False, True)],
        "failing": _failing(rank),
    }


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_all, NODES * GPUS)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", ["birder", "onebit"])
def test_overlapped_hook_equals_synchronous_bit_for_bit(runs, scheme):
    for rank, run in enumerate(runs):
        (sync_params, sync_counters, sync_state), (async_params, async_counters, async_state) = run[scheme]
        assert torch.equal(sync_params, async_params), f"rank {rank}"
        assert torch.equal(runs[0][scheme][1][0], async_params), f"rank {rank} differs from rank 0"
        for key in ("intra_node_bytes", "inter_node_bytes", "calls"):
            assert sync_counters[key] == async_counters[key], key
        for counters in (sync_counters, async_counters):  # one thread does both in turn, within the steps
            seconds = counters["collective_seconds"], counters["compress_seconds"]
            assert min(seconds) > 0 and sum(seconds) <= counters["wall_s"], counters
        if scheme == "onebit":
            assert all(torch.equal(sync_state[k], async_state[k]) for k in sync_state)
        else:
            assert sync_state.keys() == async_state.keys()
            for i in sync_state:
                for k, t in sync_state[i]["state"].items():
                    assert torch.equal(t, async_state[i]["state"][k]), (rank, i, k)


@pytest.mark.timeout(400)
def test_failure_on_the_communication_thread_surfaces_on_the_training_thread(runs):
    for run in runs:
        errors = run["failing"]["errors"]
        assert len(errors) == 2, errors  # the failing step, and the next one fails at once (no hang)
        assert run["failing"]["thread_alive"], "the thread should outlive a failed bucket (it fails later ones)"
        assert all("injected failure" in e for e in errors), errors


# ----------------------------------------------------------------------------------- the thread alone
@pytest.mark.timeout(60)
def test_comm_thread_runs_fifo_and_fails_every_later_future():
    thread, order = CommThread("test-comm"), []
    gate = threading.Event()

    def job(i):
        def work():
            if i == 0:
                gate.wait(10)
            order.append(i)
            if i == 2:
                raise KeyError("boom")
            return torch.full((1,), float(i))

        return work

    futures = [thread.submit(job(i), torch.device("cpu")) for i in range(4)]
    assert thread.busy
    gate.set()
    assert futures[0].wait().item() == 0 and futures[1].wait().item() == 1
    for fut in futures[2:]:
        with pytest.raises(RuntimeError, match="boom"):
            fut.wait()
    assert order == [0, 1, 2]  # the work after the failure never ran
    with pytest.raises(RuntimeError, match="boom"):
        thread.submit(job(5), torch.device("cpu")).wait()
    thread.close()


@pytest.mark.timeout(60)
def test_runner_without_overlap_returns_a_completed_future_and_checks_idleness():
    runner = HookRunner(overlap=False)
    fut = runner.run(lambda: torch.ones(2), torch.device("cpu"))
    assert fut.done() and torch.equal(fut.value(), torch.ones(2))
    runner = HookRunner(overlap=True)
    gate = threading.Event()
    fut = runner.run(lambda: (gate.wait(10), torch.zeros(1))[1], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="between steps"):
        runner.check_idle("state_dict()")
    gate.set()
    fut.wait()
    runner.check_idle("state_dict()")
    runner.close()


def test_step_split_with_overlap_books_only_the_exposed_time():
    from birder_repro.train import split_step_time

    # 1.0 s step, 0.7 s compute: 0.3 s exposed; 0.5 s of compression work on the thread, 0.2 s of it hidden
    assert split_step_time(1.0, 0.7, 0.5, overlapped=True) == pytest.approx((0.7, 0.0, 0.3))
    assert split_step_time(1.0, 0.7, 0.1, overlapped=True) == pytest.approx((0.7, 0.2, 0.1))
    assert split_step_time(1.0, 1.2, 0.1, overlapped=True) == pytest.approx((1.0, 0.0, 0.0))
    assert split_step_time(1.0, 0.7, 0.5) == pytest.approx((0.5, 0.0, 0.5))  # synchronous: all exposed
