"""The CUDA paths' logic, checked where it can run without a GPU: what a review of those paths found.

(The kernels' specialisation, masks, segment tables and self-test are in test_kernels.py; fp16 in
test_precision.py; the GPU-side checks themselves are ``make gpu-check``.)
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed

from birder_repro.comm import buckets
from birder_repro.comm.buckets import BucketStore, Field
from birder_repro.config import settings as layout

# -------------------------------------------------------- a lone 1-bit Adam process times on its torch device
H100 = "cuda (NVIDIA H100 80GB HBM3)"


def _lone_onebit_run(rank: int, world: int, run_dir: str):
    """A whole 1-process 1-bit Adam run through the training loop, whose device shows as a GPU's display name
    (what the record and profile print): its profile prices the compressor on the run's torch device."""
    import test_train as tiny
    from omegaconf import open_dict
    from torch import nn

    from birder_repro.comm import attach_onebit
    from birder_repro.comm.readiness import clocked_registration
    from birder_repro.comm.topology import Topology
    from birder_repro.optim import OneBitAdam
    from birder_repro.train import run_figures, train

    run_figures.device_name = lambda device: H100  # the name a GPU run shows; the tensors stay on the CPU
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(tiny.tiny_model())
    optimizer = OneBitAdam(model.parameters(), lr=1e-3, freeze_step=2)
    with clocked_registration(model):  # as the worker attaches: the hook's bucket calls are timed
        comm = attach_onebit(model, optimizer)
    cfg = tiny.make_config(run_dir, steps=5, eval=False)
    with open_dict(cfg):
        cfg.optim, cfg.nodes = {"name": "onebit_adam", "lr": 1e-3}, 1
    record = train(
        cfg,
        task=tiny.BlobsTask(),
        data=tiny.blobs_data(0, 1, 8),
        model=model,
        optimizer=optimizer,
        comm=comm,
        topology=Topology(rank=0, world_size=1, gpus_per_node=1),
        device=torch.device("cpu"),
        run_dir=run_dir,
    )
    comm.close()
    return record["profile"]


def test_a_lone_onebit_run_prices_its_compressor_on_the_torch_device_not_its_display_name(tmp_path):
    """A 1-process 1-bit Adam run priced its compressor with ``torch.randn(...).to("cuda (NVIDIA H100 ...)")``:
    'Invalid device string' after all its steps. The loop hands the profile both: the display name to record,
    the torch device to compute on."""
    (profile,) = run_distributed(_lone_onebit_run, 1, str(tmp_path))
    assert profile["device"] == H100
    assert profile["compression_s_per_element"]["onebit"] > 0


# ------------------------------------------------- loaded state is adopted by the hook's stream (record_stream)
class _StreamsOf:
    """Stand-ins for CUDA, for the tensors whose ids are in ``ids``: they say they are on ``cuda:1``, and
    ``record_stream`` records (tensor id, stream) instead of marking; ``current_stream(d)`` names d's stream."""

    def __init__(self, monkeypatch, ids):
        self.ids, self.marked = set(ids), []
        real_is_cuda, real_device = torch.Tensor.is_cuda, torch.Tensor.device
        ours = self.ids
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: id(t) in ours or real_is_cuda.__get__(t)))
        monkeypatch.setattr(
            torch.Tensor,
            "device",
            property(lambda t: torch.device("cuda", 1) if id(t) in ours else real_device.__get__(t)),
        )
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, stream: self.marked.append((id(t), stream)))
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"current stream of {device}")


def test_adopt_marks_cuda_tensors_on_their_own_devices_current_stream(monkeypatch):
    """On the stream current for the tensor's own device (a tensor on cuda:1 while cuda:0 is current would be
    marked for the wrong stream); CPU tensors are left alone."""
    gpu_side, cpu = torch.zeros(2), torch.zeros(2)
    streams = _StreamsOf(monkeypatch, [id(gpu_side)])
    buckets.adopt([gpu_side, cpu])
    assert streams.marked == [(id(gpu_side), "current stream of cuda:1")]


def test_a_loaded_store_adopts_every_loaded_tensor_once_at_its_first_bucket(monkeypatch):
    """State cloned on the training thread and freed by the communication thread after a layout change must be
    marked as used by the side stream, else the allocator may hand its memory to backward too early. (The real
    adopt runs; stand-ins make the loaded tensors say they are on a GPU and record the marks.)"""
    store = BucketStore([Field("m"), Field("e")], pad_to=8)
    sig = ((0, 0, 10), (1, 10, 6))
    b = store.bucket(0, 16, sig, torch.device("cpu"))
    b.state["m"].fill_(1.0)
    saved = store.state_dict()
    fresh = BucketStore([Field("m"), Field("e")], pad_to=8)
    fresh.load_state_dict(saved)
    loaded = list(fresh.buckets[0].state.values())
    streams = _StreamsOf(monkeypatch, [id(t) for t in loaded])
    fresh.bucket(0, 16, sig, torch.device("cpu"))  # same layout: the loaded bucket itself
    fresh.bucket(0, 16, sig, torch.device("cpu"))
    assert sorted(streams.marked) == sorted((id(t), "current stream of cuda:1") for t in loaded)
    # another layout: the migration's per-parameter state is made on this thread; nothing more to adopt
    fresh.bucket(0, 16, ((1, 0, 6), (0, 6, 10)), torch.device("cpu"))
    assert len(streams.marked) == len(loaded)


# ---------------------------------------------------------------------------------------- no silent fallback
def test_gpus_per_node_auto_is_refused_where_the_cli_cannot_count_the_gpus(compose, tmp_path, capsys):
    from birder_repro.cli import run

    cfg = compose(["task=resnet20", "optim=birder", "launcher=slurm", "dry_run=true"], hydra_config=True)
    assert run(cfg, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "[birder-repro] config error: gpus_per_node=auto with launcher=slurm: the machine that "
        "submits the job cannot count the compute nodes' GPUs; set gpus_per_node=<processes per node>"
    )


def test_pin_memory_follows_the_runs_device_not_the_machine(compose, monkeypatch):
    from birder_repro.tasks import common

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(layout, "_cuda_count", lambda: 8)
    assert common._loader_kwargs(compose(["device=cpu"]))["pin_memory"] is False
    assert common._loader_kwargs(compose(["device=cuda"]))["pin_memory"] is True
    monkeypatch.setattr(layout, "_cuda_count", lambda: 0)
    assert common._loader_kwargs(compose([]))["pin_memory"] is False


def test_start_line_names_device_backend_precision_and_versions():
    from birder_repro.train.worker import DistEnv, start_line

    line = start_line(
        DistEnv(0, 4, 0, 2),
        {
            "device": "cuda (NVIDIA H100)",
            "backend": "nccl",
            "precision": "bf16",
            "versions": {"torch": "2.14.1", "cuda": "13.0", "nccl": "2.27.3", "triton": "3.8.0"},
        },
    )
    assert line == (
        "[birder-repro] 4 processes on cuda (NVIDIA H100), backend nccl, precision bf16; torch 2.14.1, "
        "CUDA 13.0, NCCL 2.27.3, Triton 3.8.0"
    )


# ------------------------------------------- a resume leaves AdamW's step counters on the CPU, as torch keeps them
class _LoadedOnGpu(torch.Tensor):
    """A stand-in for a tensor ``torch.load(map_location=cuda)`` made: it says it is on a GPU, and ``.cpu()``
    gives a plain CPU tensor (what the real copy gives)."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).clone()


def test_a_resume_keeps_adamws_step_counters_on_the_cpu(tmp_path, monkeypatch):
    """Shards load onto the rank's device; torch's Optimizer.load_state_dict keeps ``step`` where it finds it
    (non-capturable), so a GPU step made foreach AdamW read it back twice per parameter per step after a resume."""
    from torch import nn

    from birder_repro.train import checkpoint
    from birder_repro.train.checkpoint import RunIdentity, load_checkpoint, save_checkpoint

    identity = RunIdentity(task="blobs", optim="adamw", scheme="allreduce", nodes=1, gpus_per_node=1, world_size=1)
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    cpu = torch.device("cpu")
    where = save_checkpoint(tmp_path, 1, 4.0, model, opt, None, 0, 1, cpu, identity, 2)
    real = checkpoint.load_file

    def onto_the_gpu(path, device):
        loaded = real(path, device)
        for state in (loaded.get("optimizer", {}) if isinstance(loaded, dict) else {}).get("state", {}).values():
            state["step"] = state["step"].as_subclass(_LoadedOnGpu)
        return loaded

    monkeypatch.setattr(checkpoint, "load_file", onto_the_gpu)
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    load_checkpoint(where, model, fresh, None, 0, 1, cpu, identity)
    steps = [s["step"] for s in fresh.state.values()]
    assert len(steps) == 2 and all(s.device.type == "cpu" and s.item() == 1 for s in steps)


# --------------------------------------------------------- 1-bit LAMB's step reads nothing back from the device
def test_onebit_lamb_steps_read_nothing_back_from_the_device(monkeypatch):
    """LAMB's coefficient, c_avg, the scaling ratio and its clips were Python floats: float() of a norm several
    times per parameter per step, each a host sync on a GPU. They are device tensors now: no read in a warmup or
    compression step (counted on the CPU: host_syncs.py), and one at the freeze (the momentum scales)."""
    from host_syncs import counted_reads
    from torch import nn

    from birder_repro.optim import OneBitLamb

    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(7)), nn.Parameter(torch.zeros(4))]
    opt = OneBitLamb(params, lr=1e-2, freeze_step=3, weight_decay=0.01)
    counts = []
    for _ in range(6):
        for p in params:
            p.grad = torch.randn_like(p)
        with counted_reads(monkeypatch) as reads:
            opt.step()
        counts.append(len(reads))
    assert counts == [0, 0, 1, 0, 0, 0], counts
    assert all(torch.isfinite(p).all() for p in params)


class _FakeEvent:
    """torch.cuda.Event's timing surface on the CPU: each pair lasts 2 ms; ``done`` says whether the GPU got there."""

    done = True

    def __init__(self, enable_timing=False):
        self.finished = False

    def record(self, stream=None):
        self.finished = _FakeEvent.done

    def query(self):
        return self.finished

    def synchronize(self):
        self.finished = True

    def elapsed_time(self, end):
        return 2.0


def test_cuda_timings_keep_only_the_events_still_in_flight(monkeypatch):
    """A user's script that never reads the counters (the integrations read them at save time, or never) must not
    keep two CUDA events per timed block of every step: finished pairs are folded in at each new one."""
    from birder_repro.comm.state import CommState

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    state = CommState()
    for _ in range(700):  # 100 steps of Birder's 7 timed blocks
        with state.timing("compress", "cuda"):
            pass
    assert len(state._pending) == 0
    _FakeEvent.done = False  # still running on the GPU: kept, then waited for when read
    try:
        for _ in range(3):
            with state.timing("comm", "cuda"):
                pass
        assert len(state._pending) == 3
    finally:
        _FakeEvent.done = True
    assert state.compress_seconds == pytest.approx(1.4) and state.collective_seconds == pytest.approx(0.006)
    assert len(state._pending) == 0


def test_a_hook_state_loaded_on_the_cpu_moves_to_the_buckets_device_at_its_first_bucket():
    """Accelerate and the Trainer load every rank's hook state with map_location="cpu": on a GPU the first
    bucket met CPU state ("m is on cpu, expected cuda:N"), and a layout change all-gathered CPU tensors over NCCL.
    Here the bucket's device is "meta" (a device the CPU state is not on; no GPU needed)."""
    store = BucketStore([Field("m"), Field("e")], pad_to=8)
    sig = ((0, 0, 10), (1, 10, 6))
    store.bucket(0, 16, sig, torch.device("cpu"))
    fresh = BucketStore([Field("m"), Field("e")], pad_to=8)
    fresh.load_state_dict(store.state_dict())
    bucket = fresh.bucket(0, 16, sig, torch.device("meta"))
    assert {t.device.type for t in bucket.state.values()} == {"meta"}
