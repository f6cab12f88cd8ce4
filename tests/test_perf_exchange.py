"""The pairwise exchanges across nodes (the 1-bit exchanges' all-to-all and all-gather) at their own measured shape
and rate: found from how their time grows (birder_repro.perf.exchange_shape), written by mode=probe
(perf.exchange_probe), read back by ClusterSpec and priced by the model instead of the all-reduce's rate."""

import math

import pytest
import yaml

from birder_repro.perf.cluster import ClusterSpec, op_time
from birder_repro.perf.exchange_probe import exchange_spec
from birder_repro.perf.exchange_shape import (
    ExchangeFit,
    ExchangeSample,
    exchange_multiple,
    exchange_steps,
    fit_exchange,
    rank_exchange_shapes,
)
from birder_repro.perf.implementations import Implementation
from birder_repro.perf.model import predict_step
from birder_repro.perf.profile import Profile
from birder_repro.perf.schemes import Collective, bucket_collectives

M = 4
SIZES = (64e3, 4e6, 40e6)
BASE = dict(
    name="c", inter_mbit=10_000.0, inter_latency_us=50.0, inter_efficiency=0.5, intra_mbit=100_000.0,
    intra_latency_us=5.0,
)  # fmt: skip


def _made_up(truth: ExchangeFit, group: str, counts=(2, 4), sizes=SIZES) -> list[ExchangeSample]:
    return [ExchangeSample(n, M, ((group, s),), truth.seconds(group, s, n, M)) for n in counts for s in sizes]


def test_the_shapes_steps_and_multiples_on_a_known_layout():
    # world over 4 nodes of 4 (N = 16): a step per peer; a node's 4 processes send 12/16 of S each off-node
    assert exchange_steps("pairwise", "world", 4, 4) == 15 and exchange_multiple("pairwise", "world", 4, 4) == 3.0
    assert exchange_steps("ring", "world", 4, 4) == 15 and exchange_multiple("ring", "world", 4, 4) == 15 / 16
    # the shared fabric: every cross-node message (16 x 12) and byte (16 x 12 / 16 of S) of the whole network
    assert exchange_steps("shared_fabric", "world", 4, 4) == 192
    assert exchange_multiple("shared_fabric", "world", 4, 4) == 12.0
    # among the nodes, every local rank's group at once (Birder's): 4 groups of 4 share each node's link
    assert exchange_steps("pairwise", "inter", 4, 4) == 3 and exchange_multiple("pairwise", "inter", 4, 4) == 3.0
    assert (
        exchange_steps("shared_fabric", "inter", 4, 4) == 48 and exchange_multiple("shared_fabric", "inter", 4, 4) == 12
    )
    assert exchange_steps("pairwise", "world", 1, 4) == 0 and exchange_multiple("ring", "world", 1, 4) == 0.0
    with pytest.raises(ValueError, match="unknown exchange shape"):
        exchange_steps("butterfly", "world", 2, 4)
    with pytest.raises(ValueError, match="'world' or 'inter'"):
        exchange_steps("pairwise", "intra", 2, 4)


# Among the nodes (one process a node) a ring costs as the pairwise exchange, so ("ring", "inter") is found as
# pairwise: that pair is not a case of its own.
@pytest.mark.parametrize(
    "shape, group",
    [(s, g) for s in ("pairwise", "ring", "shared_fabric") for g in ("world", "inter") if (s, g) != ("ring", "inter")],
)
def test_a_made_up_exchange_of_each_shape_is_found_with_its_rate(shape, group):
    truth = ExchangeFit(shape, alpha_s=40e-6, bytes_per_s=0.8e9)
    ranked = rank_exchange_shapes(_made_up(truth, group))
    assert ranked[0].shape == shape
    assert ranked[0].bytes_per_s == pytest.approx(0.8e9, rel=1e-6)
    assert ranked[0].alpha_s == pytest.approx(40e-6, rel=1e-4)
    assert ranked[0].residual == pytest.approx(0.0, abs=1e-12)
    # one process a node: a ring costs as the pairwise exchange
    same_cost = {"pairwise", "ring"} if group == "inter" and shape == "pairwise" else {shape}
    assert all(f.residual > 1e-3 for f in ranked if f.shape not in same_cost)


def test_one_size_the_growth_alone_tells_a_surge_from_a_pairwise_exchange():
    # the Birder paper's 1-bit Adam: its exchange grew x2.6-4.4 from 2 to 4 nodes of 8, far beyond a pairwise
    # exchange's x1.5 in a node's bytes: the shared fabric's x3 in the network's bytes
    surge = [ExchangeSample(2, 8, (("world", 6.4e6),), 0.017), ExchangeSample(4, 8, (("world", 6.4e6),), 0.061)]
    found = rank_exchange_shapes(surge)[0]
    assert found.shape == "shared_fabric" and found.alpha_s == 0.0  # one size: no latency separated
    gentle = [ExchangeSample(2, 8, (("world", 6.4e6),), 0.017), ExchangeSample(4, 8, (("world", 6.4e6),), 0.026)]
    assert rank_exchange_shapes(gentle)[0].shape == "pairwise"


def test_the_fit_keeps_alpha_and_the_rate_non_negative_and_needs_two_node_counts():
    # latency only (the same time at every size): no negative rate, an infinite one
    flat = [ExchangeSample(n, M, (("world", s),), 1e-3 * (n * M - 1)) for n in (2, 4) for s in SIZES]
    fit = fit_exchange("pairwise", flat)
    assert fit.alpha_s == pytest.approx(1e-3) and fit.seconds("world", 40e6, 8, M) == pytest.approx(31e-3)
    with pytest.raises(ValueError, match="two node counts"):
        fit_exchange("pairwise", [ExchangeSample(2, M, (("world", 1e6),), 0.01)])
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_exchange("pairwise", [ExchangeSample(n, M, (("world", 1e6),), 0.0) for n in (2, 4)])


def test_a_measured_exchange_is_priced_at_its_own_rate_not_the_all_reduces():
    fit = ExchangeFit("shared_fabric", alpha_s=10e-6, bytes_per_s=2e9)
    allreduce = {"shape": "flat_ring", "alpha_us": 100.0, "bytes_per_s": 0.5e9}
    spec = ClusterSpec(**BASE, allreduce_shape=allreduce, exchange_shape={"world": fit.to_dict()})
    a2a = Collective("all_to_all", "world", 8e6)
    assert op_time(a2a, 8, 4, spec) == pytest.approx(10e-6 * 32 * 28 + 8e6 * 32 * 28 / 32 / 2e9)
    assert op_time(Collective("all_gather", "world", 8e6), 8, 4, spec) == pytest.approx(fit.seconds("world", 8e6, 8, 4))
    # the all-reduce keeps its own shape; the inter group, not measured, keeps the links' formula
    assert op_time(Collective("allreduce", "world", 8e6), 8, 4, spec) == pytest.approx(
        spec.allreduce_shape.seconds(8e6, 8, 4, op_time(Collective("allreduce", "intra", 8e6), 1, 4, spec))
    )
    inter = Collective("all_to_all", "inter", 8e6)
    assert op_time(inter, 8, 4, spec) == pytest.approx(op_time(inter, 8, 4, ClusterSpec(**BASE)))
    assert op_time(a2a, 1, 4, spec) == pytest.approx(op_time(a2a, 1, 4, ClusterSpec(**BASE)))  # inside one node
    # the emulated cluster keeps its validated wait model
    emulated = dict(BASE, shared_host=True)
    assert op_time(a2a, 8, 4, ClusterSpec(**emulated, exchange_shape={"world": fit})) == pytest.approx(
        op_time(a2a, 8, 4, ClusterSpec(**emulated))
    )


def test_the_spec_reads_its_exchange_shapes_and_refuses_bad_ones():
    cfg = {
        "name": "probed", "link_mbit": 10_000,
        "perf": {
            "inter_latency_us": 50, "inter_efficiency": 0.5, "intra_mbit": 100_000, "intra_latency_us": 5,
            "exchange_shape": {"inter": {"shape": "pairwise", "alpha_us": 20.0, "bytes_per_s": 1e9}},
        },
    }  # fmt: skip
    spec = ClusterSpec.from_config(yaml.safe_load(yaml.safe_dump(cfg)))
    got = spec.measured_exchange("inter")
    assert (got.shape, got.alpha_s, got.bytes_per_s) == ("pairwise", pytest.approx(20e-6), 1e9)
    assert spec.measured_exchange("world") is None
    for bad, match in (
        ({"intra": {"shape": "pairwise", "bytes_per_s": 1e9}}, "'world', 'inter'"),
        ({"world": {"shape": "mesh", "bytes_per_s": 1e9}}, "unknown exchange shape"),
        ({"world": {"shape": "pairwise", "bytes_per_s": 0.0}}, "bytes_per_s must be > 0"),
        ({"world": {"alpha_us": 5.0}}, "give shape, alpha_us and bytes_per_s"),
    ):
        with pytest.raises(ValueError, match=match):
            ClusterSpec(**BASE, exchange_shape=bad)


def test_the_model_prices_the_1bit_exchange_at_its_measured_rate():
    """1-bit Adam's compression stage, whole vector in the optimizer's step (DeepSpeed's): its step is the rest
    of the step plus the measured exchange of its collectives, whatever the all-reduce's rate."""
    profile = Profile(
        name="p", device="cpu", task="t", batch_size=16, forward_backward_s=0.1, parameter_count=10_000_000,
        compression_s_per_element={"onebit": 0.0, "fp16": 0.0}, precision="fp16", bucket_layout="one_buffer",
    )  # fmt: skip
    impl = {"onebit": Implementation(overlap=0.0, granularity="whole")}
    fit = ExchangeFit("shared_fabric", alpha_s=5e-6, bytes_per_s=1e9)
    free = ExchangeFit("pairwise", 0.0, math.inf)
    n, m = 8, 4

    def step(exchange, allreduce_rate):
        ar = {"shape": "two_level", "alpha_us": 0.0, "bytes_per_s": allreduce_rate}
        spec = ClusterSpec(**BASE, allreduce_shape=ar, exchange_shape={"world": exchange})
        return predict_step(profile, spec, n, m, "onebit", implementation=impl).total_s

    ops = bucket_collectives("onebit", profile.parameter_count, n, m)
    exchange = sum(fit.seconds(op.group, op.nbytes, n, m) for op in ops if op.kind != "allreduce")
    assert step(fit, 1e9) == pytest.approx(step(free, 1e9) + exchange)
    assert step(fit, 1e9) == pytest.approx(step(fit, 9e9))  # not the all-reduce's rate
    slower = ExchangeFit("shared_fabric", alpha_s=5e-6, bytes_per_s=0.5e9)
    assert step(slower, 1e9) > step(fit, 1e9)


def test_the_probes_exchange_calls_become_a_shape_per_group():
    truth = {"world": ExchangeFit("shared_fabric", 30e-6, 1e9), "inter": ExchangeFit("pairwise", 60e-6, 2e9)}

    def calls_of(group, fit, k):
        return {
            kind: {int(s): [fit.seconds(group, s, k, M)] * 3 for s in SIZES} for kind in ("all_gather", "all_to_all")
        }

    calls = {group: {k: calls_of(group, fit, k) for k in (2, 4)} for group, fit in truth.items()}
    perf, record = exchange_spec(calls, M)
    for group, fit in truth.items():
        got = perf["exchange_shape"][group]
        assert got["shape"] == fit.shape and record[group]["found"]["shape"] == fit.shape
        assert got["bytes_per_s"] == pytest.approx(fit.bytes_per_s, rel=1e-6)
        assert got["alpha_us"] == pytest.approx(fit.alpha_s * 1e6, rel=1e-4)
    spec = ClusterSpec(**BASE, **yaml.safe_load(yaml.safe_dump(perf)))
    assert spec.measured_exchange("world").shape == "shared_fabric"
    # one node count: no shape, and the record says why
    perf, record = exchange_spec({"world": {2: calls["world"][2]}}, M)
    assert perf == {} and "one node count" in record["world"]["note"]


def _time_scaling(rank, world, nodes, m):
    from birder_repro.perf.exchange_probe import time_scaling

    got = time_scaling(nodes, m, [4100, 65536], {"warmup": 0, "repeats": 2})
    return got if rank == 0 else None


def test_the_probe_times_the_exchanges_over_the_first_k_nodes_on_real_gloo_processes():
    """mode=probe's scaling step on 3 "nodes" of 2 gloo processes (loopback: the rates mean nothing): the world
    all-reduce in fp32 and in fp16, and the all-gather and all-to-all over every process and among the nodes
    (every local rank's group at once) at 2 and 3 nodes, each checked on known values first
    (perf.measure.measure); what it times becomes the spec's exchange shapes, which ClusterSpec reads back."""
    from dist_utils import run_distributed

    from birder_repro.perf.exchange_shape import EXCHANGE_SHAPES

    scaling, scaling16, exchanges = run_distributed(_time_scaling, 6, 3, 2)[0]
    assert set(scaling) == {2, 3} and set(scaling16) == {2, 3}
    assert all(len(ts) == 2 and min(ts) > 0 for ts in scaling16[3].values())
    # sizes rounded to whole elements on each of the 4 processes of 2 nodes: 2-byte ones in fp16, 4-byte in fp32
    assert min(scaling16[2]) == 4104 and min(scaling[2]) == 4112
    for group in ("world", "inter"):
        assert set(exchanges[group]) == {2, 3}
        for calls in exchanges[group].values():
            assert set(calls) == {"all_gather", "all_to_all"} and len(calls["all_to_all"]) == 2
            assert all(len(ts) == 2 and min(ts) > 0 for ts in calls["all_to_all"].values())
    perf, record = exchange_spec(exchanges, 2)
    assert set(perf["exchange_shape"]) == {"world", "inter"}
    spec = ClusterSpec(**BASE, **yaml.safe_load(yaml.safe_dump(perf)))
    for group in ("world", "inter"):
        assert spec.measured_exchange(group).shape in EXCHANGE_SHAPES
        assert record[group]["found"]["shape"] == spec.measured_exchange(group).shape


def test_a_16bit_all_reduce_is_priced_as_the_probe_timed_it_in_fp16():
    """A 16-bit world all-reduce across nodes takes the fp16 table (at a measured node count, between its sizes)
    or shape, its sums included (no reduce_time on top); an fp32 one keeps the fp32 measurement."""
    fp32 = {"shape": "two_level", "alpha_us": 0.0, "bytes_per_s": 1e9}
    spec = ClusterSpec(
        **BASE,
        reduce_ns_per_element={"float16": 5.0},
        allreduce_shape=fp32,
        allreduce16_shape={"shape": "flat_ring", "alpha_us": 10.0, "bytes_per_s": 0.25e9},
        allreduce16_table={2: [[1e6, 0.010], [16e6, 0.100]]},
    )
    half = Collective("allreduce", "world", 8e6, "float16")
    assert op_time(half, 2, 4, spec) == pytest.approx(0.010 + 0.090 * 7 / 15)
    node_s = op_time(Collective("allreduce", "intra", 8e6, "float16"), 1, 4, ClusterSpec(**BASE))
    assert op_time(half, 8, 4, spec) == pytest.approx(spec.allreduce16_shape.seconds(8e6, 8, 4, node_s))
    bf16 = Collective("allreduce", "world", 8e6, "bfloat16")
    assert op_time(bf16, 8, 4, spec) == pytest.approx(op_time(half, 8, 4, spec))
    full = Collective("allreduce", "world", 8e6)
    assert op_time(full, 8, 4, spec) == pytest.approx(op_time(full, 8, 4, ClusterSpec(**BASE, allreduce_shape=fp32)))
    # not measured in fp16: the fp32 measurement and the sums' extra cost, as before
    plain = ClusterSpec(**BASE, reduce_ns_per_element={"float16": 5.0}, allreduce_shape=fp32)
    assert op_time(half, 8, 4, plain) > plain.allreduce_shape.seconds(8e6, 8, 4, node_s)
