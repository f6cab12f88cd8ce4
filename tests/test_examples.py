"""The examples a user copies (examples/): each trains toy's model in toy's data order and prints the
parameters' fingerprint last; an integration is right when its fingerprint equals examples/plain_ddp.py's.

Every example runs under torchrun with 2 gloo processes (2 nodes of 1 process); each run costs 10-30 s of
imports, so the default run holds one run per example and optimizer that matters, the rest is marked slow.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="lightning is not installed: pip install -e '.[integrations]'"
)


def run_example(script: str, *args: str, nproc: int = 2, timeout: float = 300.0, batch_norm: bool = False) -> str:
    """``torchrun --standalone --nproc-per-node=<nproc> examples/<script> <args>``; its ``fingerprint=`` (the last
    line that has one), or an AssertionError with the run's output."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(EXAMPLES / script),
        *args,
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        TOY_BATCH_NORM="1" if batch_norm else "0",  # toy.make_model: a batch norm whose statistics must resume
    )
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    found = re.findall(r"^fingerprint=([0-9a-f]+)$", proc.stdout, flags=re.M)
    assert proc.returncode == 0 and found, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return found[-1]


@functools.cache
def reference(optim: str, batch_norm: bool = False) -> str:
    """examples/plain_ddp.py's fingerprint for ``optim`` (run once per test session)."""
    return run_example("plain_ddp.py", "--optim", optim, batch_norm=batch_norm)


# ------------------------------------------------------------------------------------------- plain DDP
@pytest.mark.slow
@pytest.mark.parametrize("optim", ["birder", "onebit_adam"])
def test_plain_ddp_stopped_and_resumed_ends_as_one_left_alone(optim, tmp_path):
    stopped = run_example("plain_ddp.py", "--optim", optim, "--save", str(tmp_path), "--stop-at", "4")
    assert stopped != reference(optim)  # it did stop early
    assert run_example("plain_ddp.py", "--optim", optim, "--resume", str(tmp_path)) == reference(optim)


# ----------------------------------------------------------------------------------------------- FSDP2
# slow: 35 s; FSDP2 with Birder stays by default through the runner (test_fsdp_runner.py) and its hooks (test_fsdp.py)
@pytest.mark.slow
def test_fsdp2_birder_equals_plain_ddp_bit_for_bit():
    # 1 process per node: FSDP's node average is the process's own gradient, exact (docs/fsdp.md)
    assert run_example("fsdp2.py", "--optim", "birder") == reference("birder")


def _onebit_reference_of_the_toy_run():
    """The toy run (examples/toy.py: its model, data order and 1-bit Adam) through the single-process 1-bit Adam
    reference with a scale per tensor (birder_repro.references.deepspeed_onebit, the project's choices), laid out
    as examples/fsdp2.py lays it out: one unit holding every parameter in the model's order, each of the 2
    processes a node (its own gradient is its node's)."""
    sys.path.insert(0, str(EXAMPLES))
    import toy

    from birder_repro.references.deepspeed_onebit import Choices, DeepSpeedOnebitAdamReference

    model, dataset = toy.make_model(), toy.make_dataset()
    params = [p.detach().clone() for p in model.parameters()]
    ref = DeepSpeedOnebitAdamReference(
        params,
        2,
        lr=1e-2,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        freeze_step=toy.FREEZE_STEP,
        choices=Choices.project(2),
    )
    loaders = [
        iter(torch.utils.data.DataLoader(dataset, batch_size=toy.BATCH, sampler=toy.make_sampler(dataset, r, 2)))
        for r in range(2)
    ]
    for _ in range(toy.STEPS):
        grads = []
        for loader in loaders:
            x, y = next(loader)
            with torch.no_grad():
                for p, q in zip(model.parameters(), ref.x):
                    p.copy_(q)
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads.append([p.grad.detach().clone() for p in model.parameters()])
        ref.step(grads, [list(range(len(params)))])
    return dict(zip(model.state_dict(), ref.x))


@pytest.mark.slow
def test_fsdp2_onebit_adam_follows_the_per_tensor_reference(tmp_path):
    # Not compared with plain DDP: 1-bit Adam's server scales are per piece of a chunk of the exchanged vector,
    # and FSDP's shard orders the parameters as the model does, DDP's bucket in gradient-ready order.
    run_example("fsdp2.py", "--optim", "onebit_adam", "--save", str(tmp_path))
    params = torch.load(tmp_path / "model.pt", weights_only=True)
    want = _onebit_reference_of_the_toy_run()
    for name, value in params.items():
        torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


# ------------------------------------------------------------------------------------------- Lightning
# slow: 76 s of Lightning's imports; a framework's stop-and-resume stays by default: the Trainer's (test_examples_hf.py)
@pytest.mark.slow
@needs_lightning
@pytest.mark.parametrize("optim", ["birder", pytest.param("onebit_adam", marks=pytest.mark.slow)])
def test_lightning_killed_and_resumed_equals_plain_ddp(optim, tmp_path):
    """Stopped at step 4 with Lightning's checkpoints (each rank's hook state beside them), resumed with
    ``fit(ckpt_path=...)``: the parameters and batch norm's statistics of plain DDP's uninterrupted run, bit for
    bit (the settling pass before the load leaves the statistics alone)."""
    run_example("lightning_birder.py", "--optim", optim, "--save", str(tmp_path), "--stop-at", "4", batch_norm=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch=0-step=4.ckpt",
        "epoch=0-step=4.ckpt.birder_hook_rank00000.pt",
        "epoch=0-step=4.ckpt.birder_hook_rank00001.pt",
        "last.ckpt",
        "last.ckpt.birder_hook_rank00000.pt",
        "last.ckpt.birder_hook_rank00001.pt",
    ]  # older checkpoints removed with their hook states
    resumed = run_example(
        "lightning_birder.py", "--optim", optim, "--resume", str(tmp_path / "last.ckpt"), batch_norm=True
    )
    assert resumed == reference(optim, batch_norm=True)


@needs_lightning
@pytest.mark.slow
@pytest.mark.parametrize("optim", ["birder", "onebit_adam"])
def test_lightning_left_alone_equals_plain_ddp(optim):
    assert run_example("lightning_birder.py", "--optim", optim) == reference(optim)


@needs_lightning
def test_lightning_strategy_layout_and_refusals():
    from birder_repro.integrations.lightning import BirderStrategy, hook_state_path

    with pytest.raises(ValueError, match="ddp_comm_hook"):
        BirderStrategy(ddp_comm_hook=lambda state, bucket: None)
    assert hook_state_path("ckpt/last.ckpt", 3).name == "last.ckpt.birder_hook_rank00003.pt"
    # processes per node: Lightning's devices, unless given
    cpus = [torch.device("cpu")] * 4
    assert BirderStrategy(parallel_devices=cpus).processes_per_node == 4
    assert BirderStrategy(parallel_devices=cpus, gpus_per_node=1).processes_per_node == 1
    # and the layout line says which (it said "gpus_per_node=4 as given" where the value came from devices)
    assert BirderStrategy(parallel_devices=cpus).layout_source == "Lightning's devices=4 a node, num_nodes=1"
    assert BirderStrategy(parallel_devices=cpus, gpus_per_node=1).layout_source == (
        "gpus_per_node=1 given to BirderStrategy"
    )


@needs_lightning
@pytest.mark.slow  # 36 s; Lightning stays by default (killed and resumed above), the hooks in bf16: test_precision
def test_lightning_16_mixed_on_the_cpu_runs_as_bf16_and_equals_plain_ddp_under_bf16_autocast():
    """``precision="16-mixed"`` as a user leaves it: on a CPU Lightning runs it as bf16-mixed (no GradScaler),
    which equals plain DDP with its forward and loss under bf16 autocast, bit for bit."""
    got = run_example("lightning_birder.py", "--optim", "birder", "--precision", "16-mixed")
    assert got == run_example("plain_ddp.py", "--optim", "birder", "--autocast", "bf16")
    assert got != reference("birder")  # bf16 did change the run


# ------------------------------------------------------------------------------------------ torch.compile
@pytest.mark.slow  # 21 s; torch.compile(ddp_model) with the hooks on 2 processes stays by default: test_compile.py
@pytest.mark.parametrize("optim", ["birder", "onebit_adam"])
def test_torch_compile_of_the_ddp_model_equals_eager(optim):
    """torch.compile(ddp_model) (DDPOptimizer splits the graph at bucket boundaries; DDP's C++ reducer still
    calls the hook per bucket): on the toy model the same bits as eager."""
    assert run_example("compiled_ddp.py", "--optim", optim, "--mode", "compile") == reference(optim)


def _attach_under_python_reducer(rank, world):
    import torch._dynamo

    from birder_repro.comm import attach_birder, attach_onebit
    from birder_repro.optim import Birder, OneBitAdam

    torch._dynamo.config.optimize_ddp = "python_reducer"  # what compiled autograd needs of DDP
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    refused = []
    for attach, opt in (
        (attach_birder, Birder(ddp.parameters(), lr=0.1)),
        (attach_onebit, OneBitAdam(ddp.parameters(), lr=0.1, freeze_step=2)),
    ):
        try:
            attach(ddp, opt)
        except ValueError as err:
            refused.append(str(err))
    return refused


def test_compiled_autograd_is_refused_in_one_line():
    from dist_utils import run_distributed

    refused = run_distributed(_attach_under_python_reducer, 2)[0]
    assert [line.split(":")[0] for line in refused] == ["attach_birder", "attach_onebit"]
    assert all("python_reducer" in line and "\n" not in line for line in refused)


@pytest.mark.slow
def test_compiled_autograd_example_stops_at_the_attach():
    with pytest.raises(AssertionError, match="optimize_ddp='python_reducer'"):
        run_example("compiled_ddp.py", "--optim", "birder", "--mode", "compiled_autograd")
