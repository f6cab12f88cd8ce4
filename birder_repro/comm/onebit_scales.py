"""1-bit Adam's compressed all-reduce with a scale per tensor (``optim.comm.scale=tensor``), as DeepSpeed's
OnebitAdam compresses: each tensor with its own worker scale, and each server chunk of a tensor with its own
server scale (its ``runtime/fp16/onebit/adam.py`` calls the compressed all-reduce of ``runtime/comm/nccl.py``
once per tensor). :mod:`birder_repro.comm.onebit` holds the hook,
:mod:`birder_repro.comm.onebit_exchange` the exchange with one scale per bucket; this module only the
arithmetic and the collectives of one bucket with a scale per tensor.

The bucket keeps DDP's layout (its elements in bucket order, padded at the end to a multiple of 8 N) and its
chunking: server k serves elements [k C, (k+1) C) of the padded bucket, C = P'/N, so the per-element errors and
their checkpoints (:class:`~birder_repro.comm.buckets.BucketStore`) are those of the bucket scale. What changes
is only where a scale's norm stops:

    worker   one segment per tensor of the bucket (a gap or the padding joins the tensor before it: masked,
             it adds nothing to the norm nor to the count): T scales per worker;
    server   the tensors' segments cut at the chunk's edges: server k has S_k segments, each with its own scale
             (DeepSpeed's per-chunk server scales; there a chunk is a tensor's, here the bucket's: with one
             tensor per bucket the two agree, docs/optimizers.md "1-bit Adam next to DeepSpeed's").

Each scale is ||c|| / sqrt(#mask) over its segment (Sign(0) = 0 where the mask is 0, as the bucket scale).
Bytes per process per bucket: 2 (N-1)/N * P'/8 for the bits plus (N-1) 4 T for the worker scales and (N-1) 4 S
for the server scales, S = max_k S_k (every server sends S scales: an all-gather needs equal parts; the unused
ones are zeros that nothing reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import count_peer_bytes
from birder_repro.comm.collectives import all_gather_flat, wait_all
from birder_repro.comm.onebit_exchange import SCALE_BYTES
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.comm.state import CommState
from birder_repro.comm.topology import Topology, group_or_world

__all__ = [
    "SCALES",
    "TensorLayout",
    "tensor_layout",
    "scale_counts",
    "compress_segments_",
    "compressed_allreduce_per_tensor",
]

SCALES = ("bucket", "tensor")  # optim.comm.scale


# ------------------------------------------------------------------------------------------------ layout
@dataclass(frozen=True)
class TensorLayout:
    """Where the scales of one bucket stop, on the process that serves chunk ``me`` (fixed for a bucket).

    ``worker``: (start, end, unmasked count) of each tensor's segment of the padded bucket; ``server``: the
    same for this server's chunk, relative to the chunk; ``server_tensor``: the tensor each of those pieces
    belongs to; ``chunks``: every server's pieces (start, end), relative to its chunk.
    """

    worker: tuple[tuple[int, int, int], ...]
    server: tuple[tuple[int, int, int], ...]
    server_tensor: tuple[int, ...]
    chunks: tuple[tuple[tuple[int, int], ...], ...]
    per_server: int  # S: server scales each server sends
    _tables: dict = field(default_factory=dict, compare=False, repr=False)  # device -> index tensors

    @property
    def tensors(self) -> int:
        return len(self.worker)

    def tables(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The layout as tensors on ``device`` for the vectorised path (made once per bucket and device)."""
        if device not in self._tables:

            def ints(values):
                return torch.tensor(values, dtype=torch.int64, device=device)

            every = [[b - a for a, b in c] + [0] * (self.per_server - len(c)) for c in self.chunks]
            self._tables[device] = {
                "worker_lengths": ints([b - a for a, b, _ in self.worker]),
                "worker_counts": torch.tensor([max(n, 1) for *_, n in self.worker], device=device).float(),
                "server_lengths": ints([b - a for a, b, _ in self.server]),
                "server_counts": torch.tensor([max(n, 1) for *_, n in self.server], device=device).float(),
                "server_tensor": ints(list(self.server_tensor)),
                "all_lengths": ints([x for row in every for x in row]),
            }
        return self._tables[device]


def _cut(starts: Sequence[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Segments [a, b) of range [lo, hi), cut at ``starts`` (the segments' first elements; starts[0] == 0),
    as (a - lo, b - lo, index of the segment a lies in)."""
    out = []
    for j, a in enumerate(starts):
        b = starts[j + 1] if j + 1 < len(starts) else None
        a2, b2 = max(a, lo), hi if b is None else min(b, hi)
        if a2 < b2:
            out.append((a2 - lo, b2 - lo, j))
    return out


def tensor_layout(signature: Sequence[tuple], padded: int, mask: torch.Tensor, world: int, me: int) -> TensorLayout:
    """The segments of a bucket with DDP signature ((parameter, offset, numel), ...) padded to ``padded``."""
    offsets = sorted(offset for _, offset, numel, *_ in signature if numel > 0) or [0]
    starts = [0] + offsets[1:]  # a gap before the first tensor joins it; the padding joins the last
    counts = [int(c) for c in _segment_counts(mask, starts, padded)]
    worker = tuple((a, b, counts[j]) for a, b, j in _cut(starts, 0, padded))
    chunk = padded // world
    cuts = [_cut(starts, k * chunk, (k + 1) * chunk) for k in range(world)]
    per_server = max(len(c) for c in cuts)
    mine = cuts[me]
    chunk_mask = mask[me * chunk : (me + 1) * chunk]
    server = tuple((a, b, int(torch.count_nonzero(chunk_mask[a:b]))) for a, b, _ in mine)
    chunks = tuple(tuple((a, b) for a, b, _ in c) for c in cuts)
    return TensorLayout(worker, server, tuple(j for _, _, j in mine), chunks, per_server)


def scale_counts(numels: Sequence[int], world: int) -> tuple[int, int]:
    """(T, S): the worker scales and the server scales each process sends for a bucket of tensors of
    ``numels`` elements (in bucket order, padded to a multiple of 8 ``world``): the byte count's inputs."""
    starts = [sum(numels[:j]) for j in range(len(numels))] or [0]
    padded = -(-max(sum(numels), 1) // (8 * world)) * 8 * world
    chunk = padded // world
    return len(starts), max(len(_cut(starts, k * chunk, (k + 1) * chunk)) for k in range(world))


def _segment_counts(mask: torch.Tensor, starts: Sequence[int], padded: int) -> list[int]:
    ends = list(starts[1:]) + [padded]
    return [int(torch.count_nonzero(mask[a:b])) for a, b in zip(starts, ends)]


# ------------------------------------------------------------------------------------------- the formulas
def compress_segments_(
    x: torch.Tensor,
    error: torch.Tensor,
    mask: torch.Tensor,
    segments: Sequence[tuple[int, int, int]],
    tables: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Error-compensated 1-bit compression with a scale per segment (a, b, unmasked count), in place on
    ``error``: c = (x + error) * mask; s_j = ||c[a:b]|| / sqrt(count_j); error = (c - s_j sign(c)) * mask,
    sign(c) = +1 for c > 0, -1 otherwise. Returns the packed bits of c > 0 and the (S,) scales.

    Two paths, the same values to float rounding: a loop over the segments' views (2 S small operations, no
    extra pass: the CPU's), or with ``tables`` (the segments' lengths and counts as tensors) a fixed number of
    kernels whatever S, one of them an extra pass that spreads the scales over the elements (a GPU's, where
    each operation costs a kernel launch)."""
    c = torch.add(x, error, out=error).mul_(mask)  # c lives in the error's buffer until it becomes the error
    bits = c > 0
    if tables is not None:
        lengths, counts = tables
        # unsafe=True: the lengths are the layout's own (non-negative, summing to the bucket); the check it skips
        # reads them back to the host, a sync per call on CUDA
        scales = torch.segment_reduce(c * c, "sum", lengths=lengths, unsafe=True).div_(counts).sqrt_()
        spread = scales.repeat_interleave(lengths, output_size=c.numel())
        c.sub_(torch.where(bits, spread, spread.neg())).mul_(mask)
        return pack_bits(bits), scales
    scales = torch.stack([torch.linalg.vector_norm(c[a:b]) / max(n, 1) ** 0.5 for a, b, n in segments])
    for (a, b, _), s in zip(segments, scales):
        c[a:b].sub_(torch.where(bits[a:b], s, -s))
    c.mul_(mask)
    return pack_bits(bits), scales


class TensorExchange(NamedTuple):
    """What one per-tensor compressed all-reduce produced on this process (the tests compare every field)."""

    result: torch.Tensor  # (P',) the averaged momentum, zero where masked
    worker_bits: torch.Tensor  # (P'/8,) this process's packed signs
    worker_scales: torch.Tensor  # (N, T) every worker's scale of every tensor
    server_bits: torch.Tensor  # (N, P'/(8N)) every server's packed chunk
    server_scales: torch.Tensor  # (N, S) every server's scale of every piece of its chunk (zeros past S_k)


def compressed_allreduce_per_tensor(
    x: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    mask: torch.Tensor,
    layout: TensorLayout,
    group: dist.ProcessGroup | None = None,
    stats: CommState | None = None,
    topology: Topology | None = None,
    nonfinite: torch.Tensor | None = None,
    vectorised: bool | None = None,
) -> TensorExchange:
    """The compressed all-reduce of :func:`birder_repro.comm.onebit_exchange.compressed_allreduce` with the scales of
    ``layout`` (module doc); the same arguments, the same steps, the same errors updated in place.
    ``vectorised``: a fixed number of kernels per step (:func:`compress_segments_`); None: on CUDA only."""
    group = group_or_world(group)
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if x.numel() % (8 * n):
        raise ValueError(f"compressed_allreduce needs a multiple of 8 x {n} elements, got {x.numel()}: pad first")
    chunk, device = x.numel() // n, x.device
    t = layout.tables(device) if (x.is_cuda if vectorised is None else vectorised) else None

    def timing(what: str):
        return stats.timing(what, device) if stats is not None else contextlib.nullcontext()

    with timing("compress"):  # Step II: each tensor of the bucket with its own worker scale
        worker_bits, worker_scale = compress_segments_(
            x, worker_error, mask, layout.worker, (t["worker_lengths"], t["worker_counts"]) if t is not None else None
        )
        if nonfinite is not None:
            worker_scale = torch.where(nonfinite > 0, torch.full_like(worker_scale, float("nan")), worker_scale)
    received = torch.empty_like(worker_bits)
    worker_scales = torch.empty(n * layout.tensors, device=device, dtype=worker_scale.dtype)
    with timing("comm"):  # Step III
        works = [
            dist.all_to_all_single(received, worker_bits, group=group, async_op=True),
            all_gather_flat(worker_scales, worker_scale, group=group, async_op=True),
        ]
        wait_all(works)
    count_peer_bytes(stats, topology, group, chunk // 8 + SCALE_BYTES * layout.tensors)
    worker_scales = worker_scales.view(n, layout.tensors)

    with timing("compress"):  # Step IV: every worker's scale of the tensor each piece belongs to
        signs = unpack_signs(received.view(n, chunk // 8))
        if t is not None:
            signs.mul_(
                worker_scales[:, t["server_tensor"]].repeat_interleave(t["server_lengths"], dim=1, output_size=chunk)
            )
        else:
            for (a, b, _), j in zip(layout.server, layout.server_tensor):
                signs[:, a:b].mul_(worker_scales[:, j : j + 1])
        mean = signs.mean(dim=0)
        server_chunk_bits, server_scale = compress_segments_(
            mean,
            server_error,
            mask[me * chunk : (me + 1) * chunk],
            layout.server,
            (t["server_lengths"], t["server_counts"]) if t is not None else None,
        )
        sent_scales = torch.zeros(layout.per_server, device=device, dtype=server_scale.dtype)
        sent_scales[: server_scale.numel()] = server_scale
    server_bits = torch.empty(n, chunk // 8, device=device, dtype=torch.uint8)
    server_scales = torch.empty(n * layout.per_server, device=device, dtype=server_scale.dtype)
    with timing("comm"):  # Step V
        works = [
            all_gather_flat(server_bits.view(-1), server_chunk_bits, group=group, async_op=True),
            all_gather_flat(server_scales, sent_scales, group=group, async_op=True),
        ]
        wait_all(works)
    count_peer_bytes(stats, topology, group, chunk // 8 + SCALE_BYTES * layout.per_server)

    with timing("compress"):  # Step VI: every piece of every chunk with its server's scale
        server_scales = server_scales.view(n, layout.per_server)
        signs = unpack_signs(server_bits)
        if t is not None:
            signs.view(-1).mul_(server_scales.view(-1).repeat_interleave(t["all_lengths"], output_size=x.numel()))
        else:
            for k, pieces in enumerate(layout.chunks):
                for (a, b), s in zip(pieces, server_scales[k]):
                    signs[k, a:b].mul_(s)
        result = signs.view(-1).mul_(mask)
    return TensorExchange(result, worker_bits, worker_scales, server_bits, server_scales)
