"""1-bit Adam's compressed all-reduce of one padded bucket (1-bit Adam paper, Algorithm 1, lines 7-11; 1-bit
LAMB paper, Algorithm 1, line 1): the arithmetic and the collectives of Steps II-VI, with one scale per
bucket. :mod:`birder_repro.comm.onebit` holds the hook around it (the warmup, Step I, the state);
:mod:`birder_repro.comm.onebit_scales` the same exchange with a scale per tensor.

For a bucket of P elements padded to P' (a multiple of 8 N, N processes) and the local momentum m_i:

    Step II   worker compression (lines 7-8): c = (m_i + e_worker) * mask; s_i = ||c|| / sqrt(#mask);
              bits = c > 0; e_worker = (c - s_i sign(c)) * mask; one scale for the whole bucket;
    Step III  all-to-all of the packed bits (chunk k to process k) and all-gather of the N worker scales;
    Step IV   server k (lines 10-11) on chunk k: c = (mean_i s_i sign_i + e_server) * mask; its own scale
              s_k = ||c|| / sqrt(#mask) over the chunk; bits; e_server = (c - s_k sign(c)) * mask;
    Step V    all-gather of the packed chunks and of the N server scales;
    Step VI   unpack: the bucket's averaged momentum s_k sign * mask.

The mask is the paper's Sign(0) = 0, which one bit cannot say, put back where the zeros are known (the hook's
module doc says which). Scales are norms over the unmasked elements only, so that
C[x] = ||x|| / ||Sign(x)|| Sign(x) (1-bit LAMB paper, Algorithm 1, line 1) holds with Sign(0) = 0. Bits: LSB
first, bit 1 = +1 (:mod:`birder_repro.comm.pack`); a masked element's bit is 0 and means nothing.

Bytes per process per bucket: 2 (N-1)/N * P'/8 for the bits plus 2 (N-1) * 4 for the scales, each peer's
share counted intra- or inter-node by whether the peer is on this process's node (the compressed all-reduce
itself is flat over all processes, as in the paper's comparison).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import count_peer_bytes
from birder_repro.comm.collectives import all_gather_flat, wait_all
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, group_or_world

__all__ = ["SCALE_BYTES", "Exchange", "masked_scale", "compress_", "decompress", "compressed_allreduce"]

SCALE_BYTES = 4  # one fp32 scale per worker (per bucket) and per server chunk


# ------------------------------------------------------------------------------------------- the formulas
def masked_scale(c: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """||c|| / sqrt(#mask) for a ``c`` already zero outside ``mask``: the scale of C[x] with Sign(0) = 0.

    A tensor (no host synchronisation); 0 where the mask is empty.
    """
    count = torch.count_nonzero(mask).clamp_(min=1).to(c.dtype)
    return torch.linalg.vector_norm(c) / count.sqrt()


def compress_(x: torch.Tensor, error: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Error-compensated 1-bit compression (Algorithm 1, lines 7-8 and 10-11), in place on ``error``.

    c = (x + error) * mask; scale = ||c|| / sqrt(#mask); error = (c - scale * sign(c)) * mask, where
    sign(c) = +1 for c > 0 and -1 otherwise. Returns the packed bits of c > 0 and the scale (a 1-element tensor).
    ``mask`` may be bool or 0/1 floats; floats are several times faster here (no conversion per product).
    """
    c = torch.add(x, error, out=error).mul_(mask)  # c lives in the error's buffer until it becomes the error
    scale = masked_scale(c, mask)
    bits = c > 0
    c.sub_(torch.where(bits, scale, -scale)).mul_(mask)
    return pack_bits(bits), scale.reshape(1)


def decompress(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(k, B) packed rows with one scale each -> (k, 8B) values scale_r * (+-1)."""
    return unpack_signs(packed).mul_(scales.reshape(-1, 1))


class Exchange(NamedTuple):
    """What one compressed all-reduce produced on this process (the tests compare every field)."""

    result: torch.Tensor  # (P',) the averaged momentum, zero where masked
    worker_bits: torch.Tensor  # (P'/8,) this process's packed signs
    worker_scales: torch.Tensor  # (N,) every worker's scale
    server_bits: torch.Tensor  # (N, P'/(8N)) every server's packed chunk
    server_scales: torch.Tensor  # (N,) every server's scale


def compressed_allreduce(
    x: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    mask: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    stats: CommState | None = None,
    topology: Topology | None = None,
    nonfinite: torch.Tensor | None = None,
) -> Exchange:
    """Steps II-VI of the module doc on one padded buffer: the error-compensated 1-bit average over ``group``.

    ``x``, ``worker_error``, ``mask``: (P',) with P' a multiple of 8 N; ``server_error``: (P'/N,), the chunk
    this process serves (its rank in ``group``). Updates both errors in place. With ``stats`` the seconds are
    timed into it and, with ``topology`` as well, the bytes sent to each peer are counted intra- or inter-node.
    ``nonfinite`` (> 0: this process's gradient held a NaN or Inf) makes this worker's scale NaN, so that the
    scales every process gathers anyway carry the flag (:mod:`birder_repro.comm.nonfinite`): no extra message.
    """
    group = group_or_world(group)
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if x.numel() % (8 * n):
        raise ValueError(f"compressed_allreduce needs a multiple of 8 x {n} elements, got {x.numel()}: pad first")
    chunk = x.numel() // n
    device = x.device

    def timing(what: str):
        return stats.timing(what, device) if stats is not None else contextlib.nullcontext()

    # Step II: worker compression over the whole buffer: one scale per worker.
    with timing("compress"):
        worker_bits, worker_scale = compress_(x, worker_error, mask)
        if nonfinite is not None:
            worker_scale = torch.where(nonfinite > 0, torch.full_like(worker_scale, float("nan")), worker_scale)

    # Step III: chunk k of every worker's bits to process k; every worker's scale to everyone.
    received = torch.empty_like(worker_bits)
    worker_scales = torch.empty(n, device=x.device, dtype=worker_scale.dtype)
    with timing("comm"):
        works = [
            dist.all_to_all_single(received, worker_bits, group=group, async_op=True),
            all_gather_flat(worker_scales, worker_scale, group=group, async_op=True),
        ]
        wait_all(works)
    count_peer_bytes(stats, topology, group, chunk // 8 + SCALE_BYTES)

    # Step IV: the server's average of its chunk, error-compensated and compressed again with its own scale.
    chunk_mask = mask[me * chunk : (me + 1) * chunk]
    with timing("compress"):
        mean = decompress(received.view(n, chunk // 8), worker_scales).mean(dim=0)
        server_chunk_bits, server_scale = compress_(mean, server_error, chunk_mask)

    # Step V: every server's chunk and scale to everyone.
    server_bits = torch.empty(n, chunk // 8, device=x.device, dtype=torch.uint8)
    server_scales = torch.empty(n, device=x.device, dtype=server_scale.dtype)
    with timing("comm"):
        works = [
            all_gather_flat(server_bits.view(-1), server_chunk_bits, group=group, async_op=True),
            all_gather_flat(server_scales, server_scale, group=group, async_op=True),
        ]
        wait_all(works)
    count_peer_bytes(stats, topology, group, chunk // 8 + SCALE_BYTES)

    # Step VI: unpack every chunk with its server's scale.
    with timing("compress"):
        result = decompress(server_bits, server_scales).view(-1).mul_(mask)
    return Exchange(result, worker_bits, worker_scales, server_bits, server_scales)
