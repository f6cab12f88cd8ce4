"""How an all-reduce across nodes grows with the node count: found from measurements, not assumed.

A library's all-reduce over n nodes of m processes (N = n m) runs in one of a few shapes; each prices a vector
of S bytes as

    T(S, n) = [T_node(S)] + alpha * steps(n) + S * g(n) / B

with B the rate of one node's link (bytes/s), alpha a network step's latency, T_node the node's own all-reduce
(the 1-node measurement) where the shape runs it as a phase of its own, and

    shape       steps(n)          g(n) (the vector's multiples through a node's link)    T_node
    flat_ring   2 (N - 1)         2 (N - 1) / N: one ring over every process, one hop     no (its intra-node hops
                                  a step leaves each node                                 are inside the ring)
    two_level   2 (n - 1)         2 (n - 1) / n: reduce-scatter in the node, a ring       yes
                                  across nodes of each process's 1/m, all-gather
    tree        2 ceil(log2 n)    1: a (double) binary tree across nodes, the vector      yes
                                  up once and down once whatever n

The ring costs are Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH" (IJHPCA 2005), section 4.4; the two-level one is the hierarchical all-reduce of the same paper's
reduce-scatter + all-gather decomposition with the inter-node stage in the middle; the tree's constant
bandwidth term and logarithmic latency are NCCL's double binary trees (Sanders, Speck and Traeff, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 2009, section 3).

:func:`detect_shape` fits each shape to measured times at two node counts or more (a probe at 2 and 4 nodes)
and keeps the one whose growth fits best: a flat ring's time barely grows from 2 to 4 nodes of m processes
((4m-1)/(4m) over (2m-1)/(2m): x1.07 at m = 4), a two-level one's grows x1.5 in its network term, a tree's
only in its latency. What a shape cannot separate from one vector size (the latency from the rate) is not
guessed: with a single size measured, alpha is 0 and the rate carries the whole network term.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "SHAPES",
    "Measured",
    "ShapeFit",
    "latency_steps",
    "link_multiple",
    "runs_node_phase",
    "fit_shape",
    "detect_shape",
    "interpolate_size",
    "rank_shapes",
]

SHAPES = ("two_level", "flat_ring", "tree")  # the order breaks an exact tie


@dataclass(frozen=True)
class Measured:
    """One measured all-reduce: ``nodes`` nodes, a vector of ``nbytes`` bytes, ``seconds`` (the slowest rank's)."""

    nodes: int
    nbytes: float
    seconds: float


def _check(shape: str) -> None:
    if shape not in SHAPES:
        raise ValueError(f"unknown all-reduce shape {shape!r}; known: {', '.join(SHAPES)}")


def latency_steps(shape: str, nodes: int, gpus_per_node: int) -> int:
    """The network steps of ``shape`` on ``nodes`` x ``gpus_per_node`` (module doc); 0 on one node."""
    _check(shape)
    n, world = nodes, nodes * gpus_per_node
    if n <= 1:
        return 0
    return {"flat_ring": 2 * (world - 1), "two_level": 2 * (n - 1), "tree": 2 * math.ceil(math.log2(n))}[shape]


def link_multiple(shape: str, nodes: int, gpus_per_node: int) -> float:
    """g(n): how many times the vector passes through one node's link (module doc); 0 on one node."""
    _check(shape)
    n, world = nodes, nodes * gpus_per_node
    if n <= 1:
        return 0.0
    return {"flat_ring": 2 * (world - 1) / world, "two_level": 2 * (n - 1) / n, "tree": 1.0}[shape]


def runs_node_phase(shape: str) -> bool:
    """Whether ``shape`` runs the node's own all-reduce as a phase of its own (two-level, tree)."""
    _check(shape)
    return shape != "flat_ring"


NodeTime = Callable[[float], float]  # the 1-node all-reduce of a vector of S bytes, seconds


def _no_node(_: float) -> float:
    return 0.0


@dataclass(frozen=True)
class ShapeFit:
    """A shape with its fitted latency and rate; ``residual``: the sum of squared log errors on its points."""

    shape: str
    alpha_s: float
    bytes_per_s: float
    residual: float = 0.0
    points: int = 0

    def seconds(self, nbytes: float, nodes: int, gpus_per_node: int, node_s: float = 0.0) -> float:
        """The all-reduce of ``nbytes`` on ``nodes`` x ``gpus_per_node``; ``node_s``: the 1-node all-reduce of
        the same vector (added where the shape runs it as a phase)."""
        if nodes <= 1:
            return node_s
        network = (
            self.alpha_s * latency_steps(self.shape, nodes, gpus_per_node)
            + nbytes * link_multiple(self.shape, nodes, gpus_per_node) / self.bytes_per_s
        )
        return network + (node_s if runs_node_phase(self.shape) else 0.0)

    def to_dict(self) -> dict[str, float | str | int]:
        return {
            "shape": self.shape,
            "alpha_us": self.alpha_s * 1e6,
            "bytes_per_s": self.bytes_per_s,
            "residual": self.residual,
            "points": self.points,
        }


def _usable(points: Sequence[Measured]) -> list[Measured]:
    multi = [p for p in points if p.nodes > 1]
    if len({p.nodes for p in multi}) < 2:
        raise ValueError(
            "the all-reduce's shape needs measured times at two node counts or more (a probe at 2 and 4 nodes); "
            f"got node counts {sorted({p.nodes for p in points})}"
        )
    for p in multi:
        if not (p.seconds > 0 and p.nbytes > 0):
            raise ValueError(f"a measured all-reduce needs bytes > 0 and seconds > 0, got {p}")
    return multi


def least_squares_two(rows: Sequence[tuple[float, float, float]], min_det: float = 0.0) -> tuple[float, float] | None:
    """(alpha, beta) minimising sum (alpha a + beta b - y)^2 over ``rows`` of (a, b, y), unconstrained (the normal
    equations); None where they do not determine both (det <= ``min_det`` x saa x sbb)."""
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    say = sum(a * y for a, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    det = saa * sbb - sab * sab
    if not det > min_det * saa * sbb:
        return None
    return (say * sbb - sab * sby) / det, (saa * sby - sab * say) / det


def fit_shape(
    shape: str, points: Sequence[Measured], gpus_per_node: int, node_time: NodeTime | None = None
) -> ShapeFit:
    """``shape``'s alpha and rate that fit ``points`` (least squares on the network term, alpha >= 0; alpha 0
    where a single vector size was measured), with the sum of squared log errors of its times. A shape that
    leaves no positive network term (the 1-node phase alone above the measured times) gets an infinite residual.
    """
    _check(shape)
    node = node_time or _no_node
    pts = _usable(points)
    m = gpus_per_node
    rows = []
    for p in pts:
        y = p.seconds - (node(p.nbytes) if runs_node_phase(shape) else 0.0)
        rows.append((latency_steps(shape, p.nodes, m), p.nbytes * link_multiple(shape, p.nodes, m), y))
    alpha, beta = 0.0, None
    if len({p.nbytes for p in pts}) > 1:
        solved = least_squares_two(rows)
        if solved is not None and solved[0] >= 0:
            alpha, beta = solved
    if beta is None:
        beta = sum(b * y for _, b, y in rows) / sum(b * b for _, b, _ in rows)
    if not beta > 0:
        return ShapeFit(shape, 0.0, math.inf, math.inf, len(pts))
    fit = ShapeFit(shape, alpha, 1.0 / beta, 0.0, len(pts))
    residual = 0.0
    for p in pts:
        predicted = fit.seconds(p.nbytes, p.nodes, m, node(p.nbytes))
        residual += math.log(predicted / p.seconds) ** 2 if predicted > 0 else math.inf
    return ShapeFit(shape, alpha, 1.0 / beta, residual, len(pts))


def rank_shapes(
    points: Sequence[Measured],
    gpus_per_node: int,
    node_time: NodeTime | None = None,
    shapes: Sequence[str] = SHAPES,
) -> list[ShapeFit]:
    """Every shape's fit (:func:`fit_shape`), the best (smallest residual) first; a tie keeps ``shapes``' order.
    How far the runner-up's residual is from the best's says how clearly the growth decided."""
    fits = [fit_shape(shape, points, gpus_per_node, node_time) for shape in shapes]
    return sorted(fits, key=lambda f: f.residual)  # sorted is stable: a tie keeps the order of shapes


def detect_shape(
    points: Sequence[Measured],
    gpus_per_node: int,
    node_time: NodeTime | None = None,
    shapes: Sequence[str] = SHAPES,
) -> ShapeFit:
    """The shape of :data:`SHAPES` whose fit (:func:`fit_shape`) leaves the smallest residual on ``points``:
    how the measured all-reduce grows with the node count decides it. Needs two node counts at least."""
    fits = rank_shapes(points, gpus_per_node, node_time, shapes)
    best = fits[0]
    if not math.isfinite(best.residual):
        raise ValueError(f"no shape fits the measured all-reduce times {list(points)}: each leaves no network term")
    return best


def interpolate_size(points: Sequence[tuple[float, float]], nbytes: float) -> float | None:
    """The measured time of an all-reduce of ``nbytes`` from (bytes, seconds) measured at one node count: the
    mean at a measured size, linear in the bytes between two measured sizes (alpha-beta between them); None
    outside the measured sizes (no extrapolation: the shape's fit prices those)."""
    by_size: dict[float, list[float]] = {}
    for size, seconds in points:
        by_size.setdefault(float(size), []).append(float(seconds))
    sizes = sorted(by_size)
    if not sizes or not sizes[0] <= nbytes <= sizes[-1]:
        return None
    mean = {size: sum(ts) / len(ts) for size, ts in by_size.items()}
    for lo, hi in itertools.pairwise(sizes):
        if lo <= nbytes <= hi:
            return mean[lo] + (mean[hi] - mean[lo]) * (nbytes - lo) / (hi - lo)
    return mean[sizes[0]]  # one size measured, and nbytes is it
