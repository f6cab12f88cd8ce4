"""The training loop for real: a tiny task on 2 gloo processes (a few seconds), and its pieces in-process.

The two-process run uses an fp16 all-reduce hook written here (a minimal CommStats subclass with two labelled
stages), so the loop is tested against byte counts we know exactly: one bucket of P fp16 elements over 2
processes is 2(2-1)/2 x 2P = 2P bytes per step per process, all inter-node (2 nodes x 1 process).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf, open_dict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from birder_repro.comm.accounting import CommStats, allreduce_bytes
from birder_repro.comm.kernels import process_cores
from birder_repro.comm.readiness import clocked_registration
from birder_repro.comm.topology import Topology, build_topology
from birder_repro.perf.profile import load_profile
from birder_repro.run.summary import format_summary, human_bytes
from birder_repro.tasks.base import Task, TaskData
from birder_repro.train import split_step_time, stage_of, total_steps, train
from birder_repro.train.logger import METRICS_FILE, RunLogger, wandb_mode

sys.path.insert(0, str(Path(__file__).parent))
from dist_utils import run_distributed

ROOT = Path(__file__).resolve().parents[1]
FREEZE_STEP = 6  # the test hook's stage switch: "warmup" before, "compression" from this step
TARGET_TOP1 = 90.0  # the full run's task.target


# ------------------------------------------------------------------------------------------ a tiny task
class BlobsTask(Task):
    """Four Gaussian blobs in 8 dimensions: learnable in a few steps."""

    name = "blobs"
    metrics = ("top1",)

    def loss(self, model, batch, device):
        x, y = batch
        return F.cross_entropy(model(x.to(device)), y.to(device)), len(y)

    @torch.no_grad()
    def evaluate(self, model, loader, device):
        correct = loss = n = 0.0
        for x, y in loader:
            out = model(x.to(device))
            correct += (out.argmax(1) == y).sum().item()
            loss += F.cross_entropy(out, y, reduction="sum").item()
            n += len(y)
        return {"top1": (100.0 * correct, n), "loss": (loss, n)}


def blobs(size: int, seed: int) -> TensorDataset:
    centers = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (size,), generator=g)
    return TensorDataset(centers[y] + 0.5 * torch.randn(size, 8, generator=g), y)


def blobs_data(rank: int, world: int, batch_size: int, train_size: int = 80) -> TaskData:
    sampler = DistributedSampler(blobs(train_size, 1), world, rank, shuffle=True, seed=0)
    eval_set = blobs(64, 2)
    return TaskData(
        train=DataLoader(sampler.dataset, batch_size=batch_size, sampler=sampler),
        eval=DataLoader(eval_set, batch_size=16, sampler=DistributedSampler(eval_set, world, rank, shuffle=False)),
        train_size=train_size,
        description="synthetic: 4 Gaussian blobs (test data)",
        sampler=sampler,
    )


def tiny_model() -> nn.Module:
    # BatchNorm and Dropout: the compute calibration must leave their buffers and RNG as it found them.
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))


# ------------------------------------------------------------------------- a counted fp16 all-reduce
class CountingComm(CommStats):
    """fp16 all-reduce with counted bytes and timed casts; two stages by name only, as 1-bit Adam has."""

    __slots__ = ()

    def stage(self, step: int) -> str:
        return "warmup" if step < FREEZE_STEP else "compression"

    def state_dict(self):
        return {"stats": self.snapshot()}

    def load_state_dict(self, sd):
        for k, v in sd["stats"].items():
            setattr(self, k, type(getattr(self, k))(v))


def fp16_counting_hook(state: CountingComm, bucket):
    buffer, world = bucket.buffer(), dist.get_world_size()
    with state.timing("compress"):
        half = buffer.to(torch.float16).div_(world)
    state.inter_node_bytes += allreduce_bytes(half.numel() * half.element_size(), world)  # 1 process a node
    state.calls += 1

    def decompress(fut):
        with state.timing("compress"):
            buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(half, async_op=True).get_future().then(decompress)


# ------------------------------------------------------------------------------------------ the config
def make_config(run_dir: Path, logger: str = "none", **train) -> OmegaConf:
    """The real ``train:`` and ``logger`` nodes of conf/, struct mode on, with the test's values."""
    base = OmegaConf.load(ROOT / "conf" / "config.yaml")
    cfg = OmegaConf.create(
        {
            "train": base.train,
            "logger": OmegaConf.load(ROOT / "conf" / "logger" / f"{logger}.yaml"),
            "task": {"name": "blobs"},
            "optim": {"name": "sgdm", "lr": 0.2},
            "nodes": 2,
            "gpus_per_node": 1,
            "seed": 0,
        }
    )
    cfg.train.merge_with({"batch_size": 8, "timing_warmup_steps": 2, "log_every": 2, "eval_max_batches": 2, **train})
    if logger == "wandb":
        cfg.logger.mode = "offline"
    OmegaConf.set_struct(cfg, True)
    return cfg


def _train_worker(rank: int, world: int, runs: list[tuple[str, str]], env: dict):
    """Each (config, run directory) of ``runs`` in turn, in the same processes: DDP's first construction
    imports torch._dynamo (seconds), which is paid once this way."""
    os.environ.update(env)
    results = []
    for cfg_yaml, run_dir in runs:
        torch.manual_seed(0)
        cfg = OmegaConf.create(cfg_yaml)
        OmegaConf.set_struct(cfg, True)
        topology = build_topology(gpus_per_node=1)
        model = nn.parallel.DistributedDataParallel(tiny_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=0.9)
        comm = CountingComm()
        with clocked_registration(model):  # as attach_comm registers every hook: its calls are timed
            model.register_comm_hook(comm, fp16_counting_hook)
        record = train(
            cfg,
            task=BlobsTask(),
            data=blobs_data(rank, world, cfg.train.batch_size),
            model=model,
            optimizer=optimizer,
            comm=comm,
            topology=topology,
            device=torch.device("cpu"),
            run_dir=run_dir,
        )
        # numpy arrays travel by value; tensors would be shared through file descriptors of exited processes.
        results.append((record, {k: v.detach().numpy().copy() for k, v in model.module.state_dict().items()}))
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """On 2 processes: 12 steps with W&B offline, the lr divided by 10 halfway and a checkpoint at step 8;
    then, with logger none, the same run resumed from that checkpoint (mid-epoch: 5 steps an epoch)."""
    tmp = tmp_path_factory.mktemp("train")
    full_dir, resumed_dir = tmp / "full", tmp / "resumed"
    env = {
        "WANDB_DIR": str(tmp),
        "WANDB_CACHE_DIR": str(tmp / "cache"),
        "WANDB_CONFIG_DIR": str(tmp / "cfg"),
        "WANDB_SILENT": "true",
    }
    schedule = {"name": "multistep", "milestones": [0.5], "gamma": 0.1}  # lr / 10 from step 6 on
    full = make_config(full_dir, logger="wandb", steps=12, checkpoint_every=8, schedule=schedule, eval_every=4)
    with open_dict(full):  # time to accuracy: evaluations after steps 4 and 8, and the final one
        full.task.target = {"metric": "top1", "value": TARGET_TOP1, "direction": "higher"}
    resumed = make_config(resumed_dir, logger="none", steps=12, resume=str(full_dir), schedule=schedule)
    no_eval_dir = tmp / "no-eval"  # train.eval=false: no evaluation at all, those every eval_every steps too
    no_eval = make_config(no_eval_dir, logger="none", steps=4, eval_every=2, eval=False)
    at_target_dir = tmp / "at-target"  # train.stop_at_target: a target any evaluation reaches ends it at step 2
    at_target = make_config(at_target_dir, logger="none", steps=8, eval_every=2, stop_at_target=True)
    with open_dict(at_target):
        at_target.task.target = {"metric": "top1", "value": 0.0, "direction": "higher"}
    by_rank = run_distributed(
        _train_worker,
        2,
        [
            (OmegaConf.to_yaml(c), str(d))
            for c, d in ((full, full_dir), (resumed, resumed_dir), (no_eval, no_eval_dir), (at_target, at_target_dir))
        ],
        env,
    )
    return {
        "full": (full_dir, [r[0] for r in by_rank]),
        "resumed": (resumed_dir, [r[1] for r in by_rank]),
        "no_eval": (no_eval_dir, [r[2] for r in by_rank]),
        "at_target": (at_target_dir, [r[3] for r in by_rank]),
    }


def test_stop_at_target_ends_every_rank_at_the_first_reaching_evaluation(runs):
    _, [(record, _), (record1, _)] = runs["at_target"]
    for rec in (record, record1):  # reached at step 2; the first timed step (the 3rd) comes before the stop
        assert (rec["steps"], rec["planned_steps"], rec["stopped_at_target"]) == (3, 8, True)
        assert rec["time_to_target"]["reached"] and rec["time_to_target"]["step"] == 2
        assert rec["timed_steps"] == 1 and rec["compute_calibration_passes"] > 0
    assert "3 steps (ended at its target: train.stop_at_target; 8 planned)" in format_summary(record)
    _, [(full, _), _] = runs["full"]
    assert (full["steps"], full["planned_steps"], full["stopped_at_target"]) == (12, 12, False)


def test_eval_false_turns_off_the_evaluations_during_training_too(runs):
    run_dir, [(record, _), _] = runs["no_eval"]
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert rows and not [r for r in rows if any(k.startswith("eval/") for k in r)]
    assert record["steps"] == 4


@pytest.fixture
def full_run(runs):
    return runs["full"]


# ------------------------------------------------------------------------------------- two processes
def test_record_has_every_key_and_parts_sum_to_the_step(full_run):
    _, [(record, _), _] = full_run
    for key in (
        "steps",
        "samples",
        "throughput_samples_per_s",
        "throughput_by_stage",
        "step_time_s",
        "intra_node_bytes_per_step",
        "inter_node_bytes_per_step",
        "fp32_allreduce_bytes_per_step",
        "metrics",
        "final_loss",
        "timing_warmup_steps",
    ):
        assert key in record, key
    assert "loss_history" not in record
    assert record["steps"] == 12 and record["samples"] == 12 * 16 and record["timing_warmup_steps"] == 2
    st = record["step_time_s"]
    assert min(st["compute"], st["communication"], st["compression"], st["data_wait"]) >= 0
    # Throughput counts the whole step: the wait for the batch is its fourth part.
    assert st["data_wait"] == pytest.approx(record["data_wait_s_per_step"])
    # Each part is its own measurement, not a remainder: compute is the calibrated forward + backward (no_sync
    # passes) plus the optimizer step; compression the hook's timed fp16 casts; communication what is left of
    # the step, which is never negative: where noise would make it so, compute gives up the difference.
    own_compute = record["forward_backward_s"] + record["profile"]["optimizer_s"]
    assert record["forward_backward_s"] > 0 and record["profile"]["optimizer_s"] > 0
    # The contention the profile was measured under: this node's processes and the cores they could run on.
    assert record["profile"]["name"].endswith("/2x1") and record["profile"]["processes"] == 1  # a node's
    assert record["profile"]["node_cores"] == process_cores()
    assert st["compression"] == pytest.approx(record["overlap_s"]["compression_work"]) and st["compression"] > 0
    if st["communication"] > 0:
        assert st["compute"] == pytest.approx(own_compute, rel=1e-9)
    else:
        assert st["compute"] <= own_compute
    step = st["total"] - st["data_wait"]
    assert st["communication"] == pytest.approx(max(0.0, step - own_compute - st["compression"]), abs=1e-12)
    assert record["compute_calibration_passes"] == 3 and record["timed_steps"] == 10
    assert record["throughput_samples_per_s"] == pytest.approx(16 / st["total"], rel=1e-6)
    assert set(record["throughput_by_stage"]) == {"warmup", "compression"}
    assert all(v > 0 for v in record["throughput_by_stage"].values())


def test_time_to_target_is_the_first_logged_evaluation_that_reached_it(full_run):
    """The record's time to target, from what metrics.jsonl logged independently: the first evaluation line
    (steps 4 and 8) or else the final metrics at step 12 reaching top-1 90, at that line's training clock less
    the first step's one-time work; the training clock never runs ahead of the wall clock."""
    run_dir, [(record, _), (record1, _)] = full_run
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    evals = [(r["step"], r["eval/top1"], r["train_s"]) for r in rows if "eval/top1" in r]
    assert [s for s, _, _ in evals] == [4, 8]
    final_clock = max(r["train_s"] for r in rows if r["step"] == 12)
    candidates = evals + [(12, record["metrics"]["top1"], final_clock)]
    hit = next(((s, v, t) for s, v, t in candidates if v >= TARGET_TOP1), None)
    got = record["time_to_target"]
    assert (got["metric"], got["target"], got["direction"]) == ("top1", TARGET_TOP1, "higher")
    assert got["evaluations"] == 3 and got["eval_every"] == 4 and got["clock_from_step"] == 0
    if hit is None:
        assert got["reached"] is False and got["seconds"] is None
    else:
        step, value, clock = hit
        assert got["reached"] is True and (got["step"], got["samples"]) == (step, step * 16)
        assert got["value"] == pytest.approx(value)
        assert got["seconds"] == pytest.approx(clock - record["compile_s"], abs=2e-4)  # the line's 4 decimals
        assert got["wall_s"] >= got["seconds"] + record["compile_s"] - 1e-9  # evaluations and all in the wall
    assert record["first_step_s"] >= record["compile_s"] >= 0 and record["startup_s"] > 0
    assert record1["time_to_target"]["step"] == got["step"]  # every rank found the same evaluation
    # loop_step_s: the clock's mean pass over the timed steps, which the whole clock holds (and more: the first
    # steps, less only the first step's one-time work)
    assert 0 < record["loop_step_s"] * record["timed_steps"] <= final_clock + 1e-3
    clocks = [r["train_s"] for r in rows]
    assert clocks == sorted(clocks) and all(r["train_s"] <= r["time_s"] + 1e-3 for r in rows)


def test_record_has_a_profile_the_performance_model_loads(full_run):
    _, [(record, params), _] = full_run
    profile = load_profile(record)  # a record (load_profile also takes its run directory)
    assert profile.task == "blobs" and profile.batch_size == 8
    assert profile.forward_backward_s == pytest.approx(record["forward_backward_s"])
    assert 0 < profile.backward_fraction <= 1 and profile.optimizer_s >= 0
    p = sum(v.size for k, v in params.items() if "running" not in k and "num_batches" not in k)
    assert sum(profile.bucket_elements) == profile.parameter_count == p
    assert len(profile.bucket_ready) == len(profile.bucket_elements) == len(profile.bucket_ready_s)
    assert all(0 <= f <= 1 for f in profile.bucket_ready) and all(t >= 0 for t in profile.bucket_ready_s)
    assert profile.data_wait_s == pytest.approx(record["data_wait_s_per_step"])


def test_bytes_per_step_are_the_hooks_count_and_fp32_is_twice_fp16(full_run):
    _, [(record, params), _] = full_run
    p = sum(v.size for k, v in params.items() if "running" not in k and "num_batches" not in k)
    assert record["inter_node_bytes_per_step"] == pytest.approx(2 * p)  # 2(n-1)/n x 2 bytes x P with n = 2
    assert record["intra_node_bytes_per_step"] == 0
    assert record["fp32_allreduce_bytes_per_step"] == pytest.approx(4 * p)
    assert record["fp32_allreduce_inter_node_bytes_per_step"] == pytest.approx(4 * p)


def test_loss_falls_and_metrics_are_reduced_over_processes(full_run):
    run_dir, [(record, params0), (record1, params1)] = full_run
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    losses = [row["loss"] for row in lines if "loss" in row]
    assert record["final_loss"] < 0.7 * losses[0], losses
    assert record["metrics"]["loss"] == record["final_loss"]
    assert 0 <= record["metrics"]["top1"] <= 100 and "eval_loss" in record["metrics"]
    assert record1["metrics"] == record["metrics"]  # every rank gets the same all-reduced figures
    for k in params0:  # parameters agree; BatchNorm's running statistics are each rank's own
        if "running" not in k and "num_batches" not in k:
            assert np.array_equal(params0[k], params1[k]), k


def test_only_rank0_writes_metrics_jsonl_and_wandb_offline_runs(full_run):
    run_dir, _ = full_run
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    logged = [r["step"] for r in rows if "loss" in r]
    assert logged == [2, 4, 6, 8, 10, 12]  # one line per log step: a second writer would repeat them
    # The lr of the last step of each window: step index 5 still at the peak, index 7 on divided by 10.
    assert [r["lr"] for r in rows if "loss" in r] == pytest.approx([0.2, 0.2, 0.2, 0.02, 0.02, 0.02])
    assert {r["stage"] for r in rows if "loss" in r} == {"warmup", "compression"}
    assert any("final/top1" in r for r in rows)
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B offline run directory missing"
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step-000008").iterdir()) == [
        "COMPLETE",
        "manifest.json",
        "model.pt",
        "rank00000.pt",
        "rank00001.pt",
    ]


def test_resume_from_checkpoint_continues_as_if_uninterrupted(runs):
    _, [(record, final0), (_, final1)] = runs["full"]
    resumed_dir, [(resumed, params0), (_, params1)] = runs["resumed"]
    assert resumed["resumed_from_step"] == 8 and resumed["samples"] == record["samples"]
    # Same data position, optimizer, hook counters, BatchNorm statistics and dropout RNG: identical results.
    for k in final0:
        assert np.array_equal(params0[k], final0[k]), k
        assert np.array_equal(params1[k], final1[k]), k
    rows = [json.loads(line) for line in (resumed_dir / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [10, 12]  # logger none: metrics.jsonl all the same
    assert [r["lr"] for r in rows if "loss" in r] == pytest.approx([0.02, 0.02])  # the peak lr x 0.1, not x 0.01
    assert not (resumed_dir / "wandb").exists()


# ------------------------------------------------------------------------------------------- in-process
def _single_process_run(run_dir, **train_cfg) -> dict:
    torch.manual_seed(0)
    model = tiny_model()
    return train(
        make_config(run_dir, **train_cfg),
        task=BlobsTask(),
        data=blobs_data(0, 1, 16),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
        comm=None,
        topology=Topology(rank=0, world_size=1, gpus_per_node=1),
        device=torch.device("cpu"),
        run_dir=run_dir,
    )


def test_single_process_run_without_ddp_recalibrates_compute(tmp_path):
    record = _single_process_run(tmp_path, steps=30, compute_calibration_every=10, eval=False)
    assert record["compute_calibration_passes"] == 3 + 1 + 1  # 3 after warm-up, 1 at 10 and 20 timed steps
    assert record["throughput_by_stage"] == {} and record["inter_node_bytes_per_step"] == 0
    assert record["fp32_allreduce_bytes_per_step"] == 0  # one process sends nothing
    assert set(record["metrics"]) == {"loss"} and record["final_loss"] < 1.0
    st = record["step_time_s"]
    assert st["compute"] + st["communication"] + st["compression"] + st["data_wait"] == pytest.approx(
        st["total"], rel=1e-9
    )
    assert record["profile"]["bucket_elements"] == []  # no DDP, no hook: buckets from parameter_count


def test_a_short_run_keeps_one_timed_step(tmp_path):
    record = _single_process_run(tmp_path, steps=3, timing_warmup_steps=50, eval=False)
    assert record["timing_warmup_steps"] == 2 and record["timed_steps"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_single_process_run_on_cuda(tmp_path):
    """The CUDA path: synchronized timings, device RNG state, a checkpoint and its resume."""
    device = torch.device("cuda")
    results = []
    for resume in (None, str(tmp_path / "a" / "checkpoints" / "step-000006")):
        torch.manual_seed(0)
        model = tiny_model().to(device)
        run_dir = tmp_path / ("b" if resume else "a")
        record = train(
            make_config(run_dir, steps=10, checkpoint_every=6, resume=resume),
            task=BlobsTask(),
            data=blobs_data(0, 1, 16),
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
            comm=None,
            topology=Topology(rank=0, world_size=1, gpus_per_node=1),
            device=device,
            run_dir=run_dir,
        )
        results.append((record, {k: v.cpu() for k, v in model.state_dict().items()}))
    (full, params), (resumed, params_resumed) = results
    assert resumed["resumed_from_step"] == 6 and full["step_time_s"]["total"] > 0
    for k in params:
        assert torch.equal(params[k], params_resumed[k]), k


def test_split_step_time_sums_and_compute_absorbs_a_negative_rest():
    assert split_step_time(1.0, 0.5, 0.2) == pytest.approx((0.5, 0.3, 0.2))
    compute, comm, compress = split_step_time(1.0, 0.9, 0.2)  # calibration noise: 0.9 + 0.2 > 1
    assert (comm, compress) == (0.0, 0.2) and compute == pytest.approx(0.8)
    assert sum(split_step_time(0.1, 0.0, 0.5)) == pytest.approx(0.1)  # compression capped at the step


def test_total_steps_from_epochs_or_steps():
    assert total_steps(50, 1, 1000, 64) == 50
    assert total_steps(None, 2, 1000, 64) == 2 * 16  # ceil(1000 / 64) = 16 steps an epoch
    with pytest.raises(ValueError):
        total_steps(0, 1, 1000, 64)


def test_stage_of_method_or_none():
    assert stage_of(CountingComm(), 0) == "warmup" and stage_of(CountingComm(), FREEZE_STEP) == "compression"
    assert stage_of(CommStats(), 3) is None


def test_progress_is_a_plain_line_per_interval_where_output_is_not_a_terminal():
    import io

    from birder_repro.train.progress import Progress

    out = io.StringIO()
    progress = Progress(steps=20, start_step=0, enabled=True, interactive=False, stream=out)
    assert progress.bar is None
    for _ in range(10):
        progress.step()
    progress.interval(10, 0, 1.23456, 99.9, 0.1, "warmup")
    progress.close()
    (line,) = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and line.startswith("train: step 10/20 (50%), epoch 0, loss 1.2346")
    assert "99.9 samples/s" in line and "stage warmup" in line
    silent = io.StringIO()
    Progress(steps=20, start_step=0, enabled=False, interactive=False, stream=silent).interval(1, 0, 1, 1, 1, None)
    assert silent.getvalue() == ""


def test_wandb_mode_follows_key_and_environment():
    assert wandb_mode(None, {}) == "offline"
    assert wandb_mode(None, {"WANDB_API_KEY": "x"}) == "online"
    assert wandb_mode(None, {"WANDB_MODE": "disabled", "WANDB_API_KEY": "x"}) == "disabled"
    assert wandb_mode("offline", {"WANDB_API_KEY": "x"}) == "offline"


@pytest.mark.parametrize("broken", ["missing", "init_fails"])
def test_a_broken_wandb_warns_once_and_metrics_jsonl_goes_on(broken, tmp_path, monkeypatch, capsys):
    if broken == "missing":
        monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    else:

        def init(**kwargs):
            raise RuntimeError("no network")

        monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=dict))
    with RunLogger(make_config(tmp_path, logger="wandb"), tmp_path) as logger:
        logger.log(1, {"loss": 2.0})
        logger.log(2, {"loss": float("nan")})
    assert capsys.readouterr().err.count("warning: W&B is off") == 1
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert all(r.pop("time_s") >= 0 for r in rows)  # wall-clock seconds since the logger started (Figure 2)
    assert rows == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": None}]


def test_disabled_logger_writes_nothing(tmp_path, monkeypatch):
    """A rank other than 0 logs nothing: no file anywhere, no W&B run started (whatever logger= says)."""
    import wandb

    started = []
    monkeypatch.setattr(wandb, "init", lambda *a, **k: started.append(k))
    before = set(tmp_path.rglob("*"))
    with RunLogger(make_config(tmp_path, logger="wandb"), tmp_path / "run", enabled=False) as logger:
        logger.log(1, {"loss": 1.0})
        logger.log(2, {"loss": float("nan")})
    assert set(tmp_path.rglob("*")) == before and started == []


SAMPLE_RECORD = {
    "status": "completed",
    "task": "resnet20",
    "optim": "birder",
    "world_size": 2,
    "cluster": {"nodes": 2, "gpus_per_node": 1, "interconnect": "loopback"},
    "data": "synthetic CIFAR-100-shaped images (class-conditional)",
    "steps": 150,
    "samples": 19200,
    "global_batch_size": 128,
    "throughput_samples_per_s": 512.34,
    "timing_warmup_steps": 5,
    "throughput_by_stage": {},
    "step_time_s": {"total": 0.25, "compute": 0.2, "communication": 0.035, "compression": 0.015},
    "intra_node_bytes_per_step": 0.0,
    "inter_node_bytes_per_step": 34_000.0,
    "fp32_allreduce_bytes_per_step": 1_088_000.0,
    "fp32_allreduce_inter_node_bytes_per_step": 1_088_000.0,
    "final_loss": 2.5,
    "loss_definition": "mean training loss over the last 15 steps, all processes",
    "headline_metric": "top1",
    "metrics": {"loss": 2.5, "top5": 40.0, "top1": 12.5},
}


def test_format_summary_of_a_completed_run():
    text = format_summary(SAMPLE_RECORD)
    assert "resnet20 with birder on 2 nodes x 1 process (loopback)" in text
    assert "synthetic CIFAR-100-shaped" in text and "150 steps" in text
    assert "512.3 samples/s (first 5 steps left out)" in text
    assert "loss 2.5" in text and text.index("top1 12.5") < text.index("top5 40")
    assert "250.0 ms = compute 200.0 + communication 35.0 + compression 15.0 ms" in text
    assert "intra-node 0 B, inter-node 33.2 KiB" in text
    assert "1.04 MiB" in text and "32x less inter-node" in text


def test_format_summary_by_stage_and_of_a_failed_run():
    staged = dict(SAMPLE_RECORD, throughput_by_stage={"warmup": 100.0, "compression": 300.0})
    assert "by stage: warmup 100.0, compression 300.0" in format_summary(staged)
    failed = {
        "status": "failed",
        "task": "resnet20",
        "optim": "sgdm",
        "world_size": 4,
        "error": "Traceback ...\nValueError: boom",
    }
    text = format_summary(failed)
    assert "failed" in text and "ValueError: boom" in text and "throughput" not in text


def test_summary_says_an_uncompressed_run_sent_what_fp32_sends():
    same = dict(SAMPLE_RECORD, intra_node_bytes_per_step=0.0, inter_node_bytes_per_step=1_088_000.0)
    text = format_summary(same)
    assert "this run sent the same as fp32 in all, the same as fp32 inter-node" in text and "1x" not in text
    more = dict(SAMPLE_RECORD, inter_node_bytes_per_step=2_176_000.0)
    assert "2x more inter-node" in format_summary(more)


def test_human_bytes():
    assert [human_bytes(v) for v in (0, 1023, 1024, 1536 * 1024, None)] == ["0 B", "1023 B", "1 KiB", "1.5 MiB", "n/a"]


def test_grad_clip_applies_only_where_grad_holds_gradients():
    from birder_repro.comm.birder import BirderState
    from birder_repro.train import grads_are_gradients, run_step

    class _Task:
        def loss(self, model, batch, device):
            return (model(batch) ** 2).sum() * 100, batch.shape[0]

    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves the parameters, we read grads
    comm = CommStats()  # a plain all-reduce's state: .grad holds gradients
    seen = []
    sgd.register_step_pre_hook(
        lambda opt, *_: seen.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item())
    )
    run_step(_Task(), model, sgd, torch.ones(8, 4), torch.device("cpu"), comm, grad_clip=0.5)
    assert seen[-1] == pytest.approx(0.5, rel=1e-5)
    assert grads_are_gradients(comm)
    assert not grads_are_gradients(BirderState(Topology(rank=0, world_size=1, gpus_per_node=1)))  # u_bar


def test_summary_shows_the_kernel_counted_link_bytes_of_emulated_runs():
    from birder_repro.run.summary import format_summary

    text = format_summary(
        {
            "task": "resnet50",
            "optim": "birder",
            "status": "completed",
            "intra_node_bytes_per_step": 0,
            "throughput_samples_per_s": 183.4,
            "step_time_s": {"total": 0.174, "compute": 0.042, "communication": 0.056, "compression": 0.077},
            "inter_node_bytes_per_step": 677350,
            "fp32_allreduce_bytes_per_step": 21675168,
            "link_bytes_per_step": [741715, 719013],
        }
    )
    assert "kernel count" in text and text.count("KiB") >= 2
