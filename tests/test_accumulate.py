"""Gradient accumulation (``train.accumulate=K``): K micro-batches per optimizer step, the hook once a step.

The claim tested: a run of K = 4 micro-batches of b samples equals, within float rounding, the same run with
one batch of 4b, with SGDM over DDP's all-reduce and with Birder over its 1-bit hook, under DDP and under FSDP2
(2 gloo processes, the whole training loop); its record counts optimizer steps, and its bytes per step are the
4b run's (the hook ran once a step, on the sum). The model has no batch norm or dropout: those see the
micro-batch, not the batch, and would make the two runs differ by design. Birder's update does not depend on
the gradients' scale (it sends and applies signs), so the SGDM case is the one that checks the loss / K; the
Birder cases check that the hook runs on the sum, once a step (a hook on every micro-batch moves its weights by
0.3 to 0.6).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from birder_repro.config.settings import ConfigError, global_batch
from birder_repro.train import RunPlan, TrainSettings

sys.path.insert(0, str(Path(__file__).parent))
from dist_utils import run_distributed
from test_train import BlobsTask, blobs_data

STEPS, MICRO, K = 6, 2, 4  # 6 steps of 2 x 4 x 2 = 16 samples: the 80 blobs' epoch (5 steps) is crossed

# Tolerance: the two runs compute the same sums in a different order (the mean over 8 samples against the
# sum of 4 means over 2, each divided by 4), so they differ by float32 rounding, ~1e-7 relative a step.
# Birder's update is the sign of a momentum: it could differ only where an element is within rounding of 0,
# which no element of this seeded run is; so 1e-5 holds for both.
ATOL = 1e-5


class _Blobs(BlobsTask):
    def fsdp_units(self, model):
        return [model[0]]  # parallel=fsdp: the first layer a unit of its own, the root the rest


def _config(
    compose, optim: str, batch: int, accumulate: int, run_dir: Path, parallel: str = "ddp", extra: tuple = ()
) -> str:
    cfg = compose(
        [
            f"optim={optim}",
            "task=digits",
            "nodes=2",
            "gpus_per_node=1",
            "logger=none",
            f"parallel={parallel}",
            f"train.steps={STEPS}",
            f"train.batch_size={batch}",
            f"train.accumulate={accumulate}",
            "train.eval=false",
            "train.schedule.name=constant",
            "train.schedule.milestones=[]",
            "train.timing_warmup_steps=1",
            "optim.lr=0.05",
            "optim.weight_decay=0.0",
            *extra,
        ]
    )
    return OmegaConf.to_yaml(cfg, resolve=True)


def _linear_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _worker(rank: int, world: int, runs: list[tuple[str, str]]):
    from birder_repro.comm import build_topology
    from birder_repro.train import build_parallel, train
    from birder_repro.train.worker import optim_config

    results = []
    for cfg_yaml, run_dir in runs:
        cfg = OmegaConf.create(cfg_yaml)
        OmegaConf.set_struct(cfg, True)
        topology = build_topology(gpus_per_node=1)
        plan = RunPlan.build(cfg, world, 80)
        torch.manual_seed(0)
        model, optimizer, comm = build_parallel(
            cfg, _Blobs(), _linear_model(), torch.device("cpu"), topology, optim_config(cfg, plan.steps)
        )
        data = blobs_data(rank, world, int(cfg.train.batch_size))
        record = train(
            cfg,
            task=_Blobs(),
            data=data,
            model=model,
            optimizer=optimizer,
            comm=comm,
            topology=topology,
            device=torch.device("cpu"),
            run_dir=run_dir,
            plan=plan,
        )
        module = getattr(model, "module", model)  # DDP's wrapped module; FSDP's model is the module itself
        state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in module.state_dict().items()}
        results.append((record, {k: v.detach().numpy().copy() for k, v in state.items()}))
    return results


@pytest.mark.parametrize("optim,parallel", [("sgdm", "ddp"), ("birder", "ddp"), ("birder", "fsdp")])
def test_four_micro_batches_equal_one_four_times_larger_batch(compose, tmp_path, optim, parallel):
    runs = [
        (_config(compose, optim, MICRO * K, 1, tmp_path / "big", parallel), str(tmp_path / "big")),
        (_config(compose, optim, MICRO, K, tmp_path / "acc", parallel), str(tmp_path / "acc")),
    ]
    (big, big_state), (acc, acc_state) = run_distributed(_worker, 2, runs)[0]
    moved = max(float(np.abs(acc_state[k]).max()) for k in acc_state)
    assert moved > 0.1  # trained: the weights are not near their tolerance
    for name, want in big_state.items():
        np.testing.assert_allclose(acc_state[name], want, rtol=0, atol=ATOL, err_msg=f"{optim}: {name}")
    # The record counts optimizer steps, with K micro-batches of 2 each on each of the 2 processes.
    assert (acc["steps"], acc["accumulate"], acc["batch_size"]) == (STEPS, K, MICRO)
    assert acc["global_batch_size"] == big["global_batch_size"] == MICRO * 2 * K
    assert acc["samples"] == big["samples"] == STEPS * MICRO * 2 * K
    # The hook ran once a step, on the sum: the same bytes per optimizer step as the 4x batch.
    assert acc["inter_node_bytes_per_step"] == pytest.approx(big["inter_node_bytes_per_step"])
    assert acc["inter_node_bytes_per_step"] > 0
    assert acc["final_loss"] == pytest.approx(big["final_loss"], rel=1e-4)


def test_accumulate_setting_and_global_batch(compose):
    cfg = compose(["task=digits", "nodes=2", "gpus_per_node=2", "train.batch_size=32", "train.accumulate=8"])
    assert global_batch(cfg) == 32 * 4 * 8
    plan = RunPlan.build(cfg, 4, 1437)
    assert plan.global_batch == 1024 and plan.settings.accumulate == 8
    assert plan.steps == 10 * 2  # 10 epochs of ceil(1437 / 1024) optimizer steps
    assert compose(["task=digits"]).train.accumulate == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="train.accumulate"):
            TrainSettings(batch_size=8, accumulate=bad).check()


def test_predicted_step_counts_every_micro_batch(compose):
    """mode=predict: a step computes K micro-batches (the profile's compute is linear in the batch) and sends
    one step's bytes; throughput counts the K x b samples of every process."""
    from birder_repro.perf.predict import predict_record

    def predicted(k: int) -> dict:
        cfg = compose(
            [
                "experiment=table1",
                "optim=sgdm",
                "nodes=1",
                "predict.profile=paper",
                "train.batch_size=32",
                f"train.accumulate={k}",
            ]
        )
        return predict_record(OmegaConf.to_container(cfg, resolve=True))

    one, eight = predicted(1), predicted(8)
    assert (eight["batch_size"], eight["accumulate"], eight["global_batch_size"]) == (32, 8, 2048)
    assert eight["intra_node_bytes_per_step"] == pytest.approx(one["intra_node_bytes_per_step"])
    assert eight["step_time_s"]["compute"] > 5 * one["step_time_s"]["compute"]  # forward and backward x 8
    assert eight["throughput_samples_per_s"] == pytest.approx(2048 / eight["step_time_s"]["total"])


def test_a_step_of_four_micro_batches_reads_its_loss_once(monkeypatch):
    """The micro-batches' losses add up on the device and are read with the step's own (counted on the CPU:
    host_syncs.py): a read per micro-batch would make a GPU wait for each one's kernels before queueing the next."""
    from host_syncs import counted_reads

    from birder_repro.comm import CommState
    from birder_repro.train.timing import run_step

    torch.manual_seed(0)
    from test_train import blobs

    model, data = nn.Linear(8, 4), blobs(32, 0)
    batches = [(data.tensors[0][i : i + 8], data.tensors[1][i : i + 8]) for i in range(0, 32, 8)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with counted_reads(monkeypatch) as reads:
        result = run_step(
            BlobsTask(), model, optimizer, batches[-1], torch.device("cpu"), CommState(), accumulated=batches[:-1]
        )
    assert reads.count("__float__") == 1, reads
    assert result.samples == 32 and result.loss_sum > 0


def test_a_run_of_micro_batches_resumed_mid_epoch_equals_the_run_left_alone(compose, tmp_path):
    """K = 4 micro-batches a step, stopped after step 2 (a checkpoint) and resumed to step 6: the resumed run
    starts at micro-batch 2 x 4 of the data stream, not at batch 2, and so ends where the run left alone does,
    bit for bit (SGDM, whose momentum and weights follow every sample)."""
    first, second = tmp_path / "first", tmp_path / "second"
    runs = [
        (_config(compose, "sgdm", MICRO, K, tmp_path / "alone"), str(tmp_path / "alone")),
        (_config(compose, "sgdm", MICRO, K, first, extra=("train.steps=2", "train.checkpoint_every=2")), str(first)),
        (_config(compose, "sgdm", MICRO, K, second, extra=(f"train.resume={first}",)), str(second)),
    ]
    (alone, alone_state), _, (resumed, resumed_state) = run_distributed(_worker, 2, runs)[0]
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == alone["steps"] == STEPS
    for name, want in alone_state.items():
        np.testing.assert_array_equal(resumed_state[name], want, err_msg=name)
