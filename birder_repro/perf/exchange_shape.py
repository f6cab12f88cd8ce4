"""How a pairwise exchange across nodes (all-to-all, all-gather: the 1-bit exchanges') grows with the node count:
found from measurements, not assumed.

The compressed exchanges of 1-bit Adam / 1-bit LAMB (a world all-to-all and all-gather, 1-bit Adam paper,
section 6) and of Birder (an all-to-all and all-gather among the nodes, every local rank's group at once; Birder
paper, section 4) are not all-reduces: their time need not follow the all-reduce's rate nor its shape (the Birder
paper, appendix E: "the communication time for 1-bit Adam experiences a sudden surge" from 32 to 64 GPUs, while
the all-reduce's grows gently). A probe times them at two node counts or more, and the shape their growth fits
best carries them to other node counts.

A collective over a group of p processes, q of them on each node, c such groups running at once on every node
(``world``: p = N = n m, q = m, c = 1; ``inter``: p = n, q = 1, c = m), with an S-byte vector (Thakur,
Rabenseifner and Gropp's sizes, perf.schemes: each process's input for all-to-all, the gathered output for
all-gather), prices as

    T(S, n) = alpha * steps(n) + S * g(n) / B

    shape          steps(n)                         g(n): multiples of S through the bottleneck
    pairwise       p - 1: a step per peer           c q (p - q) / p: a node's processes' off-node bytes through
                                                    its link (NCCL's and MPI's pairwise exchange; Thakur et al.,
                                                    section 4.5)
    ring           p - 1                            c (p - 1) / p: one hop a step leaves each node (a ring
                                                    all-gather, Thakur et al., section 4.2)
    shared_fabric  N (p - q): every cross-node      N (p - q) / p: every cross-node byte of every group
                   message of every group           through one shared capacity B
                   through one shared fabric

The shared fabric is what an oversubscribed switch, or many TCP flows converging on one port (incast), does to
an exchange: its cost follows the whole network's cross-node messages and bytes, which the Birder paper counts
for these exchanges (section 4: "the communication volume across nodes for all GPUs"), and it grows about as N^2
where the pairwise exchange grows as N. B is then the fabric's capacity, not a node's link.

:func:`rank_exchange_shapes` fits each shape (least squares on the times, alpha >= 0; a single vector size
measured leaves alpha at 0 and the rate carrying the whole time) to samples of a method's exchange (several
collectives summed, each priced by the same alpha and B) and orders them by the sum of squared log errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .shape import least_squares_two

__all__ = [
    "EXCHANGE_SHAPES",
    "EXCHANGE_GROUPS",
    "ExchangeSample",
    "ExchangeFit",
    "exchange_steps",
    "exchange_multiple",
    "fit_exchange",
    "rank_exchange_shapes",
    "exchange_fits",
]

EXCHANGE_SHAPES = ("pairwise", "ring", "shared_fabric")  # the order breaks an exact tie
EXCHANGE_GROUPS = ("world", "inter")


def _layout(group: str, nodes: int, gpus_per_node: int) -> tuple[int, int, int]:
    """(p, q, c) of the module doc for ``group``."""
    if group == "world":
        return nodes * gpus_per_node, gpus_per_node, 1
    if group == "inter":
        return nodes, 1, gpus_per_node
    raise ValueError(f"an exchange across nodes runs over 'world' or 'inter', not {group!r}")


def _check(shape: str) -> None:
    if shape not in EXCHANGE_SHAPES:
        raise ValueError(f"unknown exchange shape {shape!r}; known: {', '.join(EXCHANGE_SHAPES)}")


def exchange_steps(shape: str, group: str, nodes: int, gpus_per_node: int) -> int:
    """steps(n) of the module doc; 0 on one node."""
    _check(shape)
    p, q, _ = _layout(group, nodes, gpus_per_node)
    if nodes <= 1:
        return 0
    world = nodes * gpus_per_node
    return {"pairwise": p - 1, "ring": p - 1, "shared_fabric": world * (p - q)}[shape]


def exchange_multiple(shape: str, group: str, nodes: int, gpus_per_node: int) -> float:
    """g(n) of the module doc; 0 on one node."""
    _check(shape)
    p, q, c = _layout(group, nodes, gpus_per_node)
    if nodes <= 1:
        return 0.0
    world = nodes * gpus_per_node
    return {"pairwise": c * q * (p - q) / p, "ring": c * (p - 1) / p, "shared_fabric": world * (p - q) / p}[shape]


@dataclass(frozen=True)
class ExchangeSample:
    """A measured exchange: ``ops`` ((group, nbytes) of each collective it issues across nodes) on ``nodes``
    nodes of ``gpus_per_node`` processes took ``seconds`` in all."""

    nodes: int
    gpus_per_node: int
    ops: tuple[tuple[str, float], ...]
    seconds: float


@dataclass(frozen=True)
class ExchangeFit:
    """A shape with its fitted latency a step and rate; ``residual``: the sum of squared log errors."""

    shape: str
    alpha_s: float
    bytes_per_s: float
    residual: float = 0.0
    points: int = 0

    def seconds(self, group: str, nbytes: float, nodes: int, gpus_per_node: int) -> float:
        """One collective of ``nbytes`` over ``group`` on ``nodes`` x ``gpus_per_node``."""
        if nodes <= 1:
            return 0.0
        return (
            self.alpha_s * exchange_steps(self.shape, group, nodes, gpus_per_node)
            + nbytes * exchange_multiple(self.shape, group, nodes, gpus_per_node) / self.bytes_per_s
        )

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "alpha_us": self.alpha_s * 1e6, "bytes_per_s": self.bytes_per_s}

    @classmethod
    def from_value(cls, value: Any, key: str = "exchange_shape") -> ExchangeFit:
        """A mapping (shape, alpha_us, bytes_per_s) or an ExchangeFit; a clear error otherwise."""
        if isinstance(value, ExchangeFit):
            return value
        if not isinstance(value, Mapping) or not {"shape", "bytes_per_s"} <= set(value):
            raise ValueError(f"cluster.perf.{key}={value!r}: give shape, alpha_us and bytes_per_s")
        fit = cls(str(value["shape"]), float(value.get("alpha_us", 0.0)) * 1e-6, float(value["bytes_per_s"]))
        _check(fit.shape)
        if not (fit.bytes_per_s > 0 and fit.alpha_s >= 0):
            raise ValueError(f"cluster.perf.{key}={dict(value)}: bytes_per_s must be > 0 and alpha_us >= 0")
        return fit


def _features(shape: str, s: ExchangeSample) -> tuple[float, float]:
    """(latency steps, bytes through the bottleneck) of sample ``s`` under ``shape``: the sum over its ops."""
    a = sum(exchange_steps(shape, g, s.nodes, s.gpus_per_node) for g, _ in s.ops)
    b = sum(nbytes * exchange_multiple(shape, g, s.nodes, s.gpus_per_node) for g, nbytes in s.ops)
    return float(a), float(b)


def fit_exchange(shape: str, samples: Sequence[ExchangeSample]) -> ExchangeFit:
    """``shape``'s alpha and rate that fit ``samples`` (least squares on the times, both >= 0), with the sum of
    squared log errors; an infinite residual where nothing positive fits. With one vector size measured (the same
    collectives in every sample) alpha is 0 and the rate carries the whole time, as perf.shape.fit_shape does:
    two node counts would fit any shape's two numbers exactly, and only the growth of the bytes' term can tell
    the shapes apart. Needs samples at two node counts or more."""
    _check(shape)
    pts = [s for s in samples if s.nodes > 1]
    if len({s.nodes for s in pts}) < 2:
        raise ValueError(
            "an exchange's shape needs measured times at two node counts or more (a probe at 2 and 4 nodes); "
            f"got node counts {sorted({s.nodes for s in samples})}"
        )
    for s in pts:
        if not (s.seconds > 0 and s.ops):
            raise ValueError(f"a measured exchange needs collectives and seconds > 0, got {s}")
    rows = [(*_features(shape, s), s.seconds) for s in pts]
    if len({tuple(sorted(nbytes for _, nbytes in s.ops)) for s in pts}) > 1:
        alpha, beta = _nonnegative_least_squares(rows)
    else:  # one size: two node counts fit any shape's alpha and rate exactly; the growth decides on the rate alone
        alpha, beta = 0.0, max(0.0, sum(b * y for _, b, y in rows) / sum(b * b for _, b, _ in rows))
    if not beta > 0 and not alpha > 0:
        return ExchangeFit(shape, 0.0, math.inf, math.inf, len(pts))
    residual = sum((math.log(alpha * a + beta * b) - math.log(y)) ** 2 for a, b, y in rows)
    return ExchangeFit(shape, alpha, 1.0 / beta if beta > 0 else math.inf, residual, len(pts))


def _nonnegative_least_squares(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(alpha, beta) >= 0 minimising sum (alpha a + beta b - y)^2 over ``rows`` of (a, b, y): the unconstrained
    solution where both are >= 0 (and determined), else the better of alpha alone and beta alone."""
    solved = least_squares_two(rows, min_det=1e-9)
    if solved is not None and solved[0] >= 0 and solved[1] >= 0:
        return solved
    saa, sbb = sum(a * a for a, _, _ in rows), sum(b * b for _, b, _ in rows)
    say, sby = sum(a * y for a, _, y in rows), sum(b * y for _, b, y in rows)
    candidates = [(0.0, max(0.0, sby / sbb) if sbb else 0.0), (max(0.0, say / saa) if saa else 0.0, 0.0)]
    return min(candidates, key=lambda ab: sum((ab[0] * a + ab[1] * b - y) ** 2 for a, b, y in rows))


def rank_exchange_shapes(
    samples: Sequence[ExchangeSample], shapes: Sequence[str] = EXCHANGE_SHAPES
) -> list[ExchangeFit]:
    """Every shape's fit (:func:`fit_exchange`), the best (smallest residual) first; a tie keeps ``shapes``'
    order. The first is the shape found; an error where none leaves a positive rate."""
    fits = sorted((fit_exchange(shape, samples) for shape in shapes), key=lambda f: f.residual)
    if not math.isfinite(fits[0].residual):
        raise ValueError(f"no exchange shape fits the measured times {list(samples)}")
    return fits


def exchange_fits(value: Any) -> tuple[tuple[str, ExchangeFit], ...] | None:
    """``perf.exchange_shape`` ({group: (shape, alpha_us, bytes_per_s)}) as sorted (group, ExchangeFit) pairs,
    hashable; None where not given."""
    if value is None:
        return None
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for group, fit in items:
        if group not in EXCHANGE_GROUPS:
            raise ValueError(f"cluster.perf.exchange_shape: group {group!r} is not one of {list(EXCHANGE_GROUPS)}")
        out.append((str(group), ExchangeFit.from_value(fit, f"exchange_shape.{group}")))
    return tuple(sorted(out))
