"""The cluster as the performance model sees it: two link levels, and what one collective costs on them.

A :class:`ClusterSpec` comes from the ``cluster`` config group (conf/cluster/*.yaml, its ``perf`` block):
the inter-node link (``link_mbit``, ``perf.inter_latency_us``, ``perf.inter_efficiency``) and the intra-node
link (``perf.intra_mbit``, ``perf.intra_latency_us``, ``perf.intra_efficiency``). Efficiency is the fraction
of the line rate the transport reaches (NCCL over TCP sockets falls well short of 10 Gbit/s).

Costs of one collective (Thakur, Rabenseifner and Gropp 2005 formulas, birder_repro.perf.collectives):

    intra   the formula over m processes on the intra-node link;
    inter   the formula over n processes on the inter-node link, whose bandwidth the node's m concurrent
            groups share (every local rank runs the same collective at the same time);
    world   one node: as intra. Several nodes:
            - all-reduce, ``perf.world_allreduce: ring`` (gloo, the emulated cluster): one ring over the N
              processes in rank order; its 2(N-1) steps move in lockstep, each as slow as its slowest hop, and one
              hop a step leaves each node: 2(N-1) inter-node alphas + 2(N-1)/N of the vector at the slower of the
              NIC (one stream, not shared) and the intra-node link. MEASURED: SGDM's flat all-reduce on 2 x 2 put
              4.27 MB a step on each node's link, 1.5 x the 2.68 MB vector, and took as long as on 4 x 1. On an
              emulated cluster's shared cores, where ``perf.world_latency_us`` gives the all-reduce's step
              latency over every process (mode=probe's world group), each step lasts at least that: the wait for
              a process's turn on its core overlaps the step's latency and bytes (collectives.
              ring_allreduce_with_waits). A large vector's steps are their bytes, as above; a small one's (the
              PowerSGD hook's factors) are that wait. Elsewhere the measured latency replaces the alpha;
            - all-reduce, ``two_level`` (the default, NCCL; DDP's fp32 / fp16 / PowerSGD): ASSUMPTION, NCCL's
              multi-node all-reduce as the bandwidth-optimal two-level one: intra reduce-scatter, inter ring
              all-reduce of each process's 1/m (the m rings share the NIC), intra all-gather. Its NIC carries
              2(n-1)/n of the vector per node, which NCCL's tree reaches at 2 nodes (one buffer each way) and its
              flat ring exceeds (2(N-1)/N): the paper's BERT rows rule the flat ring out (Table 4, 2 nodes over
              Ethernet: 571 ms per step, while a flat ring needs 1.875 x 438 MB / 1.25 GB/s = 657 ms at the full
              line rate);
            - pairwise exchanges (all-to-all, all-gather): N-1 steps, n-1 of them paying the inter-node latency
              and N-n the intra-node one (NCCL's tuning model counts a collective's network steps so), or, where
              ``perf.world_latency_us`` gives the kind's latency measured over every process at once
              (mode=probe's world group), N-1 of those; and bandwidth bound by the busier of the node's NIC (m
              processes' off-node bytes, at the exchange efficiency) and the process's intra-node link.

A 16-bit all-reduce or reduce-scatter also pays its sums beyond its bytes (:func:`reduce_time`): the links'
bandwidths are fitted on fp32 calls, which hold fp32's sum, while gloo sums fp16 element by element through fp32
(MEASURED on loopback: half the bytes of an fp32 all-reduce, no faster). ``perf.reduce_ns_per_element`` is what
mode=probe measured it at over every process at once (birder_repro.perf.measure.measure_reduce_cost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from birder_repro.config.resources import conf_dir

from .collectives import Link, collective_time, ring_allreduce_with_waits
from .exchange_shape import ExchangeFit, exchange_fits
from .schemes import ELEMENT_BYTES, Collective, counted_bytes
from .shape import ShapeFit, interpolate_size, latency_steps

__all__ = [
    "CLUSTER_DIR",
    "ClusterSpec",
    "ROUTE_ERROR_BANDS",
    "op_time",
    "exchange_latency",
    "reduce_time",
    "group_size",
    "host_contention",
    "no_spare_core",
    "node_contention",
]

# What ``make validate-published`` (perf.published) found for each route, over every cluster's predicted rows
# (the uncalibrated route on the clusters its settings were not fitted on): median and worst |error| of the step
# time and of the all-reduce. mode=predict prints the band of the route a prediction took (ClusterSpec.route).
ROUTE_ERROR_BANDS = {
    "probed": {"step_median": 0.09, "step_worst": 0.33, "allreduce_median": 0.10, "allreduce_worst": 0.23},
    "uncalibrated": {"step_median": 0.18, "step_worst": 0.58, "allreduce_median": 0.37, "allreduce_worst": 0.92},
}
PAIRWISE = ("all_to_all", "all_gather")  # the exchanges that only move data: every send posted at once
WORLD_ALLREDUCE = ("two_level", "ring")  # how a world all-reduce across nodes runs (the module doc's "world")
MBIT = 1e6 / 8  # bytes per second in one Mbit/s
# The cluster configs specs come from: conf/cluster of the checkout, or of the installed package.
CLUSTER_DIR = (conf_dir() or Path(__file__).resolve().parents[2] / "conf") / "cluster"


@dataclass(frozen=True)
class ClusterSpec:
    """Line rates in Mbit/s per direction, latencies in microseconds, efficiencies in (0, 1]."""

    name: str
    inter_mbit: float
    inter_latency_us: float
    inter_efficiency: float
    intra_mbit: float
    intra_latency_us: float
    intra_efficiency: float = 1.0
    exchange_efficiency: float | None = None  # pairwise exchanges across nodes; None: inter_efficiency
    shared_host: bool = False  # emulated clusters: every node's processes share one machine's cores
    cores_per_node: int | None = None  # emulated clusters: the cores each node is pinned to (None: cores // nodes)
    world_allreduce: str = "two_level"  # a world all-reduce across nodes: "two_level" (NCCL) or "ring" (gloo)
    # a step's latency of a collective over every process, per kind (allreduce, all_gather, all_to_all), where
    # mode=probe measured it (its world group); None: from the inter- and intra-node latencies
    world_latency_us: Any = None  # a mapping given; kept as sorted (kind, us) pairs, so the spec stays hashable
    # per 16-bit dtype, the nanoseconds a process's sum of one element costs beyond what an fp32 sum of the same
    # bytes does, where mode=probe measured it (its reduce block); None or a dtype left out: nothing beyond the bytes
    reduce_ns_per_element: Any = None  # kept as sorted (dtype, ns) pairs, as world_latency_us
    # a step's latency of a collective between the nodes while every local rank's group runs one at once (as the
    # two-level and hierarchical schemes' inter-node steps do), per kind, where mode=probe measured it (its
    # inter_all level); None or a kind left out: inter_latency_us
    inter_all_latency_us: Any = None  # sorted (kind, us) pairs
    # MEASURED: a world all-reduce across nodes as mode=probe found it at two node counts or more (perf.shape: its
    # shape, a network step's latency and the node link's rate), used as measured in place of ``world_allreduce``
    # and the links' fitted efficiency; a mapping (shape, alpha_us, bytes_per_s) or a perf.shape.ShapeFit
    allreduce_shape: Any = None
    # MEASURED: the probe's world all-reduce times per node count, {nodes: [[bytes, seconds], ...]}: used as
    # measured at those node counts between the measured sizes (perf.shape.interpolate_size), the shape elsewhere
    allreduce_table: Any = None  # kept as sorted (nodes, ((bytes, seconds), ...)) pairs, hashable
    # MEASURED: the pairwise exchanges across nodes (all-to-all, all-gather: the 1-bit exchanges) as mode=probe
    # found them at two node counts or more, per group ("world": 1-bit Adam's; "inter": every local rank's group
    # at once, Birder's), {group: (shape, alpha_us, bytes_per_s)} (perf.exchange_shape): priced by that shape
    # and rate in place of the links' formula, never at the all-reduce's rate
    exchange_shape: Any = None  # kept as sorted (group, ExchangeFit) pairs
    # MEASURED: the world all-reduce timed in fp16 as the above (its sums included: 16-bit runs' all-reduces, bf16
    # priced the same); where given, a 16-bit all-reduce across nodes is priced by them, not by the fp32 one's
    allreduce16_shape: Any = None
    allreduce16_table: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allreduce_shape", _shape_fit(self.allreduce_shape))
        object.__setattr__(self, "allreduce_table", _table(self.allreduce_table))
        object.__setattr__(self, "exchange_shape", exchange_fits(self.exchange_shape))
        object.__setattr__(self, "allreduce16_shape", _shape_fit(self.allreduce16_shape))
        object.__setattr__(self, "allreduce16_table", _table(self.allreduce16_table))
        object.__setattr__(self, "world_latency_us", _latencies(self.world_latency_us))
        object.__setattr__(self, "inter_all_latency_us", _latencies(self.inter_all_latency_us))
        object.__setattr__(self, "reduce_ns_per_element", _reduce_costs(self.reduce_ns_per_element))
        for key in ("inter_efficiency", "intra_efficiency", "exchange_efficiency"):
            value = getattr(self, key)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"cluster.perf.{key}={value}: give a fraction of the line rate in (0, 1]")
        if self.world_allreduce not in WORLD_ALLREDUCE:
            raise ValueError(
                f"cluster.perf.world_allreduce={self.world_allreduce!r}: give one of {sorted(WORLD_ALLREDUCE)}"
            )
        for key in ("inter_mbit", "intra_mbit"):
            if not getattr(self, key) > 0:
                raise ValueError(f"cluster {key}={getattr(self, key)}: give a rate > 0 in Mbit/s")

    @property
    def inter(self) -> Link:
        return Link(self.inter_latency_us * 1e-6, self.inter_mbit * MBIT * self.inter_efficiency)

    @property
    def exchange(self) -> Link:
        """The inter-node link as pairwise exchanges (all-to-all, all-gather) see it."""
        eff = self.inter_efficiency if self.exchange_efficiency is None else self.exchange_efficiency
        return Link(self.inter_latency_us * 1e-6, self.inter_mbit * MBIT * eff)

    @property
    def intra(self) -> Link:
        return Link(self.intra_latency_us * 1e-6, self.intra_mbit * MBIT * self.intra_efficiency)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, cluster: Mapping[str, Any]) -> ClusterSpec:
        """From a ``cluster`` config (a mapping, or an omegaconf node): ``link_mbit`` and the ``perf`` block."""
        perf = cluster.get("perf") or {}
        name = cluster.get("name", "cluster")

        def need(key: str, value):
            if value is None:
                raise ValueError(
                    f"cluster {name!r} has no {key}: the performance model needs it (set cluster.{key}=...)"
                )
            return float(value)

        # The configs' rule (conf/cluster/*.yaml): the link is link_mbit; perf.inter_mbit only while it is null
        # (unshaped veths, loopback "nodes"), so that cluster.link_mbit=100 is what an emulated run predicts with.
        link = cluster.get("link_mbit")
        inter_mbit = link if link is not None else perf.get("inter_mbit")
        return cls(
            name=str(name),
            inter_mbit=need("link_mbit", inter_mbit),
            inter_latency_us=need("perf.inter_latency_us", perf.get("inter_latency_us")),
            inter_efficiency=need("perf.inter_efficiency", perf.get("inter_efficiency")),
            intra_mbit=need("perf.intra_mbit", perf.get("intra_mbit")),
            intra_latency_us=need("perf.intra_latency_us", perf.get("intra_latency_us")),
            intra_efficiency=float(perf.get("intra_efficiency", 1.0) or 1.0),
            exchange_efficiency=(
                None if perf.get("exchange_efficiency") is None else float(perf.get("exchange_efficiency"))
            ),
            shared_host=bool(perf.get("shared_host", False)),
            cores_per_node=None if cluster.get("cores_per_node") is None else int(cluster.get("cores_per_node")),
            world_allreduce=str(perf.get("world_allreduce") or "two_level"),
            world_latency_us=perf.get("world_latency_us"),  # each as __post_init__ keeps it
            reduce_ns_per_element=perf.get("reduce_ns_per_element"),
            inter_all_latency_us=perf.get("inter_all_latency_us"),
            allreduce_shape=perf.get("allreduce_shape"),
            allreduce_table=perf.get("allreduce_table"),
            exchange_shape=perf.get("exchange_shape"),
            allreduce16_shape=perf.get("allreduce16_shape"),
            allreduce16_table=perf.get("allreduce16_table"),
        )

    def measured_allreduce_s(self, nbytes: float, nodes: int) -> float | None:
        """The probe's world all-reduce of ``nbytes`` on ``nodes`` nodes where measured at that node count and
        between its measured sizes; None elsewhere."""
        points = dict(self.allreduce_table or ()).get(int(nodes))
        return None if points is None else interpolate_size(points, nbytes)

    def measured_allreduce16_s(self, op: Collective, nodes: int, gpus_per_node: int) -> float | None:
        """A 16-bit world all-reduce across nodes as the probe timed it in fp16: at a measured node count between
        its sizes, else carried by its shape; None where not measured (or not such an all-reduce)."""
        if op.kind != "allreduce" or op.group != "world" or op.dtype not in ("float16", "bfloat16") or nodes <= 1:
            return None
        points = dict(self.allreduce16_table or ()).get(int(nodes))
        got = None if points is None else interpolate_size(points, op.nbytes)
        if got is None and self.allreduce16_shape is not None:
            node_s = collective_time("allreduce", op.nbytes, gpus_per_node, self.intra)
            got = self.allreduce16_shape.seconds(op.nbytes, nodes, gpus_per_node, node_s)
        return got

    def measured_exchange(self, group: str) -> ExchangeFit | None:
        """The probe's fit of the pairwise exchanges over ``group`` (world, inter); None where not measured, and on
        an emulated cluster (shared_host), whose exchanges keep the wait model make validate-emulated validated
        (world_latency_us, perf.model.waits_overlap_wire): there the probe's shapes are recorded, not used."""
        return None if self.shared_host else dict(self.exchange_shape or ()).get(group)

    def route(self, nodes: int) -> str:
        """How a prediction on ``nodes`` nodes prices the all-reduce across nodes: ``one node`` (it does not),
        ``emulated`` (a shared-host cluster, validated by make validate-emulated), ``probed`` (measured at that
        node count, or carried there by a measured shape) or ``uncalibrated`` (the line rate times the shipped
        efficiency; perf.published prints the error band that route showed)."""
        if nodes <= 1:
            return "one node"
        if self.shared_host:
            return "emulated"
        if self.allreduce_shape is not None or int(nodes) in dict(self.allreduce_table or ()):
            return "probed"
        return "uncalibrated"

    @property
    def calibrated(self) -> bool:
        """Whether the world all-reduce across nodes is priced as measured (a probe's shape) rather than from the
        line rate times a fitted efficiency (perf.published: the error band of each route)."""
        return self.allreduce_shape is not None or self.allreduce_table is not None

    def world_alpha_s(self, kind: str) -> float | None:
        """The measured step latency of ``kind`` over every process, in seconds; None where not measured."""
        us = dict(self.world_latency_us or ()).get(kind)
        return None if us is None else float(us) * 1e-6

    def inter_alpha_s(self, kind: str, gpus_per_node: int) -> float:
        """A step's latency of ``kind`` between the nodes: with several processes a node, every local rank's group
        runs at once, at its measured ``inter_all_latency_us`` where given; else ``inter_latency_us``."""
        us = dict(self.inter_all_latency_us or ()).get(kind) if gpus_per_node > 1 else None
        return self.inter.alpha_s if us is None else float(us) * 1e-6

    def reduce_extra_s(self, dtype: str) -> float:
        """Seconds a process's sum of one ``dtype`` element costs beyond an fp32 sum of the same bytes (0 where
        not measured, and for fp32, whose sum the links' fitted bandwidth already holds)."""
        return 1e-9 * dict(self.reduce_ns_per_element or ()).get(dtype, 0.0)


def _shape_fit(value: Any) -> ShapeFit | None:
    """``perf.allreduce_shape`` as a ShapeFit (hashable); None where not given."""
    if value is None or isinstance(value, ShapeFit):
        return value
    if not isinstance(value, Mapping) or not {"shape", "bytes_per_s"} <= set(value):
        raise ValueError(f"cluster.perf.allreduce_shape={value!r}: give shape, alpha_us and bytes_per_s")
    alpha_s = float(value["alpha_s"]) if "alpha_s" in value else float(value.get("alpha_us", 0.0)) * 1e-6
    fit = ShapeFit(str(value["shape"]), alpha_s, float(value["bytes_per_s"]))
    latency_steps(fit.shape, 2, 1)  # an unknown shape is a clear error here
    if not (fit.bytes_per_s > 0 and fit.alpha_s >= 0):
        raise ValueError(f"cluster.perf.allreduce_shape={dict(value)}: bytes_per_s must be > 0 and alpha_us >= 0")
    return fit


def _table(value: Any) -> tuple[tuple[int, tuple[tuple[float, float], ...]], ...] | None:
    """``perf.allreduce_table`` as sorted (nodes, ((bytes, seconds), ...)) pairs; None where not given."""
    if value is None:
        return None
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for nodes, points in items:
        pts = tuple(sorted((float(b), float(t)) for b, t in points))
        if int(nodes) < 2 or not pts or any(b <= 0 or t <= 0 for b, t in pts):
            raise ValueError(
                f"cluster.perf.allreduce_table: node count {nodes} needs >= 2 nodes and [bytes, seconds] > 0, "
                f"got {points}"
            )
        out.append((int(nodes), pts))
    return tuple(sorted(out))


def _reduce_costs(value: Any) -> tuple[tuple[str, float], ...] | None:
    """``perf.reduce_ns_per_element`` as sorted (dtype, ns) pairs, each at least 0; None where not given."""
    pairs = _pairs(value)
    for dtype, _ in pairs or ():
        if dtype not in ELEMENT_BYTES:
            raise ValueError(f"cluster.perf.reduce_ns_per_element: {dtype!r} is not one of {sorted(ELEMENT_BYTES)}")
    return None if pairs is None else tuple((k, max(0.0, v)) for k, v in pairs)


def _latencies(value: Any) -> tuple[tuple[str, float], ...] | None:
    """``perf.world_latency_us`` or ``perf.inter_all_latency_us``, per kind or one number for every kind, as
    sorted (kind, us) pairs; None where not given."""
    if value is None or isinstance(value, (Mapping, tuple, list)):
        return _pairs(value)
    return _pairs({kind: value for kind in ("allreduce", "all_gather", "all_to_all", "reduce_scatter")})


def _pairs(value: Any) -> tuple[tuple[str, float], ...] | None:
    """A mapping (or (key, number) pairs) as sorted (str, float) pairs, hashable; None stays None."""
    if value is None:
        return None
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), float(v)) for k, v in items))


def group_size(op: Collective, nodes: int, gpus_per_node: int) -> int:
    """The processes of ``op``'s group: a node's, one a node, or all."""
    return {"intra": gpus_per_node, "inter": nodes, "world": nodes * gpus_per_node}[op.group]


def reduce_time(op: Collective, nodes: int, gpus_per_node: int, cluster: ClusterSpec) -> float:
    """What ``op``'s sums cost beyond its bytes: a ring all-reduce or reduce-scatter over p processes has each
    add (p-1)/p of the vector, at :meth:`ClusterSpec.reduce_extra_s` an element. MEASURED on gloo (loopback,
    670,730 elements, 2 processes): fp32 3.08 ms, fp16 3.94, bf16 2.98, where half the bytes would predict
    about half the time; nothing for the collectives that do not sum."""
    if op.kind not in ("allreduce", "reduce_scatter") or op.dtype == "float32":
        return 0.0
    p = group_size(op, nodes, gpus_per_node)
    return (p - 1) / p * op.elements * cluster.reduce_extra_s(op.dtype) if p > 1 else 0.0


def op_time(op: Collective, nodes: int, gpus_per_node: int, cluster: ClusterSpec) -> float:
    """Seconds ``op`` takes on ``nodes`` nodes of ``gpus_per_node`` processes (the rules of the module doc),
    with its 16-bit sums' extra cost (:func:`reduce_time`); a 16-bit world all-reduce the probe timed in fp16 as
    timed (its sums included)."""
    sixteen = cluster.measured_allreduce16_s(op, nodes, gpus_per_node)
    if sixteen is not None:
        return sixteen
    return _transfer_time(op, nodes, gpus_per_node, cluster) + reduce_time(op, nodes, gpus_per_node, cluster)


def _transfer_time(op: Collective, nodes: int, gpus_per_node: int, cluster: ClusterSpec) -> float:
    n, m = nodes, gpus_per_node
    if op.group == "intra" or (op.group == "world" and n == 1):
        return collective_time(op.kind, op.nbytes, m, cluster.intra)
    fitted = cluster.measured_exchange(op.group) if op.kind in PAIRWISE else None
    if fitted is not None:  # measured by a probe: its own shape and rate, not the all-reduce's
        return fitted.seconds(op.group, op.nbytes, n, m)
    nic = cluster.inter.shared(m)
    exchange = cluster.exchange.shared(m)
    if op.group == "inter":
        link = nic if op.kind == "allreduce" else exchange
        return collective_time(op.kind, op.nbytes, n, Link(cluster.inter_alpha_s(op.kind, m), link.bandwidth_Bps))
    world_alpha = cluster.world_alpha_s(op.kind)
    if op.kind == "allreduce":  # measured by a probe: as measured, else carried to this node count by its shape
        measured = cluster.measured_allreduce_s(op.nbytes, n)
        if measured is not None:
            return measured
        if cluster.allreduce_shape is not None:
            node_s = collective_time("allreduce", op.nbytes, m, cluster.intra)
            return cluster.allreduce_shape.seconds(op.nbytes, n, m, node_s)
    if op.kind == "allreduce" and cluster.world_allreduce == "ring":
        slowest = max(cluster.inter.beta, cluster.intra.beta)
        if cluster.shared_host and world_alpha is not None:  # waits for a turn on a core, against the bytes
            return ring_allreduce_with_waits(op.nbytes, n * m, Link(cluster.inter.alpha_s, 1.0 / slowest), world_alpha)
        alpha = cluster.inter.alpha_s if world_alpha is None else world_alpha
        return collective_time("allreduce", op.nbytes, n * m, Link(alpha, 1.0 / slowest))
    if op.kind == "allreduce":
        return (
            collective_time("reduce_scatter", op.nbytes, m, cluster.intra)
            + collective_time("allreduce", op.nbytes / m, n, nic)
            + collective_time("all_gather", op.nbytes, m, cluster.intra)
        )
    intra_bytes, inter_bytes = counted_bytes(op, n, m)
    return exchange_latency(op, n, m, cluster) + max(inter_bytes * exchange.beta, intra_bytes * cluster.intra.beta)


def exchange_latency(op: Collective, nodes: int, gpus_per_node: int, cluster: ClusterSpec) -> float:
    """The latency part of a collective other than an all-reduce (the pairwise exchanges: all-to-all,
    all-gather) over every process of several nodes: its N-1 steps at the kind's ``perf.world_latency_us``
    where measured, else NCCL's tuning model (src/graph/tuning.cc, ncclTopoTuneModel): of the N-1 steps, n-1
    cross the network and pay its latency, the other N-n stay inside a node and pay the intra-node one. The
    rest of :func:`op_time` is its bytes."""
    n, world = nodes, nodes * gpus_per_node
    if op.group != "world" or n == 1 or op.kind == "allreduce":
        raise ValueError(
            f"{op.kind} over {op.group!r} on {nodes} node(s): not an exchange over every process of several nodes"
        )
    world_alpha = cluster.world_alpha_s(op.kind)
    if world_alpha is not None:  # measured over every process at once, as the op runs
        return (world - 1) * world_alpha
    return (n - 1) * cluster.inter.alpha_s + (world - n) * cluster.intra.alpha_s


def host_contention(
    cluster: ClusterSpec, processes: int, threads: int, host_cores: int | None, nodes: int = 1
) -> float:
    """Processes' compute threads per core on the busiest core of an emulated cluster of ``nodes`` nodes whose
    ``processes`` of ``threads`` each share one machine of ``host_cores`` (1 on real clusters, or when not
    known): ASSUMPTION, compute-bound work time-shares the cores evenly. Each node is pinned to
    ``cluster.cores_per_node`` cores, else to ``host_cores // nodes`` (birder_repro.launch.emulated, no
    pinning with fewer cores than nodes): the larger of the machine's load and a node's (:func:`node_contention`).
    """
    if not cluster.shared_host or not host_cores:
        return 1.0
    node_cores = cluster.cores_per_node or (host_cores // nodes if host_cores >= nodes else None)
    return max(
        node_contention(processes, threads, host_cores),
        node_contention(processes // max(nodes, 1), threads, node_cores),
    )


def node_contention(processes: int | None, threads: int, cores: int | None) -> float:
    """Compute threads per core of ``processes`` of ``threads`` on ``cores``, at least 1; 1 where either is not
    known. Also the contention a 1-node profile was measured under, already in its times (its node's processes
    on the cores it was pinned to; older profiles say neither: they ran unpinned, a core or more a process)."""
    if not processes or not cores:
        return 1.0
    return max(1.0, processes * max(threads, 1) / float(cores))


def no_spare_core(cluster: ClusterSpec, processes: int, threads: int, host_cores: int | None) -> bool:
    """Whether the emulated cluster's ``processes`` of ``threads`` each leave no core of ``host_cores`` for a
    hook's communication thread, so that its compression takes turns with the backward pass (measured with
    ResNet-50 at 100 Mbit/s, 2 nodes of one core: the backward pass 0.25-0.3 s longer than alone while the
    thread compresses). False on real clusters, whose accelerators compute while a host thread compresses or a
    side stream runs."""
    if not cluster.shared_host or not host_cores:
        return False
    return host_cores / max(processes, 1) <= max(threads, 1)
