"""DiLoCo with a 1-bit outer exchange (birder_repro.optim.DiLoCo1bit over birder_repro.comm.diloco_onebit) against
the single-process reference (birder_repro.references.diloco_onebit): 4 gloo processes as 2 nodes x 2, H = 3.

The reference keeps one model per node and feeds it the average of its two processes' gradients (each process's
own, recorded at the run's parameters as tests/test_diloco.py does); every H steps it averages the nodes'
outer gradients with the scale, Birder's quantizer and error feedback, with the hook's documented draws. The
quantizer is discontinuous, so the check is bit for bit up to float rounding (rtol 1e-5): a single differing
draw would move an element by twice its tensor's scale.
"""

from __future__ import annotations

import copy

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

# Imported here, before the processes start: the kernels size numba's thread pool from this process's
# environment (birder_repro.comm.kernels), which the processes inherit.
from birder_repro.comm.diloco_onebit import attach_diloco_1bit
from birder_repro.optim.diloco_1bit import DiLoCo1bit

NODES, GPUS, WORLD = 2, 2, 4
H, STEPS = 3, 10  # three outer steps and one inner step after them
SAVE_AT = 7  # a checkpoint after two outer steps and one inner step
INNER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
OUTER_LR, OUTER_MU, SEED = 0.7, 0.9, 5
CLOSE = dict(rtol=1e-5, atol=1e-6)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _run(rank: int, world: int, gpus: int) -> dict:
    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = DiLoCo1bit(ddp.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, seed=SEED, **INNER)
    state = attach_diloco_1bit(ddp, opt, gpus_per_node=gpus, kernel_backend="torch")  # no numba compile
    out: dict = {"grads": [], "params": [], "inter": [], "outer": []}
    saved = None
    for step in range(STEPS):
        if step == SAVE_AT:  # after two outer steps and one inner step: the errors hold something
            saved = copy.deepcopy((model.state_dict(), opt.state_dict(), state.state_dict()))  # as a file would
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
        with opt.synchronised():
            out["outer"].append([p.detach().clone() for p in model.parameters()])
    if rank == 0:
        out["hook_state"] = state.state_dict()
    opt.finish()
    out["finished"] = [p.detach().clone() for p in model.parameters()]
    out["outer_steps"] = (opt.outer_steps, state.outer_steps)
    out["resumed"] = _resume(rank, gpus, saved)
    out["nearest"] = _nearest(rank, gpus)
    return out


def _nearest(rank: int, gpus: int) -> dict:
    """The same run with optim.comm.rounding=nearest: each step's gradients (at the run's parameters) and
    parameters."""
    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = DiLoCo1bit(ddp.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, seed=SEED, **INNER)
    attach_diloco_1bit(ddp, opt, gpus_per_node=gpus, kernel_backend="torch", rounding="nearest")
    out: dict = {"grads": [], "params": []}
    for step in range(STEPS):
        plain = _net()
        plain.load_state_dict(model.state_dict())
        _loss(plain, _batch(rank, step)).backward()
        out["grads"].append([p.grad.clone() for p in plain.parameters()])
        _loss(ddp, _batch(rank, step)).backward()
        opt.step()
        opt.zero_grad()
        out["params"].append([p.detach().clone() for p in model.parameters()])
    return out


def _resume(rank: int, gpus: int, saved) -> list[torch.Tensor]:
    """A fresh model, optimizer and hook loaded from the checkpoint taken at SAVE_AT, run to the end."""
    model = _net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = DiLoCo1bit(ddp.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, seed=SEED, **INNER)
    state = attach_diloco_1bit(ddp, opt, gpus_per_node=gpus, kernel_backend="torch")
    model_sd, opt_sd, hook_sd = saved
    model.load_state_dict(model_sd)
    opt.load_state_dict(opt_sd)
    state.load_state_dict(hook_sd)
    for step in range(SAVE_AT, STEPS):
        _loss(ddp, _batch(rank, step)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_run, WORLD, GPUS)


def _reference(runs, keep_error: bool = True, rounding: str = "stochastic"):
    from birder_repro.references.diloco_onebit import ReferenceDiLoCoOneBit

    ref = ReferenceDiLoCoOneBit(
        [_net() for _ in range(NODES)], INNER, H, OUTER_LR, OUTER_MU, SEED, keep_error=keep_error, rounding=rounding
    )
    history = []
    for step in range(STEPS):
        grads = []
        for k in range(NODES):
            pairs = zip(*(_of(runs[k * GPUS + j], rounding)["grads"][step] for j in range(GPUS)))
            grads.append([sum(gs) / GPUS for gs in pairs])
        ref.step(grads)
        history.append([[p.detach().clone() for p in m.parameters()] for m in ref.models])
    return history, ref


def _of(run: dict, rounding: str) -> dict:
    return run["nearest"] if rounding == "nearest" else run


def _differs(runs, want) -> bool:
    return any(
        not torch.allclose(a, b, **CLOSE)
        for step in range(STEPS)
        for rank in range(WORLD)
        for a, b in zip(runs[rank]["params"][step], want[step][rank // GPUS])
    )


def test_diloco_1bit_follows_the_reference(runs):
    want, _ = _reference(runs)
    for step in range(STEPS):
        for rank in range(WORLD):
            for a, b in zip(runs[rank]["params"][step], want[step][rank // GPUS]):
                torch.testing.assert_close(a, b, **CLOSE, msg=lambda m, s=step, r=rank: f"step {s + 1} rank {r}: {m}")
    assert runs[0]["outer_steps"] == (STEPS // H + 1, STEPS // H + 1)  # finish() took one more


def test_nearest_rounding_follows_the_reference(runs):
    """optim.comm.rounding=nearest: the sign at the worker and the server (the reference's Q with every draw 1/2)."""
    want, _ = _reference(runs, rounding="nearest")
    for step in range(STEPS):
        for rank in range(WORLD):
            for a, b in zip(runs[rank]["nearest"]["params"][step], want[step][rank // GPUS]):
                torch.testing.assert_close(a, b, **CLOSE, msg=lambda m, s=step, r=rank: f"step {s + 1} rank {r}: {m}")
    stochastic = zip(runs[0]["nearest"]["params"][H - 1], runs[0]["params"][H - 1])
    assert not all(torch.equal(a, b) for a, b in stochastic)


def test_error_feedback_matters_here(runs):
    """The reference without error feedback parts from the run: the test above would see a hook that dropped it."""
    want, _ = _reference(runs, keep_error=False)
    assert _differs(runs, want)


def test_resumed_from_a_checkpoint_between_outer_steps_equals_the_run_left_alone(runs):
    """The hook's errors are in its state_dict: a run resumed from it at step 8 continues as the one left alone
    (the optimizer's own checkpoint keeps each rank's parameters, outer parameters and momentum)."""
    for rank in range(WORLD):
        assert all(torch.equal(a, b) for a, b in zip(runs[rank]["resumed"], runs[rank]["params"][-1])), rank


def test_the_errors_are_in_the_checkpointed_state(runs):
    sd = runs[0]["hook_state"]
    assert sd["scheme"] == "diloco_1bit"
    buckets = sd["exchange"]["buckets"]["buckets"]
    (bucket,) = buckets.values()
    assert bucket["state"]["e"].abs().sum() > 0 and bucket["state"]["e_bar"].abs().sum() > 0


def test_every_rank_meets_at_each_outer_step_and_synchronised_shows_it(runs):
    for step in range(STEPS):
        across = all(torch.equal(a, b) for a, b in zip(runs[0]["params"][step], runs[2]["params"][step]))
        assert across == ((step + 1) % H == 0), f"step {step + 1}"
        for rank in range(1, WORLD):  # synchronised(): the outer model, the same on every rank
            assert all(torch.equal(a, b) for a, b in zip(runs[0]["outer"][step], runs[rank]["outer"][step]))
        if (step + 1) % H == 0:
            assert all(torch.equal(a, b) for a, b in zip(runs[0]["outer"][step], runs[0]["params"][step]))
    # the block restored each rank's own parameters: the recorded ones are the rank's (checked against the
    # reference above); finish() ended on a sync: every rank holds the same parameters
    for rank in range(1, WORLD):
        assert all(torch.equal(a, b) for a, b in zip(runs[0]["finished"], runs[rank]["finished"]))


def test_inter_node_bytes_are_a_32nd_of_dilocos_plus_the_scales(runs):
    numel = sum(p.numel() for p in _net().parameters())
    tensors = len(list(_net().parameters()))
    padded = -(-numel // (8 * WORLD)) * (8 * WORLD)
    chunk = padded // (8 * GPUS * NODES)  # bytes of a server chunk
    want = (NODES - 1) * (chunk + 1) + (NODES - 1) * chunk + 2 * (NODES - 1) / NODES * 8 * tensors
    for step, sent in enumerate(runs[0]["inter"]):
        assert sent == (want if (step + 1) % H == 0 else 0), step
    # the signs are a 32nd of DiLoCo's fp32 exchange of the same (padded) shard, 2 (n-1)/n 4 P'/m
    assert 2 * (NODES - 1) * chunk * 32 == 2 * (NODES - 1) / NODES * 4 * padded / GPUS


def test_one_process_is_dilocos_single_worker_and_finish_is_idempotent():
    from birder_repro.optim import DiLoCo

    def run(cls):
        model = _net()
        opt = cls(model.parameters(), local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, **INNER)
        for step in range(STEPS):
            _loss(model, _batch(0, step)).backward()
            opt.step()
            opt.zero_grad()
        return model, opt

    (a, _), (b, opt) = run(DiLoCo), run(DiLoCo1bit)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with opt.synchronised():
        inside = [p.detach().clone() for p in b.parameters()]
    assert all(torch.equal(x, y) for x, y in zip(inside, opt._outer))
    assert not all(torch.equal(x, y) for x, y in zip(inside, b.parameters()))  # one inner step since the sync
    opt.finish()
    after = [p.detach().clone() for p in b.parameters()]
    assert opt.outer_steps == STEPS // H + 1 and all(torch.equal(x, y) for x, y in zip(after, opt._outer))
    opt.finish()
    assert opt.outer_steps == STEPS // H + 1


def test_bad_seed_is_refused():
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        DiLoCo1bit(list(_net().parameters()), seed=-1)
