"""The Accelerate and Hugging Face Trainer examples against the plain DDP one (examples/, docs/integrations.md).

Each example trains toy's model in toy's data order on 2 gloo processes (2 nodes of one process) and prints
``fingerprint=<hash of the parameters>`` last: equal fingerprints, equal parameters bit for bit. Every run costs
~10-30 s of imports, so the default set is Birder's (the same arithmetic as plain DDP: bit for bit), each
framework's stop-and-resume through its own checkpoints (which equal plain DDP's run bit for bit: the left-alone
runs add nothing to that in the default set); 1-bit Adam, the left-alone runs and gradient accumulation are slow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TOY_STEPS = 8  # examples/toy.py STEPS

pytest.importorskip("accelerate")


def run_example(script: str, *args: str, batch_norm: bool = False) -> tuple[str, str]:
    """Run ``examples/<script>`` under torchrun with 2 processes; (its fingerprint, its whole stdout)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(EXAMPLES / script),
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOY_BATCH_NORM": "1" if batch_norm else "0"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # Where every rank prints (plain_ddp.py), their lines may interleave: read every hash, and they must agree.
    found = set(re.findall(r"fingerprint=([0-9a-f]{16})", done.stdout))
    assert len(found) == 1, f"{script}: expected one fingerprint, got {found or 'none'}:\n{done.stdout[-3000:]}"
    return found.pop(), done.stdout


_plain: dict[tuple[str, bool], str] = {}


def plain_ddp(optim: str, batch_norm: bool = False) -> str:
    """The plain DDP example's fingerprint (run once per optimizer, model and test session)."""
    if (optim, batch_norm) not in _plain:
        _plain[optim, batch_norm] = run_example("plain_ddp.py", "--optim", optim, batch_norm=batch_norm)[0]
    return _plain[optim, batch_norm]


def slow_unless(optim: str):
    return pytest.param(optim, marks=pytest.mark.slow) if optim != "birder" else optim


OPTIMS = [slow_unless("birder"), slow_unless("onebit_adam")]


@pytest.mark.slow  # the resumed run below equals plain DDP bit for bit, each step through Accelerate included
@pytest.mark.parametrize("optim", OPTIMS)
def test_accelerate_equals_plain_ddp(optim):
    """Prepared by Accelerate, the same arithmetic as plain DDP: the same parameters bit for bit, and the hook
    ran once per optimizer step (the toy model is one DDP bucket)."""
    fingerprint, out = run_example("accelerate_birder.py", "--optim", optim)
    assert f"hook_calls={TOY_STEPS} optimizer_steps={TOY_STEPS}" in out
    assert fingerprint == plain_ddp(optim)


@pytest.mark.slow  # the resumed run below equals plain DDP bit for bit, each step through the Trainer included
@pytest.mark.parametrize("optim", OPTIMS)
def test_hf_trainer_equals_plain_ddp(optim):
    assert run_example("hf_trainer_birder.py", "--optim", optim)[0] == plain_ddp(optim)


@pytest.mark.slow  # 55 s; a framework's stop-and-resume through its checkpoints stays by default: the Trainer's, below
@pytest.mark.parametrize("optim", OPTIMS)
def test_accelerate_resumed_equals_left_alone(optim, tmp_path):
    """Stopped after 4 steps with accelerator.save_state, resumed with load_state: as if never stopped, batch
    norm's statistics included (the settling pass after the load leaves them alone)."""
    ckpt = str(tmp_path / "ckpt")
    run_example("accelerate_birder.py", "--optim", optim, "--save", ckpt, "--stop-at", "4", batch_norm=True)
    assert sorted(p.name for p in Path(ckpt).glob("birder_hook_rank*.pt")) == [
        "birder_hook_rank00000.pt",
        "birder_hook_rank00001.pt",
    ]
    fingerprint, out = run_example("accelerate_birder.py", "--optim", optim, "--resume", ckpt, batch_norm=True)
    assert f"hook_calls={TOY_STEPS}" in out  # 4 before the stop, 4 after: the counters came back too
    assert fingerprint == plain_ddp(optim, batch_norm=True)


@pytest.mark.parametrize("optim", OPTIMS)
def test_hf_trainer_resumed_equals_left_alone(optim, tmp_path):
    """Stopped after the Trainer's checkpoint at step 4, resumed with resume_from_checkpoint=True: batch norm's
    statistics too (the Trainer loads the model before the settling pass, which must leave them alone)."""
    out_dir = tmp_path / "out"
    run_example("hf_trainer_birder.py", "--optim", optim, "--save", str(out_dir), "--stop-at", "4", batch_norm=True)
    assert {p.name for p in (out_dir / "checkpoint-4").glob("birder_hook_rank*.pt")} == {
        "birder_hook_rank00000.pt",
        "birder_hook_rank00001.pt",
    }
    resumed = run_example("hf_trainer_birder.py", "--optim", optim, "--resume", str(out_dir), batch_norm=True)[0]
    assert resumed == plain_ddp(optim, batch_norm=True)


@pytest.mark.slow
def test_accelerate_accumulation_birder_once_per_step():
    """2 micro-batches of 4 under accelerator.accumulate: one hook call per optimizer step, on the mean of the
    accumulated gradients. Birder's +-1 update only changes where a rounding difference in that mean flips a
    stochastic-rounding draw (none does here): the same parameters as plain DDP's batches of 8."""
    fingerprint, out = run_example("accelerate_birder.py", "--accum", "2")
    assert f"hook_calls={TOY_STEPS} optimizer_steps={TOY_STEPS}" in out
    assert fingerprint == plain_ddp("birder")


@pytest.mark.slow
def test_accelerate_accumulation_onebit_adam_within_rounding(tmp_path):
    """1-bit Adam's fp32 warmup steps use the gradient itself: the mean of two half-batch means differs from the
    mean over the batch by float32 rounding (~1 ulp), which Adam's m / sqrt(v) carries on. Measured: at most
    1.2e-6 after 8 steps; a flipped sign in the compressed stage would move an element by ~lr = 1e-2."""
    whole, halves = tmp_path / "whole.pt", tmp_path / "halves.pt"
    run_example("accelerate_birder.py", "--optim", "onebit_adam", "--dump", str(whole))
    _, out = run_example("accelerate_birder.py", "--optim", "onebit_adam", "--accum", "2", "--dump", str(halves))
    assert f"hook_calls={TOY_STEPS} optimizer_steps={TOY_STEPS}" in out
    for a, b in zip(torch.load(whole), torch.load(halves)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


@pytest.mark.slow  # 28 s; Accelerate's fp16 scaler reaching the hook stays by default: tests/test_grad_scaler.py
def test_accelerate_with_mixed_precision_fp16_on_the_cpu_equals_plain_ddp():
    """``mixed_precision="fp16"`` as a user leaves it: on a CPU Accelerate makes no GradScaler and no autocast, so
    the run is fp32 and equals plain DDP bit for bit (on a GPU its scaler reaches the hook: test_grad_scaler.py)."""
    fingerprint, out = run_example("accelerate_birder.py", "--optim", "birder", "--mixed-precision", "fp16")
    assert "mixed_precision=fp16 scaler=NoneType" in out
    assert fingerprint == plain_ddp("birder")
