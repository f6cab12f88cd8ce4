"""Latency-bandwidth (alpha-beta) costs of the collectives the communication schemes issue.

Every formula is from Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH" (IJHPCA 2005), section 2's cost model: sending a message of n bytes between two processes takes
alpha + n * beta, alpha the latency per message and beta the time per byte (1 / bandwidth). p processes,
n bytes as each formula says. NCCL-tests' "bus bandwidth" uses the same factors ((p-1)/p, 2(p-1)/p).

A :class:`Link` is one level of the cluster: intra-node (NVLink, PCIe or loopback) or inter-node (the NIC).
A collective whose group lies inside one node pays the intra-node link; one whose group spans nodes pays the
slowest level it crosses (every step of a ring or pairwise exchange waits for its slowest hop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Link",
    "ring_allreduce",
    "ring_allreduce_with_waits",
    "ring_reduce_scatter",
    "ring_all_gather",
    "pairwise_all_to_all",
    "broadcast",
    "collective_time",
    "KINDS",
    "BROADCAST_SHORT_BYTES",
]

# MPICH's switch from the binomial-tree broadcast to scatter + all-gather (Thakur et al. 2005, section 4.1).
BROADCAST_SHORT_BYTES = 12 * 1024


@dataclass(frozen=True)
class Link:
    """One level of the interconnect: ``alpha_s`` seconds per message, ``bandwidth_Bps`` usable bytes/s.

    ``bandwidth_Bps`` is the line rate times the transport's efficiency (the fraction of the line rate a
    transport such as NCCL over TCP reaches); ``beta`` is its inverse.
    """

    alpha_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if self.alpha_s < 0:
            raise ValueError(f"Link latency must be >= 0 s, got {self.alpha_s}")
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"Link bandwidth must be > 0 bytes/s, got {self.bandwidth_Bps}")

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth_Bps

    def shared(self, ways: int) -> Link:
        """The same link split among ``ways`` concurrent transfers (the m processes of a node on one NIC)."""
        return Link(self.alpha_s, self.bandwidth_Bps / max(ways, 1))


def ring_allreduce(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce of an ``nbytes`` vector: 2(p-1) alpha + 2(p-1)/p n beta (Thakur et al., section 4.4)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.alpha_s + 2 * (p - 1) / p * nbytes * link.beta


def ring_allreduce_with_waits(nbytes: float, p: int, link: Link, wait_s: float) -> float:
    """Ring all-reduce whose every step lasts at least ``wait_s``: 2(p-1) max(wait, alpha + n/p beta). A step's
    wait for a process's turn on a shared core overlaps its own latency and bytes: a small vector's ring is its
    waits, a large one's its latency and bytes (:func:`ring_allreduce`)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * max(wait_s, link.alpha_s + nbytes / p * link.beta)


def ring_reduce_scatter(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of an ``nbytes`` input: (p-1) alpha + (p-1)/p n beta (section 4.3, long messages)."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.alpha_s + (p - 1) / p * nbytes * link.beta


def ring_all_gather(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather of an ``nbytes`` output (p contributions of n/p): (p-1) alpha + (p-1)/p n beta (4.2)."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.alpha_s + (p - 1) / p * nbytes * link.beta


def pairwise_all_to_all(nbytes: float, p: int, link: Link) -> float:
    """Pairwise-exchange all-to-all of an ``nbytes`` input per process (p blocks of n/p):
    (p-1) alpha + (p-1)/p n beta (section 4.5, long messages)."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.alpha_s + (p - 1) / p * nbytes * link.beta


def broadcast(nbytes: float, p: int, link: Link) -> float:
    """MPICH's broadcast (section 4.1): binomial tree, ceil(log2 p)(alpha + n beta), below 12 KiB; above,
    van de Geijn's scatter + ring all-gather, (log2 p + p - 1) alpha + 2(p-1)/p n beta."""
    if p <= 1:
        return 0.0
    steps = math.ceil(math.log2(p))
    if nbytes < BROADCAST_SHORT_BYTES:
        return steps * (link.alpha_s + nbytes * link.beta)
    return (steps + p - 1) * link.alpha_s + 2 * (p - 1) / p * nbytes * link.beta


KINDS = {
    "allreduce": ring_allreduce,
    "reduce_scatter": ring_reduce_scatter,
    "all_gather": ring_all_gather,
    "all_to_all": pairwise_all_to_all,
    "broadcast": broadcast,
}


def collective_time(kind: str, nbytes: float, p: int, link: Link) -> float:
    """The cost of collective ``kind`` (a name of :data:`KINDS`) on one link level."""
    try:
        fn = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}") from None
    return fn(nbytes, p, link)
