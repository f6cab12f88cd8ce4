"""Run a function on several gloo processes (forked from a forkserver that has imported torch) and collect what
each returns."""

from __future__ import annotations

import io
import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, queue, environ: dict) -> None:
    # The caller's environment as it is now (a forked process has the forkserver's, from when it started).
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # As bytes: tensors passed through the queue as they are live in this process's shared memory,
        # which is gone once the process exits.
        buf = io.BytesIO()
        torch.save(fn(rank, world, *args), buf)
        queue.put((rank, buf.getvalue(), None))
    except BaseException:  # noqa: BLE001 - every failure, KeyboardInterrupt too, goes back to the caller
        queue.put((rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def _context():
    """A forkserver that has imported torch once: each process of every later call forks from it instead of
    starting a fresh interpreter and importing torch again (about 3 s of CPU a process). It imports what every
    process imports next too: torch._dynamo (DDP's constructor loads it: 1.3 s a process) and the project's
    hooks, kernels (numba) and training loop."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "torch",
            "torch.distributed",
            "torch.nn.parallel",
            "torch._dynamo",
            "birder_repro.comm.birder",
            "birder_repro.comm.onebit",
            "birder_repro.comm.kernels.cpu",
            "birder_repro.train.loop",
            "dist_utils",
        ]
    )
    return ctx


def start(fn, world: int, *args) -> None:
    """``torch.multiprocessing.spawn(fn, args, world)``, forked from the preloaded forkserver (:func:`_context`)
    instead of ``world`` fresh interpreters; ``fn(rank, *args)`` sets up its own process group."""
    _context()
    mp.start_processes(fn, args=args, nprocs=world, join=True, start_method="forkserver")


def run_distributed(fn, world: int, *args, timeout: float = 240.0) -> list:
    """``fn(rank, world, *args)`` on ``world`` gloo processes; returns the results by rank, raising any failure.

    ``fn`` must be a module-level function (it is pickled); results travel through a queue, so keep them small
    or CPU tensors.
    """
    ctx = _context()
    queue = ctx.SimpleQueue()
    port = free_port()  # every process of this call rendezvous on the same port
    environ = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue, environ)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = [None] * world, []
    for _ in range(world):
        rank, value, err = queue.get()
        results[rank] = None if value is None else torch.load(io.BytesIO(value), weights_only=False)
        if err:
            errors.append(f"rank {rank}:\n{err}")
    for p in procs:
        p.join(timeout)
    if errors:
        raise AssertionError("\n".join(errors))
    return results
