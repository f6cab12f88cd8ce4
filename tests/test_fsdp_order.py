"""The FSDP hooks' collectives, streams and attach checks (comm.fsdp_hooks, module doc "Streams and order").

Every collective a process issues during training is recorded (thread, group, operation) by wrapping the
ProcessGroup's methods, on 4 gloo processes (2 nodes x 2) running Birder and 1-bit Adam (warmup, then
compression) under FSDP2:

- inside the hook (``overlap=False`` here; always on CUDA, ``runs_in_hook``) every collective comes from the
  autograd thread, and every rank issues the same sequence over all its groups: one order across the
  communicators, as NCCL asks; the node's flag is made on the thread (so the stream) that reads it;
- on the communication thread (CPU, ``overlap=True``) no group is used from two threads and every rank of a
  group issues the same sequence on it;
- both give the same parameters bit for bit.

Without a GPU, a stand-in shard that says it is on CUDA drives the real hook: its work runs in the hook call,
never on the thread (whose side stream would read a flag made on FSDP's stream).
"""

from __future__ import annotations

import threading
import types

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_distributed
from test_fsdp import LR, WORLD, _batch, _sharded_net
from torch import nn

OPS = (
    "allreduce",
    "allreduce_coalesced",
    "all_gather_single",
    "_allgather_base",
    "allgather",
    "allgather_into_tensor_coalesced",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "broadcast",
    "barrier",
)


def _record_collectives(log: list) -> None:
    """Wrap every collective method of ProcessGroup: (thread name, the group's ranks, op) into ``log`` while
    ``log.on`` is set (a list attribute)."""
    for name in OPS:
        orig = getattr(dist.ProcessGroup, name, None)
        if orig is None:
            continue

        def wrapped(self, *args, _orig=orig, _name=name, **kwargs):
            if getattr(log, "on", False):
                log.append((threading.current_thread().name, tuple(dist.get_process_group_ranks(self)), _name))
            return _orig(self, *args, **kwargs)

        setattr(dist.ProcessGroup, name, wrapped)


class _Log(list):
    on = False


def _flags_made_where_read():
    """Wrap local_flag and the hooks' work: (thread that made each flag, thread that read it)."""
    from birder_repro.comm import fsdp_hooks

    made, pairs = {}, []
    orig_flag, orig_init = fsdp_hooks.local_flag, fsdp_hooks.UnitHooks.__init__

    def local_flag(x):
        flag = orig_flag(x)
        made[id(flag)] = threading.current_thread().name
        return flag

    def init(self, state, units, topology, traffic, work):
        def reading(unit, shard, flag):
            pairs.append((made.get(id(flag)), threading.current_thread().name))
            return work(unit, shard, flag)

        orig_init(self, state, units, topology, traffic, reading)

    fsdp_hooks.local_flag, fsdp_hooks.UnitHooks.__init__ = local_flag, init
    return pairs


def _train(rank, optim: str, overlap: bool, log: _Log, pairs: list):
    from birder_repro.comm import attach_birder_fsdp, attach_onebit_fsdp
    from birder_repro.optim import Birder, OneBitAdam

    log.clear()
    pairs.clear()
    model, mesh = _sharded_net()
    if optim == "birder":
        opt = Birder(model.parameters(), lr=LR, beta=0.9, weight_decay=1e-3)
        state = attach_birder_fsdp(model, opt, mesh, overlap=overlap)
    else:
        opt = OneBitAdam(model.parameters(), lr=1e-2, freeze_step=1)
        state = attach_onebit_fsdp(model, opt, mesh, overlap=overlap)
    for step in range(3):
        x, y = _batch(rank, step)
        log.on = True
        nn.functional.mse_loss(model(x), y).backward()
        log.on = False
        opt.step()
        opt.zero_grad()
    state.close()
    return {
        "log": list(log),
        "pairs": list(pairs),
        "params": torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]),
    }


def _gradients_left(rank) -> str:
    """A second backward without zero_grad on the thread path: FSDP would add the shard to the gradients before
    the thread writes it, so the hook refuses (last: the failed backward leaves FSDP's state behind)."""
    from birder_repro.comm import attach_birder_fsdp
    from birder_repro.optim import Birder

    model, mesh = _sharded_net()
    opt = Birder(model.parameters(), lr=LR, beta=0.9)
    state = attach_birder_fsdp(model, opt, mesh, overlap=True)
    x, y = _batch(rank, 0)
    nn.functional.mse_loss(model(x), y).backward()
    try:
        nn.functional.mse_loss(model(x), y).backward()
    except RuntimeError as exc:
        return str(exc)
    finally:
        state.close()
    return "no error"


def _all(rank, world):
    log = _Log()
    _record_collectives(log)  # once per process: the wrappers stay installed
    pairs = _flags_made_where_read()
    out = {
        (optim, overlap): _train(rank, optim, overlap, log, pairs)
        for optim in ("birder", "onebit")
        for overlap in (False, True)
    }
    out["gradients_left"] = _gradients_left(rank)
    return out


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_all, WORLD)


def _role(ranks: tuple) -> str:
    return {2: "node" if ranks[1] - ranks[0] == 1 else "replicate", WORLD: "world"}[len(ranks)]


def _same_sequence_per_group(logs: list[list]) -> None:
    per_group: dict[tuple, dict[int, list]] = {}
    for rank, log in enumerate(logs):
        for _thread, ranks, op in log:
            per_group.setdefault(ranks, {}).setdefault(rank, []).append(op)
    assert {_role(g) for g in per_group} == {"node", "replicate"}
    for ranks, by_rank in per_group.items():
        assert sorted(by_rank) == list(ranks)  # only its members use it
        assert all(seq == by_rank[ranks[0]] for seq in by_rank.values()), ranks


@pytest.mark.parametrize("optim", ["birder", "onebit"])
def test_inside_the_hook_every_rank_launches_one_order_over_all_groups_from_one_thread(runs, optim):
    logs = [runs[r][(optim, False)]["log"] for r in range(WORLD)]
    _same_sequence_per_group(logs)
    orders = [[(_role(ranks), op) for _, ranks, op in log] for log in logs]
    assert all(order == orders[0] for order in orders)  # one order across the communicators
    assert {thread for log in logs for thread, _, _ in log} == {"MainThread"}
    ops = {op for _, ranks, op in logs[0] if _role(ranks) == "replicate"}
    assert ops == (
        {"all_to_all_single", "all_gather_single"}
        if optim == "birder"
        else {"allreduce", "all_to_all_single", "all_gather_single"}
    ), ops
    # the node's flag is made and read in the same hook call (on CUDA: on the same stream)
    pairs = [p for r in range(WORLD) for p in runs[r][(optim, False)]["pairs"]]
    assert pairs and all(made == read == "MainThread" for made, read in pairs)


@pytest.mark.parametrize("optim", ["birder", "onebit"])
def test_on_the_thread_no_group_is_used_from_two_threads_and_each_keeps_one_order(runs, optim):
    logs = [runs[r][(optim, True)]["log"] for r in range(WORLD)]
    _same_sequence_per_group(logs)
    for log in logs:
        threads: dict[tuple, set] = {}
        for thread, ranks, _ in log:
            threads.setdefault(ranks, set()).add(thread)
        assert all(len(t) == 1 for t in threads.values()), threads
        assert {next(iter(t)) for r, t in threads.items() if _role(r) == "node"} == {"MainThread"}
        replicate = {next(iter(t)) for r, t in threads.items() if _role(r) == "replicate"}
        assert len(replicate) == 1 and next(iter(replicate)).startswith(f"{optim}-comm-"), replicate


@pytest.mark.parametrize("optim", ["birder", "onebit"])
def test_inside_the_hook_and_on_the_thread_train_alike_bit_for_bit(runs, optim):
    for r in range(WORLD):
        assert torch.equal(runs[r][(optim, False)]["params"], runs[r][(optim, True)]["params"])


def test_the_thread_refuses_a_unit_that_already_has_gradients(runs):
    for r in range(WORLD):
        says = runs[r]["gradients_left"]
        assert "already has gradients" in says and "zero_grad(set_to_none=True)" in says and "\n" not in says


def test_on_cuda_the_work_always_runs_inside_the_hook():
    from birder_repro.comm.fsdp_hooks import runs_in_hook

    # CUDA: inside the hook whatever overlap says (one thread, one stream); CPU: the thread where asked.
    assert runs_in_hook(torch.device("cuda", 1), True) and runs_in_hook("cuda", False)
    assert not runs_in_hook(torch.device("cpu"), True) and runs_in_hook("cpu", False)


class _CudaShard(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0: the hook's choice of path, without a GPU."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_a_cuda_shard_is_worked_on_inside_the_hook_and_never_queued_to_the_thread():
    """The real hook with stand-ins around it: a CUDA shard's flag is made and its work done in the hook call
    (on CUDA: on FSDP's all-reduce stream, the stream the flag is made on), even with overlap on; nothing is
    handed to the communication thread, whose side stream would read the flag."""
    from birder_repro.comm.fsdp_hooks import UnitHooks
    from birder_repro.comm.fsdp_units import Unit

    calls = []

    class Runner:
        overlap = True

        def run(self, work, device):
            calls.append("queued to the thread")

    state = types.SimpleNamespace(runner=Runner(), add_bytes=lambda *a: None)
    fsdp_group = types.SimpleNamespace(gradient_divide_factor=None, force_sum_reduction_for_comms=False)
    module = types.SimpleNamespace(
        set_all_reduce_hook=lambda hook: None,
        _get_fsdp_state=lambda: types.SimpleNamespace(_fsdp_param_groups=[fsdp_group]),
    )  # FSDP's settings the hook reads (fsdp_postdivide): averaged in the reduce-scatter, nothing to undo
    unit = Unit(0, module, (), ((0, 0, 4, 0),), 4, 16)
    topology = types.SimpleNamespace(intra_group=None, gpus_per_node=1)
    traffic = types.SimpleNamespace(reduced=lambda *a: None)
    hooks = UnitHooks(
        state,
        [unit],
        topology,
        traffic,
        lambda u, shard, flag: calls.append((threading.current_thread().name, float(flag))),
    )
    hooks.hook(unit, torch.tensor([1.0, float("nan"), 0.0, 0.0]).as_subclass(_CudaShard))
    assert calls == [(threading.current_thread().name, 1.0)] and not hooks.pending and not hooks.callback_queued


def test_the_fsdp_attach_runs_the_triton_self_test_and_refuses_a_failing_one(monkeypatch):
    """An old Triton whose tl.rand draws other numbers than the CPU backends is refused when Birder attaches
    to an FSDP model, in the self-test's one line, as attach_birder does (no process group needed: the
    backend is checked before the mesh)."""
    from birder_repro.comm import kernels
    from birder_repro.comm.fsdp import attach_birder_fsdp
    from birder_repro.optim import Birder

    says = "the triton kernels backend: tl.rand does not draw Philox4x32-10 (Triton < 3.4?); set kernel_backend=torch"

    def self_test(device):
        raise RuntimeError(says)

    monkeypatch.setattr(kernels, "available_backends", lambda device: ("triton", "cpu", "torch"))
    monkeypatch.setattr(kernels, "_module", lambda name: types.SimpleNamespace(self_test=self_test))
    monkeypatch.setattr(kernels, "_CHECKED", set())
    model = nn.Linear(3, 2)
    with pytest.raises(RuntimeError) as err:
        attach_birder_fsdp(model, Birder(model.parameters(), lr=0.1), mesh=None, kernel_backend="triton")
    assert str(err.value) == says
