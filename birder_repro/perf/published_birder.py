"""The Birder paper's A100 clusters in ``make validate-published`` (perf.published): Tables 3 and 4 and Table 1's
128-a-GPU rows, a cluster per interconnect; the profile from the 1-node rows (perf.paper_profiles), the probe
from the rows at 2 and 4 nodes (perf.published_protocol), the 8-node rows predicted."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from pathlib import Path

import pandas as pd

from .cluster import PAIRWISE, ClusterSpec
from .collectives import ring_allreduce
from .exchange_shape import ExchangeFit, ExchangeSample, rank_exchange_shapes
from .implementations import implementation_of
from .model import predict_step
from .published_protocol import measured_table as _table
from .published_protocol import relative_error as _err
from .published_protocol import split
from .schemes import bucket_collectives, scheme_for_optim
from .shape import Measured, ShapeFit, rank_shapes
from .validate_rows import PAPER_DIR, _paper_profile, _warmup, cluster_spec, validate

__all__ = ["BIRDER_GROUPS", "BASELINES", "load_birder_rows", "birder_frame"]

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


# the compressed methods whose probe rows measure an exchange across nodes, and the group it runs over
EXCHANGE_METHODS = {"onebit_adam": "world", "birder": "inter"}
_FREE = ExchangeFit("pairwise", 0.0, math.inf)  # an exchange that costs nothing: what the rest of a step takes


def exchange_samples(rows: pd.DataFrame, cluster: str, spec: ClusterSpec) -> dict[str, list[ExchangeSample]]:
    """The probe rows of each compressed method as measured exchanges across nodes (what a user's probe of that
    method would time), per group (:data:`EXCHANGE_METHODS`): the row's step less the model's step with those
    collectives free (``spec``: the measured all-reduce, the 1-node profile's compute, compression, intra-node
    collectives and leftover; the paper ran both methods without overlap, perf.implementations "paper", so the
    rest adds). 1-bit Adam's rows average its warmup and compression stages (appendix E): its compression
    stage's step is (t - f t_warmup) / (1 - f), t_warmup the baseline's row at the same layout (the 1-node
    profile's assumption, perf.profiles/paper.yaml, step 3)."""
    free = replace(spec, exchange_shape={"world": _FREE, "inter": _FREE})
    out: dict[str, list[ExchangeSample]] = {group: [] for group in EXCHANGE_METHODS.values()}
    for (task, batch), g in rows.groupby(["task", "batch_per_gpu"], sort=False):
        profile = _paper_profile(task, int(batch), cluster_spec(cluster), "paper")
        probe = g[(g["role"] == "probe") & g["optimizer"].isin(list(EXCHANGE_METHODS))]
        for _, r in probe.iterrows():
            n, m, scheme = int(r["nodes"]), int(r["gpus_per_node"]), scheme_for_optim(str(r["optimizer"]))
            step = float(r["step_ms"]) / 1e3
            f = _warmup(scheme, task, int(batch))
            if f > 0:
                base = g[(g["nodes"] == n) & g["optimizer"].isin(BASELINES)]["step_ms"].iloc[0] / 1e3
                step = (step - f * base) / (1 - f)
            rest = predict_step(profile, free, n, m, scheme, int(batch), implementation="paper").total_s
            whole = implementation_of("paper", scheme).granularity == "whole"
            sizes = [profile.parameter_count] if whole else profile.buckets()
            ops = tuple(
                (op.group, op.nbytes)
                for size in sizes
                for op in bucket_collectives(scheme, size, n, m)
                if op.kind in PAIRWISE and op.group != "intra"
            )
            if step > rest:  # a row faster than the rest of its step measures no exchange
                out[EXCHANGE_METHODS[str(r["optimizer"])]].append(ExchangeSample(n, m, ops, step - rest))
    return out


@cache
def _birder_probed(cluster: str, paper_dir: Path = PAPER_DIR) -> tuple[dict, ShapeFit, ShapeFit]:
    """The probed cluster: the all-reduce's shape and table from the baselines' probe rows, and each compressed
    exchange's own shape and rate from its method's probe rows (:func:`exchange_samples`,
    perf.exchange_shape). Returns (the ClusterSpec fields measured, the all-reduce's shape, its runner-up); the
    exchanges' fits ranked are under ``exchange_ranked``."""
    rows = split(load_birder_rows(paper_dir))
    rows = rows[rows["cluster"] == cluster]
    points, m = _birder_points(rows, cluster)
    spec = cluster_spec(cluster)
    fit, runner_up = rank_shapes(points, m, lambda s: ring_allreduce(s, m, spec.intra))[:2]
    measured: dict = {"allreduce_shape": fit, "allreduce_table": _table(points)}
    samples = exchange_samples(rows, cluster, replace(spec, **measured))
    ranked = {group: rank_exchange_shapes(s) for group, s in samples.items()}
    measured["exchange_shape"] = {group: fits[0] for group, fits in ranked.items()}
    return {**measured, "exchange_ranked": ranked}, fit, runner_up


def birder_frame(paper_dir: Path = PAPER_DIR) -> tuple[pd.DataFrame, dict[str, dict]]:
    rows = split(load_birder_rows(paper_dir))
    out, fits = [], {}
    for cluster, group in BIRDER_GROUPS.items():
        link, fit, runner_up = _birder_probed(cluster, paper_dir)
        fits[group] = {"fit": fit, "runner_up": runner_up, "link": link}
        fields = {k: v for k, v in link.items() if k != "exchange_ranked"}
        for route, links in (("probed", {cluster: fields}), ("uncalibrated", None)):
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
