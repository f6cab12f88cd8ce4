"""1-bit Adam with a scale per tensor (``optim.comm.scale=tensor``) against a reference written from DeepSpeed's
OnebitAdam and compressed all-reduce (birder_repro/references/deepspeed_onebit.py).

One spawn of 4 gloo processes (2 nodes x 2) trains the small model of tests/test_onebit.py with DDP and the hook
through the freeze step, twice: with one tensor per DDP bucket (DeepSpeed's own structure: each tensor its own
compressed all-reduce, its server chunks that tensor's) and with several tensors per bucket (the servers' chunks
cut over the bucket, the reference told so); the second run also saves, and resumes into a fresh DDP model
whose buckets change layout twice. The reference runs the project's deliberate departures from DeepSpeed
(:meth:`Choices.project`: masked padding and v == 0 elements, sign(0) -> -1, F Adam warmup steps); a test per
departure below shows that DeepSpeed's own choice is what the reference does without it.

Tolerance: rtol 1e-5, atol 1e-6 on the parameters, as tests/test_onebit.py: float rounding of the same sums in
another order (gloo's ring in the warmup, a norm by segment against one over a slice, p - lr u against
p.add_(u, alpha=-lr)) carried through 8 steps is a few ulps of values of order 1; a wrong scale (per bucket
against per tensor, padding counted, another chunk's norm) moves a parameter by lr x O(1) = 1e-2.
"""

from __future__ import annotations

import io

import pytest
import torch
from dist_utils import run_distributed
from test_onebit import ADAM, _batch, _buckets, _checkpoint, _loss, _net, _restore, _train_step
from torch import nn

from birder_repro.comm.onebit import attach_onebit
from birder_repro.comm.onebit_exchange import SCALE_BYTES
from birder_repro.comm.onebit_scales import (
    compress_segments_,
    compressed_allreduce_per_tensor,
    scale_counts,
    tensor_layout,
)
from birder_repro.comm.pack import padded_size
from birder_repro.comm.topology import build_topology
from birder_repro.optim import OneBitAdam
from birder_repro.perf.schemes import bucket_collectives, counted_bytes
from birder_repro.references.deepspeed_onebit import Choices, DeepSpeedOnebitAdamReference

WORLD, GPUS_PER_NODE = 4, 2
FREEZE, STEPS, SAVE_AFTER = 3, 8, 5
ALONE, GROUPED = 1e-6, 0.001  # bucket_cap_mb: every tensor its own bucket; two buckets of several tensors
CLOSE = dict(rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- distributed scenarios
def _run(rank: int, topology, cap_mb: float, resume: bool) -> dict:
    model = _net()
    initial = [p.detach().clone() for p in model.parameters()]
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    opt = OneBitAdam(ddp.parameters(), freeze_step=FREEZE, **ADAM)
    state = attach_onebit(ddp, opt, topology=topology, scale="tensor")
    steps, blob = [], None
    for step in range(STEPS):
        steps.append(_train_step(ddp, opt, state, rank, step))
        if step + 1 == SAVE_AFTER:
            blob = _checkpoint(ddp, opt, state)
    out = {"initial": initial, "steps": steps}
    if resume:  # a restarted run: DDP's initial layout, then its rebuild: the errors follow their elements
        ddp2 = nn.parallel.DistributedDataParallel(_net(), bucket_cap_mb=cap_mb)
        opt2 = OneBitAdam(ddp2.parameters(), freeze_step=FREEZE, **ADAM)
        state2 = attach_onebit(ddp2, opt2, topology=topology, scale="tensor")
        _restore(blob, ddp2, opt2, state2)
        out["resumed"] = [_train_step(ddp2, opt2, state2, rank, step) for step in range(SAVE_AFTER, STEPS)]
        out["resumed_layout_changes"] = state2.layout_changes
    return out


def _both_paths(rank: int) -> dict:
    """The loop (CPU) and the vectorised (CUDA) path of the per-tensor all-reduce on the same 3 steps."""
    numel, sig = 1001, ((0, 0, 300), (1, 300, 1), (2, 301, 700))
    padded = padded_size(numel, 8 * WORLD)
    mask = (torch.rand(padded, generator=torch.Generator().manual_seed(1)) > 0.1).float()
    mask[numel:] = 0
    layout = tensor_layout(sig, padded, mask, WORLD, rank)
    out = {}
    for vectorised in (False, True):
        we, se, results = torch.zeros(padded), torch.zeros(padded // WORLD), []
        for step in range(3):
            x = torch.randn(padded, generator=torch.Generator().manual_seed(100 * step + rank)) * mask
            results.append(compressed_allreduce_per_tensor(x, we, se, mask, layout, vectorised=vectorised).result)
        out[vectorised] = (torch.stack(results), we, se)
    return out


def _nonfinite(rank: int, topology) -> dict:
    """An Inf in rank 1's gradient at a compressed step: its NaN scales tell every rank to skip the step."""
    ddp = nn.parallel.DistributedDataParallel(_net(), bucket_cap_mb=GROUPED)
    opt = OneBitAdam(ddp.parameters(), freeze_step=FREEZE, **ADAM)
    state = attach_onebit(ddp, opt, topology=topology, scale="tensor")
    params = []
    for step in range(FREEZE + 3):
        opt.zero_grad()
        loss = _loss(ddp, _batch(rank, step))
        (loss * float("inf") if step == FREEZE + 1 and rank == 1 else loss).backward()
        opt.step()
        params.append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]))
    return {"params": params, "skipped": state.nonfinite_steps, "steps_done": opt.steps_done}


def _scenarios(rank: int, world: int) -> bytes:
    torch.manual_seed(0)
    topology = build_topology(GPUS_PER_NODE)
    results = {
        "alone": _run(rank, topology, ALONE, resume=False),
        "grouped": _run(rank, topology, GROUPED, resume=True),
        "paths": _both_paths(rank),
        "nonfinite": _nonfinite(rank, topology),
    }
    buf = io.BytesIO()
    torch.save(results, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def dist_results() -> list[dict]:
    return [torch.load(io.BytesIO(b), weights_only=False) for b in run_distributed(_scenarios, WORLD)]


def _reference(initial, choices: Choices) -> DeepSpeedOnebitAdamReference:
    return DeepSpeedOnebitAdamReference(initial, WORLD, freeze_step=FREEZE, choices=choices, **ADAM)


def _follow(ref, steps_by_rank: list[list[dict]], ranks=range(WORLD)):
    """The reference through the given steps with every rank's gradients and the hook's layout of each step."""
    for k in range(len(steps_by_rank[0])):
        stage = ref.step([steps_by_rank[r][k]["grads"] for r in ranks], _buckets(steps_by_rank[0][k]["layout"]))
        yield k, stage, torch.cat([x.reshape(-1) for x in ref.x])


# ------------------------------------------------------------------------ against the DeepSpeed reference
def test_one_tensor_per_bucket_is_deepspeeds_per_tensor_compression(dist_results):
    """Each tensor its own bucket: the hook's per-tensor scale is DeepSpeed's compressed all-reduce run per
    tensor, padding to N lcm(N, 8) = 8 N (N = 4) included, with the project's masks, sign(0) and warmup."""
    res = [r["alone"] for r in dist_results]
    assert all(len(sig) == 1 for sig in res[0]["steps"][-1]["layout"].values()), "DDP grouped tensors"
    choices = Choices(**{**Choices.project(WORLD).__dict__, "pad_multiple": None, "by_bucket": False})
    stages = []
    for k, stage, want in _follow(_reference(res[0]["initial"], choices), [r["steps"] for r in res]):
        stages.append(stage)
        torch.testing.assert_close(res[0]["steps"][k]["params"], want, **CLOSE, msg=lambda m: f"step {k + 1}: {m}")
        assert res[0]["steps"][k]["identical"]
    assert stages == ["warmup"] * FREEZE + ["compression"] * (STEPS - FREEZE)


def test_grouped_tensors_match_the_reference_cut_by_bucket(dist_results):
    """Several tensors per bucket: a worker scale per tensor, a server scale per piece of a tensor in a chunk."""
    res = [r["grouped"] for r in dist_results]
    assert any(len(sig) > 1 for sig in res[0]["steps"][-1]["layout"].values()), "every bucket has one tensor"
    for k, _, want in _follow(_reference(res[0]["initial"], Choices.project(WORLD)), [r["steps"] for r in res]):
        torch.testing.assert_close(res[0]["steps"][k]["params"], want, **CLOSE, msg=lambda m: f"step {k + 1}: {m}")


def test_per_tensor_scale_is_not_the_bucket_scale(dist_results):
    """The comparison above sees the scale: the reference with one scale per bucket differs by far more."""
    res = [r["grouped"] for r in dist_results]
    choices = Choices(**{**Choices.project(WORLD).__dict__, "scale": "bucket"})
    *_, (k, _, want) = _follow(_reference(res[0]["initial"], choices), [r["steps"] for r in res])
    assert (res[0]["steps"][k]["params"] - want).abs().max() > 1e-4


def test_resume_into_fresh_ddp_keeps_the_per_tensor_errors(dist_results):
    """Saved after step 5, loaded into a fresh DDP model (its initial layout, then the rebuild): the errors are
    per element, so the run continues as the reference does over the same two layouts."""
    res = [r["grouped"] for r in dist_results]
    ref = _reference(res[0]["initial"], Choices.project(WORLD))
    for _ in _follow(ref, [r["steps"][:SAVE_AFTER] for r in res]):
        pass
    resumed = [r["resumed"] for r in res]
    assert resumed[0][0]["layout"] != resumed[0][1]["layout"], "DDP did not change its layout"
    for k, _, want in _follow(ref, resumed):
        torch.testing.assert_close(
            resumed[0][k]["params"], want, **CLOSE, msg=lambda m: f"resumed step {SAVE_AFTER + k + 1}: {m}"
        )
        assert all(r[k]["identical"] for r in resumed)
    assert res[0]["resumed_layout_changes"] == 2


def test_vectorised_path_matches_the_loop(dist_results):
    """The path a GPU takes (a fixed number of kernels) against the CPU's loop: results and both errors."""
    for rank in range(WORLD):
        loop, vectorised = dist_results[rank]["paths"][False], dist_results[rank]["paths"][True]
        for got, want in zip(vectorised, loop):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert loop[0].abs().sum() > 0


def test_a_nonfinite_gradient_skips_the_step_on_every_rank(dist_results):
    for rank in range(WORLD):
        run = dist_results[rank]["nonfinite"]
        assert run["skipped"] == 1 and run["steps_done"] == FREEZE + 2, rank
        assert torch.equal(run["params"][FREEZE], run["params"][FREEZE + 1]), rank  # the skipped step
        assert not torch.equal(run["params"][FREEZE + 1], run["params"][FREEZE + 2]), rank
        assert torch.isfinite(run["params"][-1]).all() and torch.equal(
            run["params"][-1], dist_results[0]["nonfinite"]["params"][-1]
        )


def test_bytes_count_every_scale(dist_results):
    """Per bucket and process: 2 (N-1)/N P'/8 for the bits, (N-1) 4 T worker scales, (N-1) 4 S server scales."""
    n = WORLD
    for which in ("alone", "grouped"):
        steps = dist_results[0][which]["steps"]
        mask = torch.ones(10_000)
        want = 0.0
        for sig in steps[-1]["layout"].values():
            padded = padded_size(sum(k for _, _, k in sig), 8 * n)
            layout = tensor_layout(sig, padded, mask[:padded], n, 0)
            want += 2 * (n - 1) / n * padded / 8 + (n - 1) * SCALE_BYTES * (layout.tensors + layout.per_server)
        for s in steps[FREEZE:]:
            assert s["intra"] + s["inter"] == pytest.approx(want), which
            assert s["intra"] == pytest.approx(want / 3)  # one of 3 peers on this node
        # the performance model's formula, from the tensors' sizes alone
        predicted = sum(
            sum(counted_bytes(op, 2, 2))
            for sig in steps[-1]["layout"].values()
            for op in bucket_collectives(
                "onebit",
                sum(k for _, _, k in sig),
                2,
                2,
                scale="tensor",
                matrices=[[k] for _, _, k in sorted(sig, key=lambda e: e[1])],
            )
        )
        assert predicted == pytest.approx(want), which
    assert scale_counts([10, 100, 5], 4) == (3, 2)  # 115 -> 128 in chunks of 32: the second tensor spans 4


# ------------------------------------------------------------------ the reference itself: DeepSpeed's choices
def _single(choices: Choices, world: int = 2, freeze: int = 3, steps: int = 5, numel: int = 5):
    torch.manual_seed(0)
    p = torch.randn(numel)
    ref = _reference_of([p], world, freeze, choices)
    grads = [[[torch.randn(numel)] for _ in range(world)] for _ in range(steps)]
    trail = [(ref.step(g), ref.x[0].clone()) for g in grads]
    return ref, p, trail


def _reference_of(params, world, freeze, choices):
    return DeepSpeedOnebitAdamReference(
        params, world, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, freeze_step=freeze, choices=choices
    )


def test_deepspeeds_first_step_only_initialises():
    ref, p, trail = _single(Choices())
    assert [stage for stage, _ in trail] == ["init", "warmup", "warmup", "compression", "compression"]
    assert torch.equal(trail[0][1], p) and ref.adam_steps == 2
    _, _, project = _single(Choices.project(2))
    assert [stage for stage, _ in project][:4] == ["warmup"] * 3 + ["compression"]


def test_deepspeeds_padding_counts_in_the_scale_and_carries_error():
    """5 elements over 2 workers pad to 16 (N lcm(N, 8)): 11 padding elements, compressed like the rest."""
    ref, _, _ = _single(Choices())
    assert ref.errors[((0,), 0)].numel() == 11 and ref.errors[((0,), 0)].abs().sum() > 0
    ref, _, _ = _single(Choices.project(2))
    assert ref.errors[((0,), 0)].numel() == 11 and ref.errors[((0,), 0)].abs().sum() == 0


def test_deepspeeds_sign_of_zero_is_plus_one():
    from birder_repro.references.deepspeed_onebit import _compress

    c, keep = torch.tensor([0.0, 2.0, -2.0, 0.0]), torch.ones(4)
    out, _ = _compress(c, keep, [0], 1.0)
    assert out.tolist() == pytest.approx([1.4142135, 1.4142135, -1.4142135, 1.4142135])
    out, _ = _compress(c, keep, [0], -1.0)
    assert out[0] < 0


def test_compress_segments_matches_the_reference_compression():
    """The hook's per-segment compression against the reference's on one buffer with a masked piece."""
    from birder_repro.references.deepspeed_onebit import _compress

    torch.manual_seed(0)
    x, mask = torch.randn(64), (torch.rand(64) > 0.2).float()
    segments = [(0, 10, int(mask[:10].sum())), (10, 40, int(mask[10:40].sum())), (40, 64, int(mask[40:].sum()))]
    error = torch.randn(64) * mask
    want, want_error = _compress((x + error) * mask, mask, [0, 10, 40], -1.0)
    tables = (torch.tensor([10, 30, 24]), torch.tensor([float(n) for *_, n in segments]))
    for path in (None, tables):
        e = error.clone()
        _, scales = compress_segments_(x, e, mask, segments, path)
        torch.testing.assert_close(e, want_error)
        for (a, b, _), s in zip(segments, scales):
            torch.testing.assert_close(want[a:b].abs().max(), s)


def test_scale_setting_is_checked():
    dist_free = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"optim\.comm\.scale must be one of bucket, tensor"):
        from birder_repro.comm.onebit import OneBitState
        from birder_repro.comm.topology import flat_topology

        OneBitState(OneBitAdam(dist_free.parameters(), freeze_step=2), None, flat_topology(), {}, scale="layer")


def test_deepspeeds_exp_avg_mask_applies_after_the_allreduce():
    """DeepSpeed: a masked element is still compressed (it keeps an error) and only its result is zeroed; the
    project's choice masks it inside the compression (no error)."""
    torch.manual_seed(0)
    grads = [[[torch.randn(16)] for _ in range(2)] for _ in range(4)]
    mask = {0: (torch.arange(16) % 4 != 0).float()}
    for choices, error_left in ((Choices(), True), (Choices.project(2, by_bucket=False), False)):
        ref = DeepSpeedOnebitAdamReference(
            [torch.zeros(16)],
            2,
            lr=1e-2,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=0.0,
            freeze_step=2,
            choices=choices,
            exp_avg_mask=mask,
        )
        for g in grads:
            ref.step(g)
        assert torch.count_nonzero(ref.m[0][::4]) == 0
        assert bool(ref.errors[(0, 0)][::4].abs().sum() > 0) == error_left


def test_deepspeeds_load_resets_the_errors():
    """DeepSpeed's resume drops the errors; the project's keeps them, and the next compressed step shows it."""
    ref, _, _ = _single(Choices(), steps=5)
    kept, _, _ = _single(Choices(), steps=5)
    ref.reset_errors()
    assert not ref.errors and kept.errors
    g = [[torch.full((5,), 0.1)], [torch.full((5,), -0.2)]]
    assert ref.step(g) == kept.step(g) == "compression"
    assert not torch.allclose(ref.x[0], kept.x[0])


def test_the_vectorised_scales_read_nothing_back_to_the_host(monkeypatch):
    """The path CUDA takes (a fixed number of kernels a step) must not sync: torch.segment_reduce validates its
    lengths on the host unless told unsafe=True (4 syncs per bucket per step on a GPU, once per call); and the
    spread of the scales is told its size (repeat_interleave's output_size), which it would otherwise read back."""
    calls = {}
    segment_reduce, repeat_interleave = torch.segment_reduce, torch.Tensor.repeat_interleave

    def watched_reduce(*args, **kwargs):
        calls["segment_reduce"] = kwargs
        return segment_reduce(*args, **kwargs)

    def watched_repeat(self, *args, **kwargs):
        calls["repeat_interleave"] = kwargs
        return repeat_interleave(self, *args, **kwargs)

    monkeypatch.setattr(torch, "segment_reduce", watched_reduce)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", watched_repeat)
    x, mask = torch.randn(16), torch.ones(16)
    compress_segments_(
        x, torch.zeros(16), mask, [(0, 6, 6), (6, 16, 10)], (torch.tensor([6, 10]), torch.tensor([6.0, 10.0]))
    )
    assert calls["segment_reduce"].get("unsafe") is True, calls
    assert calls["repeat_interleave"].get("output_size") == 16, calls


def test_the_runner_passes_optim_comm_scale_and_the_library_defaults_to_the_clis_scale(monkeypatch):
    """A user moving from ``birder-repro optim=onebit_adam`` (or ``onebit_lamb``) to ``attach_onebit`` in a script
    (or a framework's attach) gets the same arithmetic: the library's default scale is the optimizer's, which is
    its config's; and the runner hands the configured scale to the hook, whichever it is."""
    from conftest import compose_config

    from birder_repro.comm import onebit
    from birder_repro.optim import OneBitLamb

    for name, cls in (("onebit_adam", OneBitAdam), ("onebit_lamb", OneBitLamb)):
        assert cls.comm_scale == compose_config([f"optim={name}"]).optim.comm.scale, name
    assert OneBitAdam.comm_scale == "tensor"  # DeepSpeed's
    passed = []
    monkeypatch.setattr(onebit, "attach_onebit", lambda *args, **kwargs: passed.append(kwargs["scale"]))
    opt = OneBitAdam(nn.Linear(2, 2).parameters(), freeze_step=2)
    for scale in ("bucket", "tensor"):
        onebit.attach_from_config(None, opt, {"comm": {"scale": scale}}, topology=None)
    onebit.attach_from_config(None, opt, {"comm": {}}, topology=None)
    assert passed == ["bucket", "tensor", "tensor"]


def test_the_runner_passes_optim_comm_scale_to_the_fsdp_hook_too(monkeypatch):
    """``parallel=fsdp optim=onebit_adam``: the configured scale reaches attach_onebit_fsdp (it used to build
    every FSDP state with one scale per unit whatever the setting said); unset, the optimizer's default."""
    from birder_repro.comm import fsdp

    passed = []
    monkeypatch.setattr(fsdp, "attach_onebit_fsdp", lambda *args, **kwargs: passed.append(kwargs["scale"]))
    opt = OneBitAdam(nn.Linear(2, 2).parameters(), freeze_step=2)
    for scale in ("bucket", "tensor"):
        fsdp.attach_from_config(None, opt, None, {"comm": {"scale": scale}}, "onebit")
    fsdp.attach_from_config(None, opt, None, {"comm": {}}, "onebit")
    assert passed == ["bucket", "tensor", None]  # None: attach_onebit_fsdp takes the optimizer's comm_scale
