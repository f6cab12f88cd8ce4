"""Non-finite gradients in the compressed hooks: the whole step is skipped on every rank alike."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.birder import attach_birder
from birder_repro.optim import Birder

NODES, GPUS, STEPS, BAD_STEP, BAD_RANK = 2, 2, 5, 2, 3


def _hook_state(state) -> dict:
    return {(i, k): t.clone() for i, b in state.store.buckets.items() for k, t in b.state.items()}


def _script(rank: int, world: int, mode: str, overlap: bool):
    """A user's own training script: Birder + attach_birder on 2 nodes x 2 processes; rank 3's loss is
    multiplied by NaN at step 2."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)  # a few buckets
    opt = Birder(ddp.parameters(), lr=0.01)
    state = attach_birder(ddp, opt, gpus_per_node=GPUS, overlap=overlap, nonfinite=mode)
    gen = torch.Generator().manual_seed(rank)
    out = {"params": [], "hook": [], "error": None}
    for step in range(STEPS):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x), y)
        if step == BAD_STEP and rank == BAD_RANK:
            loss = loss * float("nan")
        try:  # raise mode fails at the optimizer's step, where the flags are read (once per step)
            loss.backward()
            opt.step()
        except (RuntimeError, FloatingPointError) as exc:
            out["error"] = str(exc)
            return out
        opt.zero_grad()
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["hook"].append(_hook_state(state))
    out["nonfinite_steps"] = state.nonfinite_steps
    state.close()
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_a_nan_on_one_rank_skips_the_whole_step_on_every_rank(overlap):
    runs = run_distributed(_script, NODES * GPUS, "skip", overlap)
    for rank, run in enumerate(runs):
        assert run["nonfinite_steps"] == 1, rank
        before, skipped, after = run["params"][BAD_STEP - 1], run["params"][BAD_STEP], run["params"][BAD_STEP + 1]
        assert all(torch.equal(a, b) for a, b in zip(before, skipped)), f"rank {rank}: the skipped step moved x"
        assert not all(torch.equal(a, b) for a, b in zip(skipped, after)), f"rank {rank}: training stopped"
        assert all(torch.isfinite(p).all() for p in run["params"][-1])
        hook_before, hook_skipped = run["hook"][BAD_STEP - 1], run["hook"][BAD_STEP]
        assert hook_before.keys() == hook_skipped.keys()
        for key in hook_before:  # m, b, e, e_bar of every bucket untouched by the skipped step
            assert torch.equal(hook_before[key], hook_skipped[key]), (rank, key)
            assert torch.isfinite(run["hook"][-1][key]).all(), (rank, key)
        for p, q in zip(run["params"][-1], runs[0]["params"][-1]):
            assert torch.equal(p, q), f"rank {rank} differs from rank 0"


def test_nonfinite_raise_fails_the_step_naming_it_and_the_bucket():
    runs = run_distributed(_script, NODES * GPUS, "raise", True)
    for run in runs:
        assert run["error"] is not None and "non-finite gradient" in run["error"]
        assert "bucket" in run["error"] and f"step {BAD_STEP + 1}" in run["error"]


ONEBIT_BAD = (1, 3)  # one step in the warmup (fp32 all-reduce), one in the compression stage (freeze_step=2)


def _onebit_script(rank: int, world: int):
    from birder_repro.comm.onebit import attach_onebit
    from birder_repro.optim import OneBitAdam

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)
    opt = OneBitAdam(ddp.parameters(), lr=0.01, freeze_step=2)
    state = attach_onebit(ddp, opt)
    gen = torch.Generator().manual_seed(rank)
    out = {"params": [], "state": []}
    for step in range(6):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x), y)
        if step in ONEBIT_BAD and rank == 1:
            loss = loss * float("inf")
        loss.backward()
        opt.step()
        opt.zero_grad()
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["state"].append(
            {
                **{(i, k): t.clone() for i, b in state.store.buckets.items() for k, t in b.state.items()},
                **{
                    (j, k): t.clone()
                    for j, p in enumerate(model.parameters())
                    for k, t in opt.state[p].items()
                    if isinstance(t, torch.Tensor)
                },
            }
        )
    out["nonfinite_steps"], out["steps_done"] = state.nonfinite_steps, opt.steps_done
    state.close()
    return out


def test_onebit_adam_skips_a_nonfinite_step_in_both_stages():
    runs = run_distributed(_onebit_script, 4)
    for rank, run in enumerate(runs):
        assert run["nonfinite_steps"] == 2 and run["steps_done"] == 4, rank
        for bad in ONEBIT_BAD:
            assert all(torch.equal(a, b) for a, b in zip(run["params"][bad - 1], run["params"][bad])), (rank, bad)
            before, after = run["state"][bad - 1], run["state"][bad]
            for key in before:  # momentum, variance, worker and server errors untouched
                assert torch.equal(before[key], after[key]), (rank, bad, key)
        assert all(torch.isfinite(p).all() for p in run["params"][-1])
        assert not all(torch.equal(a, b) for a, b in zip(run["params"][-2], run["params"][-1]))
        for p, q in zip(run["params"][-1], runs[0]["params"][-1]):
            assert torch.equal(p, q), rank


@pytest.mark.parametrize("mode", ["skip", "raise"])
def test_the_flags_of_all_buckets_are_read_in_one_host_sync(monkeypatch, mode):
    """A read per bucket syncs the device once per bucket on a GPU: the step's flags are read together, once
    (counted on the CPU: host_syncs.py), for a finite step and for a skipped one."""
    from host_syncs import counted_reads

    from birder_repro.comm.nonfinite import NonFiniteGuard

    guard = NonFiniteGuard(mode, rank=1)
    for bad in (False, True):
        for index in range(6):
            guard.note(torch.tensor(1.0 if bad and index == 4 else 0.0), index, 7)
        with counted_reads(monkeypatch) as reads:
            try:
                assert guard.end_step() == bad
            except FloatingPointError as exc:
                assert mode == "raise" and bad and "DDP bucket 4 at the hook's step 7" in str(exc)
        assert len(reads) == 1, reads


def test_a_load_drops_the_flags_a_settling_pass_left():
    """The integrations run one forward and backward before loading a checkpoint (DDP's buckets as the saved run
    had them); its flags belong to no step of the resumed run: a non-finite settle batch must not skip the first
    resumed step. The guard alone, as the hook states' load_state_dict hands it its part."""
    from birder_repro.comm.nonfinite import NonFiniteGuard

    guard = NonFiniteGuard("skip")
    guard.note(torch.tensor(1.0), index=0, step=0)  # the settling pass saw a NaN
    assert guard.pending
    guard.load_state_dict({"nonfinite_steps": 3})
    assert not guard.pending and not guard.skip_step and guard.nonfinite_steps == 3
    assert guard.end_step() is False  # the first resumed step runs


def test_gradscalers_inf_outside_the_buckets_skips_and_restores_in_the_same_read(monkeypatch):
    """GradScaler found an Inf the hook's buckets did not hold (a parameter outside DDP, say): the step is
    skipped and the bucket's state restored, with the flags and the verdict read in one copy; the hook's own
    count of non-finite steps is not raised (GradScaler counts its skips)."""
    import types

    from host_syncs import counted_reads

    from birder_repro.comm.nonfinite import NonFiniteGuard

    bucket = types.SimpleNamespace(step=5, state={"m": torch.zeros(3)})
    bucket.workspace = lambda name, like: torch.empty_like(like)
    guard = NonFiniteGuard("skip")
    guard.backup(bucket)
    bucket.state["m"].add_(1.0)
    bucket.step += 1
    guard.note(torch.tensor(0.0), index=0, step=6)
    with counted_reads(monkeypatch) as reads:
        assert guard.end_step(torch.tensor([1.0])) is True
    assert len(reads) == 1
    assert bucket.step == 5 and torch.equal(bucket.state["m"], torch.zeros(3)) and guard.nonfinite_steps == 0
    guard.note(torch.tensor(0.0), index=0, step=6)
    assert guard.end_step(torch.tensor([0.0])) is False
