"""One-pass compression kernels for Birder (Birder paper, Algorithm 1 lines 4-12; section 4, steps ii-iv).

Public API (``from birder_repro.comm import kernels``); g, m, b, e are float32 1-D tensors of one length, a
multiple of 8, and the state is updated in place (or written to ``state_out`` / ``e_bar_out``, leaving the
old state whole)::

    packed = kernels.worker_compress(g, m, b, e, beta=0.95, eps=1e-8, seed=s, offset=0)   # uint8, n/8
    packed_bar = kernels.server_compress(received, e_bar, seed=s, offset=0)   # received uint8 (workers, k)
    signs = kernels.unpack(packed)                                             # float32 +-1, 8 per byte

Worker (lines 4-9): m = beta*m + (1-beta)*g; b = beta*b + (1-beta)*|g| (with ``b_hat``, after T0 steps: the
EMA goes to b_hat and b = max(b, b_hat)); x = m/(b+eps) + e; u = Q(x); e = x - u; u packed LSB first, bit 1
meaning +1 (:mod:`birder_repro.comm.pack`). Server (lines 11-12): the mean of the workers' +-1, x = mean +
e_bar, u_bar = Q(x), e_bar = x - u_bar, packed. Q(x) is +1 iff uniform < (x + 1) / 2 (Eq. (5)).

Uniforms are counter-based: element j draws ``tl.rand(seed, position_j)`` (Philox4x32-10; :mod:`.philox`
reproduces it in torch), with position_j = offset + j, or, for ``offset=Segments(starts, global_offsets)``,
global_offsets[s] + (j - starts[s]) in segment s. Seeds come from :func:`derive_seed`.

Backends (``backend=``): ``torch`` (the reference: the optimizer's own functions), ``cpu`` (numba, one pass,
all the process's cores), ``triton`` (GPU; CPU tensors under ``TRITON_INTERPRET=1``), ``auto`` (triton on
CUDA tensors, and an error where Triton is missing rather than the slow reference; cpu on CPU tensors where
numba imports, else torch). All give the same bits and state. :func:`check_backend` also self-tests triton on
its device (the hooks call it when they attach).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

import torch

from birder_repro.comm.kernels.philox import Offset, Segments, as_segments, derive_seed, uniform

__all__ = [
    "worker_compress",
    "server_compress",
    "unpack",
    "uniform",
    "derive_seed",
    "Segments",
    "BACKENDS",
    "available_backends",
    "resolve_backend",
    "check_backend",
    "backend_threads",
]

# backend name -> module with worker_compress, server_compress, unpack, threads
BACKENDS = {
    "torch": "birder_repro.comm.kernels.reference",
    "cpu": "birder_repro.comm.kernels.cpu",
    "triton": "birder_repro.comm.kernels.gpu",
}
_IMPORT_ERRORS: dict[str, str] = {}


def numba_pool_size(environ: Mapping[str, str], cores: int) -> str | None:
    """NUMBA_NUM_THREADS for this process before numba is imported: the thread budget (OMP_NUM_THREADS, which the
    launchers and torchrun set per process) capped at the cores it may run on; None (numba's own default, every
    core) where the user set NUMBA_NUM_THREADS or no budget is set.

    Why: numba starts a pool of NUMBA_NUM_THREADS threads (every core by default) whatever
    ``numba.set_num_threads`` later masks, and its OpenMP layer's idle threads spin-wait on the cores the other
    processes of the node train on. Measured, Fashion-MNIST's MLP, Birder on 1 node x 2 processes with 2 cores
    and one thread each: 72 ms a step with a pool of 2, 26 ms with a pool of 1."""
    budget = thread_budget(environ)
    if environ.get("NUMBA_NUM_THREADS") or budget is None:
        return None
    return str(max(1, min(budget, cores)))


def thread_budget(environ: Mapping[str, str]) -> int | None:
    """OMP_NUM_THREADS as a positive int (the launchers' and torchrun's per-process budget), else None."""
    budget = environ.get("OMP_NUM_THREADS", "")
    return int(budget) if budget.isdigit() and int(budget) > 0 else None


def process_cores() -> int:
    """The cores this process may run on (its CPU affinity: an emulated node pinned to its cores)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _size_numba_pool() -> None:
    size = numba_pool_size(os.environ, process_cores())
    if size is not None:
        os.environ["NUMBA_NUM_THREADS"] = size  # read once, when numba is imported (by .cpu, after this)


_size_numba_pool()


def _module(name: str):
    try:
        return importlib.import_module(BACKENDS[name])
    except ImportError as exc:  # numba or triton missing: the backend is unavailable, not broken
        _IMPORT_ERRORS[name] = str(exc)
        return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The backends that run on ``device`` here."""
    device = torch.device(device)
    names = ["torch"]
    if device.type == "cpu" and _module("cpu") is not None:
        names.append("cpu")
    if (device.type == "cuda" or (device.type == "cpu" and _interpreting())) and _module("triton") is not None:
        names.append("triton")
    return names


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """``auto`` -> the fastest backend for ``device``; a named one is checked to run there."""
    device = torch.device(device)
    if backend == "auto":
        choices = available_backends(device)
        if device.type == "cuda":  # never the slow reference on a GPU without a word
            if "triton" in choices:
                return "triton"
            raise ValueError(
                f"kernels backend auto on CUDA needs Triton, which is unavailable here "
                f"({_IMPORT_ERRORS.get('triton', 'it did not import')}): install the triton that "
                "matches torch, or set optim.comm.kernel_backend=torch (the slow reference)"
            )
        return "cpu" if "cpu" in choices else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernels backend {backend!r}; choices: auto, {', '.join(BACKENDS)}")
    if backend not in available_backends(device):
        why = _IMPORT_ERRORS.get(
            backend,
            f"it does not run on {device.type} tensors"
            + (" (set TRITON_INTERPRET=1 for CPU)" if backend == "triton" else ""),
        )
        raise ValueError(f"kernels backend {backend!r} is unavailable: {why}")
    return backend


_CHECKED: set[tuple[str, torch.device]] = set()


def check_backend(backend: str, device: torch.device | str) -> str:
    """:func:`resolve_backend`, and for ``triton`` a self-test on ``device`` once per process: every kernel
    variant compiled and run on a tiny buffer, and ``tl.rand`` checked against :func:`uniform`. A hook calls it
    when it attaches, so that a Triton that cannot compile, or whose ``tl.rand`` draws other numbers (before
    Triton 3.4 it was Philox4x64, :mod:`.philox`), is refused there in one line, not on the communication
    thread at the first bucket; and no variant is compiled inside a timed step."""
    device = torch.device(device)
    name = resolve_backend(backend, device)
    if name == "triton" and (name, device) not in _CHECKED:
        _module("triton").self_test(device)
        _CHECKED.add((name, device))
    return name


def backend_threads(backend: str, device: torch.device | str = "cpu"):
    """CPU threads the backend computes with, or "gpu"."""
    name = resolve_backend(backend, device)
    return "gpu" if torch.device(device).type == "cuda" else _module(name).threads()


def _check_float(name: str, t: torch.Tensor, n: int | None, device, what: str = "the length of g") -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise ValueError(f"{name} must be a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor, got shape {tuple(t.shape)}")
    if n is not None and t.numel() != n:
        raise ValueError(f"{name} has {t.numel()} elements, expected {n} ({what})")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")


def worker_compress(
    g: torch.Tensor,
    m: torch.Tensor,
    b: torch.Tensor,
    e: torch.Tensor,
    beta: float = 0.95,
    eps: float = 1e-8,
    seed: int = 0,
    offset: Offset = 0,
    backend: str = "auto",
    b_hat: torch.Tensor | None = None,
    state_out: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """Algorithm 1, lines 4-9 on one worker's buffer, in place on m, b, e (and b_hat); returns u packed.

    ``state_out=(m', b', e')`` (with ``b_hat``: ``(m', b', e', b_hat')``) writes the new state there instead
    and leaves m, b, e (b_hat) as they were: the old state stays whole at no cost (a hook that may have to undo
    the step keeps it, instead of copying it first)."""
    _check_float("g", g, None, g.device if isinstance(g, torch.Tensor) else None)
    n = g.numel()
    if n % 8:
        raise ValueError(f"worker_compress needs a multiple of 8 elements, got {n}: pad the buffer first")
    state = (m, b, e) + ((b_hat,) if b_hat is not None else ())
    for name, t in zip(("m", "b", "e", "b_hat"), state):
        _check_float(name, t, n, g.device)
    if state_out is not None:
        if len(state_out) != len(state):
            raise ValueError(
                f"state_out needs {len(state)} tensors (m, b, e{', b_hat' if b_hat is not None else ''}), "
                f"got {len(state_out)}"
            )
        for name, t in zip(("m'", "b'", "e'", "b_hat'"), state_out):
            _check_float(name, t, n, g.device)
    _check_seed(seed)
    segments = as_segments(offset, n)
    impl = _module(resolve_backend(backend, g.device))
    if n == 0:
        return torch.empty(0, dtype=torch.uint8, device=g.device)
    return impl.worker_compress(
        g, m, b, e, b_hat, float(beta), float(eps), seed, segments, tuple(state_out) if state_out is not None else state
    )


def server_compress(
    received: torch.Tensor,
    e_bar: torch.Tensor,
    seed: int = 0,
    offset: Offset = 0,
    backend: str = "auto",
    e_bar_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Algorithm 1, lines 11-12 on the workers' packed chunks (workers, k): in place on e_bar (8k); packed.
    ``e_bar_out``: the new error goes there and e_bar is left as it was (see ``state_out`` above)."""
    if not isinstance(received, torch.Tensor) or received.dtype != torch.uint8 or received.dim() != 2:
        raise ValueError(
            f"received must be a 2-D uint8 tensor (workers, bytes), got "
            f"{getattr(received, 'dtype', type(received).__name__)} of shape "
            f"{tuple(getattr(received, 'shape', ()))}"
        )
    if received.shape[0] < 1:
        raise ValueError("received holds no worker's chunk")
    received = received.contiguous()
    _check_float("e_bar", e_bar, received.shape[1] * 8, received.device, "8 per received byte")
    if e_bar_out is not None:
        _check_float("e_bar_out", e_bar_out, e_bar.numel(), received.device, "the length of e_bar")
    _check_seed(seed)
    segments = as_segments(offset, e_bar.numel())
    impl = _module(resolve_backend(backend, received.device))
    if e_bar.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=received.device)
    return impl.server_compress(received, e_bar, seed, segments, e_bar if e_bar_out is None else e_bar_out)


def unpack(packed: torch.Tensor, backend: str = "auto", out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 bytes -> float32 +-1, eight per byte, LSB first: (..., k) -> (..., 8k); into 1-D ``out`` if given."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError(f"unpack takes a uint8 tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    shape = (*packed.shape[:-1], packed.shape[-1] * 8) if packed.dim() else (8,)
    packed = packed.contiguous().reshape(-1)
    if out is None:
        out = torch.empty(packed.numel() * 8, dtype=torch.float32, device=packed.device)
    else:
        _check_float("out", out, packed.numel() * 8, packed.device, "8 per packed byte")
    impl = _module(resolve_backend(backend, packed.device))
    if packed.numel() == 0:
        return out.view(shape)
    return impl.unpack(packed, out).view(shape)
