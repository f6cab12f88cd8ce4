"""The ``triton`` backend: Birder's compression as one Triton kernel per step (GPU; CPU through the interpreter).

Each program handles ``BLOCK`` elements (``BLOCK / 8`` packed bytes): it loads the state once, draws its
uniforms with ``tl.rand`` itself (so the torch reference of :mod:`.philox` is checked against the real thing),
does the float32 arithmetic of the torch reference in the same order, stores the state and the packed bits.

Bit-exactness with the torch reference needs two things Triton does not do by default: the division is
``div_rn`` (IEEE round-to-nearest; plain ``/`` lowers to an approximate division on NVIDIA GPUs) and the
kernels are launched with ``enable_fp_fusion=False`` (no fused multiply-add in beta*m + (1-beta)*g).

A buffer of several segments finds each element's segment by a branch-free binary search over the (small)
table of segment starts: every probe index stays inside the table, so no masked gather is needed (which
keeps the interpreter, where masked-off addresses are still formed, on safe ground).

Specialisation. Triton compiles one variant of a kernel per "signature" of its integer arguments: their type
(i32, i64 or u64, chosen from the value) and, unless listed in ``do_not_specialize``, whether the value is 1 or
divisible by 16. A per-step Philox key would pick a new variant every few steps, each a compile of about a
second in the middle of a timed step while the other nodes wait. So the key travels as two signed 32-bit halves
(:func:`seed_halves`: always type i32) listed in ``do_not_specialize``, and the kernel puts the 64-bit key back
together (:func:`_key`). The sizes, segment counts and worker counts are not specialised on either (they only
bound loops and masks: 1 node's ``workers == 1`` or 16 nodes' ``% 16`` would each compile a new server
variant at the first bucket), nor is the alignment of the packed bytes the unpack reads (a hook unpacks a
bucket's last partial byte from a 1-byte slice at any address). So the variants :func:`self_test` compiles
when a hook attaches, ``HAS_B_HAT`` (AMSGrad from step T0 + 1) included, are the ones every bucket runs;
``tests/test_kernels.py`` checks it with Triton's own specialisation of every launch the wrappers make.

Launches run under the tensors' device (:func:`_launch`): Triton launches on the current CUDA device, and a
script that puts the model on ``cuda:r`` without ``torch.cuda.set_device(r)`` would otherwise run the kernels
on ``cuda:0`` with pointers into ``cuda:r`` (an illegal address, a sticky CUDA error).

Index arithmetic is 64-bit throughout: element and byte indices derive from an int64 program id, masks compare
``j >> 3`` with a byte count instead of forming ``8 * nbytes``, and the server's rows advance an int64 offset, so
no 32-bit product overflows past 2^31 elements (the ``allgather`` variant's unpack with many workers).

The interpreter (``TRITON_INTERPRET=1``, CPU tensors) reads the variable when this module is imported.
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from birder_repro.comm.kernels.philox import Segments

BLOCK = 1024
_LAUNCH = dict(enable_fp_fusion=False)
# The integer arguments Triton must not specialise on (module docstring): the per-step key's halves, and the
# sizes and counts, so that the variants the hook's self-test compiles are the ones every bucket runs.
NO_SPECIALIZE = ("seed_lo", "seed_hi", "n", "nbytes", "nseg", "nsteps", "workers")


def seed_halves(seed: int) -> tuple[int, int]:
    """A 64-bit key as two signed 32-bit ints (low word, high word): Triton types both i32 whatever the key."""
    lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    return (lo - (1 << 32) if lo >= 1 << 31 else lo, hi - (1 << 32) if hi >= 1 << 31 else hi)


@triton.jit
def _key(seed_lo, seed_hi):
    """The uint64 Philox key from its two 32-bit halves (:func:`seed_halves`)."""
    lo = seed_lo.to(tl.uint32, bitcast=True).to(tl.uint64)
    hi = seed_hi.to(tl.uint32, bitcast=True).to(tl.uint64)
    return (hi << 32) | lo


@triton.jit
def _in_bytes(j, nbytes):
    """Whether element j lies in the first ``nbytes`` bytes of bits: ``j < 8 * nbytes`` without the product."""
    return (j >> 3) < nbytes


@triton.jit
def _positions(j, starts_ptr, deltas_ptr, nseg, nsteps):
    """Position of buffer element j among all parameters: j + deltas[s], s the last segment starting <= j."""
    lo = tl.zeros(j.shape, tl.int32)
    hi = lo + nseg
    for _ in range(nsteps):
        mid = (lo + hi) // 2
        go_right = tl.load(starts_ptr + mid) <= j
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return j + tl.load(deltas_ptr + lo)


@triton.jit
def _quantize(x, rand):
    """Eq. (5) of the Birder paper as a bit: +1 iff rand < (x + 1) / 2; and the error x - u."""
    up = rand < (x + 1.0) * 0.5
    return up, x - tl.where(up, 1.0, -1.0)


@triton.jit
def _pack(up, BLOCK: tl.constexpr):
    """BLOCK bits -> BLOCK / 8 bytes, element 8k + i at bit i of byte k."""
    shifts = tl.arange(0, 8)
    return tl.sum(tl.reshape(up.to(tl.int32), (BLOCK // 8, 8)) << shifts[None, :], axis=1).to(tl.uint8)


@triton.jit
def _unpack_bits(packed_bytes, BLOCK: tl.constexpr):
    """BLOCK / 8 bytes -> BLOCK 0/1 int32."""
    shifts = tl.arange(0, 8)
    return tl.reshape((packed_bytes.to(tl.int32)[:, None] >> shifts[None, :]) & 1, (BLOCK,))


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _worker_kernel(
    g_ptr,
    m_ptr,
    b_ptr,
    e_ptr,
    b_hat_ptr,
    m_o_ptr,
    b_o_ptr,
    e_o_ptr,
    b_hat_o_ptr,
    out_ptr,
    n,
    beta,
    one_minus_beta,
    eps,
    seed_lo,
    seed_hi,
    starts_ptr,
    deltas_ptr,
    nseg,
    nsteps,
    HAS_B_HAT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # The state is read from m, b, e (b_hat) and written to the *_o pointers (the same ones: in place).
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = j < n
    g = tl.load(g_ptr + j, mask=mask, other=0.0)
    m = tl.load(m_ptr + j, mask=mask, other=0.0) * beta + g * one_minus_beta
    tl.store(m_o_ptr + j, m, mask=mask)
    ema_term = tl.abs(g) * one_minus_beta
    if HAS_B_HAT:
        b_hat = tl.load(b_hat_ptr + j, mask=mask, other=0.0) * beta + ema_term
        tl.store(b_hat_o_ptr + j, b_hat, mask=mask)
        b_old = tl.load(b_ptr + j, mask=mask, other=0.0)
        b = tl.where((b_old != b_old) | (b_old >= b_hat), b_old, b_hat)  # torch.maximum, NaN included
    else:
        b = tl.load(b_ptr + j, mask=mask, other=0.0) * beta + ema_term
    tl.store(b_o_ptr + j, b, mask=mask)
    x = tl.math.div_rn(m, b + eps) + tl.load(e_ptr + j, mask=mask, other=0.0)
    rand = tl.rand(_key(seed_lo, seed_hi), _positions(j, starts_ptr, deltas_ptr, nseg, nsteps))
    up, err = _quantize(x, rand)
    tl.store(e_o_ptr + j, err, mask=mask)
    q = tl.program_id(0).to(tl.int64) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    tl.store(out_ptr + q, _pack(up, BLOCK), mask=q < n // 8)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _server_kernel(
    received_ptr,
    e_bar_ptr,
    e_bar_o_ptr,
    out_ptr,
    workers,
    float_workers,
    nbytes,
    seed_lo,
    seed_hi,
    starts_ptr,
    deltas_ptr,
    nseg,
    nsteps,
    BLOCK: tl.constexpr,
):
    q = tl.program_id(0).to(tl.int64) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    qmask = q < nbytes
    count = tl.zeros((BLOCK,), tl.int32)
    row = q  # int64: worker w's byte q sits at w * nbytes + q, formed by adding, never by a 32-bit product
    for _ in range(workers):
        count += _unpack_bits(tl.load(received_ptr + row, mask=qmask, other=0), BLOCK)
        row += nbytes
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = _in_bytes(j, nbytes)
    # the sum of the workers' +-1 is exact in float32; the mean divides it by the count (torch's order)
    mean = tl.math.div_rn((2 * count - workers).to(tl.float32), float_workers)
    x = mean + tl.load(e_bar_ptr + j, mask=mask, other=0.0)
    rand = tl.rand(_key(seed_lo, seed_hi), _positions(j, starts_ptr, deltas_ptr, nseg, nsteps))
    up, err = _quantize(x, rand)
    tl.store(e_bar_o_ptr + j, err, mask=mask)
    tl.store(out_ptr + q, _pack(up, BLOCK), mask=qmask)


@triton.jit(do_not_specialize=NO_SPECIALIZE, do_not_specialize_on_alignment=("packed_ptr",))
def _unpack_kernel(packed_ptr, out_ptr, nbytes, BLOCK: tl.constexpr):
    q = tl.program_id(0).to(tl.int64) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    bits = _unpack_bits(tl.load(packed_ptr + q, mask=q < nbytes, other=0), BLOCK)
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + j, bits.to(tl.float32) * 2.0 - 1.0, mask=_in_bytes(j, nbytes))


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _rand_kernel(offsets_ptr, out_ptr, n, seed_lo, seed_hi, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(out_ptr + i, tl.rand(_key(seed_lo, seed_hi), tl.load(offsets_ptr + i, mask=mask, other=0)), mask=mask)


def _segment_args(segments: Segments, device) -> tuple:
    """The segment table on ``device``, copied there once per Segments (:meth:`Segments.on`): a copy from pageable
    host memory at every launch would synchronise the stream twice per bucket per step."""
    starts, deltas = segments.on(device)
    nseg = starts.numel()
    return starts, deltas, nseg, math.ceil(math.log2(nseg)) if nseg > 1 else 0


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` as the current CUDA device (Triton launches there); nothing to do for CPU tensors."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _launch(kernel, grid: tuple, device: torch.device, *args, **kwargs) -> None:
    """Every launch: under the tensors' device (module docstring), without fused multiply-adds."""
    with _on(device):
        kernel[grid](*args, **kwargs, **_LAUNCH)


def worker_compress(g, m, b, e, b_hat, beta, eps, seed, segments: Segments, state_out):
    n = g.numel()
    out = torch.empty(n // 8, dtype=torch.uint8, device=g.device)
    m_o, b_o, e_o = state_out[:3]
    _launch(
        _worker_kernel,
        (triton.cdiv(n, BLOCK),),
        g.device,
        g,
        m,
        b,
        e,
        b if b_hat is None else b_hat,
        m_o,
        b_o,
        e_o,
        b_o if b_hat is None else state_out[3],
        out,
        n,
        beta,
        1 - beta,
        eps,
        *seed_halves(seed),
        *_segment_args(segments, g.device),
        HAS_B_HAT=b_hat is not None,
        BLOCK=BLOCK,
    )
    return out


def server_compress(received, e_bar, seed, segments: Segments, e_bar_out):
    workers, nbytes = received.shape
    out = torch.empty(nbytes, dtype=torch.uint8, device=received.device)
    _launch(
        _server_kernel,
        (triton.cdiv(nbytes * 8, BLOCK),),
        received.device,
        received,
        e_bar,
        e_bar_out,
        out,
        workers,
        float(workers),
        nbytes,
        *seed_halves(seed),
        *_segment_args(segments, received.device),
        BLOCK=BLOCK,
    )
    return out


def unpack(packed, out):
    _launch(
        _unpack_kernel,
        (triton.cdiv(packed.numel() * 8, BLOCK),),
        packed.device,
        packed,
        out,
        packed.numel(),
        BLOCK=BLOCK,
    )
    return out


def tl_rand(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """``tl.rand(seed, offsets)`` itself, for checking :func:`.philox.uniform` against Triton."""
    out = torch.empty(offsets.shape, dtype=torch.float32, device=offsets.device)
    _launch(
        _rand_kernel,
        (triton.cdiv(offsets.numel(), BLOCK),),
        offsets.device,
        offsets,
        out,
        offsets.numel(),
        *seed_halves(seed),
        BLOCK=BLOCK,
    )
    return out


def self_test(device) -> None:
    """Compile and run every kernel variant on a tiny buffer on ``device`` and check ``tl.rand`` against
    :func:`.philox.uniform`; raise a one-line RuntimeError naming the cause where either fails.

    Before Triton 3.4, ``tl.rand`` with int64 offsets was Philox4x64 with a 64-bit uniform: its draws differ
    from the CPU backends' (Philox4x32-10), so the hooks' results would depend on the device."""
    from birder_repro.comm.kernels.philox import uniform

    try:
        n = BLOCK
        g = torch.linspace(-1, 1, n, device=device)
        state = [torch.zeros(n, device=device) for _ in range(8)]
        one = Segments(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        two = Segments(torch.tensor([0, n // 2]), torch.tensor([0, 1 << 40]))
        for segments in (one, two):
            m, b, e = state[:3]
            worker_compress(g, m, b, e, None, 0.9, 1e-8, 1 << 63, segments, tuple(state[3:6]))
            worker_compress(g, m, b, e, state[6], 0.9, 1e-8, 1 << 63, segments, tuple(state[3:7]))
        packed = server_compress(torch.zeros(2, n // 8, dtype=torch.uint8, device=device), state[0], 5, one, state[1])
        unpack(packed, state[2])
        offsets = torch.tensor([0, 1, (1 << 31) - 1, 1 << 31, (1 << 32) + 7, (1 << 62) + 3], device=device)
        draws = {seed: tl_rand(seed, offsets) for seed in (0, 12345, (1 << 64) - 1)}
    except Exception as exc:
        raise RuntimeError(
            f"the triton kernels backend does not run on {device} (Triton {triton.__version__}): "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''} "
            "- set optim.comm.kernel_backend=torch (the slow reference) or fix the Triton install"
        ) from exc
    for seed, got in draws.items():
        if not torch.equal(got.cpu(), uniform(seed, offsets.cpu())):
            raise RuntimeError(
                f"Triton {triton.__version__}'s tl.rand does not draw Philox4x32-10 as the CPU "
                "backends do (Triton before 3.4 drew Philox4x64): use Triton >= 3.4, or set "
                "optim.comm.kernel_backend=torch"
            )


def threads() -> str:
    return "gpu"
