"""birder_repro's DiLoCo against torchft's (torchft.local_sgd.DiLoCo, what torchtitan uses) on the same model,
inputs and hyperparameters: AdamW inside, SGD with Nesterov momentum outside, H inner steps a sync.

torchft's DiLoCo runs under its Manager (quorum, lighthouse, fault tolerance); here the Manager is mocked as
torchft's own unit tests mock it, its all-reduce the average over the workers. Two workers run in two threads,
each on its own batches, and meet at every all-reduce; this project's DiLoCo averages its outer gradient over
the same two threads through the hook's interface (``sync``, which attach_diloco gives it over the
nodes' gloo or NCCL group: tests/test_diloco.py checks that part across processes). Equal bit for bit: both do
torch's AdamW, then theta - lr_out (delta + mu buf) with buf = mu buf + delta in the same float order.
"""

from __future__ import annotations

import threading
from unittest.mock import create_autospec

import pytest
import torch
from torch import nn

from birder_repro.optim.diloco import DiLoCo

torchft_local_sgd = pytest.importorskip("torchft.local_sgd")
from torchft.manager import Manager  # noqa: E402
from torchft.work import _DummyWork  # noqa: E402

H, LR, WD, OUTER_LR, OUTER_MU, STEPS = 3, 1e-2, 0.1, 0.7, 0.9, 12


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(worker: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + worker)
    return [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(STEPS)]


class Meeting:
    """The workers' all-reduce: each call (the n-th of every worker) waits for the others and averages."""

    def __init__(self, workers: int) -> None:
        self.workers, self.barrier = workers, threading.Barrier(workers)
        self.lock, self.calls, self.slots = threading.Lock(), [0] * workers, {}

    def average(self, worker: int, tensor: torch.Tensor) -> None:
        n = self.calls[worker]
        self.calls[worker] += 1
        with self.lock:
            self.slots.setdefault(n, [None] * self.workers)[worker] = tensor.detach().clone()
        self.barrier.wait()
        tensor.copy_(torch.stack(self.slots[n]).mean(0))
        self.barrier.wait()  # nobody reads slot n after this


def run_workers(train, workers: int = 2) -> list[nn.Module]:
    meeting, models, errors = Meeting(workers), [model() for _ in range(workers)], []

    def target(worker: int) -> None:
        try:
            train(worker, models[worker], meeting)
        except BaseException as err:  # noqa: BLE001 - reported below, with the other thread released
            errors.append(err)
            meeting.barrier.abort()

    threads = [threading.Thread(target=target, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return models


def ours(worker: int, net: nn.Module, meeting: Meeting) -> None:
    class Nodes:
        def __init__(self) -> None:
            self.buffers: list[torch.Tensor] = []  # the net has none
            self.synced_buffers: list[torch.Tensor] = []

        def sync(self, deltas: list[torch.Tensor]) -> None:
            for t in deltas:
                meeting.average(worker, t)

    opt = DiLoCo(net.parameters(), lr=LR, weight_decay=WD, local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU)
    opt.hook_state = Nodes()
    for x, y in batches(worker):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


def theirs(worker: int, net: nn.Module, meeting: Meeting) -> None:
    inner = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    outer = torch.optim.SGD(net.parameters(), lr=OUTER_LR, momentum=OUTER_MU, nesterov=True)
    manager = create_autospec(Manager)
    manager._use_async_quorum = False
    manager.errored.return_value = None
    manager.should_commit.return_value = True
    manager.current_step.return_value = 0

    def allreduce(tensor: torch.Tensor, should_quantize: bool = False):
        meeting.average(worker, tensor)
        return _DummyWork(tensor)

    manager.allreduce.side_effect = allreduce
    with torchft_local_sgd.DiLoCo(manager, [net], inner, outer, sync_every=H):
        for x, y in batches(worker):
            inner.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            inner.step()


def test_diloco_equals_torchft_diloco_over_two_workers():
    torch.set_num_threads(1)
    a, b = run_workers(ours), run_workers(theirs)
    start = model()
    for mine, ref, first in zip(a[0].parameters(), b[0].parameters(), start.parameters()):
        assert torch.equal(mine, ref), (mine - ref).abs().max()
        assert (mine - first).abs().max() > 1e-2  # it trained
    # after the last sync (STEPS is a multiple of H) both workers hold the outer parameters
    for p, q in zip(a[0].parameters(), a[1].parameters()):
        assert torch.equal(p, q)
