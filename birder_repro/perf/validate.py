"""The performance model against the Birder paper: its multi-node rows predicted from its 1-node rows.

    python -m birder_repro.perf.validate          # Tables 1-4, with the errors and the target's verdict
    python -m birder_repro.perf.validate --fit    # also fit each interconnect's efficiency

For every multi-node row of the paper's Tables 1-4 (tables/paper/*.csv), the model predicts the throughput
from the paper profile of its task and batch (1-node rows and section 5.3 only) and the cluster config of its
interconnect (conf/cluster/<cluster>.yaml). Speedups are over the baseline's predicted throughput at the same
layout, scale efficiency T_N / ((N/8) T_8) as the paper defines it.

TARGET: the median absolute relative error of the predicted speedups of the multi-node rows of Tables 3 and 4
(the compressed optimizers' rows: the baseline's speedup is 1 by definition and not counted) is at most 15 %.

Calibration: one free number per interconnect, the inter-node efficiency (conf/cluster/<name>.yaml,
``perf.inter_efficiency``), fitted by :func:`fit_efficiency` (least squares in log throughput over all the
multi-node rows of Tables 3 and 4 on that interconnect, baselines included; not on the target's metric):
Ethernet 0.50 (NCCL 2.10 over TCP sockets reaching about 5 of 10 Gbit/s), InfiniBand 0.14 (about 28 of 200
Gbit/s). Latencies are NCCL's own tuning-model figures, NVLink from the A100 datasheet; nothing is per row.

Where the model misses, and why (README-ready):

- The model MISSES the target: median error 24 % over the 24 rows. The 1-bit Adam rows are close (median
  11 %; the 64-GPU Ethernet collapse of 1-bit Adam, 5546 samples/s, is not predicted: the model gives
  11539). The Birder rows are not (median 56 %): the model predicts 97-100 % scale efficiency for Birder on both
  interconnects, the paper prints 55-98 %. Its 1-bit traffic is 2(n-1)/n P/32 bytes per node per step
  (5.6 MB for ResNet-50 at 8 nodes): hidden behind the backward pass on any link the paper used.
- What the paper's Birder loses with more nodes does not follow bytes or collectives: over InfiniBand a
  step grows by about 4 ms per extra node for ResNet-50 (1.6, 10.5, 28.7 ms at 2, 4, 8 nodes) and for
  BERT-Base (3.6, 12, 25 ms), although BERT-Base has 4.3 times the bytes and about three times the buckets.
  Over Ethernet its 1-bit exchanges reach about 0.2-0.3 GB/s, a quarter of what the fp32 all-reduce reaches
  on the same link, while 1-bit Adam's exchanges of the same message sizes reach nearly the fp32 rate. The
  paper's own explanation (appendices D and E): its all-to-all is less efficient than all-reduce, and the
  primitives' "computation time" grows with the number of GPUs; neither is a latency or a bandwidth that
  one number per link reproduces (a second efficiency for exchanges cannot fit Birder and 1-bit Adam at
  once; a larger latency per message spoils the BERT rows). So the model's Birder figures are what the
  scheme costs on the wire, not what the paper's implementation achieved.
- Over InfiniBand the fp32 baselines need only 0.14 of the line rate and their all-reduce time barely grows
  with nodes (ResNet-50: 40, 44, 54 ms exposed at 2, 4, 8 nodes), which looks like a per-GPU limit (for
  example staging through host memory without GPUDirect RDMA) rather than the NIC; the model's 2(n-1)/n
  growth over-predicts the 2-node baseline (ResNet-50: 6.9k predicted, 4.7k printed).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Optional

import pandas as pd
import yaml

from .cluster import ClusterSpec
from .implementations import IMPLEMENTATIONS
from .model import predict_run
from .paper_profiles import PAPER_GPUS_PER_NODE, _data as _paper_data, paper_profile
from .schemes import scheme_for_optim

__all__ = ["TARGET", "validate", "target_rows", "median_speedup_error", "fit_efficiency", "cluster_spec",
           "main"]

TARGET = 0.15
REPO = Path(__file__).resolve().parents[2]
PAPER_DIR = REPO / "tables" / "paper"
CLUSTER_DIR = REPO / "conf" / "cluster"


def cluster_spec(name: str, inter_efficiency: Optional[float] = None) -> ClusterSpec:
    """conf/cluster/<name>.yaml as a ClusterSpec, optionally with another inter-node efficiency."""
    spec = ClusterSpec.from_config(yaml.safe_load((CLUSTER_DIR / f"{name}.yaml").read_text()))
    return spec if inter_efficiency is None else spec.with_efficiency(inter_efficiency)


def _warmup(scheme: str, task: str, batch: int) -> float:
    if scheme != "onebit":
        return 0.0
    rows = [v for v in _paper_data().values() if v["task"] == task and v["batch_size"] == batch]
    return float(rows[0]["onebit_warmup_fraction"])


def validate(tables: tuple[int, ...] = (1, 2, 3, 4), efficiencies: Optional[dict[str, float]] = None,
             paper_dir: Path = PAPER_DIR, implementation: str = "paper") -> pd.DataFrame:
    """One row per paper row of ``tables``: printed and predicted throughput, speedup, scale efficiency,
    each scheme run as ``implementation`` runs it (birder_repro.perf.implementations)."""
    paper = pd.concat([pd.read_csv(paper_dir / f"table{t}.csv") for t in tables], ignore_index=True)
    specs = {c: cluster_spec(c, (efficiencies or {}).get(c)) for c in paper["cluster"].unique()}
    out = []
    for (task, batch, cluster), group in paper.groupby(["task", "batch_per_gpu", "cluster"], sort=False):
        spec = specs[cluster]
        profile = paper_profile(task=task, batch_size=int(batch), node=spec, implementation=implementation)
        base_name = "sgdm" if task == "resnet50" else "bertadam"
        cache: dict[tuple, float] = {}

        def tput(optim: str, nodes: int, gpus_per_node: int) -> float:
            key = (optim, nodes)
            if key not in cache:
                scheme = scheme_for_optim(optim)
                run = predict_run(profile, spec, nodes, gpus_per_node, scheme, int(batch),
                                  warmup_fraction=_warmup(scheme, task, int(batch)),
                                  implementation=implementation)
                cache[key] = run["run"]["throughput_samples_per_s"]
            return cache[key]

        for _, row in group.iterrows():
            n, m = int(row["nodes"]), int(row["gpus_per_node"])
            pred = tput(row["optimizer"], n, m)
            base = tput(base_name, n, m)
            one = tput(row["optimizer"], 1, m)
            speedup = pred / base
            out.append({"table": int(row["table"]), "task": task, "batch": int(batch), "cluster": cluster,
                        "optimizer": row["optimizer"], "gpus": int(row["gpus"]), "nodes": n,
                        "throughput": float(row["throughput"]), "pred_throughput": pred,
                        "throughput_error": pred / float(row["throughput"]) - 1,
                        "speedup": float(row["speedup"]), "pred_speedup": speedup,
                        "speedup_error": speedup / float(row["speedup"]) - 1,
                        "scale_efficiency": row.get("scale_efficiency"),
                        "pred_scale_efficiency": 100 * pred / (n * one)})
    return pd.DataFrame(out)


def target_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows the target is about: Tables 3 and 4, several nodes, not the baseline."""
    return frame[frame["table"].isin([3, 4]) & (frame["nodes"] > 1)
                 & ~frame["optimizer"].isin(["sgdm", "bertadam"])]


def median_speedup_error(frame: pd.DataFrame) -> float:
    return float(statistics.median(target_rows(frame)["speedup_error"].abs()))


def fit_efficiency(cluster: str, grid: Optional[list[float]] = None, implementation: str = "paper") -> float:
    """The inter-node efficiency of ``cluster`` that best fits (least squares in log throughput) every
    multi-node row of Tables 3 and 4 on that interconnect, baselines included. Not the target's metric."""
    import math

    grid = grid or [round(0.02 * k, 2) for k in range(1, 51)]
    best, best_loss = grid[0], float("inf")
    for eff in grid:
        frame = validate((3, 4), {cluster: eff}, implementation=implementation)
        rows = frame[(frame["cluster"] == cluster) & (frame["nodes"] > 1)]
        loss = sum(math.log(p / t) ** 2 for p, t in zip(rows["pred_throughput"], rows["throughput"]))
        if loss < best_loss:
            best, best_loss = eff, loss
    return best


def format_table(frame: pd.DataFrame) -> str:
    shown = frame[frame["nodes"] > 1].copy()
    shown["throughput"] = shown["throughput"].map(lambda x: f"{x:.0f}")
    shown["pred_throughput"] = shown["pred_throughput"].map(lambda x: f"{x:.0f}")
    for col in ("throughput_error", "speedup_error"):
        shown[col] = shown[col].map(lambda x: f"{100 * x:+.1f}%")
    shown["speedup"] = shown["speedup"].map(lambda x: f"{x:.2f}x")
    shown["pred_speedup"] = shown["pred_speedup"].map(lambda x: f"{x:.2f}x")
    shown["scale_efficiency"] = shown["scale_efficiency"].map(lambda x: "" if pd.isna(x) else f"{x:.1f}%")
    shown["pred_scale_efficiency"] = shown["pred_scale_efficiency"].map(lambda x: f"{x:.1f}%")
    cols = ["table", "task", "batch", "cluster", "gpus", "optimizer", "throughput", "pred_throughput",
            "throughput_error", "speedup", "pred_speedup", "speedup_error", "scale_efficiency",
            "pred_scale_efficiency"]
    return shown[cols].to_markdown(index=False)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit each interconnect's efficiency first")
    parser.add_argument("--tables", default="1,2,3,4", help="paper tables to show (comma separated)")
    parser.add_argument("--implementation", default="paper", choices=sorted(IMPLEMENTATIONS),
                        help="how each scheme runs (birder_repro.perf.implementations); default: the paper's")
    args = parser.parse_args(argv)
    efficiencies = None
    if args.fit:
        efficiencies = {c: fit_efficiency(c, implementation=args.implementation)
                        for c in ("ethernet_10g", "infiniband_200g")}
        print("fitted inter-node efficiencies:", efficiencies)
    tables = tuple(int(t) for t in args.tables.split(","))
    frame = validate(tuple(sorted(set(tables) | {3, 4})), efficiencies, implementation=args.implementation)
    print(format_table(frame[frame["table"].isin(tables)]))
    err = median_speedup_error(frame)
    verdict = "meets" if err <= TARGET else "MISSES"
    print(f"\nmedian |speedup error|, multi-node compressed rows of Tables 3-4: {100 * err:.1f}% "
          f"({verdict} the {100 * TARGET:.0f}% target; {len(target_rows(frame))} rows)")
    return 0 if err <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
