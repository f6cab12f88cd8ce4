"""A measured cluster spec (ClusterSpec.allreduce_shape / allreduce_table) and what a profile carries (affine
compute, precision, one buffer, the optimizer's collectives) as the model uses them."""

import pytest

from birder_repro.perf.cluster import ClusterSpec, op_time
from birder_repro.perf.collectives import collective_time
from birder_repro.perf.implementations import Implementation
from birder_repro.perf.model import optimizer_collectives_s, predict_run, predict_step
from birder_repro.perf.profile import Profile, affine_compute
from birder_repro.perf.schemes import Collective
from birder_repro.perf.shape import ShapeFit, interpolate_size

BASE = dict(
    name="c", inter_mbit=10_000.0, inter_latency_us=50.0, inter_efficiency=0.5, intra_mbit=100_000.0,
    intra_latency_us=5.0,
)  # fmt: skip
FIT = ShapeFit("flat_ring", alpha_s=100e-6, bytes_per_s=0.5e9)
TABLE = {2: [[1e6, 0.004], [100e6, 0.400]], 4: [[1e6, 0.006], [100e6, 0.450]]}
ALLREDUCE = Collective("allreduce", "world", 50e6)


def test_a_measured_spec_prices_the_all_reduce_as_measured_then_by_its_shape():
    spec = ClusterSpec(**BASE, allreduce_shape=FIT, allreduce_table=TABLE)
    assert spec.calibrated and not ClusterSpec(**BASE).calibrated
    # at a measured node count, between its sizes: the table, linear in the bytes
    assert op_time(ALLREDUCE, 2, 4, spec) == pytest.approx(0.004 + 0.396 * 49 / 99)
    # elsewhere: the shape (a flat ring's latency steps and link multiple over all 32 processes)
    assert op_time(ALLREDUCE, 8, 4, spec) == pytest.approx(62 * 100e-6 + 50e6 * 62 / 32 / 0.5e9)
    assert op_time(Collective("allreduce", "world", 200e6), 2, 4, spec) == pytest.approx(
        FIT.seconds(200e6, 2, 4)
    )  # beyond the measured sizes: no extrapolation of the table
    # the unmeasured spec keeps its two-level formula over the links
    plain = ClusterSpec(**BASE)
    assert op_time(ALLREDUCE, 8, 4, plain) != pytest.approx(op_time(ALLREDUCE, 8, 4, spec))


def test_a_two_level_shape_adds_the_node_phase_priced_on_the_intra_link():
    fit = ShapeFit("two_level", alpha_s=0.0, bytes_per_s=1e9)
    spec = ClusterSpec(**BASE, allreduce_shape=fit)
    node = collective_time("allreduce", 50e6, 4, spec.intra)
    assert op_time(ALLREDUCE, 8, 4, spec) == pytest.approx(node + 50e6 * 1.75 / 1e9)


def test_the_spec_reads_its_measured_blocks_from_a_config():
    cfg = {
        "name": "probed",
        "link_mbit": 10_000,
        "perf": {
            "inter_latency_us": 50, "inter_efficiency": 0.5, "intra_mbit": 100_000, "intra_latency_us": 5,
            "allreduce_shape": {"shape": "flat_ring", "alpha_us": 100.0, "bytes_per_s": 0.5e9},
            "allreduce_table": {"2": [[1e6, 0.004], [100e6, 0.4]]},
        },
    }  # fmt: skip
    spec = ClusterSpec.from_config(cfg)
    assert spec.allreduce_shape.shape == "flat_ring"
    assert spec.allreduce_shape.alpha_s == pytest.approx(FIT.alpha_s)
    assert spec.allreduce_shape.bytes_per_s == FIT.bytes_per_s
    assert spec.measured_allreduce_s(1e6, 2) == pytest.approx(0.004)
    assert spec.measured_allreduce_s(1e6, 4) is None
    again = ClusterSpec.from_config({**cfg, "perf": {**cfg["perf"], **spec.to_dict()}})  # its own dict reads back
    assert again.allreduce_shape == spec.allreduce_shape and again.allreduce_table == spec.allreduce_table


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("allreduce_shape", {"shape": "butterfly", "bytes_per_s": 1e9}, "unknown all-reduce shape"),
        ("allreduce_shape", {"shape": "tree"}, "give shape, alpha_us and bytes_per_s"),
        ("allreduce_shape", {"shape": "tree", "bytes_per_s": -1.0}, "bytes_per_s must be > 0"),
        ("allreduce_table", {1: [[1e6, 0.1]]}, ">= 2 nodes"),
        ("allreduce_table", {2: [[1e6, 0.0]]}, r"\[bytes, seconds\] > 0"),
    ],
)
def test_bad_measured_blocks_are_clear_errors(key, value, match):
    with pytest.raises(ValueError, match=match):
        ClusterSpec(**BASE, **{key: value})


def test_interpolate_size_averages_repeats_and_never_extrapolates():
    points = [(1e6, 0.002), (1e6, 0.004), (3e6, 0.007)]
    assert interpolate_size(points, 1e6) == pytest.approx(0.003)
    assert interpolate_size(points, 2e6) == pytest.approx(0.005)
    assert interpolate_size(points, 4e6) is None and interpolate_size(points, 0.5e6) is None


PROFILE = dict(
    name="p", device="d", task="t", batch_size=16, forward_backward_s=0.100, parameter_count=10_000_000,
    compression_s_per_element={"fp16": 0.0, "onebit": 1e-9, "birder": 1e-9},
)  # fmt: skip


def test_compute_is_affine_with_two_batch_sizes_and_linear_with_one():
    one = Profile(**PROFILE)
    assert one.compute_s(1) == pytest.approx(0.100 / 16)
    two = Profile(**PROFILE, forward_backward_at=[[1, 0.064]])
    assert two.compute_s(1) == pytest.approx(0.064)
    assert two.compute_s(16) == pytest.approx(0.100)
    assert two.compute_s(32) == pytest.approx(0.100 + 16 * 0.036 / 15)
    # no negative fixed cost: a profile that grows faster than linear is fitted through 0
    assert affine_compute([(1, 0.001), (16, 0.100)], 0) == pytest.approx(0.0)


def test_one_buffer_is_one_bucket_and_precision_picks_the_warmup_exchange():
    p = Profile(**PROFILE, bucket_layout="one_buffer", precision="fp16")
    assert p.buckets() == [10_000_000]
    spec = ClusterSpec(**BASE)
    run = predict_run(p, spec, 4, 4, "onebit", warmup_fraction=0.2)
    fp16 = predict_step(p, spec, 4, 4, "fp16")
    assert run["stages"]["warmup"]["total_s"] == pytest.approx(fp16.total_s)
    fp32 = predict_step(p, spec, 4, 4, "fp32")
    assert fp16.total_s < fp32.total_s  # half the bytes


def test_the_optimizers_collectives_cost_only_across_processes():
    p = Profile(**PROFILE, optimizer_collectives=[["allreduce", 4.0], ["allreduce", 4.0]])
    spec = ClusterSpec(**BASE, allreduce_shape=FIT)
    assert optimizer_collectives_s(p, spec, 1, 1) == 0.0
    assert optimizer_collectives_s(p, spec, 16, 4) == pytest.approx(2 * FIT.seconds(4.0, 16, 4))
    impl = {"fp16": Implementation(overlap=0.0, granularity="whole")}
    with_norms = predict_step(p, spec, 16, 4, "fp16", implementation=impl).total_s
    without = predict_step(Profile(**PROFILE), spec, 16, 4, "fp16", implementation=impl).total_s
    assert with_norms - without == pytest.approx(optimizer_collectives_s(p, spec, 16, 4))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"precision": "bf8"}, "precision"),
        ({"bucket_layout": "zigzag"}, "bucket_layout"),
        ({"forward_backward_at": [[0, 0.1]]}, "forward_backward_at"),
    ],
)
def test_bad_profile_fields_are_clear_errors(extra, match):
    with pytest.raises(ValueError, match=match):
        Profile(**PROFILE, **extra)


def test_the_probe_times_the_all_reduce_at_growing_node_counts():
    from birder_repro.perf.probe import scaling_counts

    assert scaling_counts(1) == [] and scaling_counts(2) == [2]
    assert scaling_counts(3) == [2, 3] and scaling_counts(8) == [2, 4, 8] and scaling_counts(6) == [2, 4, 6]


def test_the_probes_scaling_becomes_a_measured_table_and_a_shape():
    from birder_repro.perf.probe import scaling_spec

    m, intra = 4, {"alpha_s": 10e-6, "bandwidth_Bps": 20e9}  # the intra group's all-reduce fit (bus bandwidth)

    def node_s(nbytes):
        return 6 * 10e-6 + 1.5 * nbytes / 20e9

    truth = ShapeFit("two_level", alpha_s=40e-6, bytes_per_s=1e9)
    sizes = (65536, 4 << 20, 64 << 20)
    scaling = {k: {b: [truth.seconds(b, k, m, node_s(b))] * 3 for b in sizes} for k in (2, 4)}
    perf, shape = scaling_spec(scaling, m, intra)
    assert perf["allreduce_shape"]["shape"] == "two_level" and shape["found"]["shape"] == "two_level"
    assert perf["allreduce_shape"]["bytes_per_s"] == pytest.approx(1e9, rel=1e-6)
    assert perf["allreduce_table"][2][0] == [65536.0, pytest.approx(truth.seconds(65536, 2, m, node_s(65536)))]
    spec = ClusterSpec(**BASE, **{k: v for k, v in perf.items() if k != "shape_note"})
    assert spec.route(4) == "probed" and spec.route(16) == "probed"
    # one node count: the table, no shape, and the spec says so
    perf, shape = scaling_spec({2: scaling[2]}, m, intra)
    assert shape is None and "allreduce_shape" not in perf and "uncalibrated" in perf["shape_note"]
    spec = ClusterSpec(**BASE, allreduce_table=perf["allreduce_table"])
    assert (spec.route(2), spec.route(4), spec.route(1)) == ("probed", "uncalibrated", "one node")
    assert ClusterSpec(**BASE, shared_host=True).route(2) == "emulated"


def test_a_prediction_names_its_route_and_its_error_band():
    from birder_repro.perf.cluster import ROUTE_ERROR_BANDS
    from birder_repro.perf.predict import format_prediction

    rec = {
        "task": "t",
        "optim": "sgdm",
        "cluster": {"nodes": 4, "gpus_per_node": 1, "name": "c"},
        "throughput_samples_per_s": 1.0,
        "global_batch_size": 32,
        "step_time_s": {"total": 0.1, "compute": 0.1, "communication": 0.0, "compression": 0.0},
        "intra_node_bytes_per_step": 0.0,
        "inter_node_bytes_per_step": 0.0,
        "collectives_per_step": 1,
        "prediction": {"scheme": "fp32", "implementation": "this", "route": "uncalibrated"},
        "profile": Profile(**PROFILE).to_dict(),
    }
    rec["prediction"]["error_band"] = ROUTE_ERROR_BANDS["uncalibrated"]
    out = format_prediction(rec)
    assert "route:      uncalibrated" in out and "run mode=probe" in out
    assert f"{100 * ROUTE_ERROR_BANDS['uncalibrated']['step_median']:.0f} % (median)" in out
    del rec["prediction"]["route"]  # an older record: no route line
    assert "route:" not in format_prediction(rec)
    rec["prediction"]["exchange_routes"] = {"world": "probed", "inter": "uncalibrated"}
    out = format_prediction(rec)
    assert "exchange:   world probed (its own shape" in out and "exchange:   inter uncalibrated" in out


def test_a_prediction_says_whether_its_exchanges_were_measured():
    from birder_repro.perf.exchange_shape import ExchangeFit
    from birder_repro.perf.predict import exchange_routes

    plain = ClusterSpec(**BASE)
    probed = ClusterSpec(**BASE, exchange_shape={"world": ExchangeFit("pairwise", 1e-5, 1e9)})
    assert exchange_routes(probed, "onebit", 1_000_000, 4, 4) == {"world": "probed"}
    assert exchange_routes(plain, "onebit", 1_000_000, 4, 4) == {"world": "uncalibrated"}
    assert exchange_routes(probed, "hierarchical", 1_000_000, 4, 4) == {"inter": "uncalibrated"}
    assert (
        exchange_routes(probed, "fp32", 1_000_000, 4, 4) == {}
        and exchange_routes(probed, "onebit", 1_000_000, 1, 4) == {}
    )
    emulated = ClusterSpec(**BASE, shared_host=True, exchange_shape={"world": ExchangeFit("pairwise", 1e-5, 1e9)})
    assert exchange_routes(emulated, "onebit", 1_000_000, 4, 4) == {"world": "emulated"}


def test_profiles_at_two_batch_sizes_combine_into_an_affine_compute():
    from birder_repro.perf.profile import combine_batches

    small = Profile(**{**PROFILE, "name": "b1", "batch_size": 1, "forward_backward_s": 0.064})
    big = Profile(**PROFILE)
    both = combine_batches([big, small])
    assert both.batch_size == 16 and both.forward_backward_at == [[1, 0.064]]
    assert both.compute_s(1) == pytest.approx(0.064) and both.compute_s(16) == pytest.approx(0.100)
    assert combine_batches([big]).compute_s(1) == pytest.approx(0.100 / 16)  # one size: linear, as before
    with pytest.raises(ValueError, match="different models"):
        combine_batches([big, Profile(**{**PROFILE, "parameter_count": 5})])


def test_mode_predict_takes_a_probed_spec_and_profiles_at_two_batches(tmp_path):
    import json

    import yaml

    from birder_repro.perf.predict import format_prediction, predict_record

    for name, batch, seconds in (("b16", 16, 0.100), ("b1", 1, 0.064)):
        p = Profile(**{**PROFILE, "name": name, "task": "resnet50", "batch_size": batch, "forward_backward_s": seconds})
        (tmp_path / f"{name}.json").write_text(json.dumps(p.to_dict()))
    perf = {"inter_latency_us": 50, "inter_efficiency": 0.5, "intra_mbit": 100_000, "intra_latency_us": 5}
    probed = {"name": "c", "link_mbit": 10_000, "perf": {**perf, "allreduce_shape": FIT.to_dict()}}
    (tmp_path / "cluster_spec.yaml").write_text(yaml.safe_dump(probed))
    cfg = {
        "task": {"name": "resnet50"},
        "optim": {"name": "sgdm"},
        "nodes": 8,
        "gpus_per_node": 4,
        "cluster": {"name": "c", "link_mbit": 10_000, "perf": perf},
        "train": {"batch_size": 1, "steps": None},
        "predict": {"profile": [str(tmp_path / "b16.json"), str(tmp_path / "b1.json")]},
    }
    rec = predict_record(cfg)
    assert rec["profile"]["forward_backward_at"] == [[1, 0.064]]  # the compute at 1 a GPU: measured, not 0.1 / 16
    assert rec["prediction"]["route"] == "uncalibrated" and "route:      uncalibrated" in format_prediction(rec)
    rec = predict_record({**cfg, "predict": {**cfg["predict"], "cluster_spec": str(tmp_path / "cluster_spec.yaml")}})
    assert rec["prediction"]["route"] == "probed" and rec["prediction"]["error_band"]["step_median"] > 0
    assert "route:      probed" in format_prediction(rec)


@pytest.mark.parametrize("config", ["ethernet_10g", "infiniband_200g"])
def test_no_emulator_term_reaches_a_real_clusters_prediction(config):
    """A shared core's wait for a turn (host contention, no spare core for the hook's thread, waits against the
    wire) belongs to the emulated cluster (shared_host) only: a profile that says it ran on 2 cores for 4
    processes of 4 threads predicts the same step on a real cluster as one that says nothing."""
    from birder_repro.perf.validate_rows import cluster_spec

    spec = cluster_spec(config)
    assert not spec.shared_host
    plain = Profile(**PROFILE)
    crowded = Profile(**PROFILE, threads=4, host_cores=2, processes=4, node_cores=2, scheme_overhead_s={"onebit": 0.01})
    for scheme in ("fp32", "onebit", "hierarchical", "flat"):
        kw = dict(implementation="this")
        a = predict_step(plain, spec, 4, 4, scheme, **kw).total_s
        b = predict_step(crowded, spec, 4, 4, scheme, **kw).total_s - (0.01 if scheme == "onebit" else 0.0)
        assert a == pytest.approx(b), scheme


@pytest.mark.slow
def test_a_three_node_probe_writes_the_all_reduces_table_and_shape(compose, tmp_path):
    """mode=probe on 3 loopback nodes of 1 process (torchrun, gloo): the world all-reduce, all-gather and
    all-to-all timed over the first 2 and all 3 nodes, the spec's measured table and shapes, read back by
    ClusterSpec. Loopback rates mean nothing."""
    import json
    from pathlib import Path

    import yaml

    from birder_repro.cli import run

    probe = compose(
        [
            "mode=probe", "nodes=3", "gpus_per_node=1", "logger=none", "probe.min_bytes=4096",
            "probe.max_bytes=65536", "probe.iters=2", "probe.warmup_iters=1", "probe.reduce_elements=0",
        ],
        hydra_config=True,
    )  # fmt: skip
    assert run(probe, tmp_path / "probe") == 0
    got = json.loads((tmp_path / "probe" / "record.json").read_text())["probe"]
    assert set(got["scaling"]) == {"2", "3"} and got["shape"]["found"]["shape"] in ("two_level", "flat_ring", "tree")
    spec = ClusterSpec.from_config(yaml.safe_load(Path(got["cluster_spec_file"]).read_text()))
    assert spec.allreduce_shape is not None and {k for k, _ in spec.allreduce_table} == {2, 3}
    assert spec.route(8) == "probed"
    # the 1-bit exchanges' own shape over every process (one process a node: no inter group of its own)
    assert spec.measured_exchange("world") is not None and got["exchange_shapes"]["world"]["found"]
    assert "inter" not in got["exchange_shapes"]
    assert spec.allreduce16_shape is not None and {k for k, _ in spec.allreduce16_table} == {2, 3}
