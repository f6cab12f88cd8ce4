"""make validate-published (birder_repro.perf.published): the transcribed rows, the protocol's split, the last line.

The whole report (about a minute: it fits the Birder paper's exchange links) runs in the slow test only."""

import math
import re
import shutil

import pandas as pd
import pytest

from birder_repro.perf import published as P
from birder_repro.perf.validate_rows import PAPER_DIR


def test_transcribed_rows_count_and_agree_with_their_own_columns():
    rows = P.load_v100_rows()
    counts = rows.groupby("group").size().to_dict()
    assert counts == {
        "onebit_adam/ethernet": 7,
        "onebit_adam/infiniband": 6,
        "onebit_lamb/ethernet": 10,
        "onebit_lamb/infiniband": 8,
    }
    multi = rows[rows["nodes"] > 1].groupby("group").size().to_dict()
    assert multi == {
        "onebit_adam/ethernet": 6,
        "onebit_adam/infiniband": 5,
        "onebit_lamb/ethernet": 9,
        "onebit_lamb/infiniband": 7,
    }
    # the printed all-reduce share agrees with the printed times (to its rounding), the layout and batch add up
    share = 100 * rows["allreduce_ms"] / rows["measured_step_ms"]
    assert (share - rows["allreduce_pct"]).abs().max() <= 0.5
    assert (rows["gpus"] == rows["nodes"] * rows["gpus_per_node"]).all()
    assert (rows["batch"] == rows["gpus"] * rows["batch_per_gpu"] * rows["accumulation"]).all()
    # every row cites its paper, table and row, once
    assert not rows.duplicated(["paper", "table", "row"]).any()
    claims = P.load_claims()
    assert len(claims) == 12 and set(claims["paper"]) == {"onebit_adam", "onebit_lamb", "apmsqueeze"}
    assert claims["where"].notna().all() and claims["text"].notna().all()


def test_the_protocol_splits_each_cluster_into_profile_probe_and_predicted():
    rows = P.split(P.load_v100_rows())
    for group, g in rows.groupby("group"):
        multi = sorted(set(g.loc[g["nodes"] > 1, "nodes"]))
        assert set(g.loc[g["role"] == "profile", "nodes"]) == {1}
        assert set(g.loc[g["role"] == "probe", "nodes"]) == set(multi[:2]), group
        assert set(g.loc[g["role"] == "predicted", "nodes"]) == set(multi[2:]), group
    lamb = rows[rows["group"] == "onebit_lamb/ethernet"]
    assert sorted(set(lamb.loc[lamb["role"] == "predicted", "nodes"])) == [8, 16, 32, 64]
    birder = P.split(P.load_birder_rows())
    assert set(birder.loc[birder["role"] == "probe", "nodes"]) == {2, 4}
    assert set(birder.loc[birder["role"] == "predicted", "nodes"]) == {8}


def _copy_tables(tmp_path):
    for f in PAPER_DIR.glob("*.csv"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _scale(path, where, columns, factor):
    frame = pd.read_csv(path)
    frame[columns] = frame[columns].astype(float)
    frame.loc[where(frame), columns] = frame.loc[where(frame), columns] * factor
    frame.to_csv(path, index=False)


def _v100_fits(paper_dir):
    rows = P.split(P.load_v100_rows(paper_dir))
    out = {}
    for group, g in rows.groupby("group"):
        spec, fit, _ = P.v100_probe(g[g["role"] == "profile"].iloc[0], g[g["role"] == "probe"])
        out[group] = (spec, fit)
    return out


def test_no_predicted_row_reaches_the_v100_fits(tmp_path):
    before = _v100_fits(PAPER_DIR)
    paper_dir = _copy_tables(tmp_path)
    for name in P.V100_FILES.values():  # every row the protocol predicts, 10x slower
        _scale(paper_dir / name, lambda f: f["nodes"] > 4, ["allreduce_ms", "step_ms"], 10.0)
    assert _v100_fits(paper_dir) == before
    for name in P.V100_FILES.values():  # the probe's rows do reach them (the check can fail)
        _scale(paper_dir / name, lambda f: f["nodes"] == 4, ["allreduce_ms"], 2.0)
    assert _v100_fits(paper_dir) != before


def _birder_fits(paper_dir):
    P._birder_probed.cache_clear()
    out = {}
    for c in P.BIRDER_GROUPS:
        link, fit, _ = P._birder_probed(c, paper_dir)
        out[c] = (fit, link["exchange_shape"])
    P._birder_probed.cache_clear()
    return out


def test_no_predicted_row_reaches_the_birder_probe(tmp_path):
    """The all-reduce's shape and each compressed exchange's own shape and rate come from the probe rows only."""
    before = _birder_fits(PAPER_DIR)
    paper_dir = _copy_tables(tmp_path)
    for t in (1, 3, 4):
        _scale(paper_dir / f"table{t}.csv", lambda f: f["nodes"] == 8, ["throughput"], 0.1)
    assert _birder_fits(paper_dir) == before
    # a compressed method's probe rows do reach its exchange (the check can fail)
    _scale(
        paper_dir / "table3.csv", lambda f: (f["nodes"] == 4) & (f["optimizer"] == "onebit_adam"), ["throughput"], 0.5
    )
    after = _birder_fits(paper_dir)
    for c in P.BIRDER_GROUPS:
        assert after[c][1]["world"] != before[c][1]["world"] and after[c][1]["inter"] == before[c][1]["inter"]


def test_the_last_line_is_exactly_the_agreed_format():
    line = P.format_last_line(P.Summary(0.262, 0.546, 0.385))
    assert line == "published: worst cluster median 26.2 %, worst row 54.6 %, worst claim 38.5 %"
    assert re.fullmatch(r"published: worst cluster median \d+\.\d %, worst row \d+\.\d %, worst claim \d+\.\d %", line)


def test_the_summary_counts_only_the_probed_routes_predicted_rows_and_predicted_claims():
    rows = pd.DataFrame(
        [
            {"group": "a", "route": "probed", "role": "predicted", "allreduce_error": 0.1, "step_error": -0.2},
            {"group": "a", "route": "probed", "role": "predicted", "allreduce_error": 0.3, "step_error": 0.0},
            {"group": "a", "route": "probed", "role": "probe", "allreduce_error": 9.0, "step_error": 9.0},
            {"group": "a", "route": "uncalibrated", "role": "predicted", "allreduce_error": 9.0, "step_error": 9.0},
            {"group": "b", "route": "probed", "role": "predicted", "allreduce_error": math.nan, "step_error": 0.05},
        ]
    )
    claims = pd.DataFrame([{"status": "predicted", "error": -0.3}, {"status": "not predicted", "error": math.nan}])
    s = P.summarize(rows, claims)
    assert s.worst_cluster_median == pytest.approx(0.2)  # group a's all-reduce: median of 0.1 and 0.3
    assert s.worst_row == pytest.approx(0.3)
    assert s.worst_claim == pytest.approx(0.3)


def test_the_claims_formula_of_both_papers_round_trips():
    # 1-bit Adam: 5.48x in the compression stage with 23K of 152K steps warmup is its "3.3x" end to end
    assert P._end_to_end(5.48, 0.151) == pytest.approx(3.27, abs=0.01)
    claim = pd.Series({"kind": "end_to_end", "value": 2.8, "warmup_ratio": 0.167})
    assert P._end_to_end(P._stage_speedup(claim), 0.167) == pytest.approx(2.8)
    assert P._stage_speedup(pd.Series({"kind": "end_to_end", "value": 7.0, "warmup_ratio": 0.15})) == math.inf


def test_the_v100_shapes_found_from_the_probe_rows():
    fits = _v100_fits(PAPER_DIR)
    shapes = {group: fit.shape for group, (_, fit) in fits.items()}
    for spec, _ in fits.values():  # a real cluster: no emulator term, the all-reduce priced as probed
        assert not spec.shared_host and spec.route(64) == "probed" and spec.route(2) == "probed"
    # the 1-bit Adam paper's Ethernet all-reduce grows as one ring over every GPU, the others as two-level ones
    assert shapes == {
        "onebit_adam/ethernet": "flat_ring",
        "onebit_adam/infiniband": "two_level",
        "onebit_lamb/ethernet": "two_level",
        "onebit_lamb/infiniband": "two_level",
    }


@pytest.mark.slow
def test_the_report_ends_with_its_line():
    text, summary = P.published_report()
    assert text.splitlines()[-1] == P.format_last_line(summary)
    assert "uncalibrated" in text and "in-sample" in text


@pytest.mark.slow
def test_the_route_bands_mode_predict_prints_are_what_the_report_finds():
    from birder_repro.perf.cluster import ROUTE_ERROR_BANDS

    v100, _ = P.v100_frame()
    birder, _ = P.birder_frame()
    bands = P.route_bands(pd.concat([v100, birder], ignore_index=True))
    for route, band in ROUTE_ERROR_BANDS.items():
        for key, value in band.items():
            assert round(bands[route][key], 2) == pytest.approx(value), (route, key)


def test_the_compressed_methods_probe_rows_give_back_a_known_exchange():
    """Rows made by the model itself with a known exchange (1-bit Adam's world one, shared fabric; Birder's inter
    one, pairwise), 1-bit Adam's averaged with its fp32 warmup as the paper's rows are: the probe's samples
    (published_birder.exchange_samples) recover each exchange's shape and rate from the 2- and 4-node rows."""
    from dataclasses import replace

    from birder_repro.perf.exchange_shape import ExchangeFit, rank_exchange_shapes
    from birder_repro.perf.model import predict_run
    from birder_repro.perf.published_birder import exchange_samples
    from birder_repro.perf.validate_rows import _paper_profile, _warmup, cluster_spec

    cluster = "ethernet_10g"
    spec = cluster_spec(cluster)
    truth = {"world": ExchangeFit("shared_fabric", 20e-6, 3e9), "inter": ExchangeFit("pairwise", 300e-6, 0.4e9)}
    made = replace(spec, exchange_shape=truth)
    rows = []
    for task, batch in (("resnet50", 32), ("bert_squad", 3)):
        profile = _paper_profile(task, batch, spec, "paper")
        for optimizer, scheme in (("sgdm", "fp32"), ("onebit_adam", "onebit"), ("birder", "hierarchical")):
            for n in (1, 2, 4):
                f = _warmup(scheme, task, batch)
                run = predict_run(profile, made, n, 8, scheme, batch, warmup_fraction=f, implementation="paper")
                rows.append(
                    {"task": task, "batch_per_gpu": batch, "optimizer": optimizer, "nodes": n, "gpus_per_node": 8,
                     "role": "profile" if n == 1 else "probe", "step_ms": 1e3 * run["run"]["total_s"]}
                )  # fmt: skip
    samples = exchange_samples(pd.DataFrame(rows), cluster, spec)
    for group, fit in truth.items():
        found = rank_exchange_shapes(samples[group])[0]
        assert found.shape == fit.shape, group
        assert found.bytes_per_s == pytest.approx(fit.bytes_per_s, rel=1e-3), group
        assert found.alpha_s == pytest.approx(fit.alpha_s, rel=1e-2), group
