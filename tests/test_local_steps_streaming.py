"""Streaming DiLoCo (birder_repro.optim.streaming_diloco over birder_repro.comm.streaming) against the
single-process reference of its Algorithm 1 (birder_repro.references.streaming_diloco): 4 gloo processes as
2 nodes x 2, H = 4, three settings in one spawn (fp32 with tau = 1; int4 with tau = 2; fp8 with tau = 0 and
alpha = 0). The reference feeds each node the average of its two processes' recorded gradients, as
tests/test_diloco.py does. The sums are the same in the same order: bit for bit is expected, rtol 1e-6 allows
for torch reordering a reduction.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.streaming import attach_streaming, decode, encode, fragment_scale, payload_bytes
from birder_repro.optim.streaming_diloco import StreamingDiLoCo, split_fragments, sync_offsets

NODES, GPUS, WORLD = 2, 2, 4
H, P, STEPS = 4, 2, 11
INNER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
OUTER_LR, OUTER_MU = 0.7, 0.9
SETTINGS = {  # name: (quantize, tau, alpha)
    "none": ("none", 1, 0.5),
    "int4": ("int4", 2, 0.5),
    "fp8": ("fp8", 0, 0.0),
}
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


def _make(params, quantize: str, tau: int, alpha: float) -> StreamingDiLoCo:
    return StreamingDiLoCo(
        params,
        local_steps=H,
        fragments=P,
        overlap_steps=tau,
        mixing=alpha,
        outer_lr=OUTER_LR,
        outer_momentum=OUTER_MU,
        quantize=quantize,
        **INNER,
    )


def _run(rank: int, world: int) -> dict:
    results = {}
    for name, (quantize, tau, alpha) in SETTINGS.items():
        model = _net()
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = _make(ddp.parameters(), quantize, tau, alpha)
        state = attach_streaming(ddp, opt, gpus_per_node=GPUS)
        out: dict = {"grads": [], "params": [], "inter": [], "outer": []}
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
            with opt.synchronised():
                out["outer"].append([p.detach().clone() for p in model.parameters()])
        opt.finish()
        out["finished"] = [p.detach().clone() for p in model.parameters()]
        results[name] = out
    return results


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_run, WORLD)


def _reference(runs, name: str):
    from birder_repro.references.streaming_diloco import ReferenceStreamingDiLoCo

    quantize, tau, alpha = SETTINGS[name]
    fragments = split_fragments([p.numel() for p in _net().parameters()], P)
    ref = ReferenceStreamingDiLoCo(
        [_net() for _ in range(NODES)], INNER, fragments, H, tau, alpha, OUTER_LR, OUTER_MU, quantize
    )
    history = []
    for step in range(STEPS):
        grads = []
        for k in range(NODES):
            pairs = zip(*(runs[k * GPUS + j][name]["grads"][step] for j in range(GPUS)))
            grads.append([sum(gs) / GPUS for gs in pairs])
        ref.step(grads)
        history.append([[p.detach().clone() for p in m.parameters()] for m in ref.models])
    return history, ref


@pytest.mark.parametrize("name", list(SETTINGS))
def test_streaming_follows_the_reference(runs, name):
    want, ref = _reference(runs, name)
    for step in range(STEPS):
        for rank in range(WORLD):
            for a, b in zip(runs[rank][name]["params"][step], want[step][rank // GPUS]):
                torch.testing.assert_close(
                    a, b, **CLOSE, msg=lambda m, s=step, r=rank: f"{name}: step {s + 1} rank {r}: {m}"
                )
    # the outer parameters synchronised() shows are the reference's, on every rank
    for rank in range(WORLD):
        for a, b in zip(runs[rank][name]["outer"][-1], ref.outer):
            torch.testing.assert_close(a, b, **CLOSE)


def test_finish_ends_every_rank_on_the_same_model(runs):
    for name in SETTINGS:
        for rank in range(1, WORLD):
            same = zip(runs[0][name]["finished"], runs[rank][name]["finished"])
            assert all(torch.equal(a, b) for a, b in same), (name, rank)
            for step in range(STEPS):
                same = zip(runs[0][name]["outer"][step], runs[rank][name]["outer"][step])
                assert all(torch.equal(a, b) for a, b in same), (name, rank, step)


def test_each_sync_sends_one_fragment_across_at_its_width(runs):
    numels = [p.numel() for p in _net().parameters()]
    fragments = split_fragments(numels, P)
    for name, (quantize, _, _) in SETTINGS.items():
        want = {}
        for p, t_p in enumerate(sync_offsets(H, P)):
            shard = -(-sum(numels[i] for i in fragments[p]) // GPUS)
            fp32 = 2 * (NODES - 1) / NODES * 4 * shard
            want[t_p] = fp32 if quantize == "none" else (NODES - 1) * payload_bytes(shard, quantize)
        for step, sent in enumerate(runs[0][name]["inter"]):
            assert sent == want.get((step + 1) % H, 0), (name, step + 1)


def test_the_schedule_syncs_each_fragment_once_every_h_steps():
    """One process with a hook state that records what starts when: fragment p (its parameters) at t mod H = t_p,
    exactly once in every H steps, one fragment every H/P steps."""

    class Recorder:
        def __init__(self):
            self.starts = []

        def start_average(self, tensors):
            self.starts.append((opt.inner_steps, [t.numel() for t in tensors]))

            class Done:
                def wait(self_inner):
                    return [torch.zeros_like(t) for t in tensors]

            return Done()

    h, fragments = 8, 4
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])  # 8 tensors, 4 fragments of 20 elements each
    opt = StreamingDiLoCo(model.parameters(), local_steps=h, fragments=fragments, overlap_steps=1)
    opt.hook_state = recorder = Recorder()
    for _ in range(3 * h):
        _loss(model, (torch.randn(2, 4), torch.randint(0, 4, (2,)))).backward()
        opt.step()
        opt.zero_grad()
    assert recorder.starts == [(t, [16, 4]) for t in range(2, 3 * h + 1, 2)]
    assert [t % h for t, _ in recorder.starts[:4]] == [2, 4, 6, 0]
    assert opt.fragments == [[0, 1], [2, 3], [4, 5], [6, 7]] and opt.offsets == [0, 2, 4, 6]
    assert opt.outer_steps == len(recorder.starts)


def test_fragments_are_contiguous_and_balanced():
    assert split_fragments([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert split_fragments([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert split_fragments([1, 1, 1, 100], 2) == [[0, 1, 2], [3]]
    assert split_fragments([5, 5, 5], 3) == [[0], [1], [2]]
    assert sync_offsets(10, 4) == [0, 2, 5, 7]


def test_one_fragment_no_overlap_and_alpha_0_is_diloco():
    from birder_repro.optim import DiLoCo

    def run(opt_of):
        model = _net()
        opt = opt_of(model.parameters())
        for step in range(STEPS):
            _loss(model, _batch(0, step)).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    diloco = run(lambda ps: DiLoCo(ps, local_steps=H, outer_lr=OUTER_LR, outer_momentum=OUTER_MU, **INNER))
    streaming = run(
        lambda ps: StreamingDiLoCo(
            ps,
            local_steps=H,
            fragments=1,
            overlap_steps=0,
            mixing=0.0,
            outer_lr=OUTER_LR,
            outer_momentum=OUTER_MU,
            **INNER,
        )
    )
    assert all(torch.equal(a, b) for a, b in zip(diloco, streaming))


def test_resumed_with_a_sync_in_flight_equals_the_run_left_alone():
    def run(stop_at, resume):
        model = _net()
        opt = _make(model.parameters(), "none", 2, 0.5)
        start = 0
        if resume is not None:
            opt.load_state_dict(resume)
            start = opt.inner_steps
        for step in range(start, STEPS if stop_at is None else stop_at):
            _loss(model, _batch(0, step)).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], opt

    alone, _ = run(None, None)
    _, stopped = run(5, None)  # fragment 0 started at step 4, due at 6
    assert stopped._pending
    resumed, _ = run(None, stopped.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(alone, resumed))


def test_the_codecs():
    x = torch.linspace(-3, 3, 101)
    for quantize, top in (("fp8", 448.0), ("int4", 7.0)):
        scale = fragment_scale(x, quantize)
        assert torch.equal(scale, torch.tensor(3.0 / top))
        payload = encode(x, scale, quantize)
        assert payload.dtype == torch.uint8 and payload.numel() == payload_bytes(101, quantize)
        back = decode(payload, 101, quantize)
        if quantize == "fp8":
            assert torch.equal(back, (x / scale).to(torch.float8_e4m3fn).float() * scale)
        else:
            assert (back - x).abs().max() <= scale / 2 + 1e-6
            assert torch.equal(back, torch.round(x / scale).clamp(-7, 7) * scale)
    assert payload_bytes(101, "int4") == 4 + 51 and payload_bytes(101, "fp8") == 4 + 101


def test_bad_settings_are_one_line_each():
    params = list(_net().parameters())
    with pytest.raises(ValueError, match="fragments must be between 1 and the 4 parameters"):
        StreamingDiLoCo(params, local_steps=10, fragments=5)
    with pytest.raises(ValueError, match=r"fragments \(3\) must be <= local_steps \(2\)"):
        StreamingDiLoCo(params, local_steps=2, fragments=3)
    with pytest.raises(ValueError, match=r"overlap_steps must be in \[0, local_steps\)"):
        StreamingDiLoCo(params, local_steps=4, overlap_steps=4)
    with pytest.raises(ValueError, match="mixing must be in"):
        StreamingDiLoCo(params, mixing=1.5)
    with pytest.raises(ValueError, match="quantize must be one of none, fp8, int4"):
        StreamingDiLoCo(params, quantize="int8")
