"""DiLoCo (birder_repro.optim.DiLoCo with birder_repro.comm.diloco) against a single-process reference of its
Algorithm 1 (Douillard et al. 2023): 4 gloo processes as 2 nodes x 2, H = 3 inner AdamW steps per outer step.

The reference keeps one model per node; a node's gradient is the average of its two processes' gradients
(each process's own, recorded at the run's parameters as tests/test_fsdp.py does); every H steps it averages
the nodes' movement since the last outer step and applies torch's Nesterov SGD to the outer parameters, which
every node then starts from. Tolerance: the sums are the same, in the same order, so bit for bit is expected;
rtol 1e-6 allows for torch reordering a reduction.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

NODES, GPUS, WORLD = 2, 2, 4
H, STEPS = 3, 7  # two outer steps and one inner step after them
INNER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
OUTER_LR, OUTER_MU = 0.7, 0.9
CLOSE = dict(rtol=1e-6, atol=1e-7)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _run(rank: int, world: int) -> dict:
    from birder_repro.comm import attach_diloco
    from birder_repro.optim import DiLoCo

    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = DiLoCo(ddp.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, **INNER)
    state = attach_diloco(ddp, opt, gpus_per_node=GPUS)
    out: dict = {"grads": [], "params": [], "inter": []}
    for step in range(STEPS):
        plain = _net()
        plain.load_state_dict(model.state_dict())
        _loss(plain, _batch(rank, step)).backward()
        out["grads"].append([p.grad.clone() for p in plain.parameters()])
        before = state.inter_node_bytes
        _loss(ddp, _batch(rank, step)).backward()
        opt.step()
        opt.zero_grad()
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["inter"].append(state.inter_node_bytes - before)
    out["outer_steps"] = (opt.outer_steps, state.outer_steps)
    return out


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_run, WORLD)


def _reference(runs) -> list[list[list[torch.Tensor]]]:
    """Each step's parameters of each node, from the processes' recorded gradients."""
    nodes = [_net() for _ in range(NODES)]
    inner = [torch.optim.AdamW(m.parameters(), **INNER) for m in nodes]
    outer = [p.detach().clone() for p in nodes[0].parameters()]
    momentum = [torch.zeros_like(p) for p in outer]
    history = []
    for step in range(STEPS):
        for k, (model, opt) in enumerate(zip(nodes, inner)):
            grads = zip(runs[k * GPUS]["grads"][step], runs[k * GPUS + 1]["grads"][step])
            for p, (a, b) in zip(model.parameters(), grads):
                p.grad = (a + b) / 2
            opt.step()
        if (step + 1) % H == 0:
            with torch.no_grad():
                for j, (x, buf) in enumerate(zip(outer, momentum)):
                    delta = torch.stack([x - list(m.parameters())[j] for m in nodes]).mean(0)
                    buf.mul_(OUTER_MU).add_(delta)
                    x.sub_(OUTER_LR * (delta + OUTER_MU * buf))
                    for m in nodes:
                        list(m.parameters())[j].copy_(x)
        history.append([[p.detach().clone() for p in m.parameters()] for m in nodes])
    return history


def test_diloco_follows_algorithm_1(runs):
    want = _reference(runs)
    for step in range(STEPS):
        for rank in range(WORLD):
            for a, b in zip(runs[rank]["params"][step], want[step][rank // GPUS]):
                torch.testing.assert_close(a, b, **CLOSE, msg=lambda m, s=step, r=rank: f"step {s + 1} rank {r}: {m}")
    assert runs[0]["outer_steps"] == (STEPS // H, STEPS // H)


def test_the_nodes_drift_apart_between_outer_steps_and_meet_at_each(runs):
    for step in range(STEPS):
        same_node = all(torch.equal(a, b) for a, b in zip(runs[0]["params"][step], runs[1]["params"][step]))
        across = all(torch.equal(a, b) for a, b in zip(runs[0]["params"][step], runs[2]["params"][step]))
        assert same_node, f"step {step + 1}: the processes of a node differ"
        assert across == ((step + 1) % H == 0), f"step {step + 1}: nodes {'differ' if not across else 'agree'}"


def test_only_the_outer_steps_cross_nodes(runs):
    numel = sum(p.numel() for p in _net().parameters())
    shard = -(-numel // GPUS)
    for step, sent in enumerate(runs[0]["inter"]):
        # a 1/m shard of the fp32 model, all-reduced between the 2 nodes: 2 (n-1)/n 4 shard bytes
        assert sent == (2 * (NODES - 1) / NODES * 4 * shard if (step + 1) % H == 0 else 0), step


def test_one_process_resumed_mid_interval_equals_the_run_left_alone():
    """Without a hook DiLoCo is one worker; a checkpoint between outer steps (state_dict: AdamW's, the outer
    parameters and momentum, this worker's parameters) resumes bit for bit."""
    from birder_repro.optim import DiLoCo

    def run(stop_at: int | None, resume: dict | None):
        model = _net()
        opt = DiLoCo(model.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, **INNER)
        start = 0
        if resume is not None:
            opt.load_state_dict(resume)
            start = opt.inner_steps
        for step in range(start, STEPS if stop_at is None else stop_at):
            _loss(model, _batch(0, step)).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], opt.state_dict()

    alone, _ = run(None, None)
    _, saved = run(4, None)  # after one outer step and one inner step
    resumed, _ = run(None, saved)
    assert all(torch.equal(a, b) for a, b in zip(alone, resumed))


def test_diloco_settings_are_checked():
    from birder_repro.optim import DiLoCo

    params = list(_net().parameters())
    with pytest.raises(ValueError, match="local_steps must be an integer >= 1"):
        DiLoCo(params, local_steps=0)
    with pytest.raises(ValueError, match="outer_momentum must be in"):
        DiLoCo(params, outer_momentum=1.0)


def test_the_record_has_the_outer_steps_and_their_time():
    from birder_repro.optim import DiLoCo
    from birder_repro.train.loop import _outer_steps

    model = _net()
    opt = DiLoCo(model.parameters(), local_steps=H, **INNER)
    for step in range(STEPS):
        _loss(model, _batch(0, step)).backward()
        opt.step()
        opt.zero_grad()
    got = _outer_steps(opt)
    assert got["outer_steps"] == STEPS // H and got["outer_step_s"] > 0
    assert _outer_steps(torch.optim.AdamW(model.parameters())) == {"outer_steps": None, "outer_step_s": None}
