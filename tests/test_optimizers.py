"""Every registered optimizer, built from its composed config, on one process: the same parametrized checks
(a convex problem converges; state_dict round trip in lockstep), then BertAdam and SoftSignSGD against
references written out by hand from their sources.
"""

from __future__ import annotations

import io

import pytest
import torch
from conftest import compose_config
from omegaconf import DictConfig, OmegaConf

from birder_repro.comm import list_schemes
from birder_repro.optim import BertAdam, SoftSignSGD, build_optimizer, get_optim_info, list_optimizers
from birder_repro.optim.bertadam import bert_param_groups

OPTIMIZERS = list_optimizers()

# The convex problem: full-batch least squares with an exact solution, so the minimum loss is 0.
CONVEX_STEPS = 300
CONVEX_LR = 0.05  # one rate for all: gradients and the solution are O(1), so sign-like and SGD-like steps fit
CONVEX_FACTOR = 100.0  # the loss must fall at least this much (the slowest, Birder, falls ~2000x here)

# The round trip: save after SAVE_AT steps, continue CONTINUE steps; with TOTAL_STEPS as the run's length,
# 1-bit Adam's (0.15) and 1-bit LAMB's (0.167) freeze steps fall after the save, so the switch is replayed.
SAVE_AT, CONTINUE, TOTAL_STEPS = 4, 8, 40


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tensors of a few dozen elements: intra-op threads only contend (10x slower steps on a loaded 2-core
    machine), so this module runs on one and gives the setting back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def optim_node(name: str, lr: float, total_steps: int) -> DictConfig:
    """The ``optim`` node a run of ``optim=<name>`` builds from (conf/optim/<name>.yaml composed, resolved), with
    the test's learning rate and, where the optimizer takes it, the run's length (lengths given as fractions of
    the run need it; the worker fills it in the same way)."""
    node = OmegaConf.create(OmegaConf.to_container(compose_config([f"optim={name}"]).optim, resolve=True))
    assert node.name == name, f"conf/optim/{name}.yaml names optimizer {node.name!r}"
    node.lr = lr
    if "total_steps" in node:
        node.total_steps = total_steps
    return node


def least_squares() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g)
    w_star, b_star = torch.randn(3, 10, generator=g) * 0.5, torch.randn(3, generator=g) * 0.5
    return x, x @ w_star.T + b_star


def new_params() -> list[torch.nn.Parameter]:
    # A matrix and a bias: two tensors of different shapes, and BertAdam decays only the first.
    return [torch.nn.Parameter(torch.zeros(3, 10)), torch.nn.Parameter(torch.zeros(3))]


def loss_of(params: list[torch.Tensor], data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    (w, b), (x, y) = params, data
    return 0.5 * ((x @ w.T + b - y) ** 2).sum(1).mean()


def take_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], data) -> None:
    opt.zero_grad()
    loss_of(params, data).backward()
    opt.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_registered_with_a_known_scheme(name):
    assert get_optim_info(name).comm in list_schemes()


def test_registries_fail_loudly_naming_the_choices():
    from birder_repro.comm import SCHEMES, attach_comm
    from birder_repro.optim import OPTIMIZERS, OptimInfo
    from birder_repro.registry import Registry

    with pytest.raises(KeyError, match=r"optimizer 'adam' is unknown; known: adamw, adamw_powersgd, bertadam"):
        get_optim_info("adam")
    with pytest.raises(KeyError, match=r"communication scheme 'nccl' is unknown; known: allreduce, birder"):
        attach_comm("nccl", None, None, {}, None)
    with pytest.raises(ValueError, match=r"optimizer 'sgd' is listed twice"):
        Registry("optimizer", [*OPTIMIZERS, OptimInfo("sgd", None, "allreduce", "again")])
    assert list_optimizers() == OPTIMIZERS.names() == sorted(r.name for r in OPTIMIZERS)
    assert "birder" in SCHEMES and "birder" in OPTIMIZERS and len(SCHEMES) == 10


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_convex_problem_converges(name):
    data, params = least_squares(), new_params()
    opt = build_optimizer(params, optim_node(name, CONVEX_LR, CONVEX_STEPS))
    with torch.no_grad():
        initial = loss_of(params, data).item()
    for step in range(CONVEX_STEPS):
        if step == int(0.7 * CONVEX_STEPS):  # lr / 10 for the last 30 %, as the runs' multistep schedule does
            for group in opt.param_groups:
                group["lr"] *= 0.1
        take_step(opt, params, data)
    with torch.no_grad():
        final = loss_of(params, data).item()
    assert final * CONVEX_FACTOR < initial, f"{name}: loss {initial:.3g} -> {final:.3g}"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_dict_round_trip_continues_in_lockstep(name):
    node, data = optim_node(name, CONVEX_LR, TOTAL_STEPS), least_squares()
    params = new_params()
    opt = build_optimizer(params, node)
    for _ in range(SAVE_AT):
        take_step(opt, params, data)

    # Through bytes, as a checkpoint goes (the training loop's loader also uses weights_only=False).
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = build_optimizer(resumed_params, node)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))

    for step in range(CONTINUE):
        take_step(opt, params, data)
        take_step(resumed, resumed_params, data)
        for p, q in zip(params, resumed_params):
            assert torch.equal(p, q), f"{name}: resumed parameters differ {step + 1} steps after the load"


# ----------------------------------------------------------------------------------------------- BertAdam
def bertadam_reference(params, grads_per_step, lr, beta1, beta2, eps, wd, decay, max_norm):
    """google-research/bert AdamWeightDecayOptimizer after tf.clip_by_global_norm, written out per element."""
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for grads in grads_per_step:
        global_norm = sum(float((g**2).sum()) for g in grads) ** 0.5
        clip = max_norm / max(global_norm, max_norm)
        for i, g in enumerate(grads):
            g = g * clip
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            update = m[i] / (v[i].sqrt() + eps)  # no bias correction
            if decay[i]:
                update = update + wd * params[i]
            params[i] = params[i] - lr * update
    return params


@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["within_norm", "clipped"])
def test_bertadam_matches_bert_reference(grad_scale):
    g = torch.Generator().manual_seed(1)
    start = [torch.randn(4, 5, generator=g), torch.randn(5, generator=g)]
    grads = [[torch.randn(4, 5, generator=g) * grad_scale, torch.randn(5, generator=g) * grad_scale] for _ in range(3)]
    weight, bias = (torch.nn.Parameter(t.clone()) for t in start)
    opt = BertAdam(
        bert_param_groups([("layer.weight", weight), ("layer.bias", bias)], 0.01),
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        max_grad_norm=1.0,
    )
    for step_grads in grads:
        weight.grad, bias.grad = (t.clone() for t in step_grads)
        opt.step()
    expected = bertadam_reference(start, grads, 1e-3, 0.9, 0.999, 1e-6, 0.01, decay=[True, False], max_norm=1.0)
    torch.testing.assert_close(weight.detach(), expected[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(bias.detach(), expected[1], rtol=1e-6, atol=1e-7)
    # The gradients stay as the model left them: clipping scales inside the step only.
    torch.testing.assert_close(weight.grad, grads[-1][0])


def test_bertadam_has_no_bias_correction():
    # One step from zero state: m = 0.1 g and v = 0.001 g^2, so the step is lr * 0.1 / sqrt(0.001) = 3.16 lr
    # per element; with bias correction (torch's Adam) it would be lr.
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([0.5, -0.2, 0.1])
    BertAdam([p], lr=1e-2, weight_decay=0.0, max_grad_norm=None).step()
    expected = -1e-2 * 0.1 * p.grad / ((0.001 * p.grad**2).sqrt() + 1e-6)
    torch.testing.assert_close(p.detach(), expected)
    assert abs(expected[0].item()) > 3 * 1e-2


def test_bert_param_groups_exclude_biases_and_layernorm():
    named = [
        ("enc.dense.weight", torch.nn.Parameter(torch.zeros(2, 2))),
        ("enc.dense.bias", torch.nn.Parameter(torch.zeros(2))),
        ("enc.LayerNorm.weight", torch.nn.Parameter(torch.zeros(2))),
    ]
    decay, no_decay = bert_param_groups(named, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(named[0][1])]
    assert [id(p) for p in no_decay["params"]] == [id(named[1][1]), id(named[2][1])]
    # Without names (DDP's parameters()): the 1-D tensors, the same set in BERT.
    decay, no_decay = bert_param_groups([p for _, p in named], 0.01)
    assert len(decay["params"]) == 1 and len(no_decay["params"]) == 2


# -------------------------------------------------------------------------------------------- SoftSignSGD
def test_softsignsgd_matches_appendix_b_algorithm():
    g = torch.Generator().manual_seed(2)
    start = torch.randn(6, generator=g)
    grads = [torch.randn(6, generator=g) for _ in range(3)]
    lr, beta, wd, eps = 0.01, 0.95, 0.05, 1e-8
    p = torch.nn.Parameter(start.clone())
    opt = SoftSignSGD([p], lr=lr, beta=beta, weight_decay=wd, eps=eps)
    x, m, b = start.clone(), torch.zeros(6), torch.zeros(6)
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
        m = beta * m + (1 - beta) * grad  # Algorithm 1 line 4
        b = beta * b + (1 - beta) * grad.abs()  # line 5
        direction = m / (b + eps)
        assert direction.abs().max() <= 1.0  # the appendix's point: every element of m / b is in [-1, 1]
        x = x - lr * (direction + wd * x)  # line 6, with decoupled weight decay as Birder's line 16
        torch.testing.assert_close(p.detach(), x)


@pytest.mark.parametrize("kwargs", [dict(lr=-1.0), dict(beta=1.0), dict(weight_decay=-0.1), dict(eps=0.0)])
def test_softsignsgd_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="SoftSignSGD"):
        SoftSignSGD([torch.nn.Parameter(torch.zeros(1))], **kwargs)


@pytest.mark.parametrize(
    "kwargs", [dict(lr=-1.0), dict(betas=(0.9, 1.0)), dict(eps=0.0), dict(weight_decay=-1.0), dict(max_grad_norm=-1.0)]
)
def test_bertadam_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="BertAdam"):
        BertAdam([torch.nn.Parameter(torch.zeros(1))], **kwargs)
