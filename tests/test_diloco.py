"""DiLoCo (birder_repro.optim.DiLoCo with birder_repro.comm.diloco) against a single-process reference of its
Algorithm 1 (Douillard et al. 2023), on gloo processes laid out as 2 x 1, 4 x 1 and 2 x 2 (nodes x processes a
node), and 1 x 2; H = 3 inner AdamW steps per outer step, 7 steps and then ``finish()``.

The reference keeps one model per node; a node's gradient is the mean of its processes' gradients (each
process's own, recorded at the run's parameters as tests/test_fsdp.py does); every H steps it averages the
nodes' movement since the last outer step and applies torch's Nesterov SGD to the outer parameters, which every
node then starts from. The model has a BatchNorm: each process's running statistics are its own between syncs
(DDP built without its buffer broadcast) and averaged over every process at each sync. Tolerance: the sums
are the same but not all in the same order (the run averages the buffers first in the node, then over the nodes),
so rtol 1e-6.

What the layouts tell apart: 1 x 2 is the only one where the processes a node (m = 2) differ from the nodes
(n = 1), so a hook that scales by 1/n, or not at all, fails there; 2 x 1 and 4 x 1 have m = 1, so an outer
average divided by m rather than n fails there; 2 x 2 has both levels.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_distributed
from torch import nn

H, STEPS = 3, 7  # two outer steps, one inner step after them, and finish()'s outer step over it
INNER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
OUTER_LR, OUTER_MU = 0.7, 0.9
CLOSE = dict(rtol=1e-6, atol=1e-7)
LAYOUTS = [(2, 1), (4, 1), (2, 2), (1, 2)]  # (nodes, processes a node)
RESUME_AT = 4  # a checkpoint one inner step after the first outer step


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.Tanh(), nn.Linear(12, 3))


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _floats(model) -> list[torch.Tensor]:
    return [b for b in model.buffers() if b.is_floating_point()]


def _copy(tensors) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


def _build(gpus: int):
    from birder_repro.comm import attach_diloco
    from birder_repro.optim import DiLoCo
    from birder_repro.train.parallel import no_buffer_broadcast

    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model, **no_buffer_broadcast())
    opt = DiLoCo(ddp.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, **INNER)
    return model, ddp, opt, attach_diloco(ddp, opt, gpus_per_node=gpus)


def _deployed(model, opt) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    with opt.synchronised():
        return _copy(model.parameters()), _copy(_floats(model))


def _train(model, ddp, opt, state, rank: int, steps: range, out: dict) -> None:
    for step in steps:
        plain = _net()
        plain.load_state_dict(model.state_dict())
        _loss(plain, _batch(rank, step)).backward()
        out["grads"].append([p.grad.clone() for p in plain.parameters()])
        before = (state.intra_node_bytes, state.inter_node_bytes)
        _loss(ddp, _batch(rank, step)).backward()
        out["ddp_grads"].append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        out["params"].append(_copy(model.parameters()))
        out["buffers"].append(_copy(_floats(model)))
        out["deployed"].append(_deployed(model, opt))
        out["bytes"].append((state.intra_node_bytes - before[0], state.inter_node_bytes - before[1]))


def _run(rank: int, world: int, gpus: int) -> dict:
    model, ddp, opt, state = _build(gpus)
    out: dict = {key: [] for key in ("grads", "ddp_grads", "params", "buffers", "deployed", "bytes")}
    out["start"] = _deployed(model, opt)
    _train(model, ddp, opt, state, rank, range(STEPS), out)
    mid = _saved({"model": model.state_dict(), "opt": opt.state_dict(), "state": state.state_dict()})  # step 7
    before = (state.intra_node_bytes, state.inter_node_bytes)
    opt.finish()
    out["finish_bytes"] = (state.intra_node_bytes - before[0], state.inter_node_bytes - before[1])
    out["final"] = (_copy(model.parameters()), _copy(_floats(model)), _deployed(model, opt))
    out["outer_steps"] = (opt.outer_steps, state.outer_steps)
    opt.finish()  # nothing left to sync: a no-op
    out["after_second_finish"] = (opt.outer_steps, _copy(model.parameters()))
    out["resumed"] = _resumed(rank, gpus, mid)
    return out


def _saved(states: dict) -> dict:
    """What a checkpoint file gives back: copies (a state_dict's tensors are the live ones)."""
    buf = io.BytesIO()
    torch.save(states, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _resumed(rank: int, gpus: int, saved: dict) -> dict:
    """A fresh model, optimizer and hook resumed as birder_repro.train.checkpoint does (rank 0's model
    broadcast, then each rank's optimizer and hook state), then finish(): the same final model."""
    model, _ddp, opt, state = _build(gpus)
    model.load_state_dict(saved["model"])
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["state"])
    opt.finish()
    return {"params": _copy(model.parameters()), "buffers": _copy(_floats(model)), "deployed": _deployed(model, opt)}


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda layout: f"{layout[0]}x{layout[1]}")
def layout(request):
    nodes, gpus = request.param
    return nodes, gpus, run_distributed(_run, nodes * gpus, gpus)


def _reference(runs, nodes: int, gpus: int) -> dict:
    """Algorithm 1 on one process: each step's parameters of each node, each process's buffers, the outer
    model (theta_{t-1}) with the buffers of its sync; and the same after the final sync."""
    world = nodes * gpus
    models = [_net() for _ in range(nodes)]
    inner = [torch.optim.AdamW(m.parameters(), **INNER) for m in models]
    procs = [_net() for _ in range(world)]  # each process's buffers (its parameters copied from its node's)
    outer = _copy(models[0].parameters())
    synced = _copy(_floats(procs[0]))
    momentum = [torch.zeros_like(p) for p in outer]
    out: dict = {"params": [], "buffers": [], "deployed": [], "grads": []}

    def sync():
        with torch.no_grad():
            for j, (x, buf) in enumerate(zip(outer, momentum)):
                delta = torch.stack([x - list(m.parameters())[j] for m in models]).mean(0)
                buf.mul_(OUTER_MU).add_(delta)
                x.sub_(OUTER_LR * (delta + OUTER_MU * buf))
                for m in models:
                    list(m.parameters())[j].copy_(x)
            for j in range(len(synced)):
                synced[j] = torch.stack([_floats(p)[j] for p in procs]).mean(0)
                for p in procs:
                    _floats(p)[j].copy_(synced[j])

    for step in range(STEPS):
        for r, proc in enumerate(procs):  # the forward pass moves each process's running statistics
            with torch.no_grad():
                for a, b in zip(proc.parameters(), models[r // gpus].parameters()):
                    a.copy_(b)
                proc(_batch(r, step)[0])
        node_grads = []
        for k, (model, opt) in enumerate(zip(models, inner)):
            ranks = range(k * gpus, (k + 1) * gpus)
            for j, p in enumerate(model.parameters()):
                p.grad = torch.stack([runs[r]["grads"][step][j] for r in ranks]).mean(0)
            node_grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
        out["grads"].append(node_grads)
        if (step + 1) % H == 0:
            sync()
        out["params"].append([_copy(m.parameters()) for m in models])
        out["buffers"].append([_copy(_floats(p)) for p in procs])
        out["deployed"].append((_copy(outer), _copy(synced)))
    sync()  # finish(): the outer step over the inner step after the last sync
    out["final"] = (_copy(outer), _copy(synced))
    return out


def _close(got, want, what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **CLOSE, msg=lambda m: f"{what}: {m}")


def test_the_hooks_gradient_is_the_mean_of_the_nodes_processes(layout):
    """The intra-node average after backward is the node's mean gradient: a hook that leaves out its 1/m, or
    divides by the nodes instead, fails at 1 x 2 (and the first at 2 x 2)."""
    nodes, gpus, runs = layout
    want = _reference(runs, nodes, gpus)
    for step in range(STEPS):
        for rank in range(nodes * gpus):
            _close(runs[rank]["ddp_grads"][step], want["grads"][step][rank // gpus], f"step {step + 1} rank {rank}")


def test_diloco_follows_algorithm_1(layout):
    """Each process's parameters and buffers, and the synchronised model it would deploy, step by step and
    after finish(), equal the reference's; at 2 x 1 and 4 x 1 an outer average divided by the processes a
    node instead of the nodes fails."""
    nodes, gpus, runs = layout
    want = _reference(runs, nodes, gpus)
    for rank in range(nodes * gpus):
        _close(runs[rank]["start"][0], _copy(_net().parameters()), f"rank {rank}: theta_0")
        _close(runs[rank]["start"][1], _copy(_floats(_net())), f"rank {rank}: theta_0's buffers")
        for step in range(STEPS):
            where = f"step {step + 1} rank {rank}"
            _close(runs[rank]["params"][step], want["params"][step][rank // gpus], f"{where}: parameters")
            _close(runs[rank]["buffers"][step], want["buffers"][step][rank], f"{where}: buffers")
            _close(runs[rank]["deployed"][step][0], want["deployed"][step][0], f"{where}: deployed parameters")
            _close(runs[rank]["deployed"][step][1], want["deployed"][step][1], f"{where}: deployed buffers")
        params, buffers, (dep_params, dep_buffers) = runs[rank]["final"]
        for got, what in ((params, "parameters"), (dep_params, "deployed parameters")):
            _close(got, want["final"][0], f"rank {rank} after finish(): {what}")
        for got, what in ((buffers, "buffers"), (dep_buffers, "deployed buffers")):
            _close(got, want["final"][1], f"rank {rank} after finish(): {what}")
    last = STEPS // H + 1  # finish() took one more outer step
    assert runs[0]["outer_steps"] == (last, last)
    assert runs[0]["after_second_finish"][0] == last  # a second finish() with nothing to sync does nothing
    assert all(torch.equal(a, b) for a, b in zip(runs[0]["after_second_finish"][1], runs[0]["final"][0]))


def test_the_deployed_model_is_the_same_on_every_rank_and_the_replicas_are_not(layout):
    """Between syncs the processes' own buffers differ (each its own BatchNorm statistics: no broadcast of rank
    0's) and the nodes' parameters drift apart; the model synchronised() shows is the same on every rank."""
    nodes, gpus, runs = layout
    world = nodes * gpus
    for step in range(STEPS):
        synced = (step + 1) % H == 0
        for rank in range(1, world):
            for a, b in zip(runs[0]["deployed"][step], runs[rank]["deployed"][step]):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step + 1} rank {rank}"
            same_buffers = all(torch.equal(x, y) for x, y in zip(runs[0]["buffers"][step], runs[rank]["buffers"][step]))
            assert same_buffers == synced, f"step {step + 1} rank {rank}: buffers {'differ' if synced else 'agree'}"
            if rank >= gpus:  # another node
                same = all(torch.equal(x, y) for x, y in zip(runs[0]["params"][step], runs[rank]["params"][step]))
                assert same == synced, f"step {step + 1} rank {rank}: nodes {'differ' if synced else 'agree'}"


def test_every_byte_is_counted(layout):
    """Per process: every step the hook's fp32 all-reduce in the node, 2 (m-1)/m 4P; at a sync (and at
    finish()) the pseudo-gradient's m-th all-reduced across the nodes, 2 (n-1)/n 4 P/m, and its all-gather in the
    node, (m-1) 4 P/m; the buffers' all-reduce in the node, 2 (m-1)/m 4B, then the same two for B. Nothing else."""
    nodes, gpus, runs = layout
    net = _net()
    numel, buffers = sum(p.numel() for p in net.parameters()), sum(b.numel() for b in _floats(net))
    shards = [-(-numel // gpus), -(-buffers // gpus)]  # each m-th, rounded up
    step_intra = 2 * (gpus - 1) / gpus * 4 * numel
    sync_intra = 2 * (gpus - 1) / gpus * 4 * buffers + sum((gpus - 1) * 4 * s if nodes > 1 else 0 for s in shards)
    sync_inter = sum(2 * (nodes - 1) / nodes * 4 * s for s in shards)
    for rank in range(nodes * gpus):
        for step, sent in enumerate(runs[rank]["bytes"]):
            synced = (step + 1) % H == 0
            assert sent == (step_intra + synced * sync_intra, synced * sync_inter), (rank, step)
        assert runs[rank]["finish_bytes"] == (sync_intra, sync_inter), rank


def test_a_run_resumed_between_syncs_ends_as_the_run_left_alone(layout):
    """A checkpoint between outer steps (rank 0's model; each rank's optimizer state with its own parameters,
    and its hook state with its own buffers and the synced ones) resumes bit for bit."""
    nodes, gpus, runs = layout
    for rank in range(nodes * gpus):
        resumed, (params, buffers, deployed) = runs[rank]["resumed"], runs[rank]["final"]
        assert all(torch.equal(a, b) for a, b in zip(resumed["params"], params)), rank
        assert all(torch.equal(a, b) for a, b in zip(resumed["buffers"], buffers)), rank
        for got, want in zip(resumed["deployed"], deployed):
            assert all(torch.equal(a, b) for a, b in zip(got, want)), rank


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
    _, saved = run(RESUME_AT, None)  # after one outer step and one inner step
    resumed, _ = run(None, saved)
    assert all(torch.equal(a, b) for a, b in zip(alone, resumed))


def test_synchronised_shows_the_outer_model_and_restores_the_workers_own():
    """One process: inside synchronised() the parameters are theta_{t-1} (before any sync, theta_0); on exit
    the worker's own again, even when the body raises."""
    from birder_repro.optim import DiLoCo

    model = _net()
    theta0 = _copy(model.parameters())
    opt = DiLoCo(model.parameters(), local_steps=H, **INNER)
    for step in range(H + 1):
        if step == H:
            theta1 = _copy(model.parameters())  # right after the first sync
        _loss(model, _batch(0, step)).backward()
        opt.step()
        opt.zero_grad()
        own = _copy(model.parameters())
        with opt.synchronised():
            inside = _copy(model.parameters())
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), own))
        if step < H - 1:
            assert all(torch.equal(a, b) for a, b in zip(inside, theta0)), step
    assert all(torch.equal(a, b) for a, b in zip(inside, theta1))
    with pytest.raises(RuntimeError, match="inside"):
        with opt.synchronised():
            raise RuntimeError("inside")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), own))


def test_diloco_is_a_local_steps_optimizer():
    from birder_repro.optim import DiLoCo
    from birder_repro.optim.common import LocalSteps

    assert isinstance(DiLoCo(_net().parameters()), LocalSteps)
    assert not isinstance(torch.optim.AdamW(_net().parameters()), LocalSteps)


def test_attach_diloco_refuses_a_ddp_model_that_broadcasts_its_buffers():
    run_distributed(_refused, 2)


def _refused(rank: int, world: int) -> None:
    from birder_repro.comm import attach_diloco
    from birder_repro.optim import DiLoCo

    ddp = nn.parallel.DistributedDataParallel(_net())  # broadcast_buffers=True, DDP's default
    with pytest.raises(ValueError, match="broadcast_buffers=False"):
        attach_diloco(ddp, DiLoCo(ddp.parameters()), gpus_per_node=1)


def test_diloco_settings_are_checked():
    from birder_repro.optim import DiLoCo

    params = list(_net().parameters())
    with pytest.raises(ValueError, match="local_steps must be an integer >= 1"):
        DiLoCo(params, local_steps=0)
    with pytest.raises(ValueError, match="outer_momentum must be in"):
        DiLoCo(params, outer_momentum=1.0)


def test_the_record_has_the_outer_steps_and_their_time():
    from birder_repro.optim import DiLoCo
    from birder_repro.train.run_figures import outer_steps

    model = _net()
    opt = DiLoCo(model.parameters(), local_steps=H, **INNER)
    for step in range(STEPS):
        _loss(model, _batch(0, step)).backward()
        opt.step()
        opt.zero_grad()
    got = outer_steps(opt)
    assert got["outer_steps"] == STEPS // H and got["outer_step_s"] > 0
    assert outer_steps(torch.optim.AdamW(model.parameters())) == {"outer_steps": None, "outer_step_s": None}
