"""The ``cpu`` backend: Birder's compression in one pass over memory, with numba on the process's cores.

Each kernel walks the buffer in blocks of ``BLOCK`` elements spread over numba's threads (``prange``); a block
is done in three cache-resident loops so that each one vectorises (AVX2 / AVX-512 where present):

    1. the Philox uniforms of the block (the costliest part: 10 rounds of two 32x32->64-bit products);
    2. the element-wise arithmetic, in the same float32 operations and order as the torch reference
       (``fastmath=False``: no reassociation, no fused multiply-add), writing one 0/1 byte per element;
    3. packing: eight 0/1 bytes read as one little-endian uint64, times a constant that gathers bit 8i to
       bit 56+i (see :mod:`birder_repro.comm.pack`), top byte kept.

Philox tricks that keep the numbers identical to ``tl.rand``: the round keys are computed once per call (they
do not depend on the element); the counter words c2 = c3 = 0 at the start, so the first round needs one
product instead of two; only the first output word is used, so the last round needs one product too; and
every word is kept visibly 32-bit (uint32 keys, masks) so that LLVM uses the 32x32->64-bit vector multiply
(vpmuludq) instead of the full 64-bit one (vpmullq): 1.4 instead of 1.7 ns per element on one core of this
project's AMD EPYC (AVX-512). Philox is then about a third of the compression time on one core; the rest is
the memory traffic of the state (28 bytes per element for the worker, 8 for the server). Drawing one Philox
block for four elements (``randint4x``) would be 4x cheaper but would no longer equal ``tl.rand``.

Compiled on first use and cached on disk (``cache=True``); later processes load the machine code. The first
call of a process whose cache is cold says so in one line (:mod:`.compile_note`).
"""

from __future__ import annotations

import os

import numba
import numpy as np
import torch
from numba import njit, prange

from birder_repro.comm.kernels import compile_note, process_cores, thread_budget
from birder_repro.comm.kernels.philox import ROUND_A, ROUND_B, UNIFORM_SCALE, Segments, round_keys

BLOCK = 8192  # elements per task: the block's scratch (uniforms, bits) stays in L1/L2
_GATHER = np.uint64(sum(1 << (56 - 7 * i) for i in range(8)))
_U32 = np.uint64(0xFFFFFFFF)
_SH32 = np.uint64(32)
_A = np.uint64(ROUND_A)
_B = np.uint64(ROUND_B)
_SCALE = np.float32(UNIFORM_SCALE)
_SIGN = np.uint64(1 << 31)
_JIT = dict(cache=True, fastmath=False, nogil=True)
_BIT_TABLE = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.int32)  # row b: the 8 bits of byte b
_SIGN_TABLE = _BIT_TABLE.astype(np.float32) * 2 - 1  # row b: the 8 signs of byte b


@njit(**_JIT)
def _uniforms(out, base, lo, hi, keys):
    """out[j - lo] = tl.rand(seed, base + j) for j in [lo, hi); keys: (10, 2) uint32 round keys.

    Every word is kept visibly below 2^32 (uint32 keys, masks): LLVM then multiplies with vpmuludq.
    """
    for j in range(lo, hi):
        pos = np.uint64(base + j)
        c1 = (pos >> _SH32) & _U32
        # Round 1 with c2 = c3 = 0: hi(B*0) = lo(B*0) = 0.
        p0 = (pos & _U32) * _A
        c0 = c1 ^ keys[0, 0]
        c2 = (p0 >> _SH32) ^ keys[0, 1]
        c1 = np.uint64(0)
        c3 = p0 & _U32
        for r in range(1, 9):
            p0 = c0 * _A
            p2 = c2 * _B
            c0 = (p2 >> _SH32) ^ c1 ^ keys[r, 0]
            c2 = (p0 >> _SH32) ^ c3 ^ keys[r, 1]
            c1 = p2 & _U32
            c3 = p0 & _U32
        word = ((c2 * _B) >> _SH32) ^ c1 ^ keys[9, 0]  # round 10: only the first word is used
        if word >= _SIGN:
            word = word ^ _U32
        out[j - lo] = np.float32(np.int32(word)) * _SCALE


@njit(**_JIT)
def _block_uniforms(out, lo, hi, starts, deltas, keys):
    """Uniforms of buffer elements [lo, hi), segment by segment (position = j + deltas[s] in segment s)."""
    s = np.searchsorted(starts, lo, side="right") - 1
    j = lo
    while j < hi:
        stop = hi if s + 1 >= starts.size else min(hi, starts[s + 1])
        _uniforms(out[j - lo :], deltas[s], j, stop, keys)
        j = stop
        s += 1


@njit(**_JIT)
def _pack(bits, out, out_lo):
    """Eight 0/1 bytes -> one byte, LSB first (the multiply gathers bit 8i to bit 56 + i)."""
    words = bits.view(np.uint64)
    for q in range(words.size):
        out[out_lo + q] = np.uint8((words[q] * _GATHER) >> np.uint64(56))


@njit(parallel=True, **_JIT)
def _worker(g, m, b, e, b_hat, m_o, b_o, e_o, b_hat_o, use_b_hat, beta, one_minus_beta, eps, starts, deltas, keys, out):
    """Reads the state from m, b, e (b_hat), writes the new one to m_o, b_o, e_o (b_hat_o): the same arrays
    for an update in place."""
    n = g.size
    one, half = np.float32(1.0), np.float32(0.5)
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        hi = min(n, lo + BLOCK)
        rand = np.empty(BLOCK, np.float32)
        bits = np.empty(BLOCK, np.uint8)
        _block_uniforms(rand, lo, hi, starts, deltas, keys)
        for j in range(lo, hi):
            gj = g[j]
            mj = m[j] * beta + gj * one_minus_beta  # m.mul_(beta).add_(g * (1 - beta))
            m_o[j] = mj
            ema_term = abs(gj) * one_minus_beta
            if use_b_hat:
                bh = b_hat[j] * beta + ema_term
                b_hat_o[j] = bh
                bo = b[j]
                bj = bo if (bo != bo or bo >= bh) else bh  # torch.maximum, NaN included
            else:
                bj = b[j] * beta + ema_term
            b_o[j] = bj
            x = mj / (bj + eps) + e[j]
            up = rand[j - lo] < (x + one) * half
            bits[j - lo] = up
            e_o[j] = x - (one if up else -one)
        _pack(bits[: hi - lo], out, lo // 8)


@njit(parallel=True, **_JIT)
def _server(received, e_bar, e_bar_o, starts, deltas, keys, bit_table, out):
    workers, nbytes = received.shape
    n = nbytes * 8
    one, half = np.float32(1.0), np.float32(0.5)
    fw = np.float32(workers)
    for blk in prange((n + BLOCK - 1) // BLOCK):
        lo = blk * BLOCK
        hi = min(n, lo + BLOCK)
        rand = np.empty(BLOCK, np.float32)
        count = np.zeros(BLOCK, np.int32)
        bits = np.empty(BLOCK, np.uint8)
        _block_uniforms(rand, lo, hi, starts, deltas, keys)
        for w in range(workers):
            for q in range(lo // 8, hi // 8):
                row = bit_table[received[w, q]]
                for i in range(8):
                    count[q * 8 + i - lo] += row[i]
        for j in range(lo, hi):
            # the sum of the workers' +-1 is exact in float32; torch's mean divides it by the count
            mean = np.float32(2 * count[j - lo] - workers) / fw
            x = mean + e_bar[j]
            up = rand[j - lo] < (x + one) * half
            bits[j - lo] = up
            e_bar_o[j] = x - (one if up else -one)
        _pack(bits[: hi - lo], out, lo // 8)


@njit(parallel=True, **_JIT)
def _unpack(packed, out, table):
    """Each byte copies its row of the (256, 8) table of +-1: one 32-byte load and store, no bit work."""
    for q in prange(packed.size):
        row = table[packed[q]]
        for i in range(8):
            out[q * 8 + i] = row[i]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def threads() -> int:
    """The threads the kernels use: the process's thread budget, OMP_NUM_THREADS where it is set (torchrun's
    one per process, the launchers' share of the cores), else torch's; at most the cores the process may run on
    (its CPU affinity: an emulated node pinned to its cores) and numba's pool.

    The environment is read because the hook calls the kernels from its communication thread, where
    ``torch.get_num_threads()`` does not report the main thread's budget (measured: 2 in a 1-process run with
    OMP_NUM_THREADS=1 on 2 cores), and a profile measured with more threads than the layout it predicts for
    priced compression at half its cost."""
    wanted = thread_budget(os.environ) or torch.get_num_threads()
    return max(1, min(wanted, process_cores(), numba.config.NUMBA_NUM_THREADS))


def _use_threads(kernel) -> None:
    compile_note.announce((kernel,))  # before its first call compiles it, where numba's cache lacks it
    if numba.get_num_threads() != threads():
        numba.set_num_threads(threads())


def _tables(segments: Segments, seed: int):
    keys = np.array(round_keys(seed), dtype=np.uint32)
    return segments.starts.numpy(), segments.deltas.numpy(), keys


def worker_compress(g, m, b, e, b_hat, beta, eps, seed, segments, state_out):
    _use_threads(_worker)
    out = torch.empty(g.numel() // 8, dtype=torch.uint8)
    starts, deltas, keys = _tables(segments, seed)
    empty = np.empty(0, np.float32)
    bh = _np(b_hat) if b_hat is not None else empty
    bh_o = _np(state_out[3]) if b_hat is not None else empty
    _worker(
        _np(g),
        _np(m),
        _np(b),
        _np(e),
        bh,
        *(_np(t) for t in state_out[:3]),
        bh_o,
        b_hat is not None,
        np.float32(beta),
        np.float32(1 - beta),
        np.float32(eps),
        starts,
        deltas,
        keys,
        _np(out),
    )
    return out


def server_compress(received, e_bar, seed, segments, e_bar_out):
    _use_threads(_server)
    out = torch.empty(received.shape[1], dtype=torch.uint8)
    starts, deltas, keys = _tables(segments, seed)
    _server(_np(received), _np(e_bar), _np(e_bar_out), starts, deltas, keys, _BIT_TABLE, _np(out))
    return out


def unpack(packed, out):
    _use_threads(_unpack)
    _unpack(_np(packed), _np(out), _SIGN_TABLE)
    return out
