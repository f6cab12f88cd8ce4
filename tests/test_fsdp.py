"""Birder and 1-bit Adam under FSDP2 (birder_repro.comm.fsdp): a user's FSDP2 script on 4 gloo processes
(2 nodes x 2, one unit per layer) against the DDP hook and against the single-process 1-bit Adam reference.

Birder's state and draws are per element at the element's position among all the parameters and keyed by the
node, so with 2 processes per node (an exact node average) the FSDP run must equal DDP's
``attach_birder(..., gpus_per_node=2, scheme="hierarchical")`` bit for bit. 1-bit Adam's scales are norms over
each exchanged vector (a unit's shard of one local rank), so its reference is laid out as FSDP lays out the
shards: each parameter's dim-0 chunk r, then its padding rows, per unit.
"""

from __future__ import annotations

import math

import pytest
import torch
from dist_utils import run_distributed
from onebit_reference import OneBitAdamReference
from torch import nn

from birder_repro.gpucheck.training import Layers
from birder_repro.references.deepspeed_onebit import Choices, DeepSpeedOnebitAdamReference

NODES, GPUS, WORLD = 2, 2, 4
LR, STEPS = 1e-2, 6
ONEBIT = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
FREEZE, ONEBIT_STEPS = 2, 5


# Three layers with row counts that do not split evenly over 2 processes (FSDP pads each parameter's dim-0
# shard): the model gpu-check's hooks section runs too.
Net = Layers


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 5, generator=gen)


def _sharded_net(mesh_shape=(NODES, GPUS)):
    """The user's script: a ("replicate", "shard") mesh, one FSDP unit per layer and the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    return model, mesh


def _fsdp_birder(rank, world, force_sum: bool = False):
    """``force_sum``: FSDP reduce-scatters a sum and divides after the hook (what it does with an fp16 reduce
    dtype too): the hook must still see the node average and hand back +-1."""
    from birder_repro.comm import attach_birder_fsdp
    from birder_repro.optim import Birder

    model, mesh = _sharded_net()
    if force_sum:
        for module in model.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)
    opt = Birder(model.parameters(), lr=LR, beta=0.9, weight_decay=1e-3)
    state = attach_birder_fsdp(model, opt, mesh)
    inter = []
    for step in range(STEPS):
        x, y = _batch(rank, step)
        before = state.inter_node_bytes
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        inter.append(state.inter_node_bytes - before)
    state.close()
    return {
        "params": torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]),
        "shards": [p.to_local().clone() for p in model.parameters()],
        "inter": inter,
        "stage": state.stage(0),
        "nonfinite": state.nonfinite_steps,
        "calls": state.calls,
        "saved": sorted(state.state_dict()),
    }


def _ddp_birder(rank, world):
    from birder_repro.comm import attach_birder
    from birder_repro.optim import Birder

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.0003)  # several buckets, unlike the units
    opt = Birder(ddp.parameters(), lr=LR, beta=0.9, weight_decay=1e-3)
    state = attach_birder(ddp, opt, gpus_per_node=GPUS, scheme="hierarchical")
    for step in range(STEPS):
        x, y = _batch(rank, step)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    state.close()
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def _fsdp_onebit(rank, world, scale="bucket"):
    """1-bit Adam under FSDP; each step also every rank's own full gradient (from a plain copy of the model)
    for the reference."""
    from birder_repro.comm import attach_onebit_fsdp
    from birder_repro.optim import OneBitAdam

    model, mesh = _sharded_net()
    initial = [p.full_tensor().clone() for p in model.parameters()]
    opt = OneBitAdam(model.parameters(), freeze_step=FREEZE, **ONEBIT)
    state = attach_onebit_fsdp(model, opt, mesh, overlap=rank % 2 == 0, scale=scale)  # both ways at once
    grads, params, stages = [], [], []
    for step in range(ONEBIT_STEPS):
        x, y = _batch(rank, step)
        plain = Net()
        with torch.no_grad():
            for q, p in zip(plain.parameters(), model.parameters()):
                q.copy_(p.full_tensor())
        nn.functional.mse_loss(plain(x), y).backward()
        grads.append([q.grad.clone() for q in plain.parameters()])
        stages.append(state.stage(step))
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        params.append([p.full_tensor().clone() for p in model.parameters()])
    state.close()
    return {"initial": initial, "grads": grads, "params": params, "stages": stages, "inter": state.inter_node_bytes}


def _birder_fsdp_state(mesh_shape=(NODES, GPUS)):
    from birder_repro.comm import attach_birder_fsdp
    from birder_repro.optim import Birder

    model, mesh = _sharded_net(mesh_shape)
    opt = Birder(model.parameters(), lr=LR, beta=0.9, weight_decay=1e-3)
    return model, opt, attach_birder_fsdp(model, opt, mesh)


def _train_steps(model, opt, rank: int, steps) -> None:
    for step in steps:
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _whole_hook_state(state) -> dict:
    """The hook's per-element state as whole tensors (what a checkpoint holds). Collective."""
    from birder_repro.train.fsdp_checkpoint import _hook_state

    return {k: v.full_tensor() for k, v in _hook_state(state, torch.device("cpu")).items()}


def _dcp_round_trip(rank, world, where: str):
    """Save after 3 steps (DCP), go on 3 steps; a fresh model loads the checkpoint and does the same 3 steps."""
    from pathlib import Path

    from birder_repro.train import fsdp_checkpoint

    model, opt, state = _birder_fsdp_state()
    _train_steps(model, opt, rank, range(3))
    fsdp_checkpoint.save_sharded(Path(where), model, opt, state, torch.device("cpu"))
    meta, saved = fsdp_checkpoint.hook_meta(state, opt, model), _whole_hook_state(state)
    _train_steps(model, opt, rank, range(3, 6))
    left_alone = torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])
    state.close()
    model, opt, state = _birder_fsdp_state()
    fsdp_checkpoint.load_sharded(Path(where), model, opt, state, meta, torch.device("cpu"))
    loaded = _whole_hook_state(state)
    _train_steps(model, opt, rank, range(3, 6))
    resumed = torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])
    state.close()
    return {"left_alone": left_alone, "resumed": resumed, "saved": saved, "loaded": loaded, "meta": meta}


class NetBN(Net):
    """Net with a BatchNorm after the first layer: its running statistics are each rank's own under FSDP."""

    def __init__(self):
        super().__init__()
        self.layers[0] = nn.Sequential(nn.Linear(8, 13), nn.BatchNorm1d(13))


def _bn_birder():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from birder_repro.comm import attach_birder_fsdp
    from birder_repro.optim import Birder

    torch.manual_seed(0)
    model = NetBN()
    mesh = init_device_mesh("cpu", (NODES, GPUS), mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    opt = Birder(model.parameters(), lr=LR, beta=0.9, weight_decay=1e-3)
    return model, opt, attach_birder_fsdp(model, opt, mesh)


def _onebit_adam():
    from birder_repro.comm import attach_onebit_fsdp
    from birder_repro.optim import OneBitAdam

    model, mesh = _sharded_net()
    opt = OneBitAdam(model.parameters(), freeze_step=FREEZE, **ONEBIT)
    return model, opt, attach_onebit_fsdp(model, opt, mesh)


def _whole(model) -> dict:
    return {
        "params": torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]),
        "buffers": {k: b.clone() for k, b in model.named_buffers()},
    }


def _resumes(rank, where: str, build, save_at: int, steps: int) -> dict:
    """Train ``save_at`` steps, save (DCP and the per-rank meta), go on to ``steps``; a fresh build loads the
    checkpoint and does the same steps. The two must end alike, bit for bit, on every rank."""
    from pathlib import Path

    from birder_repro.train import fsdp_checkpoint

    model, opt, state = build()
    _train_steps(model, opt, rank, range(save_at))
    fsdp_checkpoint.save_sharded(Path(where), model, opt, state, torch.device("cpu"))
    meta, saved = fsdp_checkpoint.hook_meta(state, opt, model), _whole(model)
    _train_steps(model, opt, rank, range(save_at, steps))
    left_alone, stage = _whole(model), state.stage(steps - 1)
    state.close()
    model, opt, state = build()
    fsdp_checkpoint.load_sharded(Path(where), model, opt, state, meta, torch.device("cpu"))
    loaded = _whole(model)
    _train_steps(model, opt, rank, range(save_at, steps))
    out = {
        "saved": saved,
        "loaded": loaded,
        "left_alone": left_alone,
        "resumed": _whole(model),
        "stages": (stage, state.stage(steps - 1)),
    }
    state.close()
    return out


def _all(rank, world, where):
    return {
        "fsdp": _fsdp_birder(rank, world),
        "fsdp_sum": _fsdp_birder(rank, world, force_sum=True),
        "ddp": _ddp_birder(rank, world),
        "onebit": _fsdp_onebit(rank, world),
        "onebit_tensor": _fsdp_onebit(rank, world, scale="tensor"),
        "dcp": _dcp_round_trip(rank, world, where),
        "bn": _resumes(rank, where + "/bn", _bn_birder, 2, 4),
        "onebit_resume": _resumes(rank, where + "/onebit", _onebit_adam, FREEZE + 1, ONEBIT_STEPS),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_distributed(_all, WORLD, str(tmp_path_factory.mktemp("dcp")))


def test_a_dcp_checkpoint_resumes_bit_for_bit(runs):
    for rank in range(WORLD):
        d = runs[rank]["dcp"]
        assert torch.equal(d["left_alone"], d["resumed"])
        assert d["saved"].keys() == d["loaded"].keys() and {k.split(".")[0] for k in d["saved"]} == {
            "m",
            "b",
            "e",
            "e_bar",
        }
        for k in d["saved"]:
            assert torch.equal(d["saved"][k], d["loaded"][k]), k


def _same(a: dict, b: dict) -> bool:
    return (
        torch.equal(a["params"], b["params"])
        and a["buffers"].keys() == b["buffers"].keys()
        and all(torch.equal(a["buffers"][k], b["buffers"][k]) for k in a["buffers"])
    )


def test_a_dcp_checkpoint_resumes_each_ranks_own_buffers(runs):
    """BatchNorm's running statistics differ between the ranks under FSDP (each its own batches; DDP would
    broadcast rank 0's): each rank gets its own back, and continues bit for bit."""
    bn = [runs[r]["bn"] for r in range(WORLD)]
    assert not torch.equal(
        bn[0]["saved"]["buffers"]["layers.0.1.running_mean"], bn[1]["saved"]["buffers"]["layers.0.1.running_mean"]
    )
    for r in range(WORLD):
        assert _same(bn[r]["loaded"], bn[r]["saved"]), f"rank {r}"
        assert _same(bn[r]["resumed"], bn[r]["left_alone"]), f"rank {r}"


def test_onebit_adam_under_fsdp_resumes_in_its_compression_stage_bit_for_bit(runs):
    """Saved after the warmup (the frozen variance, the step count and both error feedbacks in use)."""
    for r in range(WORLD):
        d = runs[r]["onebit_resume"]
        assert d["stages"] == ("compression", "compression")
        assert _same(d["resumed"], d["left_alone"]), f"rank {r}"


def _load_into_one_per_node(rank, world, where: str, meta: dict):
    """The 2 x 2 checkpoint loaded on 2 nodes x 1 process: DCP reshards every element's state."""
    from pathlib import Path

    from birder_repro.train import fsdp_checkpoint

    model, opt, state = _birder_fsdp_state((NODES, 1))
    fsdp_checkpoint.load_sharded(Path(where), model, opt, state, meta, torch.device("cpu"))
    out = {
        "params": torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]),
        "hook": _whole_hook_state(state),
    }
    state.close()
    return out


@pytest.mark.slow
def test_a_dcp_checkpoint_resumes_on_another_gpus_per_node(runs, tmp_path_factory):
    # the module's checkpoint directory holds the 2 x 2 one of test_a_dcp_checkpoint_resumes_bit_for_bit
    where = str(next(tmp_path_factory.getbasetemp().glob("dcp*")))
    resharded = run_distributed(_load_into_one_per_node, NODES, where, runs[0]["dcp"]["meta"])
    saved = runs[0]["dcp"]["saved"]
    for r in range(NODES):
        assert resharded[r]["hook"].keys() == saved.keys()
        for k in saved:  # m, b, e per node and e_bar of every element, whatever the processes per node
            assert torch.equal(resharded[r]["hook"][k], saved[k]), k


def test_user_fsdp_script_equals_ddp_hierarchical_bit_for_bit(runs):
    for rank in range(WORLD):
        assert torch.equal(runs[rank]["fsdp"]["params"], runs[rank]["ddp"]), f"rank {rank}"
    # the ranks with the same local rank on the two nodes hold identical shards
    for r in range(GPUS):
        for a, b in zip(runs[r]["fsdp"]["shards"], runs[GPUS + r]["fsdp"]["shards"]):
            assert torch.equal(a, b)
    s = runs[0]["fsdp"]
    assert s["stage"] is None and s["nonfinite"] == 0 and s["calls"] == 3 * STEPS  # 3 units
    assert {"buckets", "counters", "scheme", "seed"} <= set(s["saved"])


def test_fsdp_summing_before_the_hook_and_dividing_after_changes_nothing(runs):
    """set_force_sum_reduction_for_comms (as an fp16 reduce dtype does): FSDP sums, the hook gets m x the node
    average and FSDP divides after it. The hook takes the divide in and out: the same run bit for bit (without
    it, the +-1 leave FSDP as +-1/2)."""
    for rank in range(WORLD):
        assert torch.equal(runs[rank]["fsdp_sum"]["params"], runs[rank]["fsdp"]["params"]), f"rank {rank}"


def _shard_numels(rank_in_node: int) -> list[int]:
    """Each unit's shard on a process: every parameter's dim-0 chunk padded to ceil(rows / GPUS) rows."""
    out = []
    for layer in Net().layers:
        total = 0
        for p in layer.parameters():
            rows = math.ceil(p.shape[0] / GPUS)
            total += rows * (p.numel() // p.shape[0])
        out.append(total)
    return out


def test_inter_node_bytes_match_the_formula(runs):
    # Per unit: shard S padded to S' (a multiple of 8 n); all-to-all of n chunks of S'/(8n) bytes + 1 flag
    # byte each, and all-gather of the chunk: (n-1)(S'/(8n) + 1) + (n-1) S'/(8n) bytes to the other node.
    n = NODES
    want = 0
    for s in _shard_numels(0):
        chunk = math.ceil(s / (8 * n)) * 8 * n // (8 * n)
        want += (n - 1) * (chunk + 1) + (n - 1) * chunk
    for rank in range(WORLD):
        assert runs[rank]["fsdp"]["inter"] == [want] * STEPS


def _reference_layout(initial: list[torch.Tensor]):
    """The reference's "parameters" as FSDP lays out the shards: for each parameter its dim-0 chunk r and its
    padding rows (zeros, masked: their frozen variance stays 0); buckets: per unit and local rank r."""
    pieces, where, buckets = [], [], []
    index = 0
    for layer_params in ([0, 1], [2, 3], [4, 5]):
        for r in range(GPUS):
            bucket = []
            for j in layer_params:
                p = initial[j]
                rows = math.ceil(p.shape[0] / GPUS)
                lo, hi = min(r * rows, p.shape[0]), min((r + 1) * rows, p.shape[0])
                real = p[lo:hi].reshape(-1)
                width = p.numel() // p.shape[0]
                pieces.append(real.clone())
                where.append((j, lo * width, hi * width))
                bucket.append(len(pieces) - 1)
                if rows - (hi - lo):
                    pieces.append(torch.zeros((rows - (hi - lo)) * width))
                    where.append(None)
                    bucket.append(len(pieces) - 1)
            buckets.append(bucket)
            index += 1
    return pieces, where, buckets


def _follow(res: list[dict], ref, pieces, where, step_args=()) -> None:
    """The reference through every step of a 1-bit FSDP run: a node is one worker whose gradient is the average
    of its two processes'; every rank's parameters are the same and within rounding of the reference's."""

    def cut(full: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            torch.zeros(len(x)) if w is None else full[w[0]].reshape(-1)[w[1] : w[2]].clone()
            for x, w in zip(pieces, where)
        ]

    for step in range(ONEBIT_STEPS):
        node_grads = [
            [(a + b) / 2 for a, b in zip(cut(res[k * GPUS]["grads"][step]), cut(res[k * GPUS + 1]["grads"][step]))]
            for k in range(NODES)
        ]
        ref.step(node_grads, *step_args)
        got = cut(res[0]["params"][step])
        for rank in range(1, WORLD):
            assert all(torch.equal(a, b) for a, b in zip(got, cut(res[rank]["params"][step])))
        for a, b, w in zip(got, ref.x, where):
            if w is not None:
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"step {step + 1}: max {(a - b).abs().max()}"


def test_onebit_adam_under_fsdp_matches_the_reference(runs):
    res = [runs[r]["onebit"] for r in range(WORLD)]
    assert res[0]["stages"] == ["warmup"] * FREEZE + ["compression"] * (ONEBIT_STEPS - FREEZE)
    pieces, where, buckets = _reference_layout(res[0]["initial"])
    _follow(res, OneBitAdamReference(pieces, buckets, NODES, freeze_step=FREEZE, **ONEBIT), pieces, where)
    assert res[0]["inter"] > 0


def test_onebit_adam_under_fsdp_honours_a_scale_per_tensor(runs):
    """``scale="tensor"`` (optim=onebit_adam's default) under FSDP: a worker scale per parameter's piece of the
    unit's shard, a server scale per piece of one in a chunk: DeepSpeed's per-tensor compression laid out as
    FSDP lays out the shards (the reference of tests/test_onebit_deepspeed.py, cut by unit); and not the
    bucket-scale run."""
    res = [runs[r]["onebit_tensor"] for r in range(WORLD)]
    pieces, where, buckets = _reference_layout(res[0]["initial"])
    ref = DeepSpeedOnebitAdamReference(pieces, NODES, freeze_step=FREEZE, choices=Choices.project(NODES), **ONEBIT)
    _follow(res, ref, pieces, where, (buckets,))
    bucket_scale = runs[0]["onebit"]["params"][-1]
    assert any(not torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(res[0]["params"][-1], bucket_scale))
