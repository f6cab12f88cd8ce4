"""Streaming DiLoCo's communication (:class:`birder_repro.optim.streaming_diloco.StreamingDiLoCo`): every step
inside the node (DiLoCo's hook, :mod:`birder_repro.comm.diloco`), and one fragment's outer gradient across the
nodes every H/P steps, started asynchronously so that it overlaps the next tau inner steps.

Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping communication: towards a distributed free
lunch", 2025, Algorithm 1). On n nodes of m processes (the node's processes hold the same
fragment, as in DiLoCo), :meth:`StreamingState.start_average` cuts the fragment's flat outer gradient into m
shards and each process sends its shard to its peers of the same local rank on the other nodes:

    quantize=none   an fp32 all-reduce (sum) of the shard, ``async_op=True``: 2 (n-1)/n 4P/m bytes;
    quantize=fp8    the shard in fp8 e4m3 (``torch.float8_e4m3fn``) scaled by the fragment's amax / 448, and
                    that fp32 scale: an all-gather of (P/m + 4) bytes from each node, (n-1)(P/m + 4) bytes;
    quantize=int4   4-bit uniform, round to nearest on the 15 levels -7..7 of the fragment's amax / 7, two to a
                    byte, with the scale: (n-1)(ceil(P/(2m)) + 4) bytes.

(A sum of quantized values is no longer quantized: gloo and NCCL cannot add fp8 or 4-bit numbers, so the
quantized payloads are all-gathered and each process dequantizes and adds them in fp32, in node order, the same
on every rank; the paper quantizes the outer gradients it exchanges to 4 bits.) The scale is the
fragment's, the same on every process of a node. ``wait()`` (tau inner steps later) completes it: the sum over
the nodes divided by n, and the node's processes all-gather their shards in fp32 (m-1)/m 4P bytes inside the
node. Without ``torch.float8_e4m3fn`` fp8 falls back to int4 (said once). With one node nothing is sent or
quantized. Bytes are counted when each collective is issued.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from birder_repro.comm.accounting import all_gather_bytes, allreduce_bytes
from birder_repro.comm.buckets import require_buckets
from birder_repro.comm.collectives import all_gather_flat
from birder_repro.comm.diloco import DiLoCoState, diloco_hook
from birder_repro.comm.topology import Topology, announce_layout, resolve_topology

__all__ = [
    "QUANTIZE",
    "StreamingState",
    "PendingAverage",
    "attach_streaming",
    "attach_from_config",
    "encode",
    "decode",
    "payload_bytes",
    "resolve_quantize",
]

QUANTIZE = ("none", "fp8", "int4")  # optim.quantize
FP8_MAX = 448.0  # the largest finite float8 e4m3fn
INT4_LEVELS = 7  # the 15 levels -7..7
SCALE_BYTES = 4


def resolve_quantize(quantize: str) -> str:
    """``quantize`` as it will run: fp8 becomes int4 where this torch has no float8_e4m3fn."""
    if quantize not in QUANTIZE:
        raise ValueError(f"optim.quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        print("[birder_repro.comm] optim.quantize=fp8: this torch has no float8_e4m3fn; using int4", flush=True)
        return "int4"
    return quantize


def fragment_scale(fragment: torch.Tensor, quantize: str) -> torch.Tensor:
    """The fragment's scale: its amax over the largest code (448 for fp8 e4m3, 7 for int4); 1 for a zero one."""
    amax = fragment.abs().max() if fragment.numel() else torch.zeros(())
    top = FP8_MAX if quantize == "fp8" else float(INT4_LEVELS)
    return torch.where(amax > 0, amax / top, torch.ones_like(amax)).float()


def payload_bytes(numel: int, quantize: str) -> int:
    """Bytes of a quantized shard of ``numel`` elements with its scale (fp32 for none: no scale)."""
    if quantize == "none":
        return 4 * numel
    return SCALE_BYTES + (numel if quantize == "fp8" else -(-numel // 2))


def encode(x: torch.Tensor, scale: torch.Tensor, quantize: str) -> torch.Tensor:
    """``x`` / ``scale`` in fp8 e4m3 or int4 (round to nearest, two codes a byte, the even element low), after
    the scale's 4 bytes: a flat uint8 payload of :func:`payload_bytes`."""
    head = scale.reshape(1).float().view(torch.uint8)
    y = x.float() / scale
    if quantize == "fp8":
        body = y.to(torch.float8_e4m3fn).view(torch.uint8)
    elif quantize == "int4":
        codes = torch.round(y).clamp_(-INT4_LEVELS, INT4_LEVELS).to(torch.int16).add_(8)  # 1..15
        if codes.numel() % 2:
            codes = torch.cat([codes, codes.new_full((1,), 8)])
        pairs = codes.view(-1, 2)
        body = (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)
    else:
        raise ValueError(f"encode: no payload for quantize={quantize!r}")
    return torch.cat([head, body])


def decode(payload: torch.Tensor, numel: int, quantize: str) -> torch.Tensor:
    """The fp32 values of an :func:`encode` payload."""
    scale = payload[:SCALE_BYTES].clone().view(torch.float32)
    body = payload[SCALE_BYTES:]
    if quantize == "fp8":
        values = body.clone().view(torch.float8_e4m3fn).float()
    else:
        codes = torch.stack([body & 0xF, body >> 4], dim=1).reshape(-1)[:numel]
        values = codes.to(torch.float32) - 8
    return values[:numel] * scale


class PendingAverage:
    """One fragment's average over the nodes, in flight; :meth:`wait` completes it (once) and returns it."""

    __slots__ = ("_state", "_tensors", "_work", "_buffer", "_shard", "_result")

    def __init__(self, state: StreamingState | None, tensors: list[torch.Tensor], work=None, buffer=None, shard=0):
        self._state, self._tensors, self._work, self._buffer, self._shard = state, tensors, work, buffer, shard
        self._result: list[torch.Tensor] | None = None if state is not None else tensors

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            assert self._state is not None
            self._result = self._state._complete(self)
        return self._result


class StreamingState(DiLoCoState):
    """DiLoCo's hook state (the node's fp32 average every step) that also starts and completes the fragments'
    averages over the nodes; ``outer_steps`` counts the fragment syncs started."""

    __slots__ = ("quantize",)

    def __init__(self, topology: Topology, quantize: str = "none"):
        super().__init__(topology)
        self.quantize = resolve_quantize(quantize)

    def start_average(self, tensors: list[torch.Tensor]) -> PendingAverage:
        """Start averaging ``tensors`` (a fragment's outer gradient, the same on the node's processes) over the
        nodes; the returned handle's ``wait()`` gives the averages (new tensors). Collective over the nodes."""
        topo = self.topology
        m, n = topo.gpus_per_node, topo.nodes
        self.outer_steps += 1
        if n == 1 or not tensors:
            return PendingAverage(None, [t.clone() for t in tensors])
        device = tensors[0].device
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        shard = -(-flat.numel() // m)
        padded = torch.zeros(shard * m, device=device)
        padded[: flat.numel()] = flat
        piece = padded[topo.local_rank * shard : (topo.local_rank + 1) * shard].clone()
        started = time.perf_counter()
        work: Any
        if self.quantize == "none":
            work = dist.all_reduce(piece, group=topo.inter_group, async_op=True)
            self.add_bytes(0.0, allreduce_bytes(piece.numel() * 4, n))
            buffer = piece
        else:
            payload = encode(piece, fragment_scale(flat, self.quantize), self.quantize)
            buffer = torch.empty(n * payload.numel(), dtype=torch.uint8, device=device)
            work = all_gather_flat(buffer, payload, group=topo.inter_group, async_op=True)
            self.add_bytes(0.0, all_gather_bytes(payload.numel(), n))
        self.add_seconds("comm", time.perf_counter() - started)
        return PendingAverage(self, tensors, work, buffer, shard)

    def _complete(self, pending: PendingAverage) -> list[torch.Tensor]:
        topo = self.topology
        m, n, shard = topo.gpus_per_node, topo.nodes, pending._shard
        device = pending._tensors[0].device
        with self.timing("comm", device):
            pending._work.wait()
        if self.quantize == "none":
            piece = pending._buffer.div_(n)
        else:
            rows = pending._buffer.view(n, -1)
            with self.timing("compress", device):
                piece = decode(rows[0], shard, self.quantize)
                for k in range(1, n):  # node order, the same on every rank
                    piece = piece + decode(rows[k], shard, self.quantize)
                piece = piece.div_(n)
        if topo.intra_group is not None:
            full = torch.empty(shard * m, device=device)
            with self.timing("comm", device):
                all_gather_flat(full, piece, group=topo.intra_group)
            self.add_bytes(all_gather_bytes(piece.numel() * 4, m), 0.0)
        else:
            full = piece
        out, offset = [], 0
        for t in pending._tensors:
            out.append(full[offset : offset + t.numel()].view_as(t).to(t.dtype).clone())
            offset += t.numel()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "scheme": "diloco_streaming", "quantize": self.quantize}


def attach_streaming(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    optimizer,
    gpus_per_node: int | None = None,
    topology: Topology | None = None,
) -> StreamingState:
    """Make ``ddp_model`` average inside the node only (DiLoCo's hook) and have ``optimizer`` (a
    :class:`~birder_repro.optim.streaming_diloco.StreamingDiLoCo`) sync its fragments over the nodes at its
    ``quantize``. Collective: call it on every rank."""
    # at call time: optim.streaming_diloco imports this module
    from birder_repro.optim.streaming_diloco import StreamingDiLoCo

    require_buckets(ddp_model, "attach_streaming")
    if not isinstance(optimizer, StreamingDiLoCo):
        raise TypeError(f"attach_streaming needs a StreamingDiLoCo optimizer, got {type(optimizer).__name__}")
    topology, source, guessed = resolve_topology(gpus_per_node, topology)
    what = f"H={optimizer.local_steps}, P={optimizer.num_fragments}, tau={optimizer.overlap_steps}"
    announce_layout(f"attach_streaming ({what})", topology, source, between_nodes=True, guessed=guessed)
    state = StreamingState(topology, optimizer.quantize)
    ddp_model.register_comm_hook(state, diloco_hook)
    optimizer.hook_state = state
    return state


def attach_from_config(
    ddp_model, optimizer, cfg: Mapping[str, Any], topology: Topology, scheme: str = "diloco_streaming"
):
    """The runner's entry (birder_repro.comm.attach_comm): the layout is the run's topology."""
    if scheme != "diloco_streaming":
        raise ValueError(f"birder_repro.comm.streaming handles scheme 'diloco_streaming', not {scheme!r}")
    return attach_streaming(ddp_model, optimizer, topology=topology)
