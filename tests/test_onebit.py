"""1-bit Adam and 1-bit LAMB: the optimizers, the compressed all-reduce and its DDP hook.

One spawn of 4 gloo processes (laid out as 2 nodes x 2) runs every distributed scenario: starting processes that
import torch is most of the cost. Each rank returns what it saw, and the tests below compare it, in this
process, with the single-process references of tests/onebit_reference.py (written from the papers), so that
every check fails on its own.

Tolerances: the compressed all-reduce on identical inputs is compared exactly (bits) and to 1e-6 (floats of
order 1: a few ulps, from summing in another order); the optimizers' trajectories to rtol 1e-5,
atol 1e-6, which covers gloo's ring summation order in the warmup all-reduce (a few ulps) carried through
the steps; a wrong formula, stage or mask moves parameters by orders of magnitude more.
"""

from __future__ import annotations

import copy
import io
import time

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_distributed
from onebit_reference import CompressedAllReduceReference, OneBitAdamReference, OneBitLambReference
from torch import nn

from birder_repro.comm.onebit import attach_onebit
from birder_repro.comm.onebit_exchange import SCALE_BYTES, compressed_allreduce
from birder_repro.comm.pack import padded_size, unpack_signs
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import build_topology
from birder_repro.optim import OneBitAdam, OneBitLamb, build_optimizer, get_optim_info
from birder_repro.optim.onebit_adam import freeze_step_from_config
from birder_repro.optim.onebit_lamb import clip_ratio, momentum_scales

WORLD, GPUS_PER_NODE = 4, 2
ALLREDUCE_SIZES = (1001, 40)  # 1001 pads to 1024; 40 pads to 64, so the last server's chunk is all padding
ALLREDUCE_STEPS = 4
LARGE = 100_003  # a bucket large enough for the padding to be < 1 % of the bytes
FREEZE, STEPS, SAVE_AFTER = 3, 7, 5
ADAM = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
LAMB = dict(
    lr=2e-2,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.01,
    c_min=0.01,
    c_max=0.3,
    beta3=0.9,
    r_min=0.5,
    r_max=4.0,
    r_threshold=0.1,
)
UNUSED_ROWS = slice(8, 16)  # embedding rows no batch ever looks up: their gradient is always zero


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tensors of a few hundred elements: intra-op threads only contend on a loaded 2-core machine. (The spawned
    processes run on one thread already: tests/dist_utils.py.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ the model
class Net(nn.Module):
    """Small enough to be quick, with padding in every bucket and embedding rows that never get a gradient."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 4)
        self.fc1 = nn.Linear(10, 24)
        self.fc2 = nn.Linear(24, 3)

    def forward(self, x, idx):
        return self.fc2(torch.tanh(self.fc1(torch.cat([x, self.emb(idx)], dim=1))))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (
        torch.randn(8, 6, generator=g),
        torch.randint(0, UNUSED_ROWS.start, (8,), generator=g),
        torch.randn(8, 3, generator=g),
    )


def _loss(model, batch):
    x, idx, y = batch
    return ((model(x, idx) - y) ** 2).mean()


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


# ---------------------------------------------------------------------------- distributed scenarios
def _allreduce_inputs(numel: int, step: int, rank: int):
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + numel)
    x = torch.randn(numel, generator=g)
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.15  # the same on every rank
    return x, mask


def _scenario_allreduce(rank: int, topology) -> dict:
    out = {}
    for numel in (*ALLREDUCE_SIZES, LARGE):
        padded = padded_size(numel, 8 * WORLD)
        we, se = torch.zeros(padded), torch.zeros(padded // WORLD)
        stats = CommState()
        steps = []
        t0 = time.perf_counter()
        for step in range(ALLREDUCE_STEPS if numel != LARGE else 1):
            x, mask = _allreduce_inputs(numel, step, rank)
            xp, mp = torch.zeros(padded), torch.zeros(padded, dtype=torch.bool)
            xp[:numel], mp[:numel] = x, mask
            ex = compressed_allreduce(xp, we, se, mp, stats=stats, topology=topology)
            if numel != LARGE:
                steps.append({**ex._asdict(), "worker_error": we.clone(), "server_error": se.clone()})
        out[numel] = {
            "steps": steps,
            "intra": stats.intra_node_bytes,
            "inter": stats.inter_node_bytes,
            "compress_s": stats.compress_seconds,
            "comm_s": stats.collective_seconds,
            "wall_s": time.perf_counter() - t0,
        }
    return out


def _local_grads(model, batch) -> list[torch.Tensor]:
    """This rank's own gradient at the current parameters, from a copy outside DDP."""
    shadow = copy.deepcopy(model)
    shadow.zero_grad()
    _loss(shadow, batch).backward()
    return [p.grad.detach().clone() for p in shadow.parameters()]


def _train_step(ddp, opt, state, rank, step) -> dict:
    batch = _batch(rank, step)
    grads = _local_grads(ddp.module, batch)
    stage, holds = state.stage(step), state.grad_holds()
    before = (state.intra_node_bytes, state.inter_node_bytes)
    opt.zero_grad()
    _loss(ddp, batch).backward()
    hook_stage, holds_after = state.last_stage, state.grad_holds()
    momentum_unused = ddp.module.emb.weight.grad[UNUSED_ROWS].clone()  # the hook's output, compression stage
    opt.step()
    flat = _flat(ddp.module)
    everyone = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(everyone, flat)
    return {
        "stage": stage,
        "hook_stage": hook_stage,
        "holds": (holds, holds_after),
        "grads": grads,
        "params": flat,
        "layout": {i: b.signature for i, b in state.store.buckets.items()},
        "identical": all(torch.equal(everyone[0], t) for t in everyone),
        "intra": state.intra_node_bytes - before[0],
        "inter": state.inter_node_bytes - before[1],
        "momentum_unused": momentum_unused,
    }


def _checkpoint(ddp, opt, state) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf)
    return buf.getvalue()


def _restore(blob: bytes, ddp, opt, state) -> None:
    ck = torch.load(io.BytesIO(blob), weights_only=False)
    ddp.module.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    state.load_state_dict(ck["hook"])


def _run(make_opt, rank: int, topology) -> dict:
    """A user's script: DDP, the optimizer, attach_onebit; trains, saves, continues, and resumes twice."""
    model = _net()
    initial = [p.detach().clone() for p in model.parameters()]
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # two buckets after the rebuild
    opt = make_opt(ddp.parameters())
    state = attach_onebit(ddp, opt, topology=topology, scale="bucket")  # the reference: one scale per bucket
    steps, blob = [], None
    t0 = time.perf_counter()
    for step in range(STEPS):
        steps.append(_train_step(ddp, opt, state, rank, step))
        if step + 1 == SAVE_AFTER:
            blob = _checkpoint(ddp, opt, state)
    changes = state.layout_changes
    seconds = (state.compress_seconds, state.collective_seconds, time.perf_counter() - t0)

    # Resume into the same objects: the hook state round-trips through state_dict / torch.save.
    _restore(blob, ddp, opt, state)
    same = [_train_step(ddp, opt, state, rank, step)["params"] for step in range(SAVE_AFTER, STEPS)]

    # Resume into fresh ones, as a restarted run does (DDP starts from its initial bucket layout again).
    model2 = _net()
    ddp2 = nn.parallel.DistributedDataParallel(model2, bucket_cap_mb=0.001)
    opt2 = make_opt(ddp2.parameters())
    state2 = attach_onebit(ddp2, opt2, topology=topology, scale="bucket")
    _restore(blob, ddp2, opt2, state2)
    fresh = [_train_step(ddp2, opt2, state2, rank, step) for step in range(SAVE_AFTER, STEPS)]
    return {
        "initial": initial,
        "steps": steps,
        "layout_changes": changes,
        "seconds": seconds,
        "resumed_same": same,
        "resumed_fresh": fresh,
        "resumed_fresh_layout_changes": state2.layout_changes,
        "resumed_fresh_pending": len(state2.store.pending),
    }


def _scenario_attach_checks(topology) -> dict:
    ddp = nn.parallel.DistributedDataParallel(_net())
    errors = {}
    for name, opt in (
        ("freeze_step_1", OneBitAdam(ddp.parameters(), freeze_step=1)),
        ("not_onebit", torch.optim.Adam(ddp.parameters())),
    ):
        try:
            attach_onebit(ddp, opt, topology=topology, scale="bucket")
            errors[name] = None
        except (ValueError, TypeError) as e:
            errors[name] = type(e).__name__
    return errors


def _all_scenarios(rank: int, world: int) -> bytes:
    torch.manual_seed(0)
    topology = build_topology(GPUS_PER_NODE)
    results = {
        "allreduce": _scenario_allreduce(rank, topology),
        "adam": _run(lambda ps: OneBitAdam(ps, freeze_step=FREEZE, **ADAM), rank, topology),
        "lamb": _run(lambda ps: OneBitLamb(ps, freeze_step=FREEZE, **LAMB), rank, topology),
        "attach": _scenario_attach_checks(topology),
    }
    # As bytes: tensors sent through a multiprocessing queue are shared memory that dies with this process.
    buf = io.BytesIO()
    torch.save(results, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dist_results() -> list[dict]:
    return [torch.load(io.BytesIO(b), weights_only=False) for b in run_distributed(_all_scenarios, WORLD)]


# ------------------------------------------------------------------ compressed all-reduce vs reference
@pytest.mark.parametrize("numel", ALLREDUCE_SIZES)
def test_compressed_allreduce_matches_reference_step_by_step(dist_results, numel):
    ref = CompressedAllReduceReference(numel, WORLD)
    chunk = ref.chunk
    for step in range(ALLREDUCE_STEPS):
        inputs = [_allreduce_inputs(numel, step, r) for r in range(WORLD)]
        want = ref([x for x, _ in inputs], inputs[0][1])
        for rank in range(WORLD):
            got = dist_results[rank]["allreduce"][numel]["steps"][step]
            where = f"numel {numel}, step {step}, rank {rank}"
            close = dict(rtol=1e-6, atol=1e-6, msg=lambda m: f"{where}: {m}")
            torch.testing.assert_close(got["result"][:numel], want["result"], **close)
            assert torch.equal(unpack_signs(got["worker_bits"]), want["worker_signs"][rank]), where
            torch.testing.assert_close(got["worker_scales"], want["worker_scales"], **close)
            assert torch.equal(unpack_signs(got["server_bits"]).reshape(-1), want["server_signs"]), where
            torch.testing.assert_close(got["server_scales"], want["server_scales"], **close)
            torch.testing.assert_close(got["worker_error"], ref.worker_errors[rank], **close)
            torch.testing.assert_close(
                got["server_error"], ref.server_error[rank * chunk : (rank + 1) * chunk], **close
            )
    if numel == 40:  # the last chunk is padding only: its server has nothing to send but a zero scale
        assert float(want["server_scales"][-1]) == 0.0


def test_compressed_allreduce_bytes(dist_results):
    """Per process: 2 (N-1)/N * P'/8 for the bits and 2 (N-1) scales; one of 3 peers is on this node."""
    n = WORLD
    for numel in (*ALLREDUCE_SIZES, LARGE):
        steps = ALLREDUCE_STEPS if numel != LARGE else 1
        padded = padded_size(numel, 8 * n)
        exact = steps * (2 * (n - 1) / n * padded / 8 + 2 * (n - 1) * SCALE_BYTES)
        for rank in range(n):
            r = dist_results[rank]["allreduce"][numel]
            assert r["intra"] + r["inter"] == pytest.approx(exact)
            assert r["intra"] == pytest.approx(exact / 3)  # peers: 1 on this node, 2 on the other
            # The counters time disjoint parts of the calls (compression, collectives) in seconds: both ran,
            # and together they fit in the wall time around the calls (a counter in ms, or counting a block
            # twice, would not).
            assert r["compress_s"] > 0 and r["comm_s"] > 0 and r["compress_s"] + r["comm_s"] <= r["wall_s"]
    ideal = 2 * (n - 1) / n * LARGE / 8 + 2 * (n - 1) * SCALE_BYTES  # the paper's volume, without padding
    got = dist_results[0]["allreduce"][LARGE]
    assert abs(got["intra"] + got["inter"] - ideal) / ideal < 0.01


# ----------------------------------------------------------------------------- 1-bit Adam under DDP
def _buckets(layout: dict) -> list[list[int]]:
    """Parameter indices of each bucket in buffer order; checks that they tile the buffer."""
    out = []
    for _, sig in sorted(layout.items()):
        offset = 0
        for _, off, numel in sig:
            assert off == offset, "bucket with gaps: the reference would lay it out differently"
            offset += numel
        out.append([i for i, _, _ in sig])
    return out


def _reference(which: str, initial: list[torch.Tensor]):
    if which == "adam":
        return OneBitAdamReference(initial, [], WORLD, freeze_step=FREEZE, **ADAM)
    return OneBitLambReference(initial, [], WORLD, freeze_step=FREEZE, **LAMB)


def _advance(ref, steps_by_rank: list[list[dict]], indices) -> list[torch.Tensor]:
    """The reference through the given steps, with every rank's gradients and the hook's layout of each step."""
    trajectory = []
    for k in indices:
        ref.step([steps_by_rank[r][k]["grads"] for r in range(WORLD)], _buckets(steps_by_rank[0][k]["layout"]))
        trajectory.append(torch.cat([x.reshape(-1) for x in ref.x]))
    return trajectory


@pytest.mark.parametrize("which", ["adam", "lamb"])
def test_parameters_identical_on_all_ranks_every_step(dist_results, which):
    stages = [s["stage"] for s in dist_results[0][which]["steps"]]
    assert stages == ["warmup"] * FREEZE + ["compression"] * (STEPS - FREEZE)
    for rank in range(WORLD):
        for step, s in enumerate(dist_results[rank][which]["steps"]):
            assert s["identical"], f"{which}: ranks differ after step {step + 1}"
            assert s["hook_stage"] == s["stage"] == stages[step]
            # what .grad holds once the hook ran (the training loop clips only gradients)
            want = "gradient" if stages[step] == "warmup" else "momentum"
            assert s["holds"] == (want, want), f"{which}, step {step + 1}"


@pytest.mark.parametrize("which", ["adam", "lamb"])
def test_matches_algorithm_1_on_each_side_of_the_freeze_step(dist_results, which):
    """1-bit Adam: warmup = Adam of Eq. (1) on averaged gradients, then frozen v and the compressed momentum.
    1-bit LAMB: LAMB with c_avg, then the compressed momentum, fresh variance and clipped scaling ratios."""
    res = [r[which] for r in dist_results]
    ref = _reference(which, res[0]["initial"])
    steps = [r["steps"] for r in res]
    for step, want in enumerate(_advance(ref, steps, range(STEPS))):
        torch.testing.assert_close(
            res[0]["steps"][step]["params"], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{which}, step {step + 1}: {m}"
        )
    assert res[0]["layout_changes"] == 0  # compression started after DDP's rebuild: one layout throughout
    if which == "lamb":
        assert any(r != 1.0 for r in ref.r), "the scaling ratios never moved: the test would not see them"


def test_onebit_adam_warmup_is_adam(dist_results):
    """The warmup steps equal torch's Adam-like update without bias correction, computed here by hand."""
    res = dist_results[0]["adam"]
    x = [p.clone() for p in res["initial"]]
    m = [torch.zeros_like(p) for p in x]
    v = [torch.zeros_like(p) for p in x]
    b1, b2 = ADAM["betas"]
    for step in range(FREEZE):
        for j in range(len(x)):
            g = torch.stack([dist_results[r]["adam"]["steps"][step]["grads"][j] for r in range(WORLD)]).mean(0)
            m[j] = b1 * m[j] + (1 - b1) * g
            v[j] = b2 * v[j] + (1 - b2) * g * g
            x[j] = x[j] - ADAM["lr"] * (m[j] / (v[j].sqrt() + ADAM["eps"]) + ADAM["weight_decay"] * x[j])
        torch.testing.assert_close(
            res["steps"][step]["params"], torch.cat([t.reshape(-1) for t in x]), rtol=1e-5, atol=1e-6
        )


def test_momentum_mask_keeps_zero_gradient_rows_still(dist_results):
    """Rows that never get a gradient have v = 0: their compressed momentum is exactly 0, so they only decay."""
    res = dist_results[0]["adam"]
    emb = slice(0, 64)  # the embedding is parameter 0, 16 x 4
    rows_at_freeze = res["steps"][FREEZE - 1]["params"][emb].reshape(16, 4)[UNUSED_ROWS]
    decay = 1 - ADAM["lr"] * ADAM["weight_decay"]
    for k, step in enumerate(range(FREEZE, STEPS), start=1):
        s = res["steps"][step]
        assert torch.count_nonzero(s["momentum_unused"]) == 0
        rows = s["params"][emb].reshape(16, 4)[UNUSED_ROWS]
        torch.testing.assert_close(rows, rows_at_freeze * decay**k, rtol=1e-6, atol=0)


def test_stage_switch_and_bytes_per_stage(dist_results):
    """Warmup: a flat fp32 ring all-reduce's bytes; compression: 2 (N-1)/N * P'/8 + scales per bucket."""
    n = WORLD
    res = dist_results[0]["adam"]
    numel = sum(p.numel() for p in res["initial"])
    sizes = [sum(k for _, _, k in sig) for sig in res["steps"][-1]["layout"].values()]
    warm = 2 * (n - 1) / n * numel * 4
    exact = sum(2 * (n - 1) / n * padded_size(k, 8 * n) / 8 + 2 * (n - 1) * SCALE_BYTES for k in sizes)
    unpadded = sum(2 * (n - 1) / n * k / 8 + 2 * (n - 1) * SCALE_BYTES for k in sizes)
    padding = sum(2 * (n - 1) / n * (padded_size(k, 8 * n) - k) / 8 for k in sizes)
    for step, s in enumerate(res["steps"]):
        total = s["intra"] + s["inter"]
        if step < FREEZE:
            assert total == pytest.approx(warm) and s["inter"] == pytest.approx(warm / GPUS_PER_NODE)
        else:
            assert total == pytest.approx(exact)
            assert abs(total - unpadded) <= padding + 1e-9
            assert s["intra"] == pytest.approx(total / 3)
    compress_s, comm_s, wall_s = res["seconds"]
    assert compress_s > 0 and comm_s > 0 and compress_s + comm_s <= wall_s  # disjoint parts of the steps


@pytest.mark.parametrize("which", ["adam", "lamb"])
def test_hook_state_round_trip_continues_identically(dist_results, which):
    """Saved after step 5 and loaded into the same DDP model, optimizer and hook: the same steps 6 and 7."""
    for rank in range(WORLD):
        res = dist_results[rank][which]
        uninterrupted = [res["steps"][step]["params"] for step in range(SAVE_AFTER, STEPS)]
        for got, want in zip(res["resumed_same"], uninterrupted):
            assert torch.equal(got, want), f"{which}: resuming diverged on rank {rank}"


@pytest.mark.parametrize("which", ["adam", "lamb"])
def test_resume_in_fresh_ddp_keeps_errors_through_layout_changes(dist_results, which):
    """A restarted run's DDP starts from its initial bucket layout and rebuilds after one step: the errors
    follow their elements through both changes (the reference keeps them per element, whatever the layout)."""
    res = [r[which] for r in dist_results]
    ref = _reference(which, res[0]["initial"])
    _advance(ref, [r["steps"] for r in res], range(SAVE_AFTER))
    fresh = [r["resumed_fresh"] for r in res]
    layouts = [f["layout"] for f in fresh[0]]
    assert layouts[0] != layouts[1] == res[0]["steps"][-1]["layout"], "DDP did not change its layout"
    for k, want in enumerate(_advance(ref, fresh, range(STEPS - SAVE_AFTER))):
        for rank in range(WORLD):
            assert fresh[rank][k]["identical"]
        torch.testing.assert_close(
            fresh[0][k]["params"],
            want,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m: f"{which}, resumed step {SAVE_AFTER + k + 1}: {m}",
        )
    assert res[0]["resumed_fresh_layout_changes"] == 2 and res[0]["resumed_fresh_pending"] == 0


def test_attach_checks(dist_results):
    assert dist_results[0]["attach"] == {"freeze_step_1": "ValueError", "not_onebit": "TypeError"}


# ----------------------------------------------------------------------------- single process
def _quadratic_grads(x: torch.Tensor) -> torch.Tensor:
    return 2 * (x - torch.arange(x.numel(), dtype=x.dtype).reshape(x.shape))


@pytest.mark.parametrize(
    "cls, kwargs, ref_cls", [(OneBitAdam, ADAM, OneBitAdamReference), (OneBitLamb, LAMB, OneBitLambReference)]
)
def test_single_process_matches_reference(cls, kwargs, ref_cls):
    """Without the hook: one worker, exact momentum with the variance frozen after freeze_step."""
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(5, 3))
    opt = cls([p], freeze_step=3, **kwargs)
    ref = ref_cls([p.detach()], [[0]], 1, freeze_step=3, **kwargs)
    for step in range(8):
        g = _quadratic_grads(p.detach()) + 0.1 * torch.randn(5, 3)
        p.grad = g.clone()
        opt.step()
        ref.step([[g]])
        torch.testing.assert_close(p.detach(), ref.x[0], rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step + 1}: {m}")
    assert opt.stage == "compression" and opt.steps_done == 8


def test_variance_is_frozen_after_the_freeze_step():
    p = nn.Parameter(torch.randn(4))
    opt = OneBitAdam([p], lr=1e-2, freeze_step=2)
    for step in range(5):
        p.grad = torch.randn(4)
        opt.step()
        v = opt.state[p]["exp_avg_sq"].clone()
        if step == 1:
            frozen = v
        if step > 1:
            assert torch.equal(v, frozen)


@pytest.mark.parametrize("cls", [OneBitAdam, OneBitLamb])
def test_converges_on_a_quadratic(cls):
    torch.manual_seed(0)
    p = nn.Parameter(torch.zeros(6))
    opt = cls([p], lr=0.05, freeze_step=20) if cls is OneBitAdam else cls([p], lr=0.2, freeze_step=20, c_max=10.0)
    target = torch.arange(6.0)
    for _ in range(300):
        p.grad = 2 * (p.detach() - target)
        opt.step()
    assert torch.allclose(p.detach(), target, atol=0.1), p


@pytest.mark.parametrize("cls", [OneBitAdam, OneBitLamb])
def test_zero_variance_elements_do_not_move_single_process(cls):
    """A gradient that appears only after the freeze step finds v = 0: masked, not lr * g / eps; the same for
    a parameter whose first gradient comes after the freeze."""
    p, late = nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(3))
    opt = cls([p, late], lr=1e-2, freeze_step=2)
    for step in range(4):
        p.grad = torch.tensor([1.0, 1.0, 0.0, 0.0]) if step < 2 else torch.ones(4)
        late.grad = None if step < 2 else torch.ones(3)
        opt.step()
    assert torch.equal(p.detach()[2:], torch.ones(2)) and torch.equal(late.detach(), torch.ones(3))
    assert p.detach()[0] < 1


def test_exp_avg_mask_of_a_param_group():
    p = nn.Parameter(torch.ones(4))
    opt = OneBitAdam([{"params": [p], "exp_avg_mask": [torch.tensor([1.0, 0.0, 1.0, 1.0])]}], lr=1e-2, freeze_step=1)
    p.grad = torch.ones(4)
    opt.step()
    moved = p.detach().clone()
    for _ in range(3):
        p.grad = torch.ones(4)
        opt.step()
    assert p.detach()[1] == moved[1] and p.detach()[0] < moved[0]
    sd = opt.state_dict()
    assert "exp_avg_mask_by_param" not in sd["param_groups"][0]


def test_state_dict_round_trip_single_process():
    def make():
        torch.manual_seed(3)
        p = nn.Parameter(torch.randn(3, 2))
        return p, OneBitLamb([p], freeze_step=2, **{k: v for k, v in LAMB.items()})

    p, opt = make()
    for step in range(6):
        p.grad = _quadratic_grads(p.detach())
        opt.step()
        if step == 2:
            saved = copy.deepcopy((p.detach().clone(), opt.state_dict()))
    q, opt2 = make()
    with torch.no_grad():
        q.copy_(saved[0])
    opt2.load_state_dict(saved[1])
    assert opt2.steps_done == 3
    for _ in range(3):
        q.grad = _quadratic_grads(q.detach())
        opt2.step()
    assert torch.equal(p.detach(), q.detach())


# ----------------------------------------------------------------------------- pieces and checks
def test_clip_ratio_follows_lines_18_and_19():
    assert clip_ratio(3.0, 1.0, 0.5, 4.0, 0.1) == pytest.approx(1.1)  # threshold first
    assert clip_ratio(0.1, 0.52, 0.5, 4.0, 0.1) == pytest.approx(0.5)  # then [r_min, r_max]
    assert momentum_scales([1.0, 3.0, 0.0]) == [2.0, pytest.approx(2 / 3), 1.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=-1.0),
        dict(betas=(1.0, 0.999)),
        dict(eps=0.0),
        dict(weight_decay=-1.0),
        dict(freeze_step=0),
        dict(freeze_step=2.5),
    ],
)
def test_argument_checks(kwargs):
    with pytest.raises(ValueError):
        OneBitAdam([nn.Parameter(torch.zeros(1))], **kwargs)


@pytest.mark.parametrize(
    "kwargs", [dict(c_min=0.5, c_max=0.1), dict(beta3=1.0), dict(r_min=2.0), dict(r_max=0.9), dict(r_threshold=1.0)]
)
def test_lamb_argument_checks(kwargs):
    with pytest.raises(ValueError):
        OneBitLamb([nn.Parameter(torch.zeros(1))], **kwargs)


def test_freeze_step_from_config():
    assert freeze_step_from_config({"freeze": 0.15, "total_steps": 1000}) == 150
    assert freeze_step_from_config({"freeze": 500, "total_steps": None}) == 500
    assert freeze_step_from_config({"freeze": 0.15, "total_steps": 4}) == 2  # DDP's rebuild needs two
    with pytest.raises(ValueError, match=r"optim\.freeze=0\.15 .*optim\.total_steps"):
        freeze_step_from_config({"freeze": 0.15, "total_steps": None})
    with pytest.raises(ValueError, match=r"optim\.freeze >= 1 is a number of steps and must be whole"):
        freeze_step_from_config({"freeze": 12.5})
    with pytest.raises(ValueError, match=r"optim\.freeze must be a fraction of the run in \(0, 1\)"):
        freeze_step_from_config({"freeze": 0})


def test_registry_and_recipes():
    from conftest import compose_config

    for name in ("onebit_adam", "onebit_lamb"):
        assert get_optim_info(name).comm == "onebit"
    cfg = compose_config(["task=resnet50", "optim=onebit_adam"])
    assert cfg.optim.lr == 0.001 and cfg.optim.lr_batch_scaling == 256 and cfg.optim.freeze == 0.15
    assert list(cfg.optim.betas) == [0.9, 0.999] and cfg.optim.weight_decay == 0.0001
    cfg.optim.total_steps = 1000  # what the worker fills in
    opt = build_optimizer([nn.Parameter(torch.zeros(2))], cfg.optim)
    assert isinstance(opt, OneBitAdam) and opt.freeze_step == 150
    lamb = compose_config(["optim=onebit_lamb"]).optim
    assert (lamb.c_min, lamb.c_max, lamb.beta3, lamb.r_min, lamb.r_max, lamb.r_threshold) == (
        0.01,
        0.3,
        0.9,
        0.5,
        4.0,
        0.1,
    )
    lamb.total_steps = 100
    assert isinstance(build_optimizer([nn.Parameter(torch.zeros(2))], lamb), OneBitLamb)
    cfg20 = compose_config(["task=resnet20", "optim=onebit_adam"])
    assert cfg20.optim.lr == 0.005 and cfg20.optim.weight_decay == 0.05
