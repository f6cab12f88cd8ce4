"""The ``torch`` backend: the reference, built from the optimizer's own functions and counter-based uniforms.

It runs :func:`birder_repro.optim.birder.worker_step_` and ``server_step_`` unchanged, fed with the Philox
uniforms of :mod:`.philox`, on slices of ``CHUNK`` elements (in-place ops on views update the whole state;
slicing keeps the int64 temporaries of the Philox arithmetic in cache). The other backends must match it bit for
bit.
"""

from __future__ import annotations

import torch

from birder_repro.comm.kernels.philox import Segments, uniform
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.optim.birder import server_step_, worker_step_

CHUNK = {"cpu": 1 << 16, "cuda": 1 << 24}  # on CPU the Philox temporaries stay in cache: ~15x faster than 2M


def _chunks(n: int, device: torch.device):
    step = CHUNK.get(device.type, CHUNK["cpu"])
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def _into(outs, ins) -> tuple:
    """The new state is computed in place on ``outs``: start them from the old state (unless they are it)."""
    for o, i in zip(outs, ins):
        if o is not i:
            o.copy_(i)
    return outs


def worker_compress(g, m, b, e, b_hat, beta, eps, seed, segments: Segments, state_out):
    m, b, e, *rest = _into(state_out, (m, b, e) + ((b_hat,) if b_hat is not None else ()))
    b_hat = rest[0] if rest else None
    out = torch.empty(g.numel() // 8, dtype=torch.uint8, device=g.device)
    for lo, hi in _chunks(g.numel(), g.device):
        rand = uniform(seed, segments.positions(lo, hi, g.device))
        bits = worker_step_(
            g[lo:hi], m[lo:hi], b[lo:hi], e[lo:hi], rand, beta, eps, b_hat=None if b_hat is None else b_hat[lo:hi]
        )
        out[lo // 8 : hi // 8] = pack_bits(bits)
    return out


def server_mean(received: torch.Tensor) -> torch.Tensor:
    """The mean of the workers' +-1 (Algorithm 1, line 11): their exact float32 sum divided by their count."""
    return unpack_signs(received).sum(dim=0).div_(received.shape[0])


def server_compress(received, e_bar, seed, segments: Segments, e_bar_out):
    (e_bar,) = _into((e_bar_out,), (e_bar,))
    out = torch.empty(received.shape[1], dtype=torch.uint8, device=received.device)
    for lo, hi in _chunks(e_bar.numel(), e_bar.device):
        mean = server_mean(received[:, lo // 8 : hi // 8])
        rand = uniform(seed, segments.positions(lo, hi, e_bar.device))
        out[lo // 8 : hi // 8] = pack_bits(server_step_(mean, e_bar[lo:hi], rand))
    return out


def unpack(packed, out):
    for lo, hi in _chunks(out.numel(), out.device):
        out[lo:hi] = unpack_signs(packed[lo // 8 : hi // 8])
    return out


def threads() -> int:
    return torch.get_num_threads()
