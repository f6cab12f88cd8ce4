"""The performance model (birder_repro.perf): formulas on hand-computed numbers, bytes against the hooks'
accounting, the overlap timeline, profiles, the paper validation's target and the predicted record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from birder_repro.comm.accounting import all_gather_bytes, flat_allreduce_split, reduce_scatter_bytes
from birder_repro.perf import collectives as C
from birder_repro.perf.cluster import ClusterSpec, no_spare_core, op_time
from birder_repro.perf.model import predict_run, predict_step
from birder_repro.perf.predict import predict_record
from birder_repro.perf.profile import Profile, ddp_bucket_elements, load_profile
from birder_repro.perf.schemes import (Collective, bucket_collectives, compressed_elements, counted_bytes,
                                      padded_elements, powersgd_elements, scheme_for_optim)
from birder_repro.perf.implementations import (IMPLEMENTATIONS, PAPER_DDP_OVERLAP, Implementation,
                                               implementation_of, with_overlap)
from birder_repro.perf.timeline import (BucketWork, blend, ready_times, simulate, simulate_sequential,
                                        simulate_shared)
from birder_repro.perf import validate as V
from dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[1]
LINK = C.Link(alpha_s=1e-5, bandwidth_Bps=1e9)


# ------------------------------------------------------------------------------------------ formulas
def test_collective_formulas_by_hand():
    assert C.ring_allreduce(1e6, 4, LINK) == pytest.approx(6e-5 + 1.5e-3)
    assert C.ring_reduce_scatter(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert C.ring_all_gather(1e6, 4, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert C.pairwise_all_to_all(8e5, 8, LINK) == pytest.approx(7e-5 + 0.7e-3)
    assert C.broadcast(1000, 8, LINK) == pytest.approx(3 * (1e-5 + 1e-6))          # binomial tree
    assert C.broadcast(1e6, 8, LINK) == pytest.approx(10 * 1e-5 + 1.75e-3)         # scatter + all-gather
    for fn in C.KINDS.values():
        assert fn(1e6, 1, LINK) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        C.collective_time("gossip", 1.0, 2, LINK)
    with pytest.raises(ValueError):
        C.Link(alpha_s=0.0, bandwidth_Bps=0.0)


def _spec(**kw) -> ClusterSpec:
    base = dict(name="t", inter_mbit=8000.0, inter_latency_us=10.0, inter_efficiency=1.0,
                intra_mbit=80000.0, intra_latency_us=1.0, intra_efficiency=1.0)
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


# ------------------------------------------------------------------------------------ bytes per scheme
@pytest.mark.parametrize("n,m", [(2, 4), (4, 8), (1, 8), (3, 2)])
def test_bytes_against_accounting(n, m):
    numel, world = 100_003, n * m

    def counted(scheme):
        ops = bucket_collectives(scheme, numel, n, m)
        pairs = [counted_bytes(op, n, m) for op in ops]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs), len(ops)

    assert counted("fp32")[:2] == pytest.approx(flat_allreduce_split(4 * numel, world, m))
    assert counted("fp16")[:2] == pytest.approx(flat_allreduce_split(2 * numel, world, m))

    # Birder, hierarchical (birder_repro.comm.birder's count; DESIGN.md: inter 2 (n-1)/n P'/(8m)).
    p = padded_elements("hierarchical", numel, n, m)
    assert p % (8 * m * n) == 0 and p >= numel
    intra, inter, count = counted("hierarchical")
    assert inter == pytest.approx(2 * (n - 1) / n * p / (8 * m))
    assert intra == pytest.approx(reduce_scatter_bytes(4 * p, m) + all_gather_bytes(p // (8 * m), m))
    assert count == (2 if m > 1 else 0) + (2 if n > 1 else 0)

    # 1-bit Adam's flat compressed all-reduce: per peer chunk/8 + 4, twice (birder_repro.comm.onebit).
    p = padded_elements("onebit", numel, n, m)
    intra, inter, count = counted("onebit")
    per_peer = 2 * (p // (8 * world) + 4)
    assert (intra, inter) == pytest.approx(((m - 1) * per_peer, (world - m) * per_peer))
    assert count == 4

    # Birder flat and allgather: every process a worker.
    p = padded_elements("flat", numel, n, m)
    assert sum(counted("flat")[:2]) == pytest.approx(2 * (world - 1) * p / (8 * world))
    p = padded_elements("allgather", numel, n, m)
    assert sum(counted("allgather")[:2]) == pytest.approx((world - 1) * p / 8)


def test_powersgd_collectives():
    # torch's rule: compress an n x m matrix when (n + m) r < n m / 2; vectors go uncompressed.
    assert powersgd_elements([[64, 64], [64], [4, 4]], rank=1) == (64 + 16, 64, 64)
    ops = bucket_collectives("powersgd", 4096 + 64 + 16, 2, 2, matrices=[[64, 64], [64], [4, 4]], rank=1)
    assert [op.nbytes for op in ops] == [4 * 80, 4 * 64, 4 * 64]
    assert bucket_collectives("fp32", 10, 1, 1) == []
    with pytest.raises(ValueError, match="unknown scheme"):
        bucket_collectives("zip", 10, 2, 2)


def test_scheme_for_optim():
    assert [scheme_for_optim(o) for o in ("sgdm", "bertadam", "onebit_lamb", "sgdm_fp16", "adamw_powersgd")] == \
        ["fp32", "fp32", "onebit", "fp16", "powersgd"]
    assert scheme_for_optim("birder", "flat") == "flat"


# ------------------------------------------------------------------------------------------ timeline
def test_timeline_three_buckets_by_hand():
    buckets = [BucketWork(1.0, 0.5, 1.0), BucketWork(2.0, 0.5, 0.2), BucketWork(3.0, 0.5, 0.5)]
    tl = simulate(buckets, forward_backward_s=3.0, optimizer_s=0.1)
    assert tl.starts == pytest.approx((1.0, 2.5, 3.2))
    assert tl.ends == pytest.approx((2.5, 3.2, 4.2))
    assert tl.total_s == pytest.approx(4.3)          # 3.0 compute + 1.2 exposed + 0.1 optimizer
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
    prof = load_profile("paper", task="resnet50", batch_size=32, node=spec)
    steps = [predict_step(prof, spec, 4, 8, "fp32", implementation=with_overlap("paper", o)).total_s
             for o in (0.0, 0.5, 1.0)]
    assert steps[0] > steps[1] > steps[2]
    assert implementation_of(with_overlap("paper", 0.5), "fp32").overlap == 0.5
    assert implementation_of(with_overlap("paper", 0.5), "hierarchical").overlap == 0
    spec = V.cluster_spec("ethernet_10g")
    for impl in IMPLEMENTATIONS:  # each implementation's profile gives back the 1-node rows
        prof = load_profile("paper", task="resnet50", batch_size=32, node=spec, implementation=impl)
        assert predict_step(prof, spec, 1, 8, "hierarchical", implementation=impl).throughput == \
            pytest.approx(3462, rel=1e-6)
    # Not overlapped, Birder's communication is all exposed: the paper's implementation is slower at 4 nodes.
    this = predict_step(load_profile("paper", task="bert_squad", batch_size=3, node=spec, implementation="this"),
                        spec, 4, 8, "hierarchical", implementation="this")
    paper = predict_step(load_profile("paper", task="bert_squad", batch_size=3, node=spec), spec, 4, 8,
                         "hierarchical", implementation="paper")
    assert paper.total_s > this.total_s and paper.communication_s == pytest.approx(paper.comm_busy_s)
    # 1-bit Adam in the paper's runs: one compressed all-reduce of the whole vector (4 collectives).
    onebit = predict_step(load_profile("paper", task="resnet50", batch_size=32, node=spec), spec, 2, 8, "onebit",
                          implementation="paper")
    assert onebit.collectives == 4


def test_ready_times_and_buckets():
    assert ready_times([1, 1, 2], forward_s=1.0, backward_s=2.0) == pytest.approx([1.5, 2.0, 3.0])
    assert ready_times([1, 1], 1.0, 2.0, fractions=[0.25, 1.0]) == pytest.approx([1.5, 3.0])
    sizes = ddp_bucket_elements(25_557_032)
    assert sizes[0] == 262_144 and sizes[1] == 6_553_600 and sum(sizes) == 25_557_032


# ------------------------------------------------------------------------------------------- profiles
def _profile(**kw) -> Profile:
    base = dict(name="t", device="cpu", task="resnet20", batch_size=32, forward_backward_s=0.1,
                parameter_count=1_000_000, compression_s_per_element={"birder": 1e-9})
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


def test_paper_profile_reproduces_one_node_rows():
    spec = V.cluster_spec("ethernet_10g")
    prof = load_profile("paper", task="resnet50", batch_size=32, node=spec)
    assert prof.parameter_count == 25_557_032
    paper = dict(implementation="paper")  # what the paper profile is derived for unless told otherwise
    assert predict_step(prof, spec, 1, 8, "fp32", **paper).throughput == pytest.approx(3693, rel=1e-6)
    assert predict_step(prof, spec, 1, 8, "hierarchical", **paper).throughput == pytest.approx(3462, rel=1e-6)
    run = predict_run(prof, spec, 1, 8, "onebit", warmup_fraction=0.15, **paper)
    assert run["run"]["throughput_samples_per_s"] == pytest.approx(3243, rel=1e-6)
    bert = load_profile("paper", task="bert_squad", batch_size=3, node=spec)
    assert 108e6 < bert.parameter_count < 110e6
    with pytest.raises(ValueError, match="no paper profile"):
        load_profile("paper", task="digits", batch_size=3)


def test_cluster_configs_load():
    for path in sorted((REPO / "conf" / "cluster").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        assert {"name", "interconnect", "link_mbit", "latency_ms", "backend"} <= set(cfg)  # existing keys kept
        spec = ClusterSpec.from_config(cfg)
        assert spec.inter.bandwidth_Bps > 0 and spec.intra.bandwidth_Bps > 0


# ------------------------------------------------------------------------------------ paper validation
def test_paper_validation_runs_and_is_sane():
    frame = V.validate((3, 4))
    multi = frame[frame["nodes"] > 1]
    assert len(multi) == 36 and multi["pred_throughput"].gt(0).all()
    assert set(V.target_rows(frame)["optimizer"]) == {"onebit_adam", "birder"}
    # The compressed schemes send fewer bytes, so the model never predicts them slower than fp32 on Ethernet.
    eth = V.target_rows(frame)
    assert (eth[eth["cluster"] == "ethernet_10g"]["pred_speedup"] > 1).all()


def test_paper_validation_meets_target():
    assert V.median_speedup_error(V.validate((3, 4))) <= V.TARGET


def test_shipped_links_and_overlap_are_the_fit():
    """conf/cluster's fitted numbers and PAPER_DDP_OVERLAP are what the fit gives (the loss, not the target)."""
    sweep = V.overlap_sweep((0.0, 1.0)).set_index("ddp_overlap")
    assert PAPER_DDP_OVERLAP == sweep["loss"].idxmin()
    for cluster in V.CLUSTERS:
        spec = V.cluster_spec(cluster)
        fitted = sweep.loc[PAPER_DDP_OVERLAP]
        assert (spec.inter_efficiency, spec.inter_latency_us) == pytest.approx(
            (fitted[f"{cluster}_efficiency"], fitted[f"{cluster}_latency_us"]))


# ------------------------------------------------------------------------------------- predicted record
def test_predict_record_shape():
    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "ethernet_10g.yaml").read_text())
    cfg = {"task": {"name": "resnet50"}, "optim": {"name": "onebit_adam", "freeze": 0.15},
           "nodes": 4, "gpus_per_node": 8, "cluster": cluster, "train": {"batch_size": 32, "steps": None},
           "predict": {"profile": "paper"}}
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
    cfg = compose(["experiment=table3", "optim=birder", "nodes=4", "cluster=infiniband_200g",
                   "predict.profile=paper"])
    rec = predict_record(cfg)
    assert rec["prediction"]["scheme"] == "hierarchical" and rec["cluster"]["interconnect"] == "infiniband"
    assert rec["throughput_by_stage"] is None
    # The paper's 8-GPU row comes back exactly (the profile is derived from it).
    one = predict_record(compose(["experiment=table3", "optim=birder", "nodes=1",
                                  "predict.profile=paper"]))
    assert one["throughput_samples_per_s"] == pytest.approx(3462, rel=1e-6)


# --------------------------------------------------------------------------------- mode=predict, the CLI
def test_cli_predict_mode_writes_a_predicted_record_and_launches_nothing(compose, tmp_path, capsys):
    from birder_repro.cli import run

    cfg = compose(["mode=predict", "experiment=table3", "optim=birder", "nodes=2", "predict.profile=paper"],
                  hydra_config=True)
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
    profile = Profile(name="run", device="cpu", task="resnet50", batch_size=8, forward_backward_s=0.06,
                      parameter_count=300, optimizer_s=0.004, backward_fraction=0.6, bucket_elements=[100, 200],
                      bucket_ready=[0.1, 1.0], bucket_ready_s=[0.0036, 0.036], data_wait_s=0.002,
                      compression_s_per_element={"birder": 1e-6}, threads=1, host_cores=2)
    emulated = ClusterSpec.from_config(yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text()))
    one = predict_step(profile, emulated, 1, 1, "fp32")
    assert one.total_s == pytest.approx(0.06 + 0.004 + 0.002) and one.data_wait_s == 0.002
    # 4 single-process nodes on this 2-core machine: compute runs at half speed (shared_host).
    four = predict_step(profile, emulated, 4, 1, "fp32")
    assert four.compute_s == pytest.approx(2 * (0.06 + 0.004))
    assert load_profile(json.loads(json.dumps({"profile": profile.to_dict()}))) == profile


def test_compressed_elements_alone_counts_a_lone_process():
    assert compressed_elements("hierarchical", 800, 1, 1) == 0
    assert compressed_elements("hierarchical", 800, 1, 1, alone=True) == 4 * 800  # 2P/m + P/N + P at n = m = 1


def test_validate_emulated_from_records(tmp_path):
    from birder_repro.perf.emulated import emulated_frame, format_emulated
    from birder_repro.perf.predict import predict_record as predicted

    cluster = yaml.safe_load((REPO / "conf" / "cluster" / "emulated.yaml").read_text())
    profile = Profile(name="run", device="cpu", task="resnet50", batch_size=8, forward_backward_s=0.06,
                      parameter_count=5_000_000, optimizer_s=0.004, threads=1, host_cores=64).to_dict()
    for i, nodes in enumerate((1, 2, 4)):
        cfg = {"task": {"name": "resnet50"}, "optim": {"name": "sgdm"}, "nodes": nodes, "gpus_per_node": 1,
               "cluster": {**cluster, "link_mbit": 100}, "train": {"batch_size": 8, "steps": 15},
               "predict": {"profile": profile}, "model": {"size": "tiny"}, "data": {"image_size": 64}}
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
    from birder_repro.perf.linkprobe import fit_alpha_beta

    n, alpha, beta = 4, 2e-4, 1 / 12.5e6  # 100 Mbit/s
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    times = [(n - 1) * alpha + (n - 1) / n * s * beta for s in sizes]
    assert fit_alpha_beta(sizes, times, n) == pytest.approx((alpha, beta))
    assert fit_alpha_beta([1.0, 2.0], [1.0, 0.5], 2)[1] == 0.0  # never a negative cost per byte


def _slowest(rank: int, world: int) -> list[float]:
    from birder_repro.perf.linkprobe import slowest_rank

    return slowest_rank([0.1 * (rank + 1), 0.5 - 0.1 * rank])


def test_link_probe_takes_each_call_at_its_slowest_rank():
    # Rank 0 timed (0.1, 0.5), rank 1 (0.2, 0.4): every rank gets (0.2, 0.5), the calls as the step sees them.
    assert run_distributed(_slowest, 2) == [pytest.approx([0.2, 0.5])] * 2
