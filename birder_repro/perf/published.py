"""The performance model against every published real-cluster measurement: ``make validate-published``.

    python -m birder_repro.perf.published [--rows]

The rows (tables/paper/, transcribed, each citing its paper, table and row):

    the Birder paper, Tables 3 and 4 (ResNet-50 and BERT-Base on 8 x A100 nodes, 10 Gbit/s Ethernet and 200 Gbit/s
        InfiniBand: throughput), and Table 1's 128-a-GPU rows (Table 1's 32-a-GPU rows and Table 2 repeat
        Tables 3 and 4's Ethernet ones);
    the 1-bit Adam paper (PAPER_TITLES), Table 1 (onebit_adam_table1.csv) and the 1-bit LAMB paper, appendix Table 5
        (onebit_lamb_table5.csv): BERT-Large (340M parameters, fp16) pre-training on V100 nodes, 4 a node over
        Ethernet (4.1 Gbit/s by iperf), 8 a node over 100 Gbit/s InfiniBand: forward, backward all-reduce, the
        rest of the backward pass and the optimizer step, in ms;
    the speedups those two papers claim for their compression stage and end to end, and APMSqueeze's speedups
        against bandwidth (published_claims.csv).

THE PROTOCOL, one for every cluster, fixed in code (:func:`split`) before any prediction:

    profile    a cluster's 1-node rows: what a user's 1-node profile measures;
    probe      its rows at its two smallest multi-node counts: what a user's probe (mode=probe) at those node
               counts would measure. From them the all-reduce's shape is found and its link fitted
               (birder_repro.perf.shape.detect_shape); the optimizer step's growth over its 1-node time is its
               collectives' latency, carried by the same shape;
    predicted  every other row and every claim.

The two 1-bit papers ran on the same clusters, but their all-reduces disagree (Ethernet, 4 nodes of 4: 2133 ms in
the 1-bit Adam paper, 3436 in the 1-bit LAMB paper; a flat ring's growth in one, a two-level one's in the other):
each paper's rows are a cluster of their own, with a probe of their own.

What the published rows do not hold, and the model is therefore given (ASSUMPTIONS, each printed):

- the 1-bit exchange (DeepSpeed's compressed all-reduce: an all-to-all of the signs and an all-gather over every
  GPU) is priced at the rate the probe's all-reduce reached through a node's link, per byte that crosses it
  (no all-to-all was measured) and its compression at 0 (no V100 figure is published): a predicted claim is an
  upper bound in that; where a claim is missed, what the exchange would have had to reach is printed;
- the V100 rows' compute has one micro-batch size at one node: linear in the batch from there (rows at another
  micro-batch are marked);
- on the Birder paper's clusters the probe's all-reduce is the baseline's step growth over its 1-node step (its
  DDP did not overlap, perf.implementations "paper"), and the exchange's link (efficiency, latency) is fitted on
  the probe rows' compressed methods (perf.validate.fit_link), the measured all-reduce held fixed.

Routes: ``probed`` (the protocol) and ``uncalibrated`` (the shipped cluster configs, conf/cluster/ethernet_10g.yaml
and infiniband_200g.yaml, with the user's link rate: 4100 Mbit/s and 100 Gbit/s on the V100 clusters; on the
Birder paper's clusters the shipped settings were fitted on all its rows, so that route is in-sample there).
In-sample figures (the probe rows, predicted from the fit they made) are printed beside, named so. The last line
is ``published: worst cluster median X %, worst row Y %, worst claim Z %`` over the probed route's predicted
rows (all-reduce and step time) and claims.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pandas as pd

from .cluster import MBIT, ClusterSpec, op_time
from .collectives import Link, ring_allreduce
from .implementations import Implementation
from .model import predict_step
from .profile import Profile
from .schemes import Collective, bucket_collectives, counted_bytes
from .shape import Measured, ShapeFit, detect_shape, latency_steps, rank_shapes
from .validate import PAPER_DIR, _paper_profile, cluster_spec, fit_link, validate

__all__ = [
    "TARGETS",
    "BERT_LARGE_PARAMS",
    "V100_FILES",
    "split",
    "load_v100_rows",
    "load_claims",
    "v100_profile",
    "v100_probe",
    "v100_frame",
    "load_birder_rows",
    "birder_frame",
    "claims_frame",
    "cluster_table",
    "route_bands",
    "Summary",
    "summarize",
    "published_report",
    "format_last_line",
    "main",
]

# The targets: every cluster's median error, every row, every claim (absolute relative error).
TARGETS = {"cluster_median": 0.15, "row": 0.35, "claim": 0.25}
BERT_LARGE_PARAMS = 340_000_000  # "BERT-Large (L=24, H=1024, A=16, 340M params)", 1-bit LAMB paper, section 6
V100_FILES = {"onebit_adam": "onebit_adam_table1.csv", "onebit_lamb": "onebit_lamb_table5.csv"}
PAPER_TITLES = {
    "birder": "the Birder paper, Tables 1, 3, 4",
    "onebit_adam": "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed "
    "(Tang et al., ICML 2021), Table 1",
    "onebit_lamb": "1-bit LAMB: Communication Efficient Large-Scale Large-Batch Training with LAMB's Convergence "
    "Speed, appendix Table 5",
    "apmsqueeze": "APMSqueeze: A Communication Efficient Adam-Preconditioned Momentum SGD Algorithm (Tang et al.), "
    "section 5.2",
}
# the uncalibrated route: the shipped config of each interconnect, and the rate a user would give for it
UNCALIBRATED = {"ethernet": ("ethernet_10g", 4100.0), "infiniband": ("infiniband_200g", 100_000.0)}
# DeepSpeed (both 1-bit papers): the fp16 gradients all-reduced in one buffer after the backward pass, and the
# compressed exchange inside the optimizer's step; neither overlaps the backward pass
V100_IMPLEMENTATION = {
    "fp16": Implementation(overlap=0.0, granularity="whole"),
    "onebit": Implementation(overlap=0.0, granularity="whole"),
}
# the optimizer's own collectives a step (ASSUMPTION, DeepSpeed's fp16 optimizer): the loss scaler's overflow
# flag and the gradients' global norm, each a small all-reduce over every GPU
OPTIMIZER_COLLECTIVES = [["allreduce", 4.0], ["allreduce", 4.0]]


def split(rows: pd.DataFrame) -> pd.DataFrame:
    """THE PROTOCOL: each row's ``role`` in its ``group`` (a cluster): ``profile`` (1 node), ``probe`` (the
    group's two smallest multi-node counts) or ``predicted`` (every other row)."""
    out = rows.copy()
    roles = []
    for _, row in out.iterrows():
        multi = sorted({int(n) for n in out.loc[out["group"] == row["group"], "nodes"] if int(n) > 1})
        n = int(row["nodes"])
        roles.append("profile" if n == 1 else "probe" if n in multi[:2] else "predicted")
    out["role"] = roles
    return out


def load_v100_rows(paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    """The 1-bit Adam paper's Table 1 and the 1-bit LAMB paper's Table 5, one frame, ``group`` = paper + cluster."""
    frames = [pd.read_csv(paper_dir / name) for name in V100_FILES.values()]
    rows = pd.concat(frames, ignore_index=True)
    rows["group"] = rows["paper"] + "/" + rows["cluster"]
    rows["measured_step_ms"] = rows[["forward_ms", "allreduce_ms", "backward_else_ms", "step_ms"]].sum(axis=1)
    return rows


def load_claims(paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    return pd.read_csv(paper_dir / "published_claims.csv")


# ---- the V100 clusters of the 1-bit papers -------------------------------------------------------------------


def _fp16_bytes() -> float:
    return 2.0 * BERT_LARGE_PARAMS


def v100_profile(one_node: pd.Series) -> Profile:
    """The 1-node profile of a V100 cluster from its 1-node row: forward + the rest of the backward pass at that
    row's batch a GPU (micro-batch x accumulation), the optimizer step, fp16, one buffer (DeepSpeed)."""
    return Profile(
        name=f"{one_node['paper']}:{one_node['cluster']}:1-node",
        device=f"{int(one_node['gpus_per_node'])} x V100 a node",
        task="bert_large_pretrain_seq128",
        batch_size=int(one_node["batch_per_gpu"] * one_node["accumulation"]),
        forward_backward_s=(float(one_node["forward_ms"]) + float(one_node["backward_else_ms"])) / 1e3,
        parameter_count=BERT_LARGE_PARAMS,
        optimizer_s=float(one_node["step_ms"]) / 1e3,
        compression_s_per_element={"onebit": 0.0, "fp16": 0.0},  # fp16 training: no cast; 1-bit: not published
        precision="fp16",
        bucket_layout="one_buffer",
        optimizer_collectives=[list(c) for c in OPTIMIZER_COLLECTIVES],
        notes=f"{PAPER_TITLES[str(one_node['paper'])]}, row {int(one_node['row'])}",
    )


def _intra_link(one_node: pd.Series) -> Link:
    """The node's link as its measured 1-node all-reduce of the fp16 gradients says (a ring over its GPUs)."""
    m, seconds = int(one_node["gpus_per_node"]), float(one_node["allreduce_ms"]) / 1e3
    return Link(0.0, 2 * (m - 1) / m * _fp16_bytes() / seconds)


def v100_probe(one_node: pd.Series, probe: pd.DataFrame) -> tuple[ClusterSpec, ShapeFit, ShapeFit]:
    """The cluster spec a probe at the probe rows' node counts gives: the all-reduce's shape and rate from their
    all-reduce column (perf.shape.detect_shape; the node's phase from the 1-node row), a network step's latency
    from their optimizer step's growth over the 1-node step (its collectives, carried by that shape). Returns
    the spec, the shape's fit and the runner-up shape's fit."""
    m = int(one_node["gpus_per_node"])
    intra = _intra_link(one_node)
    points = [Measured(int(r["nodes"]), _fp16_bytes(), float(r["allreduce_ms"]) / 1e3) for _, r in probe.iterrows()]
    fit = detect_shape(points, m, lambda s: ring_allreduce(s, m, intra))
    runner_up = rank_shapes(points, m, lambda s: ring_allreduce(s, m, intra))[1]
    steps = [
        (
            len(OPTIMIZER_COLLECTIVES) * latency_steps(fit.shape, int(r["nodes"]), m),
            (r["step_ms"] - one_node["step_ms"]) / 1e3,
        )
        for _, r in probe.iterrows()
    ]
    alpha = max(0.0, sum(k * y for k, y in steps) / sum(k * k for k, _ in steps))
    fit = replace(fit, alpha_s=alpha)
    spec = ClusterSpec(
        name=f"{one_node['paper']}:{one_node['cluster']}:probed",
        inter_mbit=fit.bytes_per_s / MBIT,
        inter_latency_us=alpha * 1e6,
        inter_efficiency=1.0,
        intra_mbit=intra.bandwidth_Bps / MBIT,
        intra_latency_us=0.0,
        allreduce_shape=fit,
        allreduce_table=_table(points),
    )
    return spec, fit, runner_up


def _table(points: Sequence[Measured]) -> dict[int, list[list[float]]]:
    """Measured all-reduces as ClusterSpec.allreduce_table: [bytes, seconds] per node count."""
    table: dict[int, list[list[float]]] = {}
    for p in points:
        table.setdefault(p.nodes, []).append([p.nbytes, p.seconds])
    return table


def v100_uncalibrated(one_node: pd.Series) -> ClusterSpec:
    """The shipped config of the row's interconnect at the user's link rate, the node's link as measured."""
    name, mbit = UNCALIBRATED[str(one_node["cluster"])]
    return replace(cluster_spec(name), inter_mbit=mbit, intra_mbit=_intra_link(one_node).bandwidth_Bps / MBIT)


def _v100_predict(profile: Profile, spec: ClusterSpec, row: pd.Series, scheme: str = "fp16") -> dict[str, float]:
    n, m = int(row["nodes"]), int(row["gpus_per_node"])
    batch = int(row["batch_per_gpu"] * row["accumulation"])
    step = predict_step(profile, spec, n, m, scheme, batch, implementation=V100_IMPLEMENTATION)
    allreduce = op_time(Collective("allreduce", "world", _fp16_bytes(), "float16"), n, m, spec)
    return {"allreduce_s": allreduce, "step_s": step.total_s, "exchange_s": step.communication_s}


def _err(pred: float, measured: float) -> float:
    return pred / measured - 1


def v100_frame(paper_dir: Path = PAPER_DIR) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Every V100 row with its role, and per group and route the predicted all-reduce and step, and errors."""
    rows = split(load_v100_rows(paper_dir))
    out, fits = [], {}
    for group, g in rows.groupby("group", sort=False):
        one = g[g["role"] == "profile"].iloc[0]
        profile = v100_profile(one)
        probed, fit, runner_up = v100_probe(one, g[g["role"] == "probe"])
        fits[group] = {"fit": fit, "runner_up": runner_up, "spec": probed, "profile": profile, "one_node": one}
        routes = {"probed": probed, "uncalibrated": v100_uncalibrated(one)}
        for _, row in g[g["role"] != "profile"].iterrows():
            for route, spec in routes.items():
                p = _v100_predict(profile, spec, row)
                out.append(
                    {
                        "group": group,
                        "paper": row["paper"],
                        "source": f"Table {int(row['table'])}, row {int(row['row'])}",
                        "route": route,
                        "role": row["role"],
                        "nodes": int(row["nodes"]),
                        "batch": int(row["batch"]),
                        "allreduce_error": _err(p["allreduce_s"] * 1e3, row["allreduce_ms"]),
                        "step_error": _err(p["step_s"] * 1e3, row["measured_step_ms"]),
                        "note": "" if row["batch_per_gpu"] == one["batch_per_gpu"] else "micro-batch not profiled",
                        "route_in_sample": False,
                    }
                )
    return pd.DataFrame(out), fits


# ---- the Birder paper's A100 clusters --------------------------------------------------------------------------

BIRDER_GROUPS = {"ethernet_10g": "birder/ethernet", "infiniband_200g": "birder/infiniband"}
BASELINES = ("sgdm", "bertadam")


def load_birder_rows(paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    """Tables 3 and 4, and Table 1's 128-a-GPU rows (Table 1's 32-a-GPU rows and Table 2 repeat Tables 3 and 4's
    Ethernet rows), with ``group`` = birder/<interconnect>."""
    t1 = pd.read_csv(paper_dir / "table1.csv")
    frames = [t1[t1["batch_per_gpu"] == 128]] + [pd.read_csv(paper_dir / f"table{t}.csv") for t in (3, 4)]
    rows = pd.concat(frames, ignore_index=True)
    rows["group"] = rows["cluster"].map(BIRDER_GROUPS)
    rows["step_ms"] = 1e3 * rows["gpus"] * rows["batch_per_gpu"] / rows["throughput"]
    return rows


def _birder_points(rows: pd.DataFrame, cluster: str) -> tuple[list[Measured], int]:
    """The probe rows' baselines as measured all-reduces: the step's growth over the 1-node step, shared among
    the profile's buckets (the paper's DDP all-reduced bucket by bucket, not overlapped)."""
    points, m = [], 8
    for (task, batch), g in rows[rows["optimizer"].isin(BASELINES)].groupby(["task", "batch_per_gpu"]):
        one = g[g["nodes"] == 1]
        if one.empty:
            continue
        profile = _paper_profile(task, int(batch), cluster_spec(cluster), "paper")
        k = len(profile.buckets())
        for _, r in g[g["role"] == "probe"].iterrows():
            grow = (r["step_ms"] - one["step_ms"].iloc[0]) / 1e3
            points.append(Measured(int(r["nodes"]), 4.0 * profile.parameter_count / k, grow / k))
            m = int(r["gpus_per_node"])
    return points, m


@cache
def _birder_probed(cluster: str, paper_dir: Path = PAPER_DIR) -> tuple[dict, ShapeFit, ShapeFit]:
    rows = split(load_birder_rows(paper_dir))
    rows = rows[rows["cluster"] == cluster]
    points, m = _birder_points(rows, cluster)
    spec = cluster_spec(cluster)
    fit, runner_up = rank_shapes(points, m, lambda s: ring_allreduce(s, m, spec.intra))[:2]
    probe_nodes = sorted(set(rows.loc[rows["role"] == "probe", "nodes"].astype(int)))
    measured = {"allreduce_shape": fit, "allreduce_table": _table(points)}
    link = fit_link(cluster, nodes=probe_nodes, paper_dir=paper_dir, base=measured)
    return {**link, **measured}, fit, runner_up


def birder_frame(paper_dir: Path = PAPER_DIR) -> tuple[pd.DataFrame, dict[str, dict]]:
    rows = split(load_birder_rows(paper_dir))
    out, fits = [], {}
    for cluster, group in BIRDER_GROUPS.items():
        link, fit, runner_up = _birder_probed(cluster, paper_dir)
        fits[group] = {"fit": fit, "runner_up": runner_up, "link": link}
        for route, links in (("probed", {cluster: link}), ("uncalibrated", None)):
            frame = validate((1, 3, 4), links, paper_dir, clusters=(cluster,))
            frame = frame[~((frame["table"] == 1) & (frame["batch"] == 32))]
            for _, f in frame[frame["nodes"] > 1].iterrows():
                match = rows[
                    (rows["table"] == f["table"])
                    & (rows["cluster"] == cluster)
                    & (rows["optimizer"] == f["optimizer"])
                    & (rows["nodes"] == f["nodes"])
                    & (rows["batch_per_gpu"] == f["batch"])
                ].iloc[0]
                step_error = float(f["throughput"]) / float(f["pred_throughput"]) - 1  # step = 1 / throughput
                allreduce_error = math.nan
                if f["optimizer"] in BASELINES:  # the all-reduce as the step's growth over one node
                    one = frame[
                        (frame["nodes"] == 1) & (frame["optimizer"] == f["optimizer"]) & (frame["batch"] == f["batch"])
                    ]
                    if len(one):
                        gpus, batch = float(f["gpus"]), float(f["batch"])
                        one_step = 8 * batch / float(one["throughput"].iloc[0])
                        measured = gpus * batch / float(f["throughput"]) - one_step
                        predicted = gpus * batch / float(f["pred_throughput"]) - 8 * batch / float(
                            one["pred_throughput"].iloc[0]
                        )
                        allreduce_error = _err(predicted, measured)
                out.append(
                    {
                        "group": group,
                        "paper": "birder",
                        "source": f"Table {int(f['table'])}, {f['task']}, {f['optimizer']}, {int(f['gpus'])} GPUs",
                        "route": route,
                        "role": match["role"],
                        "nodes": int(f["nodes"]),
                        "batch": int(f["batch"]) * int(f["gpus"]),
                        "allreduce_error": allreduce_error,
                        "step_error": step_error,
                        "note": "",
                        # the shipped settings were fitted on every row of these tables: not a new cluster
                        "route_in_sample": route == "uncalibrated",
                    }
                )
    return pd.DataFrame(out), fits


# ---- the claims ----------------------------------------------------------------------------------------------


def _stage_speedup(claim: pd.Series) -> float:
    """The compression stage's speedup a claim states or implies: an end-to-end one e with warmup ratio w is
    1 / (w + (1 - w) / s) (both 1-bit papers' formula), so s = (1 - w) / (1 / e - w); inf where e >= 1 / w."""
    if claim["kind"] == "compression_stage":
        return float(claim["value"])
    w, e = float(claim["warmup_ratio"]), float(claim["value"])
    return math.inf if 1 / e <= w else (1 - w) / (1 / e - w)


def _end_to_end(stage: float, w: float) -> float:
    return 1.0 / (w + (1 - w) / stage)


def _exchange_node_bytes(n: int, m: int) -> float:
    """Bytes one node's link sends in a step of the 1-bit exchange of the fp16 model's signs (all its GPUs')."""
    ops = bucket_collectives("onebit", BERT_LARGE_PARAMS, n, m)
    return m * sum(counted_bytes(op, n, m)[1] for op in ops)


def claims_frame(v100_fits: dict[str, dict], paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    out = []
    claims = load_claims(paper_dir)
    rows = load_v100_rows(paper_dir)
    for _, c in claims.iterrows():
        base = {"claim": c["claim"], "paper": c["paper"], "where": c["where"], "kind": c["kind"], "claimed": c["value"]}
        group = f"{c['paper']}/{c['cluster']}"
        if group not in v100_fits:
            out.append({**base, **_apmsqueeze_check(c)})
            continue
        f = v100_fits[group]
        row = rows[(rows["group"] == group) & (rows["nodes"] == c["nodes"]) & (rows["batch"] == c["batch"])].iloc[0]
        baseline = _v100_predict(f["profile"], f["spec"], row, "fp16")
        onebit = _v100_predict(f["profile"], f["spec"], row, "onebit")
        stage = baseline["step_s"] / onebit["step_s"]
        predicted = stage if c["kind"] == "compression_stage" else _end_to_end(stage, float(c["warmup_ratio"]))
        error = _err(predicted, float(c["value"]))
        need = ""
        if abs(error) > TARGETS["claim"]:
            wanted = _stage_speedup(c)
            rest = onebit["step_s"] - onebit["exchange_s"]
            exchange = baseline["step_s"] / wanted - rest
            n, m = int(row["nodes"]), int(row["gpus_per_node"])
            measured_rate = f["fit"].bytes_per_s * 8 / 1e9
            if exchange > 0:
                rate = _exchange_node_bytes(n, m) * 8 / exchange / 1e9
                need = (
                    f"the exchange would have had to take {1e3 * exchange:.0f} ms (predicted "
                    f"{1e3 * onebit['exchange_s']:.0f}): {rate:.1f} Gbit/s a node, {rate / measured_rate:.2f}x the "
                    f"all-reduce's measured {measured_rate:.2f}"
                )
            else:
                need = "not reachable even with a free exchange"
        out.append({**base, "predicted": predicted, "error": error, "status": "predicted", "need": need})
    return pd.DataFrame(out)


def _apmsqueeze_check(c: pd.Series) -> dict:
    """APMSqueeze's text gives no 1-node row and no probe of its cluster: nothing to predict from. Its end-to-end
    claims are checked against its own formula's bound instead: with a share w of the run uncompressed, no
    compression stage gives more than 1 / w end to end."""
    if c["kind"] != "end_to_end":
        return {"predicted": math.nan, "error": math.nan, "status": "not predicted", "need": "no 1-node row, no probe"}
    bound = 1 / float(c["warmup_ratio"])
    ok = float(c["value"]) <= bound
    need = f"within the bound 1/w = {bound:.2f}" if ok else f"ABOVE the bound 1/w = {bound:.2f} of any compression"
    return {"predicted": math.nan, "error": math.nan, "status": "not predicted", "need": need}


# ---- the report ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    worst_cluster_median: float
    worst_row: float
    worst_claim: float


def format_last_line(summary: Summary) -> str:
    """The report's last line, exactly: ``published: worst cluster median X %, worst row Y %, worst claim Z %``."""
    return (
        f"published: worst cluster median {100 * summary.worst_cluster_median:.1f} %, "
        f"worst row {100 * summary.worst_row:.1f} %, worst claim {100 * summary.worst_claim:.1f} %"
    )


def _stats(values: Sequence[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.median(abs(v) for v in vals), max(vals, key=abs)


def _pct(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return "-"
    return f"{100 * x:+.0f} %" if signed else f"{100 * x:.0f} %"


def _errors(r: pd.DataFrame) -> dict[str, str]:
    ar_med, ar_worst = _stats(r["allreduce_error"].tolist())
    st_med, st_worst = _stats(r["step_error"].tolist())
    return {
        "rows": str(len(r)),
        "all-reduce": f"{_pct(ar_med)}, {_pct(ar_worst, True)}",
        "step": f"{_pct(st_med)}, {_pct(st_worst, True)}",
    }


def cluster_table(rows: pd.DataFrame, fits: dict[str, dict], route: str = "probed") -> pd.DataFrame:
    """A row per cluster for ``route``: its predicted rows' errors (median |error|, worst signed error) and, for
    the probed route, the shape found (the runner-up and how many times the best's residual it left), the link's
    rate, and the probe rows' errors beside, named in-sample; for the uncalibrated route, whether its shipped
    settings were fitted on that cluster's rows."""
    out = []
    for group, g in rows.groupby("group", sort=False):
        line: dict[str, str] = {"cluster": str(group)}
        mine = g[g["route"] == route]
        if route == "probed":
            fit, runner_up = fits[group]["fit"], fits[group]["runner_up"]
            margin = runner_up.residual / fit.residual if fit.residual > 0 else math.inf
            line["shape (runner-up x)"] = f"{fit.shape} ({runner_up.shape} {margin:.3g}x)"
            line["link Gbit/s"] = f"{fit.bytes_per_s * 8 / 1e9:.2f}"
        line.update(_errors(mine[mine["role"] == "predicted"]))
        if route == "probed":
            inside = _errors(mine[mine["role"] == "probe"])
            line.update({f"in-sample {k}": v for k, v in inside.items()})
        else:
            fitted_here = bool(mine["route_in_sample"].any())
            line["settings"] = "fitted on these rows: in-sample" if fitted_here else "new cluster"
        out.append(line)
    return pd.DataFrame(out)


def route_bands(rows: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per route, over every cluster's predicted rows: the median and worst |error| of the step time and of the
    all-reduce (perf.cluster.ROUTE_ERROR_BANDS holds them for mode=predict to print). The uncalibrated route on
    the Birder paper's clusters is left out: the shipped settings were fitted on those rows."""
    out = {}
    for route, g in rows[(rows["role"] == "predicted") & ~rows["route_in_sample"]].groupby("route"):
        band = {}
        for col, key in (("step_error", "step"), ("allreduce_error", "allreduce")):
            med, worst = _stats(g[col].tolist())
            band[f"{key}_median"], band[f"{key}_worst"] = med, abs(worst)
        out[str(route)] = band
    return out


def summarize(rows: pd.DataFrame, claims: pd.DataFrame) -> Summary:
    probed = rows[(rows["route"] == "probed") & (rows["role"] == "predicted")]
    medians, worst = [], 0.0
    for _, g in probed.groupby("group"):
        for col in ("allreduce_error", "step_error"):
            med, w = _stats(g[col].tolist())
            if not math.isnan(med):
                medians.append(med)
                worst = max(worst, abs(w))
    predicted_claims = claims[claims["status"] == "predicted"]["error"].abs()
    return Summary(max(medians), worst, float(predicted_claims.max()) if len(predicted_claims) else math.nan)


def published_report(paper_dir: Path = PAPER_DIR, show_rows: bool = False) -> tuple[str, Summary]:
    v100, v100_fits = v100_frame(paper_dir)
    birder, birder_fits = birder_frame(paper_dir)
    rows = pd.concat([v100, birder], ignore_index=True)
    fits = {**v100_fits, **birder_fits}
    claims = claims_frame(v100_fits, paper_dir)
    summary = summarize(rows, claims)
    lines = [
        "The performance model against every published real-cluster measurement "
        "(python -m birder_repro.perf.published)",
        "protocol: profile = a cluster's 1-node rows; probe = its rows at its two smallest multi-node counts; "
        "every other row and claim predicted",
        "errors: median |error|, worst signed error (predicted / published - 1); all-reduce on the Birder paper's "
        "clusters: the baseline's step growth over one node",
        "",
        "probed route (profile + probe rows; predicted rows, and the probe rows in-sample beside):",
        cluster_table(rows, fits, "probed").to_string(index=False),
        "",
        "uncalibrated route (the shipped cluster settings at the user's link rate, no probe):",
        cluster_table(rows, fits, "uncalibrated").to_string(index=False),
        "",
        "claims (probed route; the 1-bit exchange at the all-reduce's measured rate, its compression free: "
        "an upper bound):",
    ]
    for _, c in claims.iterrows():
        pred = "-" if math.isnan(c["predicted"]) else f"{c['predicted']:.2f}x"
        err = "" if math.isnan(c["error"]) else f" ({100 * c['error']:+.0f} %)"
        lines.append(
            f"  {c['claim']:<18} {c['kind']:<18} claimed {c['claimed']:>5.2f}x  predicted {pred}{err}  [{c['where']}]"
        )
        if c["need"]:
            lines.append(f"  {'':<18} {c['need']}")
    lines += ["", "error band by route, every cluster's predicted rows (median |error|, worst |error|):"]
    for route, band in route_bands(rows).items():
        lines.append(
            f"  {route:<13} step time {_pct(band['step_median'])}, {_pct(band['step_worst'])}; "
            f"all-reduce {_pct(band['allreduce_median'])}, {_pct(band['allreduce_worst'])}"
        )
    if show_rows:
        lines += ["", rows.to_string(index=False)]
    met = (
        summary.worst_cluster_median <= TARGETS["cluster_median"]
        and summary.worst_row <= TARGETS["row"]
        and summary.worst_claim <= TARGETS["claim"]
    )
    lines += [
        "",
        f"targets: every cluster's median <= {100 * TARGETS['cluster_median']:.0f} %, every row within "
        f"{100 * TARGETS['row']:.0f} %, every claim within {100 * TARGETS['claim']:.0f} %: "
        f"{'MET' if met else 'MISSED'}",
        format_last_line(summary),
    ]
    return "\n".join(lines), summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.perf.published", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", action="store_true", help="also print every row's errors")
    args = parser.parse_args(argv)
    text, _ = published_report(show_rows=args.rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
