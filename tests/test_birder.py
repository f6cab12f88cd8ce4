"""Birder: quantizer, packing, error feedback, and the hook against the single-process reference.

Multi-process tests run 4 gloo processes as 2 nodes x 2, all scenarios in one spawn (starting processes that
import torch is most of the cost); the hook overlaps (its communication thread) unless a test says otherwise.
Gradients are multiples of 1/8 in the core tests, so the node averages are
exact in any summation order and the hook must equal the reference bit for bit; the DDP tests replay every
bucket call the ranks made through the reference, which must give the same +-1 bit for bit.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
import torch.distributed as dist
from birder_reference import ReferenceBirder
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.birder import BirderState, attach_birder
from birder_repro.comm.pack import pack_bits, pack_signs, padded_size, unpack_signs
from birder_repro.comm.topology import build_topology
from birder_repro.optim.birder import Birder, server_step_, stochastic_sign_bits, worker_step_

NODES, GPUS = 2, 2
SIZES = (1001, 37)  # two buckets, neither a multiple of 8 * m * n = 32
VARIANTS = ("hierarchical", "flat", "allgather", "hierarchical-amsgrad", "flat-amsgrad")


def test_quantizer_is_unbiased():
    # E[Q(x)] = x on [-1, 1] (Eq. 5). 40000 draws per value: the mean's std is at most 1/200; 5 sigma = 0.025.
    x = torch.linspace(-1, 1, 21).repeat_interleave(40000)
    bits = stochastic_sign_bits(x, torch.rand(x.shape, generator=torch.Generator().manual_seed(0)))
    means = (bits.float() * 2 - 1).view(21, -1).mean(dim=1)
    assert torch.allclose(means, torch.linspace(-1, 1, 21), atol=0.025)
    # outside [-1, 1] the probability clips: always +1 above, always -1 below
    assert stochastic_sign_bits(torch.full((100,), 1.7), torch.rand(100)).all()
    assert not stochastic_sign_bits(torch.full((100,), -1.2), torch.rand(100)).any()


@pytest.mark.parametrize("numel", [1, 7, 9, 64, 1001, 4097])
def test_pack_round_trip_with_padding(numel):
    x = torch.randn(numel)
    padded = torch.zeros(padded_size(numel, 8 * 4))
    padded[:numel] = x
    packed = pack_signs(padded)
    assert packed.dtype == torch.uint8 and packed.numel() == padded.numel() // 8
    assert np.array_equal(packed.numpy(), np.packbits((padded > 0).numpy(), bitorder="little"))
    assert torch.equal(unpack_signs(packed)[:numel], torch.where(x > 0, 1.0, -1.0))
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_bits(torch.ones(9, dtype=torch.bool))


def test_error_feedback_invariant():
    # Algorithm 1 lines 7-8 and 11-12: u + e_new = m/b + e_old, and e stays bounded (|e| <= 2 while |m/b| <= 1).
    gen = torch.Generator().manual_seed(1)
    m, b, e, e_bar = (torch.zeros(5000) for _ in range(4))
    for _ in range(50):
        g = torch.randn(5000, generator=gen)
        e_old = e.clone()
        bits = worker_step_(g, m, b, e, torch.rand(5000, generator=gen), beta=0.9, eps=1e-8)
        u = bits.float() * 2 - 1
        assert torch.allclose(u + e, m / (b + 1e-8) + e_old, atol=1e-5)
        assert (m / (b + 1e-8)).abs().max() <= 1 + 1e-6
        assert e.abs().max() <= 2 + 1e-5
        e_bar_old = e_bar.clone()
        ub = server_step_(u, e_bar, torch.rand(5000, generator=gen)).float() * 2 - 1
        assert torch.allclose(ub + e_bar, u + e_bar_old, atol=1e-6)
        assert e_bar.abs().max() <= 2 + 1e-5


def _grads(step: int, bucket: int, world: int) -> torch.Tensor:
    """Every rank's gradient of a bucket at a step, the same on all ranks: multiples of 1/8 in [-2, 2]."""
    g = torch.Generator().manual_seed(1000 * step + bucket)
    return torch.randint(-16, 17, (world, SIZES[bucket]), generator=g).float() / 8


def _run_core(state: BirderState, rank: int, world: int, steps) -> list:
    out = []
    for t in steps:
        for bi, numel in enumerate(SIZES):
            buf = _grads(t, bi, world)[rank].clone()
            out.append(state.allreduce_bucket(bi, buf, ((bi, 0, numel),)).clone())
    return out


def _core_worker(rank, world):
    """Four steps of two buckets under every scheme, and a save / resume, in one set of processes."""
    out = {}
    for variant in VARIANTS:
        # "amsgrad": Algorithm 1's line 6 from step 3 on (amsgrad_after=2)
        scheme = variant.partition("-")[0]
        state = BirderState(
            build_topology(GPUS),
            scheme=scheme,
            beta=0.9,
            eps=1e-8,
            seed=7,
            param_numels=SIZES,
            amsgrad_after=2 if "amsgrad" in variant else None,
        )
        results = _run_core(state, rank, world, range(4))
        buckets = state.store.buckets
        shards = {bi: {k: b.state[k].clone() for k in ("m", "b", "e")} for bi, b in buckets.items()}
        out[variant] = (
            results,
            shards,
            state.snapshot(),
            state.worker_rank,
            {bi: b.state["m"].numel() for bi, b in buckets.items()},
        )
    out["resume"] = _resume_worker(rank, world)
    out["script"] = _user_script(rank, world)
    out["fresh"] = _resume_in_fresh_ddp(rank, world, out["script"]["checkpoint"])
    return out


@pytest.fixture(scope="module")
def core_runs():
    return run_distributed(_core_worker, NODES * GPUS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_hook_equals_reference(variant, core_runs):
    world = NODES * GPUS
    scheme = variant.partition("-")[0]
    per_rank = [r[variant] for r in core_runs]
    ref = ReferenceBirder(
        NODES,
        GPUS,
        scheme,
        beta=0.9,
        eps=1e-8,
        seed=7,
        param_numels=SIZES,
        amsgrad_after=2 if "amsgrad" in variant else None,
    )
    expected = []
    for t in range(4):
        for bi, numel in enumerate(SIZES):
            expected.append(ref.bucket(((bi, 0, numel),), numel, list(_grads(t, bi, world))))
    for rank, (results, shards, _, worker_rank, shard_sizes) in enumerate(per_rank):
        for got, want in zip(results, expected):
            assert torch.equal(got, want), f"rank {rank}"
        if scheme != "allgather":
            assert set(results[0].unique().tolist()) <= {-1.0, 1.0}
        # the worker state this rank owns is its shard of its worker's state
        worker = rank // GPUS if scheme == "hierarchical" else rank
        for bi, numel in enumerate(SIZES):
            lo = worker_rank * shard_sizes[bi]
            hi = min(lo + shard_sizes[bi], numel)
            for key in ("m", "b", "e"):
                want = ref.worker[worker][key][bi][lo:hi]
                assert torch.equal(shards[bi][key][: hi - lo], want), (rank, bi, key)


def test_byte_counts_match_formula(core_runs):
    n, m = NODES, GPUS
    for run in core_runs:
        counters = run["hierarchical"][2]
        per_step_inter = counters["inter_node_bytes"] / 4
        # each chunk of the all-to-all carries one more byte: the node's non-finite flag (comm/nonfinite.py)
        formula = sum(2 * (n - 1) / n * padded_size(p, 8 * m * n) / (8 * m) + (n - 1) for p in SIZES)
        assert per_step_inter == formula
        # intra: fp32 reduce-scatter of the padded bucket (and one fp32 flag per shard), plus the packed shards
        # to the other local rank
        intra = sum((m - 1) / m * (padded_size(p, 32) + m) * 4 + (m - 1) * padded_size(p, 32) / m / 8 for p in SIZES)
        assert counters["intra_node_bytes"] / 4 == intra


def _resume_worker(rank, world):
    topo = build_topology(GPUS)
    straight = BirderState(topo, scheme="hierarchical", beta=0.9, seed=3, param_numels=SIZES)
    full = _run_core(straight, rank, world, range(6))
    first = BirderState(topo, scheme="hierarchical", beta=0.9, seed=3, param_numels=SIZES)
    _run_core(first, rank, world, range(3))
    sd = first.state_dict()
    # the seed comes back from the checkpoint
    resumed = BirderState(topo, scheme="hierarchical", beta=0.9, seed=99, param_numels=SIZES)
    resumed.load_state_dict(sd)
    return full[len(SIZES) * 3 :], _run_core(resumed, rank, world, range(3, 6))


def test_state_dict_round_trip_continues_identically(core_runs):
    for run in core_runs:
        full_tail, resumed = run["resume"]
        assert all(torch.equal(a, b) for a, b in zip(full_tail, resumed))


class _Net(nn.Module):
    """Registered in an order unlike the order gradients arrive in, so DDP's rebuilt buckets differ."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.body = nn.Linear(12, 16)
        self.stem = nn.Linear(8, 12)

    def forward(self, x):
        return self.head(torch.tanh(self.body(torch.tanh(self.stem(x)))))


LR, SCRIPT_STEPS, SAVE_AFTER = 1e-2, 4, 2


@contextlib.contextmanager
def _recording_calls():
    """Every bucket call (index, signature, local gradient, result) of this process, in order, while open."""
    calls, original = [], BirderState.allreduce_bucket

    def recording(self, index, buffer, signature):
        grad = buffer.clone()
        out = original(self, index, buffer, signature)
        calls.append((index, signature, grad, out.clone()))
        return out

    BirderState.allreduce_bucket = recording
    try:
        yield calls
    finally:
        BirderState.allreduce_bucket = original


def _net_numels() -> list[int]:
    return [p.numel() for p in _Net().parameters()]


def _params(ddp) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone()


def _train(ddp, opt, rank, world, steps) -> tuple[list[bool], list[bool]]:
    """DDP steps on this rank's data of each step; whether the ranks' parameters agree after each step, and
    whether every element moved by exactly +-lr (u_bar is +-1 and there is no weight decay)."""
    identical, exact_steps = [], []
    for step in steps:
        gen = torch.Generator().manual_seed(1000 * step + 100 + rank)
        before = [p.detach().clone() for p in ddp.parameters()]
        x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        identical.append(all(torch.equal(gathered[0], g) for g in gathered))
        delta = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, ddp.parameters())])
        exact_steps.append(bool(torch.allclose(delta.abs(), torch.full_like(delta, LR), rtol=0, atol=1e-6)))
    return identical, exact_steps


def _checkpoint(ddp, opt, state) -> dict:
    """What a checkpoint file gives back (torch.save, then torch.load as the training loop does)."""
    buf = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _user_script(rank, world):
    """The README's three lines in a training script, through DDP's bucket rebuild; checkpointed on the way."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_Net(), bucket_cap_mb=0.0006)  # several small buckets
    # --- the three lines of the README ---
    opt = Birder(ddp.parameters(), lr=LR, beta=0.9, weight_decay=0.0)
    state = attach_birder(ddp, opt, gpus_per_node=GPUS, scheme="hierarchical")
    with _recording_calls() as calls:
        identical, exact_steps = _train(ddp, opt, rank, world, range(SAVE_AFTER))
        checkpoint, calls_at_save = _checkpoint(ddp, opt, state), len(calls)
        more = _train(ddp, opt, rank, world, range(SAVE_AFTER, SCRIPT_STEPS))
    state.close()
    return {
        "identical": identical + more[0],
        "exact": exact_steps + more[1],
        "calls": calls,
        "layout_changes": state.layout_changes,
        "checkpoint": checkpoint,
        "calls_at_save": calls_at_save,
        "params": _params(ddp),
        "overlaps": state.overlaps(),
    }


def _resume_in_fresh_ddp(rank, world, checkpoint):
    """A restarted run: a new process group and topology, a new DDP model with other buckets (bucket_cap_mb and
    DDP's initial layout), a new optimizer and hook; the checkpoint of the user script after SAVE_AFTER steps."""
    group = dist.new_group(list(range(world)))
    torch.manual_seed(1)  # other initial parameters: the checkpoint must bring them back
    ddp = nn.parallel.DistributedDataParallel(_Net(), bucket_cap_mb=0.002, process_group=group)
    opt = Birder(ddp.parameters(), lr=LR, beta=0.9, weight_decay=0.0)
    state = attach_birder(ddp, opt, topology=build_topology(GPUS))
    ddp.module.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    state.load_state_dict(checkpoint["hook"])
    with _recording_calls() as calls:
        identical, exact_steps = _train(ddp, opt, rank, world, range(SAVE_AFTER, SCRIPT_STEPS))
    state.close()
    return {
        "identical": identical,
        "exact": exact_steps,
        "calls": calls,
        "layout_changes": state.layout_changes,
        "pending": len(state.store.pending),
        "params": _params(ddp),
    }


def _replay(ref: ReferenceBirder, per_rank_calls: list[list], where: str) -> None:
    """Every rank's recorded bucket calls through the reference, in the order the ranks made them: the hook's
    result must be the reference's bit for bit on every rank."""
    n_calls = len(per_rank_calls[0])
    assert all(len(c) == n_calls for c in per_rank_calls), f"{where}: ranks made different numbers of calls"
    for i in range(n_calls):
        _, signature, grad, _ = per_rank_calls[0][i]
        assert all(c[i][1] == signature for c in per_rank_calls), f"{where}: ranks disagree on the layout"
        want = ref.bucket(signature, grad.numel(), [c[i][2] for c in per_rank_calls])
        for rank, c in enumerate(per_rank_calls):
            assert torch.equal(c[i][3], want), f"{where}: call {i}, rank {rank}"


def test_user_script_trains_identically_and_matches_reference_across_bucket_rebuild(core_runs):
    per_rank = [r["script"] for r in core_runs]
    for r in per_rank:
        assert all(r["identical"]), "parameters differ between ranks"
        assert all(r["exact"]), "an update was not +-lr per element"
        assert r["layout_changes"] >= 1, "DDP's bucket rebuild was not exercised"
    assert all(r["overlaps"] for r in per_rank), "the three lines should overlap by default"
    ref = ReferenceBirder(NODES, GPUS, "hierarchical", beta=0.9, eps=1e-8, seed=0, param_numels=_net_numels())
    _replay(ref, [r["calls"] for r in per_rank], "uninterrupted")


def test_resume_in_fresh_ddp_continues_exactly(core_runs):
    """Saved after SAVE_AFTER steps, loaded into a fresh DDP model on a new process group whose buckets differ
    (DDP's initial layout, then another bucket_cap_mb): the state (m, b, e, e_bar, step) goes on exactly where
    it was, through both layout changes, and the draws are per element position, not per bucket: the resumed
    run's parameters equal the uninterrupted run's bit for bit, and its +-1 are the reference's."""
    script, fresh = [r["script"] for r in core_runs], [r["fresh"] for r in core_runs]
    for r in fresh:
        assert all(r["identical"]), "parameters differ between ranks after the resume"
        assert all(r["exact"]), "an update was not +-lr per element after the resume"
        assert r["layout_changes"] >= 1 and r["pending"] == 0
    saved_layout = {i: sig for i, sig, _, _ in script[0]["calls"][: script[0]["calls_at_save"]]}
    resumed_layout = {i: sig for i, sig, _, _ in fresh[0]["calls"]}
    assert resumed_layout != saved_layout, "the resumed run's buckets were the saved ones: nothing to migrate"
    for rank, (straight, resumed) in enumerate(zip(script, fresh)):
        assert torch.equal(straight["params"], resumed["params"]), f"rank {rank}: resumed != uninterrupted"
    ref = ReferenceBirder(NODES, GPUS, "hierarchical", beta=0.9, eps=1e-8, seed=0, param_numels=_net_numels())
    _replay(ref, [r["calls"][: r["calls_at_save"]] for r in script], "before the checkpoint")
    _replay(ref, [r["calls"] for r in fresh], "resumed")
