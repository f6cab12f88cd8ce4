"""fp16 loss scaling in a user's own script (a GradScaler outside the runner) and in the frameworks' scalers.

``scaler.scale(loss)`` makes every gradient S g before the compressed hook sees it. A hook given the scaler
(``attach_*(..., grad_scaler=scaler)``) compresses g and hands S x its result back, and the optimizers of this
package take GradScaler's handover (``_step_supports_amp_scaling``): they unscale, and skip the step on an Inf.
With a power-of-two S and no overflow every product is exact, so the scaled run equals the unscaled one bit for
bit: that is the reference here. A scaler that steps the optimizer without having been given to the hook (it
compressed S g to +-1) is refused at the first step in one line.

2 gloo processes as 2 nodes x 1; the stand-in for a GPU's fp16 is a CPU GradScaler scaling an fp32 loss (what
the scaler does to the gradients is the same; fp16 autocast is not needed to show it).
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from torch import nn

STEPS, BAD_STEP, INIT_SCALE = 6, 4, 2.0**10


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _attach(ddp, optim: str, scaler):
    from birder_repro.comm import attach_birder, attach_onebit
    from birder_repro.optim import Birder, OneBitAdam

    if optim == "birder":
        opt = Birder(ddp.parameters(), lr=0.01)
        return opt, attach_birder(ddp, opt, gpus_per_node=1, kernel_backend="torch", grad_scaler=scaler)
    opt = OneBitAdam(ddp.parameters(), lr=0.01, freeze_step=2)
    return opt, attach_onebit(ddp, opt, grad_scaler=scaler)


def _script(rank: int, world: int, optim: str, mode: str) -> dict:
    """A user's loop. ``mode``: plain (no scaler), scaled (the scaler passed to the attach), unpassed (a scaler
    the hook was not given), overflow (passed; rank 1's loss is infinite at step BAD_STEP)."""
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)
    scaler = None if mode == "plain" else torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    opt, state = _attach(ddp, optim, None if mode == "unpassed" else scaler)
    gen = torch.Generator().manual_seed(rank)
    out: dict = {"params": [], "scale": []}
    try:
        for step in range(STEPS):
            x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            loss = nn.functional.cross_entropy(ddp(x), y)
            if mode == "overflow" and step == BAD_STEP and rank == 1:
                loss = loss * float("inf")
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                out["scale"].append(scaler.get_scale())
            opt.zero_grad(set_to_none=True)
            out["params"].append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    except RuntimeError as err:
        out["error"] = str(err)
    out["nonfinite"] = state.nonfinite_steps
    state.close()
    return out


def _all(rank: int, world: int, optim: str) -> dict:
    return {mode: _script(rank, world, optim, mode) for mode in ("plain", "scaled", "unpassed", "overflow")}


@pytest.fixture(scope="module", params=["birder", "onebit_adam"])
def scripts(request):
    return request.param, run_distributed(_all, 2, request.param)


def test_a_scaler_passed_to_the_attach_trains_as_if_unscaled(scripts):
    optim, runs = scripts
    for rank, run in enumerate(runs):
        assert "error" not in run["scaled"], run["scaled"].get("error")
        assert run["scaled"]["scale"] == [INIT_SCALE] * STEPS  # no overflow, no growth in 6 steps
        for step, (a, b) in enumerate(zip(run["scaled"]["params"], run["plain"]["params"])):
            assert torch.equal(a, b), f"{optim} rank {rank} step {step}: max {(a - b).abs().max()}"


def test_a_scaler_the_hook_was_not_given_is_refused_in_one_line(scripts):
    optim, runs = scripts
    attach = "attach_birder" if optim == "birder" else "attach_onebit"
    for run in runs:
        error = run["unpassed"].get("error", "")
        assert f"{attach}(..., grad_scaler=scaler)" in error and "\n" not in error, error
        assert run["unpassed"]["params"] == []  # refused at the first step, before anything moved


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_and_backs_off(scripts):
    _, runs = scripts
    for rank, run in enumerate(runs):
        over = run["overflow"]
        assert "error" not in over, over.get("error")
        assert over["scale"][BAD_STEP] == INIT_SCALE / 2, rank
        assert torch.equal(over["params"][BAD_STEP], over["params"][BAD_STEP - 1]), f"rank {rank} moved"
        assert over["nonfinite"] == 1
        assert not torch.equal(over["params"][-1], over["params"][BAD_STEP]), "training stopped"
        assert torch.isfinite(over["params"][-1]).all()
        assert torch.equal(over["params"][-1], runs[0]["overflow"]["params"][-1]), f"rank {rank} differs"


# --------------------------------------------------------------------------------- single-process pieces
def test_the_hook_follows_the_scalers_scale_as_it_changes():
    """The scale is read from the scaler at each bucket (not copied at the attach): growth, back-off and a
    loaded checkpoint are followed; a disabled scaler scales nothing."""
    from birder_repro.comm.birder import BirderState
    from birder_repro.comm.topology import Topology

    state = BirderState(Topology(0, 1, 1), scheme="hierarchical", kernel_backend="torch", overlap=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    state.use_grad_scaler(scaler)
    scaler.scale(torch.ones(()))  # the scale tensor is made by the first scale()
    assert float(state.loss_scale) == 8.0
    scaler.update(new_scale=32.0)
    assert float(state.loss_scale) == 32.0
    scaler.load_state_dict({**scaler.state_dict(), "scale": 4.0})
    assert float(state.loss_scale) == 4.0
    state.use_grad_scaler(torch.amp.GradScaler("cpu", enabled=False))
    assert state.loss_scale is None


def test_a_scaler_with_nonfinite_raise_or_of_another_kind_is_refused():
    from birder_repro.comm.birder import BirderState
    from birder_repro.comm.topology import Topology

    raising = BirderState(Topology(0, 1, 1), scheme="hierarchical", kernel_backend="torch", nonfinite="raise")
    with pytest.raises(ValueError, match="nonfinite='raise' with a GradScaler.*use nonfinite='skip'"):
        raising.use_grad_scaler(torch.amp.GradScaler("cpu"))
    with pytest.raises(TypeError, match="grad_scaler must be a torch.amp.GradScaler, got float"):
        raising.use_grad_scaler(1024.0)


def test_a_lone_optimizer_stepped_by_a_scaler_unscales_and_skips_as_gradscaler_would():
    """No hook (one process): GradScaler hands the step its scale; the result equals a plain optimizer's
    step on the unscaled gradients, and an Inf skips it."""
    from birder_repro.optim import OneBitAdam

    def run(scaled: bool, poison: bool):
        torch.manual_seed(0)
        layer = nn.Linear(4, 2)
        opt = OneBitAdam(layer.parameters(), lr=0.1, freeze_step=3)
        scaler = torch.amp.GradScaler("cpu", init_scale=64.0, enabled=scaled)
        loss = layer(torch.ones(1, 4)).sum() * (float("inf") if poison else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        return [p.detach().clone() for p in layer.parameters()], opt.steps_done

    plain, _ = run(False, False)
    scaled, _ = run(True, False)
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled))
    torch.manual_seed(0)
    untouched = [p.detach().clone() for p in nn.Linear(4, 2).parameters()]
    skipped, steps = run(True, True)
    assert steps == 0 and all(torch.equal(a, b) for a, b in zip(skipped, untouched))


# ----------------------------------------------------------------------------- the frameworks' scalers
def _accelerate(rank: int, world: int, optim: str) -> dict:
    """Accelerate as it runs with ``mixed_precision="fp16"`` on a GPU (it makes no scaler on the CPU: the scaler
    is set as prepare() would find it there), attach_accelerate left at its defaults; and the same script
    without a scaler. Rank 1's loss is infinite at step BAD_STEP of the scaled run."""
    from accelerate import Accelerator

    from birder_repro.integrations.accelerate import attach_accelerate
    from birder_repro.optim import Birder, OneBitAdam

    out = {}
    for scaled in (False, True):
        accelerator = Accelerator(cpu=True)
        if scaled:
            accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
        model = _model()
        opt = Birder(model.parameters(), lr=0.01) if optim == "birder" else OneBitAdam(model.parameters(), lr=0.01)
        ddp, opt = accelerator.prepare(model, opt)
        state = attach_accelerate(accelerator, ddp, opt, gpus_per_node=1, checkpoint=False)
        gen = torch.Generator().manual_seed(rank)
        params, skipped = [], []
        for step in range(STEPS):
            x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            loss = nn.functional.cross_entropy(ddp(x), y)
            if scaled and step == BAD_STEP and rank == 1:
                loss = loss * float("inf")
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            params.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
            skipped.append(opt.step_was_skipped)
        state.close()
        out[scaled] = {"params": params, "skipped": skipped}
    return out


def test_accelerates_fp16_scaler_reaches_the_hook_and_its_skips_are_reported(scripts):
    optim, _ = scripts
    runs = run_distributed(_accelerate, 2, optim)
    for rank, run in enumerate(runs):
        plain, scaled = run[False]["params"], run[True]["params"]
        for step in range(BAD_STEP):
            assert torch.equal(plain[step], scaled[step]), f"{optim} rank {rank} step {step}"
        assert run[True]["skipped"] == [step == BAD_STEP for step in range(STEPS)], rank
        assert torch.equal(scaled[BAD_STEP], scaled[BAD_STEP - 1])
        assert torch.equal(scaled[-1], runs[0][True]["params"][-1])


@pytest.mark.parametrize("optim", ["birder", "onebit_adam"])
def test_lightnings_16_mixed_scaler_is_given_to_the_hook(monkeypatch, optim):
    """precision="16-mixed" on a GPU: Lightning's precision plugin holds the GradScaler (on the CPU Lightning
    runs 16-mixed as bf16-mixed and makes none); BirderStrategy hands it to the attach."""
    pytest.importorskip("lightning")
    from lightning.pytorch.plugins.precision import MixedPrecision

    from birder_repro.integrations import lightning as integration
    from birder_repro.optim import Birder, OneBitAdam

    given = {}
    attach = "attach_birder" if optim == "birder" else "attach_onebit"
    monkeypatch.setattr(integration, attach, lambda *args, **kwargs: given.update(kwargs))
    monkeypatch.setattr(integration, "build_topology", lambda per_node: None)
    strategy = integration.BirderStrategy(gpus_per_node=1)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    strategy.precision_plugin = plugin
    params = nn.Linear(2, 2).parameters()
    strategy.optimizers = [Birder(params) if optim == "birder" else OneBitAdam(params, freeze_step=2)]
    strategy._attach()
    assert given["grad_scaler"] is plugin.scaler
