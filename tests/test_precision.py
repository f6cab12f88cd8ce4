"""Mixed precision (train.precision): autocast, and fp16's loss scaling as one skip mechanism with the hooks."""

from __future__ import annotations

import itertools

import pytest
import torch
from dist_utils import run_distributed
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from birder_repro.comm.birder import BirderState
from birder_repro.comm.topology import Topology
from birder_repro.config.settings import ConfigError
from birder_repro.train.precision import Precision
from birder_repro.train.settings import TrainSettings


def test_precision_settings_are_checked_naming_the_key():
    with pytest.raises(ConfigError, match=r"train.precision='fp8': use one of fp32, bf16, fp16"):
        TrainSettings(batch_size=8, precision="fp8").check()
    assert Precision("fp32", "cpu").scaler is None and Precision("bf16", "cpu").scaler is None
    assert Precision("fp16", "cpu").scaler is not None


def test_autocast_runs_the_forward_in_the_chosen_dtype():
    layer = nn.Linear(4, 4)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with Precision(name, "cpu").autocast():
            assert layer(torch.randn(2, 4)).dtype == dtype, name
    assert layer.weight.dtype == torch.float32  # parameters (and so DDP's buckets) stay fp32


def _fp16_steps(monkeypatch, step, losses) -> tuple:
    """Host reads (host_syncs.py) of ``step(precision, optimizer)`` at each fp16 step with these loss factors;
    the precision; and how often the scale backed off (read outside the counted step)."""
    from host_syncs import counted_reads

    torch.manual_seed(0)
    model, precision = nn.Linear(4, 2), Precision("fp16", "cpu")
    opt, counts, scales = torch.optim.SGD(model.parameters(), lr=0.1), [], [precision.scaler.get_scale()]
    for factor in losses:
        with precision.autocast():
            loss = model(torch.randn(3, 4)).float().sum() * factor
        precision.backward(loss)
        with counted_reads(monkeypatch) as reads:
            step(precision, opt)
        counts.append(len(reads))
        scales.append(precision.loss_scale)
        opt.zero_grad()
    return counts, precision, sum(b < a for a, b in itertools.pairwise(scales))


def test_an_fp16_step_reads_the_device_no_more_than_gradscaler_does(monkeypatch):
    """GradScaler's step reads its found-inf flag once (torch's own host sync); Precision.step adds none (it
    read the scale twice per step), and still counts GradScaler's skips, read once at the end of the run."""
    losses = [1.0, float("inf"), 1.0, float("inf"), 1.0]

    def bare(precision, opt):
        precision.scaler.step(opt)
        precision.scaler.update()

    ours, precision, backoffs = _fp16_steps(monkeypatch, Precision.step, losses)
    theirs, _, _ = _fp16_steps(monkeypatch, bare, losses)
    assert ours == theirs and max(ours) <= 1, (ours, theirs)
    assert precision.skipped_steps == backoffs >= 2


SIG = ((0, 0, 40), (1, 40, 24))  # two parameters of one bucket


def _birder(scale=None) -> BirderState:
    state = BirderState(
        Topology(rank=0, world_size=1, gpus_per_node=1),
        scheme="flat",
        param_numels=[40, 24],
        overlap=False,
        seed=3,
        kernel_backend="torch",
    )
    state.loss_scale = None if scale is None else torch.tensor(float(scale))
    return state


def _fields(state) -> dict:
    return {k: t.clone() for k, t in state.store.buckets[0].state.items()}


def test_birder_hook_sees_true_gradients_and_hands_back_what_gradscaler_divides():
    """Steps I-II of train/precision.py: fed S x g under loss scale S, the hook's state is bit for bit the state it
    has when fed g, and its result is S x its result (GradScaler divides it back exactly: S is a power of two)."""
    plain, scaled, scale = _birder(), _birder(2.0**14), 2.0**14
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        g = torch.randn(64, generator=gen) * 1e-3
        out = plain.allreduce_bucket(0, g.clone(), SIG)
        out_scaled = scaled.allreduce_bucket(0, g * scale, SIG)
        assert torch.equal(out_scaled / scale, out) and set(out.unique().tolist()) <= {-1.0, 1.0}
        for k, t in _fields(plain).items():
            assert torch.equal(_fields(scaled)[k], t), k
        assert not plain.end_step() and not scaled.end_step()


def test_birder_hook_under_loss_scaling_poisons_a_skipped_bucket_and_restores_its_state():
    """Step II-III: a bucket whose flag is set comes back NaN (GradScaler then skips the step on every rank), and
    the step GradScaler skipped, which the optimizer never closed, is closed by settle_step: state restored."""
    state = _birder(2.0**10)
    gen = torch.Generator().manual_seed(1)
    state.allreduce_bucket(0, torch.randn(64, generator=gen), SIG)
    state.end_step()
    before = _fields(state)
    bad = torch.randn(64, generator=gen)
    bad[5] = float("inf")
    out = state.allreduce_bucket(0, bad, SIG)
    assert torch.isnan(out).all()
    state.settle_step()  # what Precision.step does after GradScaler skipped the optimizer's step
    assert state.nonfinite_steps == 1 and not state.guard.pending
    for k, t in _fields(state).items():
        assert torch.equal(t, before[k]), k
    state.settle_step()  # nothing pending: a no-op
    assert state.nonfinite_steps == 1


# ------------------------------------------------------------------------- fp16 end to end on 2 processes
class _Task:
    """The part of a task run_step uses: the loss of a batch (rank 1's is made infinite at one step)."""

    def __init__(self, rank: int, bad_step: int):
        self.rank, self.bad_step, self.step = rank, bad_step, 0

    def loss(self, model, batch, device):
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        if self.step == self.bad_step and self.rank == 1:
            loss = loss * float("inf")
        self.step += 1
        return loss, len(y)


def _fp16_run(rank: int, world: int, optim: str):
    from birder_repro.comm import attach_birder, attach_onebit
    from birder_repro.comm.accounting import CommStats
    from birder_repro.optim import Birder, OneBitAdam
    from birder_repro.train.timing import run_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)
    if optim == "birder":
        opt = Birder(ddp.parameters(), lr=0.01)
        comm = attach_birder(ddp, opt, gpus_per_node=1, kernel_backend="torch")
    elif optim == "onebit_adam":
        opt = OneBitAdam(ddp.parameters(), lr=0.01, freeze_step=2)
        comm = attach_onebit(ddp, opt)
    else:
        opt, comm = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9), CommStats()
    precision = Precision("fp16", "cpu", comm)
    task, gen = _Task(rank, bad_step=3), torch.Generator().manual_seed(rank)
    out = {"params": [], "scale": []}
    for _ in range(5):
        batch = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        run_step(task, ddp, opt, batch, torch.device("cpu"), comm, None, precision)
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["scale"].append(precision.loss_scale)
    out["skipped"] = precision.skipped_steps
    out["nonfinite"] = getattr(comm, "nonfinite_steps", None)
    if hasattr(comm, "close"):
        comm.close()
    return out


@pytest.mark.parametrize("optim", ["birder", "onebit_adam", "sgdm"])
def test_fp16_skip_is_one_decision_on_every_rank(optim):
    """Rank 1's gradient overflows at step 3 (the compression stage for 1-bit Adam): GradScaler skips that step
    on both ranks, halves the scale on both, the hooks count it once, and the ranks stay identical."""
    runs = run_distributed(_fp16_run, 2, optim)
    for rank, run in enumerate(runs):
        assert run["skipped"] == 1, rank
        if optim != "sgdm":
            assert run["nonfinite"] == 1, rank
        assert run["scale"][3] == run["scale"][2] / 2, rank
        assert all(torch.equal(a, b) for a, b in zip(run["params"][2], run["params"][3])), f"rank {rank} moved"
        assert not all(torch.equal(a, b) for a, b in zip(run["params"][3], run["params"][4])), "training stopped"
        for p, q in zip(run["params"][-1], runs[0]["params"][-1]):
            assert torch.equal(p, q) and torch.isfinite(p).all(), f"rank {rank} differs from rank 0"


def _onebit_flagged_bucket(rank: int, world: int):
    """1-bit Adam's hook alone in its group (1 node under FSDP) in the compression stage, under loss scale
    2^10: a finite bucket whose node flagged a non-finite gradient elsewhere (``node_flag``), then one not
    flagged. Returns both results."""
    from birder_repro.comm.onebit import OneBitState
    from birder_repro.comm.topology import Topology
    from birder_repro.optim import OneBitAdam

    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(16))
    opt = OneBitAdam([p], lr=0.01, freeze_step=1)
    p.grad = torch.randn(16)
    opt.step()  # past the warmup
    state = OneBitState(opt, None, Topology(rank=0, world_size=1, gpus_per_node=1), {id(p): 0}, overlap=False)
    state.loss_scale = torch.tensor(2.0**10)
    grad = torch.randn(16) * 2.0**10
    flagged = state.compress_bucket(0, grad.clone(), [p], ((0, 0, 16),), node_flag=torch.tensor(1.0)).clone()
    state.settle_step()
    clean = state.compress_bucket(0, grad.clone(), [p], ((0, 0, 16),), node_flag=torch.tensor(0.0)).clone()
    return flagged, clean, state.nonfinite_steps


def test_onebit_hook_poisons_a_flagged_bucket_whose_values_are_finite():
    """The fp16 skip above cannot tell whether 1-bit Adam's hook poisons a flagged bucket: across ranks the flag
    travels as a NaN worker scale, so the average is NaN anyway. Alone in its group, a bucket flagged by its node
    while finite here must still come back NaN, or GradScaler would apply a step the other nodes skip."""
    ((flagged, clean, skipped),) = run_distributed(_onebit_flagged_bucket, 1)
    assert torch.isnan(flagged).all() and skipped == 1
    assert torch.isfinite(clean).all() and clean.abs().max() > 0


# ------------------------------------------------------------------- every task's forward and loss, autocast
# resnet50 (30 s, the largest) only in make test-all: its layers are resnet20's kinds (convolutions, batch norm)
TASKS = [
    "digits",
    "resnet20",
    pytest.param("resnet50", marks=pytest.mark.slow),
    "vit",
    "lstm_ptb",
    "bert_squad",
    "bert_pretrain",
]


class _MatmulDtypes(TorchDispatchMode):
    """The dtypes the matrix products and convolutions under it produce (below autocast: what it cast to)."""

    OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product", "linear", "matmul")

    def __init__(self):
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and any(func.__name__.startswith(op) for op in self.OPS):
            self.dtypes.add(out.dtype)
        return out


@pytest.mark.parametrize("task_name", TASKS)
def test_every_task_trains_a_step_in_bf16_and_fp16(compose, task_name):
    """Each task's own forward, loss and backward under autocast (tiny model, synthetic data, one process): the
    model's matrix products and convolutions computed in the low precision (fp16's LSTM stays fp32 on the CPU:
    tasks/awd_lstm.py), a finite loss, fp32 gradients, and fp16's scaled backward unscaled exactly.
    (Whole runs, 2 nodes with Birder and with the baseline: test_every_task_runs_in_mixed_precision.)"""
    from birder_repro.tasks import get_task
    from birder_repro.train.data import batches

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaders = [] if task_name == "lstm_ptb" else ["data.num_workers=0"]  # (the LSTM's batches need none)
        cfg = compose([f"task={task_name}", "model.size=tiny", "data.source=synthetic", "train.batch_size=2", *loaders])
        task = get_task(task_name)
        data = task.build_data(cfg, 0, 1)
        model = task.build_model(cfg)
        _, batch = next(batches(data, 1, 0, torch.device("cpu")))
        for name in ("bf16", "fp16"):
            precision = Precision(name, "cpu")
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            for attempt in range(24):  # noqa: B007 - read after the loop; fp16: an overflow is skipped, the scale halves
                with precision.autocast(), _MatmulDtypes() as computed:
                    loss, n = task.loss(model, batch, torch.device("cpu"))
                assert torch.isfinite(loss) and n > 0, name
                assert precision.dtype in computed.dtypes, (name, computed.dtypes)  # autocast did cast
                precision.backward(loss)
                precision.unscale_(opt)
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                assert grads and all(g.dtype == torch.float32 for g in grads), name
                finite = all(torch.isfinite(g).all() for g in grads)
                precision.step(opt)
                opt.zero_grad(set_to_none=True)
                if finite:
                    break
                assert name == "fp16", "bf16 needs no loss scaling: its gradients must be finite"
            assert finite and precision.skipped_steps == attempt, (name, attempt)
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------ whole runs, through the CLI
BASELINES = {
    "bert_pretrain": "bertadam",
    "bert_squad": "bertadam",
    "digits": "sgdm",
    "lstm_ptb": "sgdm",
    "resnet20": "sgdm",
    "resnet50": "sgdm",
    "vit": "adamw",
}


def _sweep(runs_dir, task: str, optims: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    loaders = [] if task == "lstm_ptb" else ["data.num_workers=0"]
    if task in ("resnet50", "vit"):  # fp16 convolutions are slow on a CPU: small images
        loaders.append("data.image_size=64")
    args = [
        "-m",
        f"task={task}",
        f"optim={optims}",
        "train.precision=bf16,fp16",
        "nodes=2",
        "gpus_per_node=1",
        "model.size=tiny",
        "data.source=synthetic",
        "train.steps=3",
        "train.batch_size=4",
        "train.eval_max_batches=1",
        "logger=none",
        *loaders,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(runs_dir.rglob("record.json"))], proc.stdout + proc.stderr


def _check_sweep(swept: tuple, optims: str) -> None:
    """Every cell completed in its precision with a finite training loss, and each run's start line said which
    precision it resolved."""
    import math

    records, output = swept
    cells = {(r["optim"], r["precision"]) for r in records}
    assert cells == {(o, p) for o in optims.split(",") for p in ("bf16", "fp16")}
    for r in records:
        assert r["status"] == "completed", r.get("error")
        assert r["steps"] == 3 and r["config"]["train"]["precision"] == r["precision"]
        assert (r["loss_scale"] is not None) == (r["precision"] == "fp16")
        assert isinstance(r["final_loss"], float) and math.isfinite(r["final_loss"]), r["final_loss"]
    starts = [line for line in output.splitlines() if line.startswith("[birder-repro] 2 processes on cpu")]
    for precision in ("bf16", "fp16"):
        said = [line for line in starts if f", precision {precision}; torch " in line]
        assert len(said) == len(optims.split(",")), (precision, starts)


# slow: 37 s; every task's step in bf16 and fp16 and the hooks' fp16 skips stay by default (the tests above)
@pytest.mark.slow
def test_a_run_in_bf16_and_in_fp16_completes_and_says_so(runs_dir):
    """digits with Birder on 2 nodes x 1 (the other tasks and the baselines: the slow test below)."""
    _check_sweep(_sweep(runs_dir, "digits", "birder"), "birder")


@pytest.mark.slow
@pytest.mark.parametrize("task", list(BASELINES))
def test_every_task_runs_in_mixed_precision(runs_dir, task):
    """Every task, tiny and synthetic, 2 nodes x 1, with Birder and with its baseline, in bf16 and in fp16."""
    optims = f"birder,{BASELINES[task]}"
    _check_sweep(_sweep(runs_dir, task, optims), optims)


# ------------------------------------------- fp16 with torch's PowerSGD, and with DiLoCo on 2 nodes (review 4)
def _fp16_local_run(rank: int, world: int, optim: str, agree: bool = True):
    """2 processes as 2 nodes of 1, fp16 with GradScaler, rank 1's loss infinite at step 3 (PowerSGD compresses
    from step 2; DiLoCo's outer step every 2 steps). Returns every step's parameters, scales and PowerSGD state."""
    import torch.distributed as dist

    from birder_repro.comm.diloco import attach_diloco
    from birder_repro.comm.powersgd import attach_powersgd
    from birder_repro.comm.topology import build_topology
    from birder_repro.optim import DiLoCo
    from birder_repro.train.timing import run_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0002)
    if optim == "powersgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        comm = attach_powersgd(ddp, opt, build_topology(1), start_powerSGD_iter=2)
    else:
        opt = DiLoCo(ddp.parameters(), lr=0.01, local_steps=2)
        comm = attach_diloco(ddp, opt, topology=build_topology(1))
    precision = Precision("fp16", "cpu", comm, agree_over=dist.group.WORLD if agree else None)
    task, gen = _Task(rank, bad_step=3), torch.Generator().manual_seed(rank)
    out: dict = {"params": [], "scale": [], "error": [], "q": []}
    for _ in range(8):
        batch = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        run_step(task, ddp, opt, batch, torch.device("cpu"), comm, None, precision)
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["scale"].append(precision.loss_scale)
        if optim == "powersgd":
            ts = comm.torch_state
            out["error"].append({k: v.clone() for k, v in ts.error_dict.items()})
            out["q"].append({k: v.clone() for k, v in ts.q_memory_dict.items()})
    out["skipped"] = precision.skipped_steps
    return out


def _trains_on_after_the_skip(runs: list[dict]) -> None:
    for rank, run in enumerate(runs):
        assert run["skipped"] == 1, rank
        assert run["scale"][3] == run["scale"][2] / 2, rank
        assert all(torch.equal(a, b) for a, b in zip(run["params"][2], run["params"][3])), f"rank {rank} moved"
        for step in range(4, 8):  # every later step trains: finite, and the parameters move
            assert all(torch.isfinite(p).all() for p in run["params"][step]), (rank, step)
            assert not all(torch.equal(a, b) for a, b in zip(run["params"][step - 1], run["params"][step])), step


def test_fp16_powersgd_restores_its_error_and_q_at_a_skipped_step_and_trains_on():
    """torch's PowerSGD writes its error and Q before GradScaler finds the overflow: without the restore, the
    Inf stays in the error feedback and every later step is skipped. With it: one skip, the old Q back, the old
    error back at the halved scale (it is held in units of the scale), and training goes on, ranks identical."""
    runs = run_distributed(_fp16_local_run, 2, "powersgd")
    _trains_on_after_the_skip(runs)
    for rank, run in enumerate(runs):
        assert run["error"][3].keys() == run["error"][2].keys() and run["error"][3], rank
        for k, e in run["error"][3].items():
            assert torch.equal(e, run["error"][2][k] / 2), (rank, k)
            assert torch.equal(run["q"][3][k], run["q"][2][k]), (rank, k)
        for p, q in zip(run["params"][-1], runs[0]["params"][-1]):
            assert torch.equal(p, q), f"rank {rank} differs from rank 0"


def test_fp16_diloco_on_two_nodes_skips_the_overflow_on_every_node_and_trains_on():
    """DiLoCo averages gradients inside a node only: rank 1's overflow is its node's alone. GradScaler's verdict
    agreed over the world, both nodes skip step 3, halve the scale, and reach each outer step together."""
    _trains_on_after_the_skip(run_distributed(_fp16_local_run, 2, "diloco"))


def test_fp16_diloco_without_an_agreed_verdict_skips_on_one_node_only():
    """The negative control of the test above: without the agreement only rank 1 skips step 3, so the nodes
    take their outer steps at different steps, rank 0 one more than rank 1 by the end, and gloo fails that
    outer all-reduce (NCCL would hang in it)."""
    with pytest.raises(AssertionError, match="RuntimeError"):
        run_distributed(_fp16_local_run, 2, "diloco", False)


def test_the_overflow_verdict_is_agreed_only_for_a_local_step_method_on_two_or_more_nodes():
    from birder_repro.train.precision import agrees_overflow

    assert agrees_overflow({"name": "diloco", "local_steps": 10}, 2)
    assert agrees_overflow({"name": "streaming_diloco", "local_steps": 10}, 4)  # any local-step method
    assert not agrees_overflow({"name": "diloco", "local_steps": 10}, 1)
    assert not agrees_overflow({"name": "sgdm_powersgd"}, 2)
