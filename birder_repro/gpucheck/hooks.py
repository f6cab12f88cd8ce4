"""Every hook across processes (NCCL, one GPU each) against its single-process reference, and its byte counts.

The processes form ``nodes`` x ``gpus_per_node`` as the runner does (rank grouping), one per GPU. Each runs:

- Birder (``BirderState.allreduce_bucket``: Steps I-IV, the kernels, the collectives), every scheme and
  hierarchical with ``b_hat`` (Algorithm 1, line 6), 4 steps of two buckets whose sizes need padding; the
  gradients are multiples of 1/8, so the node averages are exact in any order and every rank's result must
  equal :class:`birder_repro.references.birder.ReferenceBirder` bit for bit;
- 1-bit Adam's compressed all-reduce (``comm.onebit.compressed_allreduce``), 3 steps, against
  :class:`birder_repro.references.onebit.CompressedAllReduceReference`: signs bit for bit, scales, errors and the
  average within 1e-5 (the norms are sums in another order on the GPU);
- the counted fp32 all-reduce hook against DDP's own all-reduce (bit for bit: the same collective), and the fp16
  hook within fp16 rounding of it;
- the hooks as a training script attaches them to DDP (``attach_birder`` with its communication thread and, on
  CUDA, its side stream; ``attach_onebit`` with 1-bit Adam and 1-bit LAMB through their freeze step): Birder's
  every bucket call replayed through the reference bit for bit, and every update exactly +-lr; 1-bit Adam's
  and LAMB's parameters after every step against :class:`~birder_repro.references.onebit.OneBitAdamReference`
  (:class:`~birder_repro.references.onebit.OneBitLambReference`) within 1e-5.

Byte counts are checked against the formulas of :mod:`birder_repro.comm.accounting`. The same code runs on gloo
with CPU processes (the tests do): only the backend and the device differ.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from birder_repro.comm.accounting import (all_gather_bytes, all_to_all_bytes, flat_allreduce_split,
                                          reduce_scatter_bytes)
from birder_repro.comm.pack import padded_size, unpack_signs
from birder_repro.gpucheck.table import FAIL, Check, verdict

BIRDER_SIZES = (1001, 37)  # two buckets, neither a multiple of 8 x m x n
BIRDER_STEPS, ONEBIT_STEPS, DDP_STEPS = 4, 3, 3
BIRDER_VARIANTS = ("hierarchical", "flat", "allgather", "hierarchical-amsgrad")
ONEBIT_SIZES = (1001, 40)
FLAG_BYTES = 1  # Birder's non-finite flag: one byte more in each all-to-all chunk (comm/nonfinite.py)
SCALE_BYTES = 4  # 1-bit Adam's fp32 scale per worker and per server chunk


DDP_BIRDER_LR, DDP_BIRDER_STEPS = 1e-2, 4
ONEBIT_FREEZE, ONEBIT_DDP_STEPS = 2, 5
ONEBIT_ADAM = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ONEBIT_LAMB = dict(lr=2e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, c_min=0.01, c_max=0.3, beta3=0.9,
                   r_min=0.5, r_max=4.0, r_threshold=0.1)


def layout(gpus: int) -> tuple[int, int]:
    """(nodes, gpus_per_node) for ``gpus`` processes: nodes of 2 where 4 or more split evenly, else one a node.
    Two processes a node keep the node average of real gradients exact ((a + b) / 2 = a / 2 + b / 2 in any
    order), so that the DDP hook can equal the reference bit for bit."""
    return (gpus // 2, 2) if gpus >= 4 and gpus % 2 == 0 else (gpus, 1)


def _birder_grads(step: int, bucket: int, world: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + bucket)
    return torch.randint(-16, 17, (world, BIRDER_SIZES[bucket]), generator=g).float() / 8


def _onebit_inputs(numel: int, step: int, rank: int):
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + numel)
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.15  # the same on every rank
    return torch.randn(numel, generator=g), mask


# ----------------------------------------------------------------------------- what each process runs
def _host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy that later steps cannot change (``.cpu()`` of a CPU tensor is the tensor itself)."""
    return t.detach().to("cpu", copy=True)


def _birder(topology, device) -> dict:
    from birder_repro.comm.birder import BirderState

    out = {}
    for variant in BIRDER_VARIANTS:
        state = BirderState(topology, scheme=variant.partition("-")[0], beta=0.9, eps=1e-8, seed=7,
                            param_numels=BIRDER_SIZES, amsgrad_after=2 if "amsgrad" in variant else None)
        results = []
        for t in range(BIRDER_STEPS):
            for bi, numel in enumerate(BIRDER_SIZES):
                buf = _birder_grads(t, bi, topology.world_size)[topology.rank].to(device)
                results.append(_host(state.allreduce_bucket(bi, buf, ((bi, 0, numel),))))
        out[variant] = {"results": results, "intra": state.intra_node_bytes, "inter": state.inter_node_bytes}
    return out


def _onebit(topology, device) -> dict:
    from birder_repro.comm.onebit import compressed_allreduce
    from birder_repro.comm.state import CommState

    world, out = topology.world_size, {}
    for numel in ONEBIT_SIZES:
        padded = padded_size(numel, 8 * world)
        we, se, stats = torch.zeros(padded, device=device), torch.zeros(padded // world, device=device), CommState()
        steps = []
        for step in range(ONEBIT_STEPS):
            x, mask = _onebit_inputs(numel, step, topology.rank)
            xp, mp_ = torch.zeros(padded, device=device), torch.zeros(padded, dtype=torch.bool, device=device)
            xp[:numel], mp_[:numel] = x.to(device), mask.to(device)
            ex = compressed_allreduce(xp, we, se, mp_, stats=stats, topology=topology)
            steps.append({"result": _host(ex.result), "worker_bits": _host(ex.worker_bits),
                          "worker_scales": _host(ex.worker_scales), "server_bits": _host(ex.server_bits),
                          "worker_error": _host(we), "server_error": _host(se)})
        out[numel] = {"steps": steps, "bytes": stats.intra_node_bytes + stats.inter_node_bytes}
    return out


def _model(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 3)).to(device)


def _allreduce(topology, device) -> dict:
    from birder_repro.comm import attach_allreduce

    out = {}
    for name, dtype in (("ddp", None), ("fp32", torch.float32), ("fp16", torch.float16)):
        ddp = torch.nn.parallel.DistributedDataParallel(_model(device), bucket_cap_mb=0.004,
                                                        device_ids=[device] if device.type == "cuda" else None)
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
        out[name] = {"grads": grads, "intra": state.intra_node_bytes if state else 0.0,
                     "inter": state.inter_node_bytes if state else 0.0}
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
    from birder_repro.comm.birder import BirderState, attach_birder
    from birder_repro.optim.birder import Birder

    calls, original = [], BirderState.allreduce_bucket

    def recording(self, index, buffer, signature):
        grad = _host(buffer)
        out = original(self, index, buffer, signature)
        calls.append((signature, grad, _host(out)))
        return out

    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(_BirderNet().to(device), bucket_cap_mb=0.0006,
                                                    device_ids=[device] if device.type == "cuda" else None)
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
            exact.append(bool(torch.allclose((before - after).abs(), torch.full_like(after, DDP_BIRDER_LR),
                                             rtol=0, atol=1e-6)))
            identical.append(_same_on_every_rank(after))
    finally:
        BirderState.allreduce_bucket = original
        state.close()
    return {"calls": calls, "exact": exact, "identical": identical, "overlaps": state.overlaps(),
            "numels": [p.numel() for p in ddp.parameters()]}


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

    from birder_repro.comm.onebit import attach_onebit
    from birder_repro.optim import OneBitAdam, OneBitLamb

    out = {}
    for name, cls, kwargs in (("adam", OneBitAdam, ONEBIT_ADAM), ("lamb", OneBitLamb, ONEBIT_LAMB)):
        torch.manual_seed(0)
        model = _OneBitNet().to(device)
        initial = [_host(p) for p in model.parameters()]
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001,
                                                        device_ids=[device] if device.type == "cuda" else None)
        opt = cls(ddp.parameters(), freeze_step=ONEBIT_FREEZE, **kwargs)
        state = attach_onebit(ddp, opt, topology=topology)
        steps = []
        for step in range(ONEBIT_DDP_STEPS):
            g = torch.Generator().manual_seed(1000 * step + topology.rank)
            batch = (torch.randn(8, 6, generator=g).to(device), torch.randint(0, 8, (8,), generator=g).to(device),
                     torch.randn(8, 3, generator=g).to(device))
            shadow = copy.deepcopy(ddp.module)  # this rank's own gradient, outside DDP
            ((shadow(*batch[:2]) - batch[2]) ** 2).mean().backward()
            opt.zero_grad()
            ((ddp(*batch[:2]) - batch[2]) ** 2).mean().backward()
            opt.step()
            params = _flat_params(ddp)
            steps.append({"grads": [_host(p.grad) for p in shadow.parameters()], "params": _host(params),
                          "layout": {i: b.signature for i, b in state.store.buckets.items()},
                          "identical": _same_on_every_rank(params)})
        state.close()
        out[name] = {"initial": initial, "steps": steps}
    return out


def _flat_params(ddp) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).clone()


def _same_on_every_rank(flat: torch.Tensor) -> bool:
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], t) for t in everyone)


def _process(rank: int, world: int, gpus_per_node: int, port: int, backend: str, outdir: str) -> None:
    """One process: its device, the process group, every scenario; what it measured goes to rank<r>.pt."""
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(LOCAL_RANK=str(rank % gpus_per_node), LOCAL_WORLD_SIZE=str(gpus_per_node))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            **({"device_id": device} if device.type == "cuda" else {}))
    from birder_repro.comm.topology import build_topology

    topology = build_topology(gpus_per_node)
    results = {}
    for name, scenario in (("birder", _birder), ("onebit", _onebit), ("allreduce", _allreduce),
                           ("birder_ddp", _birder_ddp), ("onebit_ddp", _onebit_ddp)):
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


def run_processes(world: int, gpus_per_node: int, backend: str = "nccl") -> list[dict]:
    """Every scenario on ``world`` processes; what each rank measured."""
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_process, args=(world, gpus_per_node, _free_port(), backend, outdir), nprocs=world, join=True)
        return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(world)]


# ------------------------------------------------------------------------------------- the comparisons
def _failed_scenario(per_rank: list[dict], name: str):
    for rank, r in enumerate(per_rank):
        if "error" in r[name]:
            return Check("hooks", name, FAIL, detail=f"rank {rank}: {r[name]['error'].strip().splitlines()[-1]}")
    return None


def birder_expected_bytes(numel: int, nodes: int, m: int) -> tuple[float, float]:
    """(intra, inter) bytes one process sends for one hierarchical bucket (Birder paper, section 4): the fp32
    reduce-scatter in the node (with one fp32 flag a shard), the all-to-all of packed chunks (one flag byte
    each) and their all-gather among nodes, the all-gather of packed shards in the node."""
    padded = padded_size(numel, 8 * m * nodes)
    shard_bytes = padded // m // 8
    intra = reduce_scatter_bytes((padded + m) * 4, m) + all_gather_bytes(shard_bytes, m)
    inter = all_to_all_bytes(shard_bytes + nodes * FLAG_BYTES, nodes) + all_gather_bytes(shard_bytes // nodes, nodes)
    return intra, inter


def check_birder(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    from birder_repro.references.birder import ReferenceBirder

    failed = _failed_scenario(per_rank, "birder")
    if failed:
        return [failed]
    rows, world = [], nodes * m
    for variant in BIRDER_VARIANTS:
        scheme = variant.partition("-")[0]
        ref = ReferenceBirder(nodes, m, scheme, beta=0.9, eps=1e-8, seed=7, param_numels=BIRDER_SIZES,
                              amsgrad_after=2 if "amsgrad" in variant else None)
        want = [ref.bucket(((bi, 0, n),), n, list(_birder_grads(t, bi, world)))
                for t in range(BIRDER_STEPS) for bi, n in enumerate(BIRDER_SIZES)]
        wrong = [(rank, i) for rank, r in enumerate(per_rank) for i, (got, w) in
                 enumerate(zip(r["birder"][variant]["results"], want)) if not torch.equal(got, w)]
        rows.append(Check("hooks", f"birder {variant}: {nodes}x{m} processes = reference", verdict(not wrong),
                          measured="bit-identical" if not wrong else f"{len(wrong)} bucket results differ "
                          f"(first: rank {wrong[0][0]}, call {wrong[0][1]})",
                          expected=f"{len(want)} bucket calls x {world} ranks equal"))
    intra, inter = (sum(x) * BIRDER_STEPS for x in zip(*(birder_expected_bytes(n, nodes, m) for n in BIRDER_SIZES)))
    got = [(r["birder"]["hierarchical"]["intra"], r["birder"]["hierarchical"]["inter"]) for r in per_rank]
    ok = all(abs(a - intra) <= 1e-6 * max(1, intra) and abs(b - inter) <= 1e-6 * max(1, inter) for a, b in got)
    rows.append(Check("hooks", f"birder hierarchical bytes, {nodes}x{m}", verdict(ok),
                      measured=f"intra {got[0][0]:.0f}, inter {got[0][1]:.0f} B (rank 0)",
                      expected=f"intra {intra:.0f}, inter {inter:.0f} B (comm.accounting)"))
    return rows


def check_onebit(per_rank: list[dict]) -> list[Check]:
    from birder_repro.references.onebit import CompressedAllReduceReference

    failed = _failed_scenario(per_rank, "onebit")
    if failed:
        return [failed]
    rows, world = [], len(per_rank)
    for numel in ONEBIT_SIZES:
        ref, problems = CompressedAllReduceReference(numel, world), []
        for step in range(ONEBIT_STEPS):
            inputs = [_onebit_inputs(numel, step, r) for r in range(world)]
            want = ref([x for x, _ in inputs], inputs[0][1])
            for rank, r in enumerate(per_rank):
                got = r["onebit"][numel]["steps"][step]
                pairs = {"result": (got["result"][:numel], want["result"]),
                         "worker scales": (got["worker_scales"], want["worker_scales"]),
                         "worker error": (got["worker_error"], ref.worker_errors[rank]),
                         "server error": (got["server_error"], ref.server_error[rank * ref.chunk:][:ref.chunk])}
                problems += [f"step {step} rank {rank}: {k}" for k, (a, b) in pairs.items()
                             if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)]
                if not torch.equal(unpack_signs(got["worker_bits"]), want["worker_signs"][rank]):
                    problems.append(f"step {step} rank {rank}: worker signs")
                if not torch.equal(unpack_signs(got["server_bits"]).reshape(-1), want["server_signs"]):
                    problems.append(f"step {step} rank {rank}: server signs")
        rows.append(Check("hooks", f"1-bit compressed all-reduce, {numel} elements, {world} processes = reference",
                          verdict(not problems), measured="equal" if not problems else "; ".join(problems[:3]),
                          expected="signs bit for bit; scales, errors, average within 1e-5"))
        padded = padded_size(numel, 8 * world)
        expected = ONEBIT_STEPS * (all_to_all_bytes(padded // 8, world) + all_gather_bytes(padded // 8 // world, world)
                                   + 2 * all_gather_bytes(SCALE_BYTES, world))
        got = [r["onebit"][numel]["bytes"] for r in per_rank]
        ok = all(abs(b - expected) < 1e-6 for b in got)
        rows.append(Check("hooks", f"1-bit bytes, {numel} elements", verdict(ok),
                          measured=f"{got[0]:.0f} B (rank 0)", expected=f"{expected:.0f} B (comm.accounting)"))
    return rows


def check_allreduce(per_rank: list[dict], gpus_per_node: int) -> list[Check]:
    failed = _failed_scenario(per_rank, "allreduce")
    if failed:
        return [failed]
    world = len(per_rank)
    numel = sum(p.numel() for p in _model("cpu").parameters())
    fp32_bytes = sum(flat_allreduce_split(numel * 4, world, gpus_per_node)) * DDP_STEPS
    rows = []
    for name, exact, nbytes in (("fp32", True, fp32_bytes), ("fp16", False, fp32_bytes / 2)):
        close = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=4e-3, atol=1e-4))
        steps = DDP_STEPS if exact else 1  # fp16 rounding changes the parameters after the first step
        ours = [r["allreduce"][name]["grads"] for r in per_rank]
        ddps = [r["allreduce"]["ddp"]["grads"] for r in per_rank]
        wrong = [(rank, s) for rank in range(world) for s in range(steps)
                 if not all(close(a, b) for a, b in zip(ours[rank][s], ddps[rank][s]))]
        rows.append(Check("hooks", f"{name} all-reduce hook = DDP's all-reduce, {world} processes", verdict(not wrong),
                          measured="equal" if not wrong else f"{len(wrong)} (rank, step) differ",
                          expected="bit for bit" if exact else "within fp16 rounding (rtol 4e-3)"))
        got = [r["allreduce"][name]["intra"] + r["allreduce"][name]["inter"] for r in per_rank]
        ok = all(abs(b - nbytes) < 1e-6 * nbytes for b in got)
        rows.append(Check("hooks", f"{name} all-reduce bytes", verdict(ok),
                          measured=f"{got[0]:.0f} B (rank 0)", expected=f"{nbytes:.0f} B (comm.accounting)"))
    return rows


def check_birder_ddp(per_rank: list[dict], nodes: int, m: int) -> list[Check]:
    """Every bucket call of every rank through the reference, in the order the ranks made them."""
    from birder_repro.references.birder import ReferenceBirder

    failed = _failed_scenario(per_rank, "birder_ddp")
    if failed:
        return [failed]
    runs = [r["birder_ddp"] for r in per_rank]
    ref = ReferenceBirder(nodes, m, "hierarchical", beta=0.9, eps=1e-8, seed=0, param_numels=runs[0]["numels"])
    problems = []
    if len({len(r["calls"]) for r in runs}) != 1:
        problems.append(f"the ranks made {sorted({len(r['calls']) for r in runs})} bucket calls")
    for i in range(min(len(r["calls"]) for r in runs)):
        signature, grad, _ = runs[0]["calls"][i]
        if any(r["calls"][i][0] != signature for r in runs):
            problems.append(f"call {i}: the ranks disagree on the bucket layout")
            break
        want = ref.bucket(signature, grad.numel(), [r["calls"][i][1] for r in runs])
        problems += [f"call {i}, rank {rank}" for rank, r in enumerate(runs) if not torch.equal(r["calls"][i][2], want)]
    problems += [f"rank {rank}: an update not +-lr" for rank, r in enumerate(runs) if not all(r["exact"])]
    problems += [f"rank {rank}: parameters differ across ranks" for rank, r in enumerate(runs)
                 if not all(r["identical"])]
    return [Check("hooks", f"birder DDP hook (overlap {runs[0]['overlaps']}), {nodes}x{m} = reference",
                  verdict(not problems), measured=f"{len(runs[0]['calls'])} bucket calls bit-identical"
                  if not problems else "; ".join(problems[:3]),
                  expected="every call = reference; updates +-lr; ranks identical")]


def _bucket_order(layout: dict) -> list[list[int]]:
    """Parameter indices of each bucket in buffer order (the reference's layout of a step)."""
    return [[i for i, _, _ in sig] for _, sig in sorted(layout.items())]


def check_onebit_ddp(per_rank: list[dict]) -> list[Check]:
    from birder_repro.references.onebit import OneBitAdamReference, OneBitLambReference

    failed = _failed_scenario(per_rank, "onebit_ddp")
    if failed:
        return [failed]
    rows, world = [], len(per_rank)
    for name, cls, kwargs in (("adam", OneBitAdamReference, ONEBIT_ADAM), ("lamb", OneBitLambReference, ONEBIT_LAMB)):
        runs = [r["onebit_ddp"][name] for r in per_rank]
        ref = cls(runs[0]["initial"], [], world, freeze_step=ONEBIT_FREEZE, **kwargs)
        problems = []
        for step in range(ONEBIT_DDP_STEPS):
            ref.step([r["steps"][step]["grads"] for r in runs], _bucket_order(runs[0]["steps"][step]["layout"]))
            want = torch.cat([x.reshape(-1) for x in ref.x])
            if not torch.allclose(runs[0]["steps"][step]["params"], want, rtol=1e-5, atol=1e-6):
                diff = float((runs[0]["steps"][step]["params"] - want).abs().max())
                problems.append(f"step {step + 1}: max difference {diff:.2e}")
            problems += [f"step {step + 1}: ranks differ" for r in runs[:1] if not r["steps"][step]["identical"]]
        rows.append(Check("hooks", f"1-bit {name.upper() if name == 'lamb' else 'Adam'} DDP hook, {world} processes "
                                   "= reference", verdict(not problems),
                          measured=f"{ONEBIT_DDP_STEPS} steps equal" if not problems else "; ".join(problems[:3]),
                          expected=f"parameters within 1e-5 every step (freeze after {ONEBIT_FREEZE}); "
                                   "ranks identical"))
    return rows


def check_hooks(world: int, backend: str = "nccl") -> list[Check]:
    """Every scenario on ``world`` processes, each compared with its reference and its byte formula."""
    nodes, m = layout(world)
    try:
        per_rank = run_processes(world, m, backend)
    except Exception as exc:  # noqa: BLE001 - processes that die are one failed row
        return [Check("hooks", f"{world} {backend} processes", FAIL, detail=f"{type(exc).__name__}: {exc}")]
    return (check_birder(per_rank, nodes, m) + check_onebit(per_rank) + check_allreduce(per_rank, m)
            + check_birder_ddp(per_rank, nodes, m) + check_onebit_ddp(per_rank))
