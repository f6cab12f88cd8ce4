"""What each process of the hook check runs (birder_repro.gpucheck.hooks compares it with the references).

The processes form ``nodes`` x ``gpus_per_node`` (:func:`layout`) as the runner does, one per GPU on NCCL, or
all on one GPU with their collectives staged through gloo (:mod:`.staged`), or CPU processes (gloo, or staged
as the tests run it). Each runs every scenario and saves what it measured: Birder's bucket
all-reduce in every variant, 1-bit Adam's compressed all-reduce, the counted fp32 / fp16 all-reduce hooks
beside DDP's own, and the hooks attached to DDP as a training script attaches them (Birder; 1-bit Adam and
1-bit LAMB through their freeze step). The inputs are made here, from seeds, so the comparisons can remake them.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from birder_repro.comm import attach_allreduce
from birder_repro.comm.birder import BirderState, attach_birder
from birder_repro.comm.onebit import attach_onebit
from birder_repro.comm.onebit_exchange import compressed_allreduce
from birder_repro.comm.pack import padded_size
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import build_topology
from birder_repro.gpucheck import staged
from birder_repro.gpucheck.training import TRAINING
from birder_repro.optim import OneBitAdam, OneBitLamb
from birder_repro.optim.birder import Birder

__all__ = [
    "BIRDER_SIZES",
    "BIRDER_STEPS",
    "ONEBIT_STEPS",
    "DDP_STEPS",
    "BIRDER_VARIANTS",
    "ONEBIT_SIZES",
    "DDP_BIRDER_LR",
    "DDP_BIRDER_STEPS",
    "ONEBIT_FREEZE",
    "ONEBIT_DDP_STEPS",
    "ONEBIT_ADAM",
    "ONEBIT_LAMB",
    "layout",
    "birder_grads",
    "onebit_inputs",
    "allreduce_model",
    "run_processes",
    "PG_TIMEOUT_S",
    "SANITIZER_ENV",
]

# A collective that waits this long on a peer fails (gloo raises, NCCL's watchdog aborts the process): a
# scenario that fails on one rank, which then reaches the barrier while the others still wait in the scenario's
# collectives, ends the check in about a minute instead of NCCL's default ten (gloo's thirty).
PG_TIMEOUT_S = 60.0
SANITIZER_ENV = "TORCH_CUDA_SANITIZER"  # read by torch at import: CSAN, torch.cuda._sanitizer

BIRDER_SIZES = (1001, 37)  # two buckets, neither a multiple of 8 x m x n
BIRDER_STEPS, ONEBIT_STEPS, DDP_STEPS = 4, 3, 3
BIRDER_VARIANTS = ("hierarchical", "flat", "allgather", "hierarchical-amsgrad")
ONEBIT_SIZES = (1001, 40)
DDP_BIRDER_LR, DDP_BIRDER_STEPS = 1e-2, 4
ONEBIT_FREEZE, ONEBIT_DDP_STEPS = 2, 5
ONEBIT_ADAM = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ONEBIT_LAMB = dict(
    lr=2e-2,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.01,
    c_min=0.01,
    c_max=0.3,
    beta3=0.9,
    r_min=0.5,
    r_max=4.0,
    r_threshold=0.1,
)


def layout(gpus: int) -> tuple[int, int]:
    """(nodes, gpus_per_node) for ``gpus`` processes: nodes of 2 where 4 or more split evenly, else one a node.
    Two processes a node keep the node average of real gradients exact ((a + b) / 2 = a / 2 + b / 2 in any
    order), so that the DDP hook can equal the reference bit for bit."""
    return (gpus // 2, 2) if gpus >= 4 and gpus % 2 == 0 else (gpus, 1)


def birder_grads(step: int, bucket: int, world: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + bucket)
    return torch.randint(-16, 17, (world, BIRDER_SIZES[bucket]), generator=g).float() / 8


def onebit_inputs(numel: int, step: int, rank: int):
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + numel)
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.15  # the same on every rank
    return torch.randn(numel, generator=g), mask


# ----------------------------------------------------------------------------- what each process runs
def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy that later steps cannot change (``.cpu()`` of a CPU tensor is the tensor itself)."""
    return t.detach().to("cpu", copy=True)


def _birder(topology, device) -> dict:
    out = {}
    for variant in BIRDER_VARIANTS:
        state = BirderState(
            topology,
            scheme=variant.partition("-")[0],
            beta=0.9,
            eps=1e-8,
            seed=7,
            param_numels=BIRDER_SIZES,
            amsgrad_after=2 if "amsgrad" in variant else None,
        )
        results = []
        for t in range(BIRDER_STEPS):
            for bi, numel in enumerate(BIRDER_SIZES):
                buf = birder_grads(t, bi, topology.world_size)[topology.rank].to(device)
                results.append(_host(state.allreduce_bucket(bi, buf, ((bi, 0, numel),))))
        out[variant] = {"results": results, "intra": state.intra_node_bytes, "inter": state.inter_node_bytes}
    return out


def _onebit(topology, device) -> dict:
    world, out = topology.world_size, {}
    for numel in ONEBIT_SIZES:
        padded = padded_size(numel, 8 * world)
        we, se, stats = torch.zeros(padded, device=device), torch.zeros(padded // world, device=device), CommState()
        steps = []
        for step in range(ONEBIT_STEPS):
            x, mask = onebit_inputs(numel, step, topology.rank)
            xp, mp_ = torch.zeros(padded, device=device), torch.zeros(padded, dtype=torch.bool, device=device)
            xp[:numel], mp_[:numel] = x.to(device), mask.to(device)
            ex = compressed_allreduce(xp, we, se, mp_, stats=stats, topology=topology)
            steps.append(
                {
                    "result": _host(ex.result),
                    "worker_bits": _host(ex.worker_bits),
                    "worker_scales": _host(ex.worker_scales),
                    "server_bits": _host(ex.server_bits),
                    "worker_error": _host(we),
                    "server_error": _host(se),
                }
            )
        out[numel] = {"steps": steps, "bytes": stats.intra_node_bytes + stats.inter_node_bytes}
    return out


def allreduce_model(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 3)).to(device)


def _allreduce(topology, device) -> dict:
    out = {}
    for name, dtype in (("ddp", None), ("fp32", torch.float32), ("fp16", torch.float16)):
        ddp = torch.nn.parallel.DistributedDataParallel(
            allreduce_model(device), bucket_cap_mb=0.004, device_ids=[device] if device.type == "cuda" else None
        )
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        state = attach_allreduce(ddp, opt, topology, dtype=dtype) if dtype is not None else None
        grads = []
        for step in range(DDP_STEPS):
            g = torch.Generator().manual_seed(1000 * topology.rank + step)
            x, y = torch.randn(16, 24, generator=g).to(device), torch.randn(16, 3, generator=g).to(device)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            grads.append([p.grad.detach().cpu().clone() for p in ddp.parameters()])
            opt.step()
        out[name] = {
            "grads": grads,
            "intra": state.intra_node_bytes if state else 0.0,
            "inter": state.inter_node_bytes if state else 0.0,
        }
    return out


class _BirderNet(torch.nn.Module):
    """Registered in an order unlike the order gradients arrive in, so DDP's rebuilt buckets differ."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 4)
        self.body = torch.nn.Linear(12, 16)
        self.stem = torch.nn.Linear(8, 12)

    def forward(self, x):
        return self.head(torch.tanh(self.body(torch.tanh(self.stem(x)))))


def _birder_ddp(topology, device) -> dict:
    """The README's three lines on DDP; every bucket call (signature, local gradient, result) recorded."""
    calls, original = [], BirderState.allreduce_bucket

    def recording(self, index, buffer, signature):
        grad = _host(buffer)
        out = original(self, index, buffer, signature)
        calls.append((signature, grad, _host(out)))
        return out

    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        _BirderNet().to(device), bucket_cap_mb=0.0006, device_ids=[device] if device.type == "cuda" else None
    )
    opt = Birder(ddp.parameters(), lr=DDP_BIRDER_LR, beta=0.9, weight_decay=0.0)
    state = attach_birder(ddp, opt, topology=topology)
    BirderState.allreduce_bucket = recording
    exact, identical = [], []
    try:
        for step in range(DDP_BIRDER_STEPS):
            gen = torch.Generator().manual_seed(1000 * step + 100 + topology.rank)
            x, y = torch.randn(32, 8, generator=gen).to(device), torch.randn(32, 4, generator=gen).to(device)
            before = _flat_params(ddp)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            after = _flat_params(ddp)
            exact.append(
                bool(torch.allclose((before - after).abs(), torch.full_like(after, DDP_BIRDER_LR), rtol=0, atol=1e-6))
            )
            identical.append(_same_on_every_rank(after))
    finally:
        BirderState.allreduce_bucket = original
        state.close()
    return {
        "calls": calls,
        "exact": exact,
        "identical": identical,
        "overlaps": state.overlaps(),
        "numels": [p.numel() for p in ddp.parameters()],
    }


class _OneBitNet(torch.nn.Module):
    """Padding in every bucket, and embedding rows no batch looks up (their momentum is masked)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)
        self.fc1 = torch.nn.Linear(10, 24)
        self.fc2 = torch.nn.Linear(24, 3)

    def forward(self, x, idx):
        return self.fc2(torch.tanh(self.fc1(torch.cat([x, self.emb(idx)], dim=1))))


def _onebit_ddp(topology, device) -> dict:
    """1-bit Adam and 1-bit LAMB attached to DDP through their freeze step: this rank's local gradients, the
    bucket layout and the parameters after every step."""
    import copy

    out = {}
    for name, cls, kwargs in (("adam", OneBitAdam, ONEBIT_ADAM), ("lamb", OneBitLamb, ONEBIT_LAMB)):
        torch.manual_seed(0)
        model = _OneBitNet().to(device)
        initial = [_host(p) for p in model.parameters()]
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=0.001, device_ids=[device] if device.type == "cuda" else None
        )
        opt = cls(ddp.parameters(), freeze_step=ONEBIT_FREEZE, **kwargs)
        state = attach_onebit(ddp, opt, topology=topology, scale="bucket")  # the reference: one scale a bucket
        steps = []
        for step in range(ONEBIT_DDP_STEPS):
            g = torch.Generator().manual_seed(1000 * step + topology.rank)
            batch = (
                torch.randn(8, 6, generator=g).to(device),
                torch.randint(0, 8, (8,), generator=g).to(device),
                torch.randn(8, 3, generator=g).to(device),
            )
            shadow = copy.deepcopy(ddp.module)  # this rank's own gradient, outside DDP
            ((shadow(*batch[:2]) - batch[2]) ** 2).mean().backward()
            opt.zero_grad()
            ((ddp(*batch[:2]) - batch[2]) ** 2).mean().backward()
            opt.step()
            params = _flat_params(ddp)
            steps.append(
                {
                    "grads": [_host(p.grad) for p in shadow.parameters()],
                    "params": _host(params),
                    "layout": {i: b.signature for i, b in state.store.buckets.items()},
                    "identical": _same_on_every_rank(params),
                }
            )
        state.close()
        out[name] = {"initial": initial, "steps": steps}
    return out


def _flat_params(ddp) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone()


def _same_on_every_rank(flat: torch.Tensor) -> bool:
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], t) for t in everyone)


def _device_and_backend(rank: int, backend: str) -> tuple[torch.device, str]:
    """``nccl``: one GPU a process; ``gloo``: CPU processes; ``staged:cuda``: every process on the one GPU, its
    device tensors' collectives staged through gloo (:mod:`.staged`); ``staged:cpu``: the same code on CPUs."""
    kind, _, where = backend.partition(":")
    if kind == "staged":
        staged.register()
        return torch.device("cuda", 0) if where == "cuda" else torch.device("cpu"), staged.backend_string(where)
    return (torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")), backend


SCENARIOS = {
    "birder": _birder,
    "onebit": _onebit,
    "allreduce": _allreduce,
    "birder_ddp": _birder_ddp,
    "onebit_ddp": _onebit_ddp,
}


def _scenarios() -> dict:
    return {**SCENARIOS, **TRAINING}


def _process(
    rank: int,
    world: int,
    gpus_per_node: int,
    port: int,
    backend: str,
    outdir: str,
    names: tuple,
    timeout_s: float = PG_TIMEOUT_S,
) -> None:
    """One process: its device, the process group, the scenarios; what it measured goes to rank<r>.pt."""
    device, pg_backend = _device_and_backend(rank, backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # several processes share the cores (and, staged, one GPU)
    os.environ.update(LOCAL_RANK=str(rank % gpus_per_node), LOCAL_WORLD_SIZE=str(gpus_per_node))
    dist.init_process_group(
        pg_backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        **({"device_id": device} if backend == "nccl" else {}),
    )

    topology = build_topology(gpus_per_node)
    results, table = {}, _scenarios()
    for name in names:  # a name, or (tests) a scenario function of (topology, device)
        scenario = table[name] if isinstance(name, str) else name
        name = name if isinstance(name, str) else name.__name__
        try:
            results[name] = scenario(topology, device)
        except Exception:  # noqa: BLE001 - recorded: the other scenarios still run and report
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    torch.save(results, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(
    world: int,
    gpus_per_node: int,
    backend: str = "nccl",
    names: tuple = tuple(SCENARIOS),
    timeout_s: float = PG_TIMEOUT_S,
    sanitizer: bool = False,
) -> list[dict]:
    """The scenarios ``names`` on ``world`` processes (``backend``: see :func:`_device_and_backend`), each
    collective failing after ``timeout_s``; with ``sanitizer``, under CSAN (``TORCH_CUDA_SANITIZER=1`` in the
    processes: it reports a kernel that touches a tensor another stream uses without a wait). What each rank
    measured."""
    saved = os.environ.get(SANITIZER_ENV)
    if sanitizer:  # the spawned processes import torch afresh, which reads it
        os.environ[SANITIZER_ENV] = "1"
    try:
        with tempfile.TemporaryDirectory() as outdir:
            mp.spawn(
                _process,
                args=(world, gpus_per_node, _free_port(), backend, outdir, tuple(names), timeout_s),
                nprocs=world,
                join=True,
            )
            return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    finally:
        if sanitizer and saved is None:
            os.environ.pop(SANITIZER_ENV, None)
        elif sanitizer:
            os.environ[SANITIZER_ENV] = saved
