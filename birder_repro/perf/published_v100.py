"""The V100 clusters of the 1-bit papers in ``make validate-published`` (perf.published): the 1-bit Adam paper's
Table 1 and the 1-bit LAMB paper's appendix Table 5 (BERT-Large, fp16, DeepSpeed), each paper's Ethernet and
InfiniBand cluster a cluster of its own; the profile from its 1-node row, the probe from its rows at its two
smallest multi-node counts (perf.published_protocol), every other row predicted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from .cluster import MBIT, ClusterSpec, op_time
from .collectives import Link, ring_allreduce
from .implementations import Implementation
from .model import predict_step
from .profile import Profile
from .published_protocol import measured_table as _table
from .published_protocol import relative_error as _err
from .published_protocol import split
from .schemes import Collective
from .shape import Measured, ShapeFit, detect_shape, latency_steps, rank_shapes
from .validate_rows import PAPER_DIR, cluster_spec

__all__ = [
    "BERT_LARGE_PARAMS",
    "V100_FILES",
    "PAPER_TITLES",
    "load_v100_rows",
    "v100_profile",
    "v100_probe",
    "v100_uncalibrated",
    "v100_predict",
    "v100_frame",
]

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


def load_v100_rows(paper_dir: Path = PAPER_DIR) -> pd.DataFrame:
    """The 1-bit Adam paper's Table 1 and the 1-bit LAMB paper's Table 5, one frame, ``group`` = paper + cluster."""
    frames = [pd.read_csv(paper_dir / name) for name in V100_FILES.values()]
    rows = pd.concat(frames, ignore_index=True)
    rows["group"] = rows["paper"] + "/" + rows["cluster"]
    rows["measured_step_ms"] = rows[["forward_ms", "allreduce_ms", "backward_else_ms", "step_ms"]].sum(axis=1)
    return rows


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


v100_predict = _v100_predict
