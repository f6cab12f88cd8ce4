"""validate: the paper's rows predicted: every row of its Tables 1-4, throughput, speedup and scale efficiency.

The rows of ``python -m birder_repro.perf.validate`` (its docstring says what is predicted from what, and the
target): each multi-node row of tables/paper/*.csv predicted from the paper profile of its task and batch and the
cluster config of its interconnect, with other link numbers where a fit (``perf.link_fit``) tries them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import pandas as pd
import yaml

from birder_repro.config.resources import paper_tables_dir

from .cluster import CLUSTER_DIR, ClusterSpec
from .implementations import ImplementationLike
from .model import predict_run
from .paper_profiles import _data as _paper_data
from .paper_profiles import paper_profile
from .schemes import scheme_for_optim

__all__ = ["TARGET", "CLUSTERS", "PAPER_DIR", "cluster_spec", "validate", "target_rows", "median_speedup_error"]

TARGET = 0.15
CLUSTERS = ("ethernet_10g", "infiniband_200g")  # the interconnects of Tables 3 and 4
REPO = Path(__file__).resolve().parents[2]
PAPER_DIR = paper_tables_dir()  # tables/paper, of the checkout or installed with the package


def cluster_spec(name: str, link: dict[str, float] | None = None) -> ClusterSpec:
    """conf/cluster/<name>.yaml as a ClusterSpec, optionally with another ``inter_efficiency`` and
    ``inter_latency_us`` (keys of ``link``)."""
    spec = _config_spec(name)
    return spec if not link else replace(spec, **link)


@cache
def _config_spec(name: str) -> ClusterSpec:
    return ClusterSpec.from_config(yaml.safe_load((CLUSTER_DIR / f"{name}.yaml").read_text()))


def _paper_profile(task: str, batch: int, spec: ClusterSpec, implementation: str):
    """The paper profile of ``task`` at ``batch`` per GPU, derived once per implementation and intra-node link:
    its derivation predicts 1-node steps only, which the inter-node numbers a fit varies do not touch."""
    one_node = replace(spec, inter_efficiency=1.0, inter_latency_us=0.0, exchange_efficiency=None)
    return _derived_profile(task, batch, one_node, implementation)


@cache
def _derived_profile(task: str, batch: int, node: ClusterSpec, implementation: str):
    return paper_profile(task=task, batch_size=batch, node=node, implementation=implementation)


def _warmup(scheme: str, task: str, batch: int) -> float:
    if scheme != "onebit":
        return 0.0
    rows = [v for v in _paper_data().values() if v["task"] == task and v["batch_size"] == batch]
    return float(rows[0]["onebit_warmup_fraction"])


def validate(
    tables: tuple[int, ...] = (1, 2, 3, 4),
    links: dict[str, dict[str, float]] | None = None,
    paper_dir: Path = PAPER_DIR,
    implementation: ImplementationLike = "paper",
    clusters: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per paper row of ``tables``: printed and predicted throughput, speedup, scale efficiency,
    each scheme run as ``implementation`` runs it (birder_repro.perf.implementations). ``links``: per cluster,
    other values of ``inter_efficiency`` / ``inter_latency_us`` than its config's. ``clusters``: only the rows
    of these interconnects (all by default)."""
    paper = pd.concat([pd.read_csv(paper_dir / f"table{t}.csv") for t in tables], ignore_index=True)
    if clusters is not None:
        paper = paper[paper["cluster"].isin(list(clusters))]
    specs = {c: cluster_spec(c, (links or {}).get(c)) for c in paper["cluster"].unique()}
    out = []
    for (task, batch, cluster), group in paper.groupby(["task", "batch_per_gpu", "cluster"], sort=False):
        spec = specs[cluster]
        profile = (
            _paper_profile(task, int(batch), spec, implementation)
            if isinstance(implementation, str)
            else paper_profile(task=task, batch_size=int(batch), node=spec, implementation=implementation)
        )
        base_name = "sgdm" if task == "resnet50" else "bertadam"
        cache: dict[tuple, float] = {}

        def tput(optim: str, nodes: int, gpus_per_node: int) -> float:
            key = (optim, nodes)
            if key not in cache:
                scheme = scheme_for_optim(optim)
                run = predict_run(
                    profile,
                    spec,
                    nodes,
                    gpus_per_node,
                    scheme,
                    int(batch),
                    warmup_fraction=_warmup(scheme, task, int(batch)),
                    implementation=implementation,
                )
                cache[key] = run["run"]["throughput_samples_per_s"]
            return cache[key]

        for _, row in group.iterrows():
            n, m = int(row["nodes"]), int(row["gpus_per_node"])
            pred = tput(row["optimizer"], n, m)
            base = tput(base_name, n, m)
            one = tput(row["optimizer"], 1, m)
            speedup = pred / base
            out.append(
                {
                    "table": int(row["table"]),
                    "task": task,
                    "batch": int(batch),
                    "cluster": cluster,
                    "optimizer": row["optimizer"],
                    "gpus": int(row["gpus"]),
                    "nodes": n,
                    "throughput": float(row["throughput"]),
                    "pred_throughput": pred,
                    "throughput_error": pred / float(row["throughput"]) - 1,
                    "speedup": float(row["speedup"]),
                    "pred_speedup": speedup,
                    "speedup_error": speedup / float(row["speedup"]) - 1,
                    "scale_efficiency": row.get("scale_efficiency"),
                    "pred_scale_efficiency": 100 * pred / (n * one),
                }
            )
    return pd.DataFrame(out)


def target_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the target is about: Tables 3 and 4, several nodes, not the baseline."""
    return frame[frame["table"].isin([3, 4]) & (frame["nodes"] > 1) & ~frame["optimizer"].isin(["sgdm", "bertadam"])]


def median_speedup_error(frame: pd.DataFrame) -> float:
    return float(statistics.median(target_rows(frame)["speedup_error"].abs()))
