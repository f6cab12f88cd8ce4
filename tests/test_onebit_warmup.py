"""1-bit Adam's blow-up at its first compressed step, reproduced, and the opt-in that prevents it.

The reproduction (docs/optimizers.md, "1-bit Adam: the warmup"): a small CNN (conv 1->32 and 32->64, 3x3, ReLU, 2x2
max-pool; linear 3136->128->10) on synthetic N(0, 1) 28x28 inputs with random labels, 2 gloo processes,
1-bit Adam with its DDP hook, lr 1e-3, weight decay 1e-2, a warmup of 12 steps. Elements whose gradients
were almost always zero during the warmup (rarely active ReLU units) have a frozen variance near 1e-21; the
1-bit compressor sends them at the bucket's scale, and the step divides that by sqrt(v) + eps: the first
compressed step moves a weight by tens (measured 93), where the last warmup step moved none by more than
0.005. Compressing the preconditioned momentum (``precondition_compression``) keeps that step within the
warmup's. Thresholds: 100x and 1x the last warmup step's largest move; the two differ by about 10^4.
"""

from __future__ import annotations

import torch
from dist_utils import run_distributed
from torch import nn

from birder_repro.comm.onebit import attach_onebit
from birder_repro.optim import OneBitAdam
from birder_repro.optim.onebit_adam import short_warmup_warning

FREEZE, BATCH = 12, 8


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3136, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def _largest_moves(rank: int, preconditioned: bool) -> list[float]:
    """The largest |change| of any parameter at each step, up to the first compressed step."""
    model = _cnn()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = OneBitAdam(
        ddp.parameters(), lr=1e-3, weight_decay=1e-2, freeze_step=FREEZE, precondition_compression=preconditioned
    )
    state = attach_onebit(ddp, opt)
    gen = torch.Generator().manual_seed(rank + 1)
    moves, before = [], torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for _ in range(FREEZE + 1):
        x, y = torch.randn(BATCH, 1, 28, 28, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        moves.append(float((after - before).abs().max()))
        before = after
    state.close()
    return moves


def _both(rank: int, world: int) -> dict:
    return {"paper": _largest_moves(rank, False), "preconditioned": _largest_moves(rank, True)}


def test_the_first_compressed_step_blows_up_with_the_paper_and_not_preconditioned():
    paper, preconditioned = (run_distributed(_both, 2)[0][k] for k in ("paper", "preconditioned"))
    assert paper[:FREEZE] == preconditioned[:FREEZE]  # the warmup is the same Adam
    last_warmup = paper[FREEZE - 1]
    assert paper[FREEZE] > 100 * last_warmup, paper
    assert preconditioned[FREEZE] < last_warmup, preconditioned


def test_a_short_warmup_is_warned_about_before_training():
    params = [nn.Parameter(torch.zeros(3))]
    line = short_warmup_warning(OneBitAdam(params, freeze_step=35))
    assert line is not None and "1 - beta2^T = 3.4%" in line and "optim.freeze" in line
    assert "optim.compress_preconditioned=true" in line
    assert short_warmup_warning(OneBitAdam(params, freeze_step=400)) is None  # 33 %: the paper's shortest
    assert short_warmup_warning(OneBitAdam(params, freeze_step=35), preconditioned=True) is None
