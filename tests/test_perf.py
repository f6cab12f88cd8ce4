"""The performance model (birder_repro.perf): formulas on hand-computed numbers, bytes against the hooks'
accounting, the overlap timeline, profiles, the paper validation's target and the predicted record."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from dist_utils import run_distributed

from birder_repro.perf import collectives as C
from birder_repro.perf import held_out, link_fit, validate_report
from birder_repro.perf import validate_rows as V
from birder_repro.perf.cluster import ClusterSpec, host_contention, no_spare_core, node_contention, op_time
from birder_repro.perf.collectives import Link
from birder_repro.perf.implementations import (
    IMPLEMENTATIONS,
    PAPER_DDP_OVERLAP,
    Implementation,
    implementation_of,
    with_overlap,
)
from birder_repro.perf.model import predict_step
from birder_repro.perf.paper_profiles import paper_profile
from birder_repro.perf.predict import predict_record
from birder_repro.perf.profile import Profile, ddp_bucket_elements, load_profile
from birder_repro.perf.schemes import (
    Collective,
    bucket_collectives,
    compressed_elements,
    counted_bytes,
    powersgd_elements,
    scheme_for_optim,
)
from birder_repro.perf.timeline import BucketWork, blend, ready_times, simulate, simulate_sequential, simulate_shared

REPO = Path(__file__).resolve().parents[1]
LINK = C.Link(alpha_s=1e-5, bandwidth_Bps=1e9)


# ------------------------------------------------------------------------------------------ formulas
def test_collective_formulas_by_hand():
    assert C.ring_allreduce(1e6, 4, LINK) == pytest.approx(6e-5 + 1.5e-3)
    assert C.ring_reduce_scatter(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert C.ring_all_gather(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert C.pairwise_all_to_all(8e5, 8, LINK) == pytest.approx(7e-5 + 0.7e-3)
    assert C.broadcast(1000, 8, LINK) == pytest.approx(3 * (1e-5 + 1e-6))  # binomial tree
    assert C.broadcast(1e6, 8, LINK) == pytest.approx(10 * 1e-5 + 1.75e-3)  # scatter + all-gather
    for fn in C.KINDS.values():
        assert fn(1e6, 1, LINK) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        C.collective_time("gossip", 1.0, 2, LINK)
    with pytest.raises(ValueError):
        C.Link(alpha_s=0.0, bandwidth_Bps=0.0)


def _spec(**kw) -> ClusterSpec:
    base = dict(
        name="t",
        inter_mbit=8000.0,
        inter_latency_us=10.0,
        inter_efficiency=1.0,
        intra_mbit=80000.0,
        intra_latency_us=1.0,
        intra_efficiency=1.0,
    )
    return ClusterSpec(**{**base, **kw})


def test_op_time_levels():
    spec = _spec()  # inter 1e9 B/s, intra 1e10 B/s
    # An inter-node group: the m = 4 concurrent groups of a node share its NIC.
    a2a = Collective("all_to_all", "inter", 1e6)
    assert op_time(a2a, 2, 4, spec) == pytest.approx(1e-5 + 0.5 * 1e6 * 4 / 1e9)
    # DDP's all-reduce across nodes: intra reduce-scatter + inter all-reduce of 1/m + intra all-gather.
    ar = Collective("allreduce", "world", 4e6)
    expect = (3e-6 + 0.75 * 4e6 / 1e10) + (2e-5 + 1.0 * 1e6 * 4 / 1e9) + (3e-6 + 0.75 * 4e6 / 1e10)
    assert op_time(ar, 2, 4, spec) == pytest.approx(expect)
    # One node: the intra-node ring.
    assert op_time(ar, 1, 4, spec) == pytest.approx(C.ring_allreduce(4e6, 4, spec.intra))
    # A world exchange of N = 8 over 2 nodes: NCCL's count, 1 network step and 6 intra-node ones.
    ag = Collective("all_gather", "world", 8e5)
    intra, inter = counted_bytes(ag, 2, 4)
    assert op_time(ag, 2, 4, spec) == pytest.approx(1e-5 + 6e-6 + max(4 * inter / 1e9, intra / 1e10))
    with pytest.raises(ValueError, match="inter_efficiency"):
        _spec(inter_efficiency=1.5)


def test_a_gloo_world_allreduce_is_one_ring_over_every_process():
    """perf.world_allreduce=ring: 2(N-1) steps at the inter-node alpha, 2(N-1)/N of the vector at the slower of
    the NIC (one stream, not shared by the node's processes) and the intra-node link."""
    ring = _spec(world_allreduce="ring")  # inter 1e9 B/s, intra 1e10 B/s
    ar = Collective("allreduce", "world", 4e6)
    assert op_time(ar, 2, 4, ring) == pytest.approx(14 * 1e-5 + 2 * 7 / 8 * 4e6 / 1e9)
    # One process a node: the same ring as NCCL's two-level one with m = 1.
    assert op_time(ar, 4, 1, ring) == pytest.approx(op_time(ar, 4, 1, _spec()))
    # One node, and other collectives: unchanged.
    assert op_time(ar, 1, 4, ring) == pytest.approx(op_time(ar, 1, 4, _spec()))
    ag = Collective("all_gather", "world", 8e5)
    assert op_time(ag, 2, 4, ring) == pytest.approx(op_time(ag, 2, 4, _spec()))
    slow_intra = _spec(world_allreduce="ring", intra_mbit=800.0)  # 1e8 B/s: the loopback is the slowest hop
    assert op_time(ar, 2, 4, slow_intra) == pytest.approx(14 * 1e-5 + 2 * 7 / 8 * 4e6 / 1e8)
    with pytest.raises(ValueError, match="world_allreduce='tree'"):
        _spec(world_allreduce="tree")
    shipped = ClusterSpec.from_config(yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text()))
    assert shipped.world_allreduce == "ring" and ClusterSpec.from_config(
        {"link_mbit": 1, "perf": {"inter_latency_us": 1, "inter_efficiency": 1, "intra_mbit": 1, "intra_latency_us": 1}}
    ).world_allreduce == ("two_level")


def test_a_measured_world_latency_prices_the_exchanges_over_every_process():
    """perf.world_latency_us (mode=probe's world group): a pairwise exchange over all N processes pays N-1 of
    its kind's measured steps, not NCCL's count of inter- and intra-node ones; a kind without one keeps that."""
    measured = _spec(world_latency_us={"all_gather": 1000.0, "all_to_all": 500.0})
    ag, a2a = Collective("all_gather", "world", 8e5), Collective("all_to_all", "world", 8e5)
    intra, inter = counted_bytes(ag, 2, 4)
    assert op_time(ag, 2, 4, measured) == pytest.approx(7 * 1e-3 + max(4 * inter / 1e9, intra / 1e10))
    assert op_time(a2a, 2, 4, measured) - op_time(a2a, 2, 4, _spec()) == pytest.approx(7 * 5e-4 - 1e-5 - 6e-6)
    ar = Collective("allreduce", "world", 4e6)  # no all-reduce latency given: as before
    assert op_time(ar, 2, 4, measured) == pytest.approx(op_time(ar, 2, 4, _spec()))
    assert op_time(Collective("all_gather", "intra", 8e5), 2, 4, measured) == pytest.approx(
        op_time(Collective("all_gather", "intra", 8e5), 2, 4, _spec())
    )  # a node's own group: its intra-node latency
    perf = {
        "inter_latency_us": 1,
        "inter_efficiency": 1,
        "intra_mbit": 1,
        "intra_latency_us": 1,
        "world_latency_us": 250,
    }
    one = ClusterSpec.from_config({"link_mbit": 1, "perf": perf})  # one number: every kind
    assert one.world_alpha_s("all_to_all") == pytest.approx(2.5e-4) and _spec().world_alpha_s("all_gather") is None


def test_on_shared_cores_a_ring_step_lasts_at_least_the_measured_wait_for_a_turn():
    """perf.world_latency_us.allreduce on an emulated cluster (shared_host): every step of gloo's ring over all
    N processes lasts max(wait, alpha + n/N beta). A small vector's ring (PowerSGD's factors) is 2(N-1) waits; a
    large one's is unchanged, its latency and bytes; a real cluster's measured latency replaces the alpha."""
    kw = dict(world_allreduce="ring", inter_latency_us=300.0, world_latency_us={"allreduce": 800.0})
    shared = _spec(shared_host=True, **kw)  # inter 1e9 B/s, intra 1e10 B/s: the ring steps at the NIC's 1e9
    small, large = Collective("allreduce", "world", 16e3), Collective("allreduce", "world", 4e6)
    assert op_time(small, 2, 2, shared) == pytest.approx(6 * 800e-6)  # 300 us + 4 us of bytes < the wait
    assert op_time(large, 2, 2, shared) == pytest.approx(6 * (300e-6 + 1e6 / 1e9))  # 1.3 ms a step > the wait
    assert C.ring_allreduce_with_waits(16e3, 4, Link(300e-6, 1e9), 0.0) == pytest.approx(
        C.ring_allreduce(16e3, 4, Link(300e-6, 1e9))
    )
    assert C.ring_allreduce_with_waits(16e3, 1, Link(300e-6, 1e9), 800e-6) == 0.0
    real = _spec(**kw)  # not shared: the measured latency is the ring's alpha, added to its bytes
    assert op_time(small, 2, 2, real) == pytest.approx(6 * 800e-6 + 2 * 3 / 4 * 16e3 / 1e9)
    assert op_time(small, 1, 4, shared) == pytest.approx(op_time(small, 1, 4, _spec()))  # one node: intra ring
    # the shipped emulated cluster holds the probe's world all-reduce latency
    shipped = ClusterSpec.from_config(yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text()))
    assert shipped.shared_host and shipped.world_alpha_s("allreduce") == pytest.approx(779e-6)


def test_inter_node_steps_with_every_local_ranks_group_at_once_pay_their_measured_latency():
    """perf.inter_all_latency_us (mode=probe's inter_all level): with several processes a node, an inter-node
    collective's steps pay that kind's latency instead of inter_latency_us; one process a node, a kind not
    measured, and the other groups keep theirs."""
    measured = _spec(inter_all_latency_us={"allreduce": 2000.0, "all_gather": 1500.0})
    ar, ag = Collective("allreduce", "inter", 4e6), Collective("all_gather", "inter", 8e5)
    assert op_time(ar, 2, 2, measured) - op_time(ar, 2, 2, _spec()) == pytest.approx(2 * (2e-3 - 1e-5))
    assert op_time(ag, 4, 2, measured) - op_time(ag, 4, 2, _spec()) == pytest.approx(3 * (1.5e-3 - 1e-5))
    assert op_time(ar, 2, 1, measured) == pytest.approx(op_time(ar, 2, 1, _spec()))  # one process a node
    a2a = Collective("all_to_all", "inter", 8e5)
    assert op_time(a2a, 2, 2, measured) == pytest.approx(op_time(a2a, 2, 2, _spec()))  # not measured
    world = Collective("allreduce", "world", 4e6)
    assert op_time(world, 2, 2, measured) == pytest.approx(op_time(world, 2, 2, _spec()))
    assert measured.inter_alpha_s("allreduce", 2) == pytest.approx(2e-3) and _spec().inter_alpha_s(
        "allreduce", 2
    ) == pytest.approx(1e-5)


def test_a_16_bit_sum_pays_its_measured_cost_beyond_its_bytes():
    """perf.reduce_ns_per_element (mode=probe's reduce block): a 16-bit all-reduce or reduce-scatter over p
    processes adds (p-1)/p of its elements at that cost on top of its bytes; fp32, the collectives that do not
    sum, and a dtype not measured pay nothing more."""
    from birder_repro.perf.cluster import reduce_time

    priced = _spec(reduce_ns_per_element={"float16": 10.0, "bfloat16": 4.0})
    fp16 = Collective("allreduce", "world", 2e6, "float16")  # 1e6 elements
    assert fp16.elements == 1e6
    assert reduce_time(fp16, 2, 2, priced) == pytest.approx(3 / 4 * 1e6 * 10e-9)
    assert op_time(fp16, 2, 2, priced) - op_time(fp16, 2, 2, _spec()) == pytest.approx(7.5e-3)
    rs = Collective("reduce_scatter", "intra", 2e6, "bfloat16")  # a node's 4 processes
    assert reduce_time(rs, 2, 4, priced) == pytest.approx(3 / 4 * 1e6 * 4e-9)
    inter = Collective("allreduce", "inter", 2e6, "bfloat16")  # one process a node: 2 of them
    assert reduce_time(inter, 2, 4, priced) == pytest.approx(1 / 2 * 1e6 * 4e-9)
    assert reduce_time(Collective("allreduce", "world", 4e6), 2, 2, priced) == 0.0  # fp32
    assert reduce_time(Collective("all_gather", "world", 2e6, "float16"), 2, 2, priced) == 0.0
    assert reduce_time(fp16, 2, 2, _spec(reduce_ns_per_element={"bfloat16": 4.0})) == 0.0
    assert reduce_time(fp16, 1, 1, priced) == 0.0  # one process sums nothing
    # The schemes say what they sum in: the fp16 hook fp16, the two-level bf16 hook bf16 at both levels.
    assert {op.dtype for op in bucket_collectives("fp16", 1000, 2, 2)} == {"float16"}
    assert [op.dtype for op in bucket_collectives("two_level_bf16", 1000, 2, 2)] == ["bfloat16"] * 3
    assert {op.dtype for op in bucket_collectives("two_level", 1000, 2, 2)} == {"float32"}
    bf16_ops = bucket_collectives("two_level_bf16", 1000, 2, 2)
    assert sum(op_time(op, 2, 2, priced) - op_time(op, 2, 2, _spec()) for op in bf16_ops) == pytest.approx(
        (1 / 2 * 1000 + 1 / 2 * 500) * 4e-9
    )
    perf = {"inter_latency_us": 1, "inter_efficiency": 1, "intra_mbit": 1, "intra_latency_us": 1}
    got = ClusterSpec.from_config({"link_mbit": 1, "perf": {**perf, "reduce_ns_per_element": {"float16": -2.0}}})
    assert got.reduce_extra_s("float16") == 0.0  # a sum measured faster than fp32's: no credit
    with pytest.raises(ValueError, match="reduce_ns_per_element: 'int8'"):
        ClusterSpec.from_config({"link_mbit": 1, "perf": {**perf, "reduce_ns_per_element": {"int8": 1.0}}})
    with pytest.raises(ValueError, match="dtype"):
        Collective("allreduce", "world", 4.0, "fp16")


def test_host_contention_counts_the_busiest_core_and_a_profile_divides_its_own_out():
    shared = _spec(shared_host=True)
    # 2 x 2 on 2 cores, each node pinned to 1: 2 processes a core; 4 x 1 unpinned (fewer cores than nodes): 2.
    assert host_contention(shared, 4, 1, 2, nodes=2) == 2.0
    assert host_contention(shared, 4, 1, 2, nodes=4) == 2.0
    # 1 x 2 on 2 cores: a core each; pinned to 1 core (cluster.cores_per_node=1): 2.
    assert host_contention(shared, 2, 1, 2, nodes=1) == 1.0
    assert host_contention(_spec(shared_host=True, cores_per_node=1), 2, 1, 2, nodes=1) == 2.0
    assert host_contention(_spec(), 64, 8, 2, nodes=8) == 1.0  # a real cluster
    assert node_contention(2, 1, 1) == 2.0 and node_contention(2, 1, 2) == 1.0
    assert node_contention(None, 1, None) == 1.0  # an older profile: measured with a core a process

    # The model charges the ratio: a profile measured on one core for 2 processes (its times hold the
    # contention) predicts the 2 x 2 run on 2 cores at its own compute, the same profile unpinned at twice it.
    base = dict(name="p", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300)
    pinned = Profile(**base, optimizer_s=0.004, threads=1, host_cores=2, processes=2, node_cores=1)
    spread = Profile(**base, optimizer_s=0.004, threads=1, host_cores=2, processes=2, node_cores=2)
    assert predict_step(pinned, shared, 2, 2, "fp32").compute_s == pytest.approx(0.064)
    assert predict_step(spread, shared, 2, 2, "fp32").compute_s == pytest.approx(2 * 0.064)
    # The pinned profile's own layout (1 x 2 on 1 core) is predicted at its own compute.
    own = _spec(shared_host=True, cores_per_node=1)
    assert predict_step(pinned, own, 1, 2, "fp32").compute_s == pytest.approx(0.064)


# ------------------------------------------------------------------------------------ bytes per scheme
def test_bytes_by_hand():
    """Bytes per process per step of a bucket of P = 100,003 elements on 2 nodes x 4 processes (N = 8), worked
    out by hand from each scheme's collectives (DESIGN.md "Birder inside DDP"; the 1-bit Adam paper's
    compressed all-reduce); the real hooks' counters are checked against the same algebra in test_birder.py
    and test_onebit.py (there with the one-byte non-finite flags the hooks add, which the model leaves out)."""
    n, m = 2, 4

    def counted(scheme):
        ops = bucket_collectives(scheme, 100_003, n, m)
        pairs = [counted_bytes(op, n, m) for op in ops]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs), len(ops)

    # fp32: a ring all-reduce in rank order sends 2 (N-1)/N x 4P = 700,021 bytes; a node's ring crosses to the
    # next node once, so 1/m of it (175,005.25) is inter-node.
    assert counted("fp32") == pytest.approx((525_015.75, 175_005.25, 1))
    assert counted("fp16") == pytest.approx((262_507.875, 87_502.625, 1))
    # Birder: P' = 100,032 (a multiple of 8 m n = 64). Intra: the fp32 reduce-scatter 3/4 x 400,128 = 300,096
    # and the all-gather of the packed shards, 3 x P'/(8m) = 3 x 3,126; inter: all-to-all and all-gather of
    # the shard's bits, (n-1)/n x 3,126 each.
    assert counted("hierarchical") == pytest.approx((309_474.0, 3_126.0, 4))
    assert counted("hierarchical")[2] == 4 and bucket_collectives("hierarchical", 100_003, 1, 1) == []
    # 1-bit Adam, flat over N = 8: P' = 100,032 (8N = 64); each peer gets P'/(8N) = 1,563 sign bytes and a
    # 4-byte scale, twice (worker and server): 3,134 per peer; 3 peers on the node, 4 off it.
    assert counted("onebit") == pytest.approx((9_402.0, 12_536.0, 4))
    # Birder flat: every process a worker, 2 (N-1) P'/(8N) = 21,882 bytes; allgather: (N-1) P'/8, P' = 100,008.
    assert sum(counted("flat")[:2]) == pytest.approx(21_882.0)
    assert sum(counted("allgather")[:2]) == pytest.approx(87_507.0)


def test_powersgd_collectives():
    # torch's rule: compress an n x m matrix when (n + m) r < n m / 2; vectors go uncompressed.
    assert powersgd_elements([[64, 64], [64], [4, 4]], rank=1) == (64 + 16, 64, 64)
    ops = bucket_collectives("powersgd", 4096 + 64 + 16, 2, 2, matrices=[[64, 64], [64], [4, 4]], rank=1)
    assert [op.nbytes for op in ops] == [4 * 80, 4 * 64, 4 * 64]
    assert bucket_collectives("fp32", 10, 1, 1) == []
    with pytest.raises(ValueError, match="unknown scheme"):
        bucket_collectives("zip", 10, 2, 2)


def test_scheme_for_optim():
    assert [scheme_for_optim(o) for o in ("sgdm", "bertadam", "onebit_lamb", "sgdm_fp16", "adamw_powersgd")] == [
        "fp32",
        "fp32",
        "onebit",
        "fp16",
        "powersgd",
    ]
    assert scheme_for_optim("birder", "flat") == "flat"


# ------------------------------------------------------------------------------------------ timeline
def test_timeline_three_buckets_by_hand():
    buckets = [BucketWork(1.0, 0.5, 1.0), BucketWork(2.0, 0.5, 0.2), BucketWork(3.0, 0.5, 0.5)]
    tl = simulate(buckets, forward_backward_s=3.0, optimizer_s=0.1)
    assert tl.starts == pytest.approx((1.0, 2.5, 3.2))
    assert tl.ends == pytest.approx((2.5, 3.2, 4.2))
    assert tl.total_s == pytest.approx(4.3)  # 3.0 compute + 1.2 exposed + 0.1 optimizer
    assert tl.compute_s == pytest.approx(3.1)
    assert tl.compression_s == pytest.approx(1.2 * 1.5 / 3.2)
    assert tl.communication_s + tl.compression_s + tl.compute_s == pytest.approx(tl.total_s)
    # Everything hidden behind the backward pass: the step is the compute.
    assert simulate([BucketWork(0.5, 0.0, 0.1)], 3.0, 0.0).total_s == pytest.approx(3.0)


def test_shared_timeline_delays_the_backward_pass_by_the_compression_inside_it():
    buckets = [BucketWork(1.0, 0.5, 1.0), BucketWork(2.0, 0.5, 0.2), BucketWork(3.0, 0.5, 0.5)]
    tl = simulate_shared(buckets, forward_backward_s=3.0, optimizer_s=0.1)
    # b1 at 1.0 (backward now ends at 3.5), b2 ready at 2.5 (link free at 2.5; backward ends at 4.0),
    # b3 ready at 4.0, after the backward pass: compressed then sent, done at 5.0
    assert tl.starts == pytest.approx((1.0, 2.5, 4.0)) and tl.ends == pytest.approx((2.5, 3.2, 5.0))
    assert tl.total_s == pytest.approx(5.1)
    assert (tl.compression_s, tl.communication_s) == pytest.approx((1.5, 0.5))
    assert tl.communication_s + tl.compression_s + tl.compute_s == pytest.approx(tl.total_s)


def test_no_spare_core_only_on_a_shared_host():
    shared = _spec(shared_host=True)
    assert no_spare_core(shared, processes=2, threads=1, host_cores=2)
    assert not no_spare_core(shared, processes=1, threads=1, host_cores=2)  # the thread has its own core
    assert not no_spare_core(_spec(), processes=64, threads=8, host_cores=2)  # a real cluster


def test_sequential_timeline_adds_everything():
    buckets = [BucketWork(1.0, 0.5, 1.0), BucketWork(2.0, 0.5, 0.2)]
    tl = simulate_sequential(buckets, forward_backward_s=3.0, optimizer_s=0.1)
    assert tl.total_s == pytest.approx(3.0 + 1.0 + 1.2 + 0.1)
    assert (tl.compression_s, tl.communication_s) == pytest.approx((1.0, 1.2))
    assert tl.starts == pytest.approx((3.0, 4.5)) and tl.ends == pytest.approx((4.5, 5.2))


def test_blend_is_a_partial_overlap():
    buckets = [BucketWork(1.0, 0.5, 1.0), BucketWork(2.0, 0.5, 0.2)]
    over, seq = simulate(buckets, 3.0, 0.1), simulate_sequential(buckets, 3.0, 0.1)
    assert blend(over, seq, 1.0).total_s == pytest.approx(over.total_s)
    assert blend(over, seq, 0.0).total_s == pytest.approx(seq.total_s)
    half = blend(over, seq, 0.5)
    assert half.total_s == pytest.approx((over.total_s + seq.total_s) / 2)
    assert half.compute_s + half.communication_s + half.compression_s == pytest.approx(half.total_s)
    with pytest.raises(ValueError, match="overlap"):
        blend(over, seq, 1.5)


def test_implementations():
    assert all(impl.overlap == 1 for impl in IMPLEMENTATIONS["this"].values())
    assert implementation_of("paper", "fp32").overlap == PAPER_DDP_OVERLAP
    assert not implementation_of("paper", "hierarchical").overlap
    assert implementation_of("paper", "onebit").granularity == "whole"
    with pytest.raises(ValueError, match="unknown implementation"):
        implementation_of("theirs", "fp32")
    with pytest.raises(ValueError, match="overlap must be in"):
        Implementation(overlap=2)
    with pytest.raises(ValueError, match="cannot overlap"):
        Implementation(overlap=0.5, granularity="whole")
    # A mapping works wherever a name does: the paper's set with its DDP baselines half overlapped lies
    # between the paper's (not overlapped) and fully overlapped baselines.
    spec = V.cluster_spec("infiniband_200g")
    prof = paper_profile(task="resnet50", batch_size=32, node=spec)
    steps = [
        predict_step(prof, spec, 4, 8, "fp32", implementation=with_overlap("paper", o)).total_s for o in (0.0, 0.5, 1.0)
    ]
    assert steps[0] > steps[1] > steps[2]
    assert implementation_of(with_overlap("paper", 0.5), "fp32").overlap == 0.5
    assert implementation_of(with_overlap("paper", 0.5), "hierarchical").overlap == 0
    spec = V.cluster_spec("ethernet_10g")
    # The profile is derived for the implementation asked for: the 1-node row comes back only when the model
    # runs the same one (derived for one and run with the other, Birder's 1-node step differs).
    derived = {
        impl: paper_profile(task="resnet50", batch_size=32, node=spec, implementation=impl) for impl in IMPLEMENTATIONS
    }
    for impl, other in (("paper", "this"), ("this", "paper")):
        assert predict_step(derived[impl], spec, 1, 8, "hierarchical", implementation=impl).throughput == pytest.approx(
            3462, rel=1e-6
        )
        assert predict_step(
            derived[impl], spec, 1, 8, "hierarchical", implementation=other
        ).throughput != pytest.approx(3462, rel=1e-3)
    # Not overlapped, Birder's communication is all exposed: the paper's implementation is slower at 4 nodes.
    this = predict_step(
        paper_profile(task="bert_squad", batch_size=3, node=spec, implementation="this"),
        spec,
        4,
        8,
        "hierarchical",
        implementation="this",
    )
    paper = predict_step(
        paper_profile(task="bert_squad", batch_size=3, node=spec), spec, 4, 8, "hierarchical", implementation="paper"
    )
    assert paper.total_s > this.total_s and paper.communication_s == pytest.approx(paper.comm_busy_s)
    # 1-bit Adam in the paper's runs: one compressed all-reduce of the whole vector (4 collectives).
    onebit = predict_step(
        paper_profile(task="resnet50", batch_size=32, node=spec), spec, 2, 8, "onebit", implementation="paper"
    )
    assert onebit.collectives == 4


def test_ready_times_and_buckets():
    assert ready_times([1, 1, 2], forward_s=1.0, backward_s=2.0) == pytest.approx([1.5, 2.0, 3.0])
    assert ready_times([1, 1], 1.0, 2.0, fractions=[0.25, 1.0]) == pytest.approx([1.5, 3.0])
    sizes = ddp_bucket_elements(25_557_032)
    assert sizes[0] == 262_144 and sizes[1] == 6_553_600 and sum(sizes) == 25_557_032


# ------------------------------------------------------------------------------------------- profiles
def _profile(**kw) -> Profile:
    base = dict(
        name="t",
        device="cpu",
        task="resnet20",
        batch_size=32,
        forward_backward_s=0.1,
        parameter_count=1_000_000,
        compression_s_per_element={"birder": 1e-9},
    )
    return Profile(**{**base, **kw})


def test_profile_round_trip_and_loader(tmp_path):
    prof = _profile(bucket_elements=[500_000, 500_000], bucket_ready=[0.5, 1.0])
    assert Profile.from_dict(json.loads(json.dumps(prof.to_dict()))) == prof
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.json").write_text(json.dumps({"status": "completed", "profile": prof.to_dict()}))
    assert load_profile(run) == prof and load_profile(run / "record.json") == prof
    (tmp_path / "p.json").write_text(json.dumps(prof.to_dict()))
    assert load_profile(tmp_path / "p.json") == prof
    with pytest.raises(ValueError, match="unknown profile keys"):
        Profile.from_dict({**prof.to_dict(), "typo": 1})
    with pytest.raises(ValueError, match="bucket_elements"):
        _profile(bucket_elements=[1, 2])
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "missing")


def test_paper_profile_derivation_by_hand():
    """The paper profile's derived numbers (birder_repro/perf/profiles/paper.yaml, steps 1-4) worked out by hand
    from the paper's printed figures and the NVLink datasheet, not from the model's functions."""
    spec = V.cluster_spec("ethernet_10g")
    prof = paper_profile(task="resnet50", batch_size=32, node=spec)
    assert prof.parameter_count == 25_557_032
    assert prof.buckets() == [262_144, 6_553_600, 6_553_600, 6_553_600, 5_634_088]  # DDP: 1 MiB, then 25 MiB
    # Step 1: SGDM's 1-node step 8 x 32 / 3693 s less its all-reduce over NVLink, not overlapped in the paper's
    # runs: 5 buckets x 2 x 7 steps x 3.4 us + 2 x 7/8 x 102,228,128 bytes / (300 GB/s x 0.78).
    nvlink = 300e9 * 0.78
    allreduce = 5 * 14 * 3.4e-6 + 1.75 * 4 * 25_557_032 / nvlink
    fb = 256 / 3693 - allreduce
    assert prof.forward_backward_s == pytest.approx(fb, rel=1e-9)
    assert fb == pytest.approx(0.068318, abs=1e-6)
    # Step 2: section 5.3's 15 ms over what one rank of 8 compresses: 1.375 x the padded 25,557,056 elements
    # (its shard P'/8, the server's unpack P'/8 and re-quantization P'/8, the final unpack P').
    per_element = 0.015 / (1.375 * 25_557_056)
    assert prof.compression_s_per_element["birder"] == pytest.approx(per_element, rel=1e-9)
    # Step 4, Birder: its 1-node step 256 / 3462 less compute, 15 ms of compression and the intra reduce-scatter
    # (4 P') and all-gather (P'/8): NEGATIVE, -10.0 ms, as paper.yaml says (the paper's numbers disagree).
    intra = 5 * 2 * 7 * 3.4e-6 + 0.875 * (4 + 1 / 8) * 25_557_056 / nvlink
    assert prof.scheme_overhead_s["hierarchical"] == pytest.approx(256 / 3462 - fb - 0.015 - intra, abs=2e-6)
    # Step 3 + 4, 1-bit Adam: the compression stage's step from the whole-run row, (t - 0.15 t_sgdm) / 0.85,
    # less compute, 3.125 P' elements compressed and its 4 collectives on one node (two of P'/8 bytes).
    t_c = (256 / 3243 - 0.15 * 256 / 3693) / 0.85
    comm = 4 * 7 * 3.4e-6 + 2 * 0.875 * 25_557_056 / 8 / nvlink
    assert prof.scheme_overhead_s["onebit"] == pytest.approx(
        t_c - fb - 3.125 * 25_557_056 * per_element - comm, abs=2e-6
    )
    assert prof.scheme_overhead_s["onebit"] == pytest.approx(-0.0219, abs=1e-4)
    bert = paper_profile(task="bert_squad", batch_size=3, node=spec)
    assert 108e6 < bert.parameter_count < 110e6
    with pytest.raises(ValueError, match="no paper profile"):
        paper_profile(task="digits", batch_size=3)


def test_cluster_configs_load():
    for path in sorted((REPO / "conf" / "cluster").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        assert {"name", "interconnect", "link_mbit", "latency_ms", "backend"} <= set(cfg)  # existing keys kept
        spec = ClusterSpec.from_config(cfg)
        assert spec.inter.bandwidth_Bps > 0 and spec.intra.bandwidth_Bps > 0


# ------------------------------------------------------------------------------------ paper validation
def test_paper_validation_by_hand():
    frame = V.validate((3, 4))
    multi = frame[frame["nodes"] > 1]
    assert len(multi) == 36 and set(V.target_rows(frame)["optimizer"]) == {"onebit_adam", "birder"}
    rows = multi.set_index(["cluster", "task", "optimizer", "nodes"])
    # SGDM, ResNet-50, 8 nodes x 8 over Ethernet, by hand: compute (68.318 ms, the profile's, checked above) +
    # per bucket, not overlapped: intra reduce-scatter and all-gather over NVLink and an inter-node ring
    # all-reduce of 1/8 of the bucket on each of the NIC's 8 shares: 2 x 7 steps x 600 us x 5 buckets +
    # 2 x 7/8 x 102,228,128 bytes / (0.76 x 1.25 GB/s) + the NVLink parts (1.0025 ms, as in the 1-node step).
    step = 0.068318 + 5 * 14 * 600e-6 + 1.75 * 102_228_128 / (0.76 * 1.25e9) + 1.0025e-3
    sgdm = rows.loc[("ethernet_10g", "resnet50", "sgdm", 8)]
    assert sgdm["pred_throughput"] == pytest.approx(64 * 32 / step, rel=1e-4)
    assert sgdm["throughput_error"] == pytest.approx(64 * 32 / step / 6189 - 1, rel=1e-3)  # the paper's 6189
    # What the model cannot follow (docs/performance-model.md, "Where the model stands"): the paper's 1-bit
    # Adam at 64 GPUs over Ethernet, 5546 samples/s, 0.89x its baseline; the model, whose link has no such
    # collapse, predicts it well above 1.
    onebit = rows.loc[("ethernet_10g", "resnet50", "onebit_adam", 8)]
    assert (onebit["throughput"], onebit["speedup"]) == (5546, 0.89)
    assert onebit["pred_speedup"] > 1.5 and onebit["speedup_error"] > 0.9


def test_in_sample_figure_is_the_one_the_readme_names_in_sample():
    """The shipped links were fitted on these very rows: 10.4 % is the in-sample figure, not a prediction."""
    assert V.median_speedup_error(V.validate((3, 4))) == pytest.approx(0.104, abs=5e-4)


@pytest.mark.slow  # 15 s of fitting; the out-of-sample headline below stays in the default run
def test_held_out_rows_never_reach_the_fit(tmp_path):
    """A fit on the 2-node rows is the same whatever the 4- and 8-node rows say; a fit on all rows is not."""
    import shutil

    paper = tmp_path / "paper"
    shutil.copytree(REPO / "tables" / "paper", paper)
    for name in ("table3.csv", "table4.csv"):
        rows = pd.read_csv(paper / name)
        rows.loc[rows["nodes"] > 2, "throughput"] *= 3  # held-out rows three times faster
        rows.to_csv(paper / name, index=False)
    eth = "ethernet_10g"
    assert link_fit.fit_link(eth, nodes=(2,), paper_dir=paper) == link_fit.fit_link(eth, nodes=(2,))
    assert link_fit.fit_link(eth, paper_dir=paper) != link_fit.fit_link(eth)


def test_out_of_sample_headline_as_the_readme_states_it():
    """The headline of docs/performance-model.md (fitted on the 2-node rows, 4 and 8 nodes predicted): 21.9 %,
    worst +98 %; it misses the 15 % target, and make validate says so."""
    frame = held_out.two_node_fit()
    assert sorted(frame["nodes"].unique()) == [4, 8] and set(frame["fitted_on"]) == {"2 nodes"}
    summary = validate_report.error_summary(frame)
    assert (summary["rows"], summary["throughput_rows"]) == (16, 24)
    assert summary["median"] == pytest.approx(0.219, abs=5e-4) and summary["worst"] == pytest.approx(0.98, abs=5e-3)
    assert summary["median"] > V.TARGET
    # error_summary by hand on three rows: median of |-0.1|, |+0.3| over the compressed rows, worst signed
    toy = pd.DataFrame(
        {
            "optimizer": ["sgdm", "birder", "onebit_adam"],
            "speedup_error": [0.0, -0.1, 0.3],
            "throughput_error": [0.05, -0.2, 0.1],
        }
    )
    assert validate_report.error_summary(toy) == {
        "rows": 2,
        "median": pytest.approx(0.2),
        "worst": 0.3,
        "throughput_rows": 3,
        "throughput_median": pytest.approx(0.1),
        "throughput_worst": -0.2,
    }


@pytest.mark.slow  # 16 s of fitting: the shipped numbers change only when the paper's rows or the fit do
def test_shipped_links_and_overlap_are_the_fit():
    """conf/cluster's fitted numbers and PAPER_DDP_OVERLAP are what the fit gives (the loss, not the target)."""
    sweep = link_fit.overlap_sweep((0.0, 1.0)).set_index("ddp_overlap")
    assert PAPER_DDP_OVERLAP == sweep["loss"].idxmin()
    for cluster in V.CLUSTERS:
        spec = V.cluster_spec(cluster)
        fitted = sweep.loc[PAPER_DDP_OVERLAP]
        assert (spec.inter_efficiency, spec.inter_latency_us) == pytest.approx(
            (fitted[f"{cluster}_efficiency"], fitted[f"{cluster}_latency_us"])
        )


# ------------------------------------------------------------------------------------- predicted record
def test_predict_record_shape():
    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "ethernet_10g.yaml").read_text())
    cfg = {
        "task": {"name": "resnet50"},
        "optim": {"name": "onebit_adam", "freeze": 0.15},
        "nodes": 4,
        "gpus_per_node": 8,
        "cluster": cluster,
        "train": {"batch_size": 32, "steps": None},
        "predict": {"profile": "paper"},
    }
    rec = predict_record(cfg)
    assert rec["status"] == "predicted" and rec["world_size"] == 32 and rec["global_batch_size"] == 1024
    st = rec["step_time_s"]
    assert set(st) == {"total", "compute", "communication", "compression", "data_wait"}
    assert st["compute"] + st["communication"] + st["compression"] + st["data_wait"] == pytest.approx(st["total"])
    assert rec["throughput_samples_per_s"] == pytest.approx(1024 / st["total"])
    assert set(rec["throughput_by_stage"]) == {"warmup", "compression"}
    assert rec["inter_node_bytes_per_step"] > 0 and rec["intra_node_bytes_per_step"] > 0
    assert rec["profile"]["task"] == "resnet50" and rec["cluster_spec"]["name"] == "ethernet_10g"
    assert rec["prediction"]["implementation"] == "this"
    paper = predict_record({**cfg, "predict": {"profile": "paper", "implementation": "paper"}})
    assert paper["prediction"]["implementation"] == "paper"
    json.dumps(rec)
    with pytest.raises(ValueError, match="predict.profile"):
        predict_record({**cfg, "predict": {"profile": None}})


def test_predict_record_from_composed_config(compose):
    cfg = compose(["experiment=table3", "optim=birder", "nodes=4", "cluster=infiniband_200g", "predict.profile=paper"])
    rec = predict_record(cfg)
    assert rec["prediction"]["scheme"] == "hierarchical" and rec["cluster"]["interconnect"] == "infiniband"
    assert rec["throughput_by_stage"] is None and rec["prediction"]["fitted_on"] == {
        "tables": [3, 4],
        "nodes": [2, 4, 8],
    }


# --------------------------------------------------------------------------------- mode=predict, the CLI
def test_cli_predict_mode_writes_a_predicted_record_and_launches_nothing(compose, tmp_path, capsys):
    from birder_repro.cli import run

    cfg = compose(
        ["mode=predict", "experiment=table3", "optim=birder", "nodes=2", "predict.profile=paper"], hydra_config=True
    )
    assert run(cfg, tmp_path / "cell") == 0
    rec = json.loads((tmp_path / "cell" / "record.json").read_text())
    assert rec["status"] == "predicted" and rec["throughput_samples_per_s"] > 0
    assert rec["config"]["predict"]["profile"] == "paper" and rec["command"].startswith("birder-repro")
    assert not (tmp_path / "cell" / "output.log").exists()  # no worker started
    out = capsys.readouterr().out
    assert "throughput:" in out and "step time:" in out and "sent/step:" in out
    # A profile of another task is refused, with a record saying why.
    bad = compose(["mode=predict", "task=resnet20", "predict.profile=paper"], hydra_config=True)
    assert run(bad, tmp_path / "bad") == 2
    assert json.loads((tmp_path / "bad" / "record.json").read_text())["status"] == "failed"


def test_measured_profile_predicts_its_own_one_node_step():
    """A profile as a run writes it, predicted back on its own layout, gives its own step (no communication)."""
    profile = Profile(
        name="run",
        device="cpu",
        task="resnet50",
        batch_size=8,
        forward_backward_s=0.06,
        parameter_count=300,
        optimizer_s=0.004,
        backward_fraction=0.6,
        bucket_elements=[100, 200],
        bucket_ready=[0.1, 1.0],
        bucket_ready_s=[0.0036, 0.036],
        data_wait_s=0.002,
        compression_s_per_element={"birder": 1e-6},
        threads=1,
        host_cores=2,
    )
    emulated = ClusterSpec.from_config(yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text()))
    one = predict_step(profile, emulated, 1, 1, "fp32")
    assert one.total_s == pytest.approx(0.06 + 0.004 + 0.002) and one.data_wait_s == 0.002
    # 4 single-process nodes on this 2-core machine: compute runs at half speed (shared_host).
    four = predict_step(profile, emulated, 4, 1, "fp32")
    assert four.compute_s == pytest.approx(2 * (0.06 + 0.004))
    assert load_profile(json.loads(json.dumps({"profile": profile.to_dict()}))) == profile


def test_the_one_node_leftover_is_charged_once_where_compute_slows_down():
    """The leftover (scheme_overhead_s) is waiting measured on one node: 4 processes on 2 cores double the
    compute and the optimizer's arithmetic, not it. A profile that leaves more than LEFTOVER_WARN of its step
    unexplained says so in every prediction from it."""
    from birder_repro.perf.predict import format_prediction
    from birder_repro.perf.profile import LEFTOVER_WARN

    emulated = ClusterSpec.from_config(yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text()))
    base = dict(name="p", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300)
    plain = Profile(**base, optimizer_s=0.004, threads=1, host_cores=2)
    left = Profile(**base, optimizer_s=0.004, threads=1, host_cores=2, scheme_overhead_s={"fp32": 0.03})
    one, four = (predict_step(p, emulated, 4, 1, "fp32") for p in (plain, left))
    assert four.total_s - one.total_s == pytest.approx(0.03)  # once, not 2 x 0.03
    assert four.compute_s == pytest.approx(2 * (0.06 + 0.004) + 0.03)
    rec = {
        "task": "t",
        "optim": "sgdm",
        "cluster": {"nodes": 4, "gpus_per_node": 1, "name": "emulated"},
        "throughput_samples_per_s": 1.0,
        "global_batch_size": 32,
        "step_time_s": {"total": 0.1, "compute": 0.1, "communication": 0.0, "compression": 0.0},
        "intra_node_bytes_per_step": 0.0,
        "inter_node_bytes_per_step": 0.0,
        "collectives_per_step": 1,
        "prediction": {"scheme": "fp32", "implementation": "this"},
        "profile": {**left.to_dict(), "unexplained_share": {"fp32": 2 * LEFTOVER_WARN}},
    }
    assert "caution:    the profile's 1-node step is 10 % unexplained" in format_prediction(rec)
    rec["profile"]["unexplained_share"] = {"fp32": LEFTOVER_WARN / 2}
    assert "caution" not in format_prediction(rec)


def test_a_flat_data_exchange_overlaps_its_waits_with_its_wire_on_shared_cores():
    """1-bit Adam's exchange (all-to-all and all-gathers over every process) on an emulated cluster takes the
    longer of its waits (its measured per-step latencies and the 1-node leftover) and its bytes on the wire,
    not their sum: known answers on both sides of the crossing, and the sum where the rule does not hold."""
    from birder_repro.perf.cluster import exchange_latency
    from birder_repro.perf.model import waits_overlap_wire

    n, m, size = 2, 2, 800_000
    ops = bucket_collectives("onebit", size, n, m)
    base = dict(name="p", device="cpu", task="t", batch_size=8, forward_backward_s=0.01, parameter_count=size)
    base["bucket_elements"] = [size]  # one bucket, ready as the backward pass ends: nothing hides it
    for mbit, leftover in ((8000.0, 0.02), (80.0, 0.002)):  # waits longer than the wire; the wire longer
        spec = _spec(inter_mbit=mbit, shared_host=True, world_latency_us={"all_gather": 300, "all_to_all": 200})
        flat = Profile(
            **base,
            optimizer_s=0.001,
            scheme_overhead_s={"onebit": leftover},
            compression_s_per_element={"onebit": 1e-9},
        )
        assert waits_overlap_wire(ops, n, spec)
        comm = sum(op_time(op, n, m, spec) for op in ops)
        latency = sum(exchange_latency(op, n, m, spec) for op in ops)
        assert latency == pytest.approx(3 * (3 * 300e-6 + 200e-6))  # 3 all-gathers, 1 all-to-all: N-1 = 3 steps each
        got = predict_step(flat, spec, n, m, "onebit")
        assert got.total_s == pytest.approx(
            0.01 + got.compress_busy_s + 0.001 + max(leftover + latency, comm - latency)
        )
        summed = predict_step(flat, dataclasses.replace(spec, shared_host=False), n, m, "onebit")
        assert summed.total_s == pytest.approx(0.01 + got.compress_busy_s + 0.001 + leftover + comm)
    # one node: no wire; a reducing exchange and a staged one: their waits and bytes add
    assert not waits_overlap_wire(bucket_collectives("onebit", size, 1, m), 1, spec)
    assert not waits_overlap_wire(bucket_collectives("fp16", size, n, m), n, spec)
    assert not waits_overlap_wire(bucket_collectives("hierarchical", size, n, m), n, spec)
    with pytest.raises(ValueError, match="not an exchange over every process"):
        exchange_latency(Collective("allreduce", "world", 8.0), n, m, spec)


def test_a_measured_profile_prices_powersgd_compression_at_the_runs_rank_and_shapes():
    """The profile's seconds per element are the run's compression seconds over the elements the model counts
    at the run's own rank and matrices, so that predicting the run's own layout gives its seconds back."""
    from birder_repro.perf.profile import bucket_matrices
    from birder_repro.train.profile import _per_element, parameter_matrices

    layer = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))
    mats = parameter_matrices(layer.parameters())
    assert mats == [[32, 64], [32], [16, 32], [16]]
    sizes = [16 * 32 + 16, 32 * 64 + 32]  # DDP's buckets: the last layer's first
    assert bucket_matrices(mats, sizes) == [[[16], [16, 32]], [[32], [32, 64]]]
    per = _per_element("powersgd", sizes, 1, 2, 0.004, 4, bucket_matrices(mats, sizes))["powersgd"]
    elements = sum(
        compressed_elements("powersgd", b, 1, 2, rank=4, matrices=g)
        for b, g in zip(sizes, bucket_matrices(mats, sizes))
    )
    assert per * elements == pytest.approx(0.004)
    at_rank_one = _per_element("powersgd", sizes, 1, 2, 0.004, 1, bucket_matrices(mats, sizes))["powersgd"]
    assert at_rank_one > per  # fewer elements at rank 1: each costs more
    assert bucket_matrices([], [10, 20]) == [None, None]  # no shapes recorded: each bucket a square


def test_a_runs_profile_counts_powersgds_compression_at_the_configured_rank():
    """measured_profile reads the rank from the run's config (optim.comm.rank) and records the shapes."""
    from omegaconf import OmegaConf

    from birder_repro.perf.profile import bucket_matrices
    from birder_repro.train.profile import measured_profile

    mats, sizes = [[32, 64], [32], [16, 32], [16]], [16 * 32 + 16, 32 * 64 + 32]
    cfg = OmegaConf.create({"task": {"name": "t"}, "optim": {"name": "sgdm_powersgd", "comm": {"rank": 4}}})
    record = {"forward_backward_s": 0.01, "parameters": sum(sizes), "batch_size": 8, "timed_steps": 5}
    calls = [[(0, sizes[0], 0.001), (1, sizes[1], 0.002)]]
    got = measured_profile(
        cfg,
        record,
        bucket_steps=calls,
        backward_s=0.006,
        optimizer_s=0.001,
        compress_s=0.004,
        nodes=2,
        gpus_per_node=1,
        device="cpu",
        threads=1,
        matrices=mats,
    )
    elements = sum(
        compressed_elements("powersgd", b, 2, 1, rank=4, matrices=g, alone=True)
        for b, g in zip(sizes, bucket_matrices(mats, sizes))
    )
    assert got["compression_s_per_element"]["powersgd"] == pytest.approx(0.004 / elements)
    assert got["matrices"] == mats


def test_compressed_elements_alone_counts_a_lone_process():
    assert compressed_elements("hierarchical", 800, 1, 1) == 0
    assert compressed_elements("hierarchical", 800, 1, 1, alone=True) == 4 * 800  # 2P/m + P/N + P at n = m = 1


def test_validate_emulated_from_records(tmp_path):
    from birder_repro.perf.emulated import emulated_frame, format_emulated
    from birder_repro.perf.predict import predict_record as predicted

    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text())
    profile = Profile(
        name="run",
        device="cpu",
        task="resnet50",
        batch_size=8,
        forward_backward_s=0.06,
        parameter_count=5_000_000,
        optimizer_s=0.004,
        threads=1,
        host_cores=64,
    ).to_dict()
    for i, nodes in enumerate((1, 2, 4)):
        cfg = {
            "task": {"name": "resnet50"},
            "optim": {"name": "sgdm"},
            "nodes": nodes,
            "gpus_per_node": 1,
            "cluster": {**cluster, "link_mbit": 100},
            "train": {"batch_size": 8, "steps": 15},
            "predict": {"profile": profile},
            "model": {"size": "tiny"},
            "data": {"image_size": 64},
        }
        rec = predicted(cfg)
        rec.update(status="completed", config=cfg, started=f"2025-01-01T10:00:0{i}", run_dir=str(tmp_path / str(i)))
        rec["throughput_samples_per_s"] *= 1.05 if nodes == 2 else 1.0  # "measured" 5 % above the model
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "record.json").write_text(json.dumps(rec))
    frame = emulated_frame(tmp_path)
    assert sorted(frame["nodes"]) == [2, 4]
    assert frame.set_index("nodes")["error"][2] == pytest.approx(1 / 1.05 - 1)
    assert frame.set_index("nodes")["error"][4] == pytest.approx(0.0, abs=1e-9)
    assert "meets the target" in format_emulated(frame)


# ------------------------------------------------------------------------------------------ link probe
def test_link_probe_fit_recovers_alpha_and_bandwidth():
    from birder_repro.perf.measure import fit_alpha_beta

    n, alpha, beta = 4, 2e-4, 1 / 12.5e6  # 100 Mbit/s
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    times = [(n - 1) * alpha + (n - 1) / n * s * beta for s in sizes]
    assert fit_alpha_beta(sizes, times, n) == pytest.approx((alpha, beta))
    assert fit_alpha_beta([1.0, 2.0], [1.0, 0.5], 2)[1] == 0.0  # never a negative cost per byte


def _slowest(rank: int, world: int) -> list[float]:
    from birder_repro.perf.measure import slowest_rank

    return slowest_rank([0.1 * (rank + 1), 0.5 - 0.1 * rank])


def test_link_probe_takes_each_call_at_its_slowest_rank():
    # Rank 0 timed (0.1, 0.5), rank 1 (0.2, 0.4): every rank gets (0.2, 0.5), the calls as the step sees them.
    assert run_distributed(_slowest, 2) == [pytest.approx([0.2, 0.5])] * 2


# ------------------------------------------------------------------------------------ mode=probe
def test_bus_bandwidth_factors_and_sizes_as_nccl_tests():
    from birder_repro.perf.measure import bus_factor, latency_steps, table_rows
    from birder_repro.perf.probe import probe_sizes

    # nccl-tests (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, reduce-scatter, all-gather, all-to-all (n-1)/n
    assert [bus_factor(k, 8) for k in ("allreduce", "reduce_scatter", "all_gather", "all_to_all")] == [
        1.75,
        0.875,
        0.875,
        0.875,
    ]
    assert (latency_steps("allreduce", 4), latency_steps("all_to_all", 4)) == (6, 3)
    assert probe_sizes(4096, 1 << 20, 4) == [4096, 16384, 65536, 262144, 1048576]
    assert probe_sizes(1000, 5000, 2) == [1000, 2000, 4000, 5000]
    # 1 MiB all-reduced over 2 processes in 0.1 s: algbw 10,485,760 B/s, busbw the same (factor 1); the
    # all-to-all of the same size and time moves half of it off each process: busbw half the algbw.
    rows = table_rows({"allreduce": {1 << 20: [0.3, 0.1, 0.05]}, "all_to_all": {1 << 20: [0.1]}}, 2)
    assert [(r["algbw_Bps"], r["busbw_Bps"]) for r in rows] == [
        (10_485_760.0, 10_485_760.0),
        (10_485_760.0, 5_242_880.0),
    ]
    assert rows[0]["seconds"] == 0.1 and rows[0]["calls_s"] == [0.3, 0.1, 0.05]  # the median call; every call kept
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("gossip", 2)


def test_robust_fit_recovers_the_link_despite_a_slow_call():
    from birder_repro.perf.measure import fit_alpha_beta

    # 100 Mbit/s (12.5 MB/s) and 300 us a step, all-reduce over 2 processes: t = 2 alpha + S / bandwidth
    sizes = [4096 * 4**k for k in range(7)]
    times = [2 * 300e-6 + s / 12.5e6 for s in sizes]
    assert fit_alpha_beta(sizes, times, 2, "allreduce", robust=True) == pytest.approx((300e-6, 1 / 12.5e6))
    assert fit_alpha_beta(sizes, times, 2, "allreduce") == pytest.approx((300e-6, 1 / 12.5e6))
    # The smallest call slowed 10x by a busy machine: the robust fit keeps both numbers, the relative errors of
    # least squares would not.
    slowed = [10 * times[0], *times[1:]]
    alpha, beta = fit_alpha_beta(sizes, slowed, 2, "allreduce", robust=True)
    assert alpha == pytest.approx(300e-6, rel=1e-6) and 1 / beta == pytest.approx(12.5e6, rel=1e-6)


# mode=probe's inter-node times (microseconds, the median of each call's slowest rank) between two emulated nodes
# at 100 Mbit/s, measured on a quiet machine: calls up to 256 KiB beat the link (the tbf's burst and the sockets'
# buffers take them), the megabyte calls run at its rate.
EMULATED_100M = {
    "allreduce": {
        4096: 260.2,
        16384: 1371.5,
        65536: 5542.4,
        262144: 24075.7,
        1048576: 90699.7,
        4194304: 383629.9,
        16777216: 1532982.7,
    },
    "all_gather": {
        4096: 221.7,
        16384: 350.3,
        65536: 2713.7,
        262144: 15405.1,
        1048576: 49013.8,
        4194304: 293541.8,
        16777216: 1101178.5,
    },
    "all_to_all": {
        4096: 112.5,
        16384: 645.1,
        65536: 4419.4,
        262144: 15175.4,
        1048576: 86381.6,
        4194304: 350146.0,
        16777216: 1405038.2,
    },
}


def test_probe_fit_takes_the_bandwidth_from_the_large_messages():
    from birder_repro.perf.measure import bus_factor, fit_level

    results = {k: {s: [us * 1e-6] for s, us in v.items()} for k, v in EMULATED_100M.items()}
    fits = fit_level(results, 2)

    def mbit(kind: str, size: int) -> float:  # nccl-tests' bus bandwidth of one measured call
        return bus_factor(kind, 2) * size / results[kind][size][0] * 8 / 1e6

    for kind in results:
        plateau = [mbit(kind, s) for s in (1 << 20, 4 << 20, 16 << 20)]
        fitted = fits[kind]["bandwidth_Bps"] * 8 / 1e6
        # Within the spread of the megabyte calls' own rates, however fast the small calls were.
        assert min(plateau) * 0.95 <= fitted <= max(plateau) * 1.2, (kind, fitted, plateau)
    # The all-to-all ran at 47.8-48.6 Mbit/s from 1 MiB up; its 4-256 KiB calls at 59-146. A line through all
    # seven sizes by relative deviations (the fit before this one) said 69.
    assert 47.8 - 0.1 <= fits["all_to_all"]["bandwidth_Bps"] * 8 / 1e6 <= 48.6 + 0.1
    # Alpha is the small messages' floor: at most the smallest call's time per network step.
    assert all(0 <= f["alpha_s"] <= results[k][4096][0] for k, f in fits.items())
    # Another probe's exchanges ran in spells at twice that rate: 5 of the 4 MiB and of the 16 MiB all-to-all's
    # 9 calls at about 90 Mbit/s (both sizes' median calls among them). Over every call of the plateau the fit
    # stays at the usual rate; neither the median of those calls (19 of 36 fast, with the 256 KiB ones) nor a
    # quartile of the sizes' medians would.
    calls = {s: [t[0]] * 9 for s, t in results["all_to_all"].items()}
    calls[16 << 20] = [740648.5e-6] * 5 + [1405038.2e-6] * 4
    calls[4 << 20] = [185000.0e-6] * 5 + [350146.0e-6] * 4
    assert 47.8 - 0.1 <= fit_level({"all_to_all": calls}, 2)["all_to_all"]["bandwidth_Bps"] * 8 / 1e6 <= 48.6 + 0.1


INTER3 = ("allreduce", "all_gather", "all_to_all")


def test_spec_from_fits_by_hand():
    from birder_repro.perf.probe import spec_from_fits

    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text())
    cluster["link_mbit"] = 100
    inter = {
        "allreduce": {"alpha_s": 3e-4, "bandwidth_Bps": 11.5e6},  # 92 Mbit/s
        "reduce_scatter": {"alpha_s": 9e-3, "bandwidth_Bps": 5.0e6},  # not priced across nodes
        "all_gather": {"alpha_s": 1e-4, "bandwidth_Bps": 8.0e6},  # 64 Mbit/s
        "all_to_all": {"alpha_s": 2e-4, "bandwidth_Bps": 6.0e6},
    }  # 48 Mbit/s
    spec = spec_from_fits(cluster, inter, None)
    perf = spec["perf"]
    assert perf["inter_efficiency"] == pytest.approx(0.92)
    assert perf["exchange_efficiency"] == pytest.approx(0.56)  # (64 + 48) / 2 of 100
    assert perf["inter_latency_us"] == pytest.approx(200.0)  # median of 300, 100, 200
    assert perf["shared_host"] is True and perf["intra_mbit"] == cluster["perf"]["intra_mbit"]  # kept
    assert spec["link_mbit"] == 100 and spec["name"] == "emulated"
    assert ClusterSpec.from_config(spec).exchange.bandwidth_Bps == pytest.approx(7.0e6)
    # No line rate given: the all-reduce's rate is the link, the exchanges a fraction of it; intra measured.
    intra = {k: {"alpha_s": 2e-5, "bandwidth_Bps": 1e9} for k in inter}
    unlined = spec_from_fits({**cluster, "link_mbit": None}, inter, intra)["perf"]
    assert unlined["inter_mbit"] == pytest.approx(92.0) and unlined["inter_efficiency"] == 1.0
    assert unlined["exchange_efficiency"] == pytest.approx(7.0 / 11.5)
    assert (unlined["intra_mbit"], unlined["intra_latency_us"]) == pytest.approx((8000.0, 20.0))
    # Faster than the stated line: capped at 1 (the setting is low), never an invalid spec.
    fast = {**inter, "allreduce": {"alpha_s": 3e-4, "bandwidth_Bps": 20e6}}
    assert spec_from_fits(cluster, fast, None)["perf"]["inter_efficiency"] == 1.0
    # Every process at once (several a node): each kind's step latency, as the model prices a world exchange.
    world = {k: {"alpha_s": a, "bandwidth_Bps": 1e9} for k, a in zip(inter, (1e-3, 2e-3, 1.5e-3, 9e-4))}
    got = spec_from_fits(cluster, inter, intra, world)["perf"]["world_latency_us"]
    assert got == pytest.approx({"allreduce": 1000.0, "all_gather": 1500.0, "all_to_all": 900.0})
    # The 16-bit sums' cost beyond their bytes, at least 0; without the measurement the config's is kept.
    reduce = {"float16": {"extra_ns_per_element": 7.5}, "bfloat16": {"extra_ns_per_element": -1.0}}
    got = spec_from_fits(cluster, inter, intra, world, reduce)["perf"]["reduce_ns_per_element"]
    assert got == {"float16": 7.5, "bfloat16": 0.0}
    kept = spec_from_fits(cluster, inter, intra, world)["perf"].get("reduce_ns_per_element")
    assert kept == cluster["perf"].get("reduce_ns_per_element")
    # Every local rank's inter-node group at once: each kind's step latency.
    inter_all = {k: {"alpha_s": a, "bandwidth_Bps": 1e9} for k, a in zip(INTER3, (2e-3, 1.5e-3, 3e-4))}
    got = spec_from_fits(cluster, inter, intra, world, None, inter_all)["perf"]["inter_all_latency_us"]
    assert got == pytest.approx({"allreduce": 2000.0, "all_gather": 1500.0, "all_to_all": 300.0})


def test_probe_settings_are_checked(compose):
    from birder_repro.config.settings import ConfigError, validate
    from birder_repro.train import checks  # noqa: F401 - the probe section's check is installed by the app's table

    with pytest.raises(ConfigError, match="probe.step_factor=1"):
        validate(compose(["mode=probe", "probe.step_factor=1"]))
    with pytest.raises(ConfigError, match="probe.max_bytes=100 is below"):
        validate(compose(["mode=probe", "probe.min_bytes=4096", "probe.max_bytes=100"]))
    with pytest.raises(ConfigError, match="nodes=1: mode=probe"):
        validate(compose(["mode=probe", "nodes=1"]))


def test_cli_probe_local_writes_a_spec_that_predict_reads(compose, tmp_path, capsys):
    """mode=probe through the CLI and torchrun (2 nodes x 2 processes on this machine, loopback), then
    mode=predict with its spec: the wiring, the record and the spec. The rates of loopback mean nothing."""
    from birder_repro.cli import run

    probe = compose(
        [
            "mode=probe",
            "nodes=2",
            "gpus_per_node=2",
            "logger=none",
            "probe.min_bytes=4096",
            "probe.max_bytes=65536",
            "probe.iters=2",
            "probe.warmup_iters=1",
            "probe.reduce_elements=4096",
        ],
        hydra_config=True,
    )
    assert run(probe, tmp_path / "probe") == 0
    rec = json.loads((tmp_path / "probe" / "record.json").read_text())
    assert rec["status"] == "completed" and rec["error"] is None and rec["config"]["mode"] == "probe"
    got = rec["probe"]
    assert [(r["kind"], r["bytes"]) for r in got["inter"]] == [
        (k, s) for k in ("allreduce", "reduce_scatter", "all_gather", "all_to_all") for s in (4096, 16384, 65536)
    ]
    assert len(got["intra"]) == len(got["world"]) == 12 and set(got["fits"]) == {"inter", "intra", "world", "inter_all"}
    for r in got["inter"]:  # busbw = size / time x the factor, as the table prints it
        factor = 1.0 if r["kind"] == "allreduce" else 0.5
        assert r["busbw_Bps"] == pytest.approx(r["bytes"] / r["seconds"] * factor)
    out = capsys.readouterr().out
    assert "busbw (Mbit/s)" in out and "cluster spec:" in out and "world (every process" in out
    assert set(got["cluster_spec"]["world_latency_us"]) == {"allreduce", "all_gather", "all_to_all"}
    assert {r["kind"] for r in got["inter_all"]} == {"allreduce", "all_gather", "all_to_all"}
    assert set(got["cluster_spec"]["inter_all_latency_us"]) == {"allreduce", "all_gather", "all_to_all"}
    assert "every local rank's group at once" in out
    for dtype in ("float16", "bfloat16"):  # the 16-bit sums over every process, beside fp32 of the same bytes
        r = got["reduce"][dtype]
        assert r["elements"] >= 1024 and r["seconds"] > 0 and r["fp32_same_bytes_s"] > 0
        assert r["extra_ns_per_element"] == pytest.approx(
            1e9 * (r["seconds"] - r["fp32_same_bytes_s"]) / (3 / 4 * r["elements"])
        )
        assert got["cluster_spec"]["reduce_ns_per_element"][dtype] == max(0.0, r["extra_ns_per_element"])
    assert "float16 sum over every process" in out
    spec_file = Path(got["cluster_spec_file"])
    spec = yaml.safe_load(spec_file.read_text())
    assert spec["probe"]["intra_measured"] is True and "fitted_on" not in spec["perf"]
    assert spec["perf"]["inter_latency_us"] == pytest.approx(
        1e6 * sorted(got["fits"]["inter"][k]["alpha_s"] for k in ("allreduce", "all_gather", "all_to_all"))[1]
    )
    # mode=predict reads it: the record's cluster spec is the probe's, and no paper row was fitted on it.
    pred = compose(
        [
            "mode=predict",
            "experiment=table3",
            "optim=birder",
            "nodes=2",
            "gpus_per_node=2",
            "predict.profile=paper",
            f"predict.cluster_spec={spec_file}",
        ],
        hydra_config=True,
    )
    assert run(pred, tmp_path / "pred") == 0
    prec = json.loads((tmp_path / "pred" / "record.json").read_text())
    assert prec["cluster_spec"]["inter_latency_us"] == pytest.approx(spec["perf"]["inter_latency_us"])
    assert prec["prediction"]["fitted_on"] is None and prec["prediction"]["cluster_spec_file"] == str(spec_file)
    missing = compose(
        [
            "mode=predict",
            "experiment=table3",
            "predict.profile=paper",
            f"predict.cluster_spec={tmp_path / 'nowhere.yaml'}",
        ],
        hydra_config=True,
    )
    assert run(missing, tmp_path / "missing") == 2
    assert "predict.cluster_spec=" in json.loads((tmp_path / "missing" / "record.json").read_text())["error"]


def test_predicted_cells_say_whether_their_row_was_fitted(compose, tmp_path):
    """paper_comparison.md: with the shipped Ethernet links (fitted on Tables 3-4 at 2, 4, 8 nodes), Table 3's
    2-node cell is in-sample, Table 1's 128-per-GPU cell held out, the 1-node cell the profile's own."""
    from birder_repro.cli import run
    from birder_repro.report.__main__ import main as tables_main

    runs = tmp_path / "runs"
    cells = [
        ("table3", "1", "sgdm"),
        ("table3", "2", "sgdm"),
        ("table3", "2", "birder"),
        ("table1", "2", "birder"),
        ("table1", "2", "sgdm"),
    ]
    for i, (exp, nodes, optim) in enumerate(cells):
        batch = ["train.batch_size=128"] if exp == "table1" else []
        cfg = compose(
            [
                "mode=predict",
                f"experiment={exp}",
                f"optim={optim}",
                f"nodes={nodes}",
                "predict.profile=paper",
                "predict.implementation=paper",
                *batch,
            ],
            hydra_config=True,
        )
        assert run(cfg, runs / f"{i}_{exp}_{optim}_{nodes}") == 0
    tables_main(["--runs", str(runs), "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "fig")])
    text = (tmp_path / "out" / "paper_comparison.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| resnet50")]
    by_cell = {
        (line.split("|")[2].strip(), line.split("|")[3].strip(), line.split("|")[4].strip()): line for line in lines
    }
    assert "IN-SAMPLE: fitted on" in by_cell[("16 (2x8)", "32", "Birder")]
    assert "held out" in by_cell[("16 (2x8)", "128", "Birder")]
    assert "1-node row" in by_cell[("8 (1x8)", "32", "SGDM")]
    assert "Held-out multi-node rows (not used to fit the links)" in text


@pytest.mark.slow
def test_probe_on_the_emulated_cluster_measures_the_shaped_rate(compose, tmp_path):
    """mode=probe between two emulated nodes at 100 Mbit/s (tc tbf): the all-reduce's bus bandwidth for large
    messages (1-16 MiB) is within 10 % of what the shaping lets through as payload, 93.6 Mbit/s: each 1448-byte
    TCP segment is a 1514-byte frame to the tbf, and since both directions carry data, each direction's tbf also
    carries the other's ACKs (66 bytes per two segments, delayed ACKs): 100 x 1448 / (1514 + 33). The fit, the rate
    three calls in four reach, lies below the median calls by their spread (83.9-88.4 Mbit/s over 8 probes), and
    the all-to-all's stays at its usual 48 Mbit/s whatever spells of calls at twice that rate the probe met."""
    import shutil

    from birder_repro.cli import run

    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("cluster=emulated needs root and iproute2 (make emulated-setup)")
    cfg = compose(
        [
            "mode=probe",
            "nodes=2",
            "cluster=emulated",
            "cluster.link_mbit=100",
            "logger=none",
            "probe.min_bytes=65536",
            "probe.max_bytes=16777216",
        ],
        hydra_config=True,
    )
    assert run(cfg, tmp_path / "probe") == 0
    rec = json.loads((tmp_path / "probe" / "record.json").read_text())
    payload = 100e6 / 8 * 1448 / (1514 + 33)
    large = [r["busbw_Bps"] for r in rec["probe"]["inter"] if r["kind"] == "allreduce" and r["bytes"] >= 1 << 20]
    assert len(large) == 3 and statistics.median(large) == pytest.approx(payload, rel=0.10)
    fits = rec["probe"]["fits"]["inter"]
    assert 0.85 * payload <= fits["allreduce"]["bandwidth_Bps"] <= max(large)
    assert fits["all_to_all"]["bandwidth_Bps"] * 8 / 1e6 == pytest.approx(48.2, rel=0.10)
    spec = yaml.safe_load(Path(rec["probe"]["cluster_spec_file"]).read_text())
    assert spec["perf"]["inter_efficiency"] == pytest.approx(fits["allreduce"]["bandwidth_Bps"] * 8 / 100e6)


def test_the_new_fields_schemes_are_priced_diloco_once_per_outer_step():
    """The two-level all-reduce sends each node's 2 (n-1)/n of the bucket across nodes (a flat ring more) and
    compresses nothing (bf16: the casts); DiLoCo sends nothing across nodes in a step of its own and its outer
    exchange, charged 1/H to every step, shrinks as H grows."""
    from birder_repro.perf.cluster import ClusterSpec
    from birder_repro.perf.model import predict_step
    from birder_repro.perf.profile import Profile
    from birder_repro.perf.schemes import bucket_collectives, compressed_elements, counted_bytes, sync_collectives

    numel, n, m = 1_000_000, 2, 2
    inter = sum(counted_bytes(op, n, m)[1] for op in bucket_collectives("two_level", numel, n, m))
    flat = sum(counted_bytes(op, n, m)[1] for op in bucket_collectives("fp32", numel, n, m))
    assert m * inter == pytest.approx(2 * (n - 1) / n * 4 * numel) and m * inter < m * flat
    assert compressed_elements("two_level", numel, n, m) == 0
    assert compressed_elements("two_level_bf16", numel, n, m) == 2 * numel
    assert compressed_elements("diloco", numel, n, m) == 0
    assert not [op for op in bucket_collectives("diloco", numel, n, m) if op.group != "intra"]
    assert [op.group for op in sync_collectives("diloco", numel, n, m)] == ["inter", "intra"]
    profile = Profile(
        name="p", device="cpu", task="t", batch_size=64, forward_backward_s=0.01, parameter_count=numel,
        optimizer_s=0.001, threads=1, host_cores=8,
    )  # fmt: skip
    spec = ClusterSpec(
        name="x", intra_mbit=100_000, inter_mbit=100, inter_latency_us=50, inter_efficiency=1.0, intra_latency_us=5
    )
    steps = [predict_step(profile, spec, n, m, "diloco", local_steps=h) for h in (1, 10, 100)]
    assert steps[0].total_s > steps[1].total_s > steps[2].total_s
    assert steps[1].inter_node_bytes == pytest.approx(steps[0].inter_node_bytes / 10)


def test_a_one_node_profile_records_its_leftover_and_its_share_of_the_step():
    from birder_repro.train.profile import _add_overhead

    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text())
    profile = Profile(name="p", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300)
    modelled = predict_step(profile, ClusterSpec.from_config(cluster), 1, 2, "fp32").total_s
    _add_overhead(profile, {"cluster": cluster}, {"step_time_s": {"total": modelled + 0.04}}, "fp32", 2)
    assert profile.scheme_overhead_s["fp32"] == pytest.approx(0.04)
    assert profile.unexplained_share["fp32"] == pytest.approx(0.04 / (modelled + 0.04))
    assert profile.loop_overhead_s == 0.0  # no loop_step_s in the record (an older run): nothing measured
    # predicted as the run ran: PowerSGD at its rank
    base = dict(name="q", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300_000)
    own = Profile(**base, compression_s_per_element={"powersgd": 1e-9})
    step = predict_step(own, ClusterSpec.from_config(cluster), 1, 2, "powersgd", rank=4).total_s + 0.005
    _add_overhead(own, {"cluster": cluster}, {"step_time_s": {"total": step}}, "powersgd", 2, 4)
    assert own.scheme_overhead_s["powersgd"] == pytest.approx(0.005)


def test_a_one_node_profile_measures_the_loops_own_work_beyond_the_step_and_its_collectives():
    """Profile.loop_overhead_s: the record's loop_step_s beyond the step and the loop's two all-reduces as the
    model prices them on the profile's layout; the training clock's steps carry it on every layout."""
    from birder_repro.perf.advise import step_times
    from birder_repro.perf.model import loop_collectives_s
    from birder_repro.train.profile import _add_overhead

    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text())
    spec = ClusterSpec.from_config(cluster)
    profile = Profile(name="p", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300)
    step = predict_step(profile, spec, 1, 2, "fp32").total_s + 0.01
    loop = step + loop_collectives_s(spec, 1, 2) + 0.0035
    _add_overhead(profile, {"cluster": cluster}, {"step_time_s": {"total": step}, "loop_step_s": loop}, "fp32", 2)
    assert profile.loop_overhead_s == pytest.approx(0.0035)
    timed = step_times(profile, spec, 2, 2, "fp32", 8, loop=False)
    clock = step_times(profile, spec, 2, 2, "fp32", 8)
    assert clock[1] - timed[1] == pytest.approx(loop_collectives_s(spec, 2, 2) + 0.0035)
    assert clock[0] - timed[0] == pytest.approx(loop_collectives_s(spec, 2, 2) + 0.0035)
    short = Profile(name="q", device="cpu", task="t", batch_size=8, forward_backward_s=0.06, parameter_count=300)
    _add_overhead(short, {"cluster": cluster}, {"step_time_s": {"total": step}, "loop_step_s": step}, "fp32", 2)
    assert short.loop_overhead_s == 0.0  # a loop measured under its collectives' price: none, never negative
