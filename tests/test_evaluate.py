"""Evaluation scores one model on every rank's shard (birder_repro.train.evaluate).

A DDP model that broadcasts its buffers (the synchronous methods) is rank 0's model: after a training forward
pass each rank's BatchNorm statistics have moved by its own batch, so every rank scores rank 0's, and gets its
own back afterwards. Two gloo processes; the expected figure is rank 0's model scored on both shards on one
process.
"""

from __future__ import annotations

import torch
from dist_utils import run_distributed
from torch import nn


class _Task:
    """A task's evaluation interface: the mean output over the shard, as (sum, count)."""

    def evaluate(self, module, loader, device):
        total, count = 0.0, 0
        for x in loader:
            out = module(x)
            total, count = total + float(out.sum()), count + out.numel()
        return {"mean": (total, count)}

    def finalize(self, means):
        return means


class _Data:
    def __init__(self, rank: int):
        self.eval = [_inputs(rank, k) for k in range(2)]


def _inputs(rank: int, k: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(10 * rank + k))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2))


def _run(rank: int, world: int, broadcast: bool) -> dict:
    from birder_repro.train.evaluate import evaluate

    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast)
    ddp(torch.randn(8, 4, generator=torch.Generator().manual_seed(rank)) * (rank + 1))  # each rank's own batch
    own = {k: v.clone() for k, v in model.state_dict().items()}
    got = evaluate(_Task(), ddp, _Data(rank), torch.device("cpu"))
    after = model.state_dict()
    return {"got": got["mean"], "own": own, "restored": all(torch.equal(own[k], after[k]) for k in own)}


def _outputs(state: dict, rank: int) -> list[torch.Tensor]:
    """``state``'s model on ``rank``'s shard, on one process."""
    model = _net()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return [model(_inputs(rank, k)) for k in range(2)]


def _mean(outs: list[torch.Tensor]) -> float:
    return float(sum(o.sum() for o in outs)) / sum(o.numel() for o in outs)


def test_a_ddp_model_that_broadcasts_its_buffers_is_scored_with_rank_0s():
    runs = run_distributed(_run, 2, True)
    assert not torch.equal(runs[0]["own"]["1.running_mean"], runs[1]["own"]["1.running_mean"])
    want = _mean(_outputs(runs[0]["own"], 0) + _outputs(runs[0]["own"], 1))
    for rank, run in enumerate(runs):
        assert abs(run["got"] - want) < 1e-6, (rank, run["got"], want)
        assert run["restored"], rank  # each rank's own buffers back after the evaluation


def test_a_ddp_model_that_keeps_its_buffers_is_left_alone():
    """broadcast_buffers=False (DiLoCo's): the caller makes the ranks agree (DiLoCo.synchronised()); nothing is
    broadcast, each rank scores its own."""
    runs = run_distributed(_run, 2, False)
    each_its_own = _mean(_outputs(runs[0]["own"], 0) + _outputs(runs[1]["own"], 1))
    for rank, run in enumerate(runs):
        assert abs(run["got"] - each_its_own) < 1e-6, (rank, run["got"], each_its_own)
        assert run["restored"], rank
