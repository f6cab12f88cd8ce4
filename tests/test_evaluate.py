"""Evaluation scores one model on every rank's shard (birder_repro.train.evaluate), with the buffers rank 0 holds.

The runner's DDP model broadcasts no buffers before its forward passes (birder_repro.train.parallel): after a
training forward pass each rank's BatchNorm statistics have moved by its own batch, so every rank scores rank 0's
(what a checkpoint's model file holds) and gets its own back afterwards. Two gloo processes; the expected figure
is rank 0's model scored on both shards on one process.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from omegaconf import OmegaConf
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


def _run(rank: int, world: int, wrap: str) -> dict:
    from birder_repro.train.evaluate import evaluate
    from birder_repro.train.parallel import no_buffer_broadcast

    model = _net()
    evaluated = nn.parallel.DistributedDataParallel(model, **no_buffer_broadcast()) if wrap == "ddp" else model
    evaluated(torch.randn(8, 4, generator=torch.Generator().manual_seed(rank)) * (rank + 1))  # each rank's batch
    own = {k: v.clone() for k, v in model.state_dict().items()}
    got = evaluate(_Task(), evaluated, _Data(rank), torch.device("cpu"))
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


@pytest.mark.parametrize("wrap", ["ddp", "plain"])  # plain: FSDP's evaluation copy is a plain module
def test_every_rank_scores_rank_0s_buffers_and_keeps_its_own(wrap):
    runs = run_distributed(_run, 2, wrap)
    assert not torch.equal(runs[0]["own"]["1.running_mean"], runs[1]["own"]["1.running_mean"])
    want = _mean(_outputs(runs[0]["own"], 0) + _outputs(runs[0]["own"], 1))
    for rank, run in enumerate(runs):
        assert abs(run["got"] - want) < 1e-6, (rank, run["got"], want)
        assert run["restored"], rank  # each rank's own buffers back after the evaluation


def _built(rank: int, world: int, configs: list[str]) -> list[bool]:
    from birder_repro.comm import build_topology
    from birder_repro.train import build_parallel
    from birder_repro.train.worker import optim_config

    out = []
    for cfg_yaml in configs:
        cfg = OmegaConf.create(cfg_yaml)
        ddp, _, _ = build_parallel(
            cfg, None, _net(), torch.device("cpu"), build_topology(gpus_per_node=1), optim_config(cfg, 10)
        )
        out.append(ddp.broadcast_buffers)
    return out


def test_the_runner_builds_ddp_without_its_buffer_broadcast(compose):
    """No method's DDP model sends rank 0's buffers before every forward pass: DiLoCo's would tie its nodes
    together between syncs, and for every method those bytes would cross the link uncounted."""
    configs = [
        OmegaConf.to_yaml(compose([f"optim={name}", "task=digits", "nodes=2", "gpus_per_node=1"]), resolve=True)
        for name in ("sgdm", "birder", "diloco")
    ]
    assert run_distributed(_built, 2, configs) == [[False] * 3] * 2
