"""Every communication scheme as the sequence of collectives it issues per DDP bucket.

The performance model counts collectives, not only bytes: each collective pays its latency steps, so a small
compressed bucket becomes latency-bound (DeepSpeed's compressed all-reduce issues four collectives per bucket;
its maintainers note that the number of communications limits speed as much as the volume).

A :class:`Collective` names the group it runs in:

    ``intra``  the m processes of one node (every node runs its own at the same time);
    ``inter``  the n processes with the same local rank, one per node; the m such groups of a node run at the
               same time and share the node's NIC;
    ``world``  all N = n m processes.

``nbytes`` follows Thakur, Rabenseifner and Gropp (2005): the vector for all-reduce and reduce-scatter, the
gathered output for all-gather, each process's input for all-to-all.

Schemes (bucket of P elements, P' padded as the hook pads it; n nodes of m processes; N = n m):

    ``fp32``        DDP's default hook: one all-reduce of 4P bytes over the world.
    ``fp16``        torch's fp16 compression hook: one all-reduce of 2P bytes over the world.
    ``two_level``   the two-level fp32 all-reduce (birder_repro.comm.two_level), P' a multiple of m: intra
                    reduce-scatter (4P'), inter all-reduce of the shard (4P'/m), intra all-gather (4P' out);
    ``two_level_bf16`` the same in bf16 (2 bytes an element).
    ``diloco``      DiLoCo (Douillard et al. 2023; birder_repro.comm.diloco): every step an intra fp32
                    all-reduce (4P); every H steps, once for the whole model, an inter all-reduce of a 1/m shard
                    of it (4P/m) and an intra all-gather (4P out): :func:`sync_collectives`.
    ``diloco_1bit`` DiLoCo, its outer average through Birder's exchange (birder_repro.comm.diloco_onebit): every
                    step as ``diloco``; every H steps, P' a multiple of 8mn, an inter all-to-all of the shard's
                    bits (P'/(8m) and a flag byte per node), an inter all-gather of the chunks (P'/(8m) out) and
                    an intra all-gather of the shards (P'/8 out). Not priced: the T fp32 scales' all-reduce
                    (a few hundred bytes) and the outer step's compression (once per H steps).
    ``diloco_streaming`` Streaming DiLoCo (Douillard et al. 2025; birder_repro.comm.streaming): every step as
                    ``diloco``; over H steps every fragment once, priced as the whole model's exchange once per
                    H steps (the P fragments' P - 1 further latencies are not charged, nor is the overlap with
                    tau inner steps credited: an upper bound on its time): fp32 as ``diloco``;
                    ``diloco_streaming_fp8`` / ``_int4`` an inter all-gather of n (P/m + 4) / n (P/(2m) + 4)
                    bytes out (the payloads and their scales) and an intra fp32 all-gather (4P out).
    ``powersgd``    torch's PowerSGD hook (Vogels et al., NeurIPS 2019, Algorithm 1): three all-reduces over
                    the world: the uncompressed tensors, P (rows x r per matrix) and Q (cols x r).
    ``onebit``      1-bit Adam / 1-bit LAMB compression stage (1-bit Adam paper, Algorithm 1; DeepSpeed's
                    compressed all-reduce), flat over all N processes, P' a multiple of 8N: all-to-all of the
                    signs (P'/8 bytes), all-gather of the N scales, all-gather of the server signs (P'/8
                    bytes out), all-gather of the N server scales. Its warmup stage is ``fp32``. With
                    ``scale='tensor'`` (``optim.comm.scale``) each worker sends T scales, one per tensor of the
                    bucket, and each server S, one per piece of a tensor in its chunk
                    (birder_repro.comm.onebit_scales.scale_counts; tensors from ``matrices``).
    ``hierarchical`` Birder's Hierarchical-1-bit-All-Reduce (Birder paper, section 4), P' a multiple of 8mn:
                    intra reduce-scatter fp32 (4P'), inter all-to-all of the shard's bits (P'/(8m)), inter
                    all-gather of the chunks (P'/(8m) out), intra all-gather of the shards (P'/8 out).
    ``flat``        Birder with every process a worker (m = 1, n = N): world all-to-all + world all-gather.
    ``allgather``   Birder's "original All-Gather": a world all-gather of every worker's P'/8 bytes.

Under ``parallel=fsdp`` (FSDP2, birder_repro.comm.fsdp) a bucket stands for an FSDP unit of P elements, P' a
multiple of 8mn (FSDP's per-parameter row padding is not modelled); every unit all-gathers its parameters
inside the node in forward and again in backward (4P' bytes out each; both are placed in the backward
timeline here, a simplification that charges the forward all-gather to the exchange) and reduce-scatters its
gradients (4P'):

    ``fsdp_hsdp``    the baselines on native HSDP: then an fp32 all-reduce of the shard across the nodes
                    (4P'/m over the inter group);
    ``fsdp_birder``  Birder in the all-reduce hook: inter all-to-all of the shard's bits (P'/(8m) and one flag
                    byte per node), inter all-gather of the chunks (P'/(8m) out), the node's flag (4 bytes)
                    all-reduced inside the node; no intra all-gather of the result (parameters stay sharded);
    ``fsdp_onebit``  1-bit Adam / LAMB in the hook: the compressed all-reduce among the n processes with the
                    same local rank on the shard (P'/m): all-to-all, scales, all-gather, scales. Its warmup
                    stage is ``fsdp_hsdp``.

:func:`counted_bytes` gives the bytes per process each collective sends as the project's hooks count them
(birder_repro.comm.accounting), split intra- and inter-node; tests check them against those functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from birder_repro.comm.accounting import (
    all_gather_bytes,
    all_to_all_bytes,
    allreduce_bytes,
    flat_allreduce_split,
    reduce_scatter_bytes,
)
from birder_repro.comm.onebit_scales import scale_counts

__all__ = [
    "Collective",
    "ELEMENT_BYTES",
    "SCHEMES",
    "FSDP_SCHEMES",
    "COMPRESSION_BACKEND",
    "bucket_collectives",
    "compressed_elements",
    "counted_bytes",
    "padded_elements",
    "scheme_for_optim",
    "powersgd_elements",
]

SCHEMES = (
    "fp32",
    "fp16",
    "two_level",
    "two_level_bf16",
    "diloco",
    "diloco_1bit",
    "diloco_streaming",
    "diloco_streaming_fp8",
    "diloco_streaming_int4",
    "powersgd",
    "onebit",
    "hierarchical",
    "flat",
    "allgather",
    "fsdp_hsdp",
    "fsdp_birder",
    "fsdp_onebit",
)
FSDP_SCHEMES = {"fp32": "fsdp_hsdp", "hierarchical": "fsdp_birder", "onebit": "fsdp_onebit"}  # DDP's -> FSDP's
GROUPS = ("intra", "inter", "world")
# Which per-element compression cost of a profile each scheme uses (Profile.compression_s_per_element).
COMPRESSION_BACKEND = {
    "fp32": None,
    "fp16": "fp16",
    "two_level": None,
    "two_level_bf16": "fp16",  # a cast to 16 bits and back, as the fp16 hook's
    "diloco": None,
    "diloco_1bit": None,  # the outer step's compression, once per H steps, is not priced
    "diloco_streaming": None,
    "diloco_streaming_fp8": None,
    "diloco_streaming_int4": None,
    "powersgd": "powersgd",
    "onebit": "onebit",
    "hierarchical": "birder",
    "flat": "birder",
    "allgather": "birder",
    "fsdp_hsdp": None,
    "fsdp_birder": "birder",
    "fsdp_onebit": "onebit",
}
SCALE_BYTES = 4  # 1-bit Adam's fp32 scale per worker and per server chunk
# The local-step methods: DiLoCo's hook every step, their outer exchange once per H steps (sync_collectives)
LOCAL_STEP_SCHEMES = ("diloco", "diloco_1bit", "diloco_streaming", "diloco_streaming_fp8", "diloco_streaming_int4")


# Bytes per element of the dtypes a reducing collective sums in (Collective.dtype).
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Collective:
    kind: str  # allreduce | reduce_scatter | all_gather | all_to_all | broadcast
    group: str  # intra | inter | world
    nbytes: float  # Thakur et al.'s n for this kind (see the module doc)
    # what an all-reduce or reduce-scatter sums in: a 16-bit sum may cost the CPU more per element than its bytes
    # say (gloo's fp16 sum is slower than its fp32 one; perf.cluster.op_time, ``perf.reduce_ns_per_element``)
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"Collective group must be one of {GROUPS}, got {self.group!r}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"Collective dtype must be one of {sorted(ELEMENT_BYTES)}, got {self.dtype!r}")

    @property
    def elements(self) -> float:
        """The elements of the vector ``nbytes`` counts."""
        return self.nbytes / ELEMENT_BYTES[self.dtype]


def _padded(numel: int, multiple: int) -> int:
    return -(-numel // multiple) * multiple


def padded_elements(scheme: str, numel: int, nodes: int, gpus_per_node: int) -> int:
    """P' as the hooks pad a bucket: every chunk at every level holds whole bytes."""
    world = nodes * gpus_per_node
    multiple = {
        "onebit": 8 * world,
        "hierarchical": 8 * world,
        "flat": 8 * world,
        "allgather": 8,
        "fsdp_birder": 8 * world,
        "fsdp_onebit": 8 * world,
        "fsdp_hsdp": gpus_per_node,
        "two_level": gpus_per_node,
        "two_level_bf16": gpus_per_node,
    }.get(scheme, 1)
    return _padded(numel, multiple)


def powersgd_elements(matrices: Sequence[Sequence[int]], rank: int) -> tuple[int, int, int]:
    """(uncompressed, P, Q) elements all-reduced for a bucket's tensors under PowerSGD at ``rank``.

    torch's hook views each tensor as (shape[0], rest) and compresses it when (rows + cols) r < rows cols / 2
    (``min_compression_rate`` 2); vectors and the rest go uncompressed.
    """
    unc = p = q = 0
    for shape in matrices:
        rows, cols = int(shape[0]), int(shape[1]) if len(shape) > 1 else 1
        if cols > 1 and (rows + cols) * rank * 2 < rows * cols:
            p, q = p + rows * rank, q + cols * rank
        else:
            unc += rows * cols
    return unc, p, q


def bucket_collectives(
    scheme: str,
    numel: int,
    nodes: int,
    gpus_per_node: int,
    *,
    matrices: Sequence[Sequence[int]] | None = None,
    rank: int = 1,
    scale: str = "bucket",
) -> list[Collective]:
    """The collectives ``scheme`` issues for one bucket of ``numel`` elements, in order. ``scale``: 1-bit
    Adam's ``optim.comm.scale`` (``tensor`` counts a scale per tensor of ``matrices``; none given: one tensor)."""
    n, m = nodes, gpus_per_node
    world = n * m
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    if world == 1:
        return []  # one process: DDP and every hook send nothing
    padded = padded_elements(scheme, numel, n, m)
    if scheme == "fp32":
        return [Collective("allreduce", "world", 4.0 * numel)]
    if scheme == "fp16":
        return [Collective("allreduce", "world", 2.0 * numel, "float16")]
    if scheme in LOCAL_STEP_SCHEMES:  # every step: the node's fp32 all-reduce; the outer exchange: sync_collectives
        return [Collective("allreduce", "intra", 4.0 * numel)] if m > 1 else []
    if scheme in ("two_level", "two_level_bf16"):
        dtype = "float32" if scheme == "two_level" else "bfloat16"
        size, shard = float(ELEMENT_BYTES[dtype]), padded / m
        ops = [Collective("reduce_scatter", "intra", size * padded, dtype)] if m > 1 else []
        ops += [Collective("allreduce", "inter", size * shard, dtype)] if n > 1 else []
        return ops + ([Collective("all_gather", "intra", size * padded, dtype)] if m > 1 else [])
    if scheme == "powersgd":
        unc, p, q = powersgd_elements(matrices if matrices is not None else _square(numel), rank)
        return [Collective("allreduce", "world", 4.0 * x) for x in (unc, p, q) if x]
    if scheme == "onebit":
        tensors, pieces = (
            (1, 1)
            if scale == "bucket" or not matrices
            else scale_counts([math.prod(int(d) for d in shape) for shape in matrices], world)
        )
        return [
            Collective("all_to_all", "world", padded / 8),
            Collective("all_gather", "world", SCALE_BYTES * world * tensors),
            Collective("all_gather", "world", padded / 8),
            Collective("all_gather", "world", SCALE_BYTES * world * pieces),
        ]
    if scheme == "hierarchical":
        ops = []
        if m > 1:
            ops.append(Collective("reduce_scatter", "intra", 4.0 * padded))
        if n > 1:
            ops += [
                Collective("all_to_all", "inter", padded / (8 * m)),
                Collective("all_gather", "inter", padded / (8 * m)),
            ]
        if m > 1:
            ops.append(Collective("all_gather", "intra", padded / 8))
        return ops
    if scheme == "flat":
        return [Collective("all_to_all", "world", padded / 8), Collective("all_gather", "world", padded / 8)]
    if scheme.startswith("fsdp_"):
        return _fsdp_collectives(scheme, padded, n, m)
    return [Collective("all_gather", "world", world * padded / 8)]  # allgather


def _fsdp_collectives(scheme: str, padded: int, n: int, m: int) -> list[Collective]:
    """One FSDP unit's collectives (module doc): FSDP's own inside the node, then the exchange across nodes."""
    ops = []
    if m > 1:
        ops += [
            Collective("all_gather", "intra", 4.0 * padded),
            Collective("all_gather", "intra", 4.0 * padded),
            Collective("reduce_scatter", "intra", 4.0 * padded),
        ]
    shard = padded / m
    if n > 1 and scheme == "fsdp_hsdp":
        ops.append(Collective("allreduce", "inter", 4.0 * shard))
    elif n > 1 and scheme == "fsdp_birder":
        ops += [Collective("all_to_all", "inter", shard / 8 + n), Collective("all_gather", "inter", shard / 8)]
    elif n > 1:  # fsdp_onebit
        ops += [
            Collective("all_to_all", "inter", shard / 8),
            Collective("all_gather", "inter", SCALE_BYTES * n),
            Collective("all_gather", "inter", shard / 8),
            Collective("all_gather", "inter", SCALE_BYTES * n),
        ]
    if m > 1 and scheme == "fsdp_birder":
        ops.append(Collective("allreduce", "intra", 4.0))
    return ops


def _square(numel: int) -> list[list[int]]:
    """No tensor shapes known: the bucket as one square matrix (PowerSGD's best case; say so where used)."""
    side = max(round(numel**0.5), 1)
    return [[side, max(numel // side, 1)]]


def counted_bytes(op: Collective, nodes: int, gpus_per_node: int) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one process sends in ``op``, as the hooks count them."""
    n, m = nodes, gpus_per_node
    world = n * m
    if op.group == "intra":
        return _group_bytes(op, m), 0.0
    if op.group == "inter":
        return 0.0, _group_bytes(op, n)
    if op.kind == "allreduce":
        return flat_allreduce_split(op.nbytes, world, m)
    # Pairwise exchanges (all-to-all, all-gather) over the world: each peer gets the same share; the m-1 peers
    # on this node are intra-node, the N-m others inter-node (the hooks' per-peer count).
    per_peer = op.nbytes / world
    return (m - 1) * per_peer, (world - m) * per_peer


def _group_bytes(op: Collective, p: int) -> float:
    if op.kind == "allreduce":
        return allreduce_bytes(op.nbytes, p)
    if op.kind == "reduce_scatter":
        return reduce_scatter_bytes(op.nbytes, p)
    if op.kind == "all_gather":
        return all_gather_bytes(op.nbytes / p, p)
    if op.kind == "all_to_all":
        return all_to_all_bytes(op.nbytes, p)
    raise ValueError(f"no byte count for collective {op.kind!r} in a group")


def compressed_elements(
    scheme: str,
    numel: int,
    nodes: int,
    gpus_per_node: int,
    rank: int = 1,
    matrices: Sequence[Sequence[int]] | None = None,
    alone: bool = False,
) -> float:
    """Elements one rank compresses or decompresses per bucket (multiplies the profile's seconds/element).

    hierarchical: Step II on the shard (P'/m) + the server's unpack of n chunks (P'/m) and re-quantization
    (P'/(mn)) + Step IV's unpack (P'); flat: the same with m = 1, n = N; allgather: quantize P' and unpack
    N P'; onebit: compress P', the server's unpack (P') and compression (P'/N), the final unpack (P'); fp16 and
    two_level_bf16: the casts to and from 16 bits (2P); fp32, two_level and diloco: nothing; powersgd: M Q,
    M^T P and P Q^T over the compressed matrices, each rows x cols x r, and error feedback on all P elements. One
    process sends nothing and counts 0, unless ``alone`` (a measured profile of one process whose hook still
    compresses: Birder's update is quantized on one worker too), which counts the same work with n = m = 1.
    """
    n, m = nodes, gpus_per_node
    world = n * m
    p = padded_elements(scheme, numel, n, m)
    if scheme in ("fp32", "two_level", *LOCAL_STEP_SCHEMES) or (world == 1 and not alone):
        return 0.0
    if scheme in ("fp16", "two_level_bf16"):
        return 2.0 * numel
    if scheme == "powersgd":
        mats = matrices if matrices is not None else _square(numel)
        compressed = sum(
            int(s[0]) * (int(s[1]) if len(s) > 1 else 1)
            for s in mats
            if len(s) > 1 and (int(s[0]) + int(s[1])) * rank * 2 < int(s[0]) * int(s[1])
        )
        return numel + 3.0 * rank * compressed
    if scheme == "onebit":
        return 3.0 * p + p / world
    if scheme in ("fsdp_birder", "fsdp_onebit"):  # compress, the server's unpack, re-compress, unpack: the shard
        return 3.0 * p / m + p / world
    if scheme == "fsdp_hsdp":
        return 0.0
    if scheme == "hierarchical":
        return 2.0 * p / m + p / world + p
    if scheme == "flat":
        return 3.0 * p + p / world
    return p + world * p  # allgather


def scheme_for_optim(
    optim_name: str, comm_scheme: str | None = None, parallel: str = "ddp", quantize: str | None = None
) -> str:
    """The communication scheme an optimizer config runs with (conf/optim/*.yaml), under ``parallel``.
    ``quantize``: Streaming DiLoCo's ``optim.quantize`` (none where not given)."""
    if parallel == "fsdp":
        ddp = scheme_for_optim(optim_name, comm_scheme)
        if ddp not in FSDP_SCHEMES:
            raise ValueError(f"parallel=fsdp: optim={optim_name} runs scheme {ddp!r}, which has no FSDP path")
        return FSDP_SCHEMES[ddp]
    if optim_name == "birder":
        return comm_scheme or "hierarchical"
    if optim_name in ("onebit_adam", "onebit_adam_precond", "onebit_lamb"):
        return "onebit"
    if optim_name.endswith("_powersgd"):
        return "powersgd"
    if optim_name.endswith("_fp16"):
        return "fp16"
    if optim_name in ("diloco", "diloco_1bit"):
        return optim_name
    if optim_name == "streaming_diloco":
        return "diloco_streaming" + ("" if quantize in (None, "none") else f"_{quantize}")
    if optim_name.endswith("_bf16_2level"):
        return "two_level_bf16"
    if optim_name.endswith("_2level"):
        return "two_level"
    return "fp32"


def sync_collectives(scheme: str, numel: int, nodes: int, gpus_per_node: int) -> list[Collective]:
    """The collectives ``scheme`` issues once per outer step for a model of ``numel`` elements (none for the
    schemes that exchange every step): DiLoCo's pseudo-gradient average over the nodes; the 1-bit DiLoCo's;
    Streaming DiLoCo's fragments, all P of them (module doc)."""
    n, m = nodes, gpus_per_node
    if scheme not in LOCAL_STEP_SCHEMES or n == 1:
        return []
    gather = [Collective("all_gather", "intra", 4.0 * _padded(numel, m))] if m > 1 else []
    if scheme == "diloco_1bit":
        padded = _padded(numel, 8 * n * m)
        ops = [
            Collective("all_to_all", "inter", padded / (8 * m) + n),
            Collective("all_gather", "inter", padded / (8 * m)),
        ]
        return ops + ([Collective("all_gather", "intra", padded / 8)] if m > 1 else [])
    shard = _padded(numel, m) / m
    if scheme == "diloco_streaming_fp8":
        return [Collective("all_gather", "inter", n * (shard + 4))] + gather
    if scheme == "diloco_streaming_int4":
        return [Collective("all_gather", "inter", n * (math.ceil(shard / 2) + 4))] + gather
    return [Collective("allreduce", "inter", 4.0 * shard)] + gather  # diloco, diloco_streaming
