"""The performance model against the Birder paper: its multi-node rows predicted from its 1-node rows.

    python -m birder_repro.perf.validate          # out of sample (the headline), with the in-sample figure beside
    python -m birder_repro.perf.validate --tables 1,2,3,4 [--fit]   # every row with the shipped (or refitted) links
    python -m birder_repro.perf.validate --overlap-sweep   # also: which overlap of the DDP baselines fits best
    python -m birder_repro.perf.validate --emulated RUNS_DIR [--cluster-spec YAML]   # birder_repro.perf.emulated

For every multi-node row of the paper's Tables 1-4 (tables/paper/*.csv), the model predicts the throughput
from the paper profile of its task and batch (1-node rows and section 5.3 only) and the cluster config of its
interconnect (conf/cluster/<cluster>.yaml). Speedups are over the baseline's predicted throughput at the same
layout, scale efficiency T_N / ((N/8) T_8) as the paper defines it.

TARGET: the median absolute relative error of the predicted speedups of the multi-node rows of Tables 3 and 4
(the compressed optimizers' rows: the baseline's speedup is 1 by definition and not counted) is at most 15 %,
on rows the links were NOT fitted on (a model's error counts only on rows not used to fit or choose it).

Implementation (birder_repro.perf.implementations, ``--implementation``, default ``paper``): the schemes run
as the paper's runs did, not as this project's hooks do. Birder's hook (section 5.1) and 1-bit Adam's
compressed all-reduce of the whole momentum (in the optimizer's step; appendix E: "off-the-shelf communication
primitives in PyTorch") block the compute stream: Figure 4 stacks computation, communication and compression
per iteration. So, FITTED, do the DDP baselines (implementations.PAPER_DDP_OVERLAP = 0; ``--overlap-sweep``
refits the links with their overlap at 0, 0.2, ..., 1: the loss is lowest at 0). ``--implementation this``
overlaps every scheme.

Calibration: two free numbers per interconnect (conf/cluster/<name>.yaml): the inter-node efficiency
(``perf.inter_efficiency``, the fraction of the line rate reached) and the cost of one network step of a
collective (``perf.inter_latency_us``; NCCL's tuning model counts n-1 network steps per ring or exchange over n
nodes, birder_repro.perf.cluster). :func:`fit_link` fits both by least absolute deviations in log throughput
over all the multi-node rows of Tables 3 and 4 on that interconnect, baselines included (not the target's
metric): Ethernet 0.76 and 600 us (NCCL 2.10 over TCP sockets: about 7.6 of 10 Gbit/s, and far more per step
than NCCL's 9.6 us for a hop), InfiniBand 0.24 and 100 us (about 48 Gbit/s). Nothing is per row, per task or per
optimizer. :func:`cross_validate` fits each interconnect on one task's rows and predicts the other task's.

Out of sample (:func:`out_of_sample_report`, what ``make validate`` prints; the fitting choices in
:data:`FIT_CHOICES` fixed before any held-out row was predicted):

- THE HEADLINE, what a user can do: each interconnect fitted on its 2-node rows only, the 4- and 8-node rows
  predicted (:func:`two_node_fit`): median 21.9 % over 16 rows, worst +98 %: it MISSES the target. Two nodes do
  not pin two numbers down (InfiniBand fits at 0.14 and 9.6 us, the grid's bottom).
- Leave one node count out (:func:`leave_one_count_out`): 12.2 % (2 nodes from 4+8: 17.5 %; 4 from 2+8: 3.0 %;
  8 from 2+4: 12.1 %), worst +99 %.
- Table 1 at 128 per GPU, never fitted (:func:`table1_128`): speedups 7.8 %, throughput up to +76 %.
- In-sample (:func:`in_sample`: the shipped links on the rows they were fitted on): 10.4 %, worst +101 %.

What the model cannot follow, in any protocol:

- 1-bit Adam's 64-GPU Ethernet collapse (5546 samples/s, slower than at 32 GPUs) is not predicted (+101 % on
  ResNet-50, +47 % on BERT in-sample): a 63-peer all-to-all over TCP degrades worse than its bytes and steps.
- Birder's BERT rows at 64 GPUs over Ethernet come out 31 % low in-sample: the paper's Birder gained more from
  32 to 64 GPUs (730 -> 990 samples/s) than the fitted link's per-step cost allows.
- Over InfiniBand at 2 nodes the printed baselines are 20-24 % slower than predicted, so the compressed rows'
  speedups there come out 16-28 % low; at 4 and 8 nodes they are within -9..+16 % (in-sample).
- Birder run as this project runs it (``--implementation this``: every scheme overlapped): 22.0 % in-sample.

How the in-sample figure got to 10.4 % (choices made on all rows, kept since): a per-step latency fitted with
the efficiency (24.3 % -> 17.4 %); least absolute deviations instead of least squares (15.4 % with the baselines
still overlapped); the baselines not overlapped, as the fit prefers (10.4 %).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import pandas as pd
import yaml

from birder_repro.config.resources import paper_tables_dir

from .cluster import CLUSTER_DIR, ClusterSpec
from .implementations import IMPLEMENTATIONS, ImplementationLike, with_overlap
from .model import predict_run
from .paper_profiles import _data as _paper_data
from .paper_profiles import paper_profile
from .schemes import scheme_for_optim

__all__ = [
    "TARGET",
    "FIT_CHOICES",
    "validate",
    "target_rows",
    "median_speedup_error",
    "fit_link",
    "cross_validate",
    "overlap_sweep",
    "cluster_spec",
    "held_out",
    "two_node_fit",
    "leave_one_count_out",
    "table1_128",
    "in_sample",
    "error_summary",
    "out_of_sample_report",
    "main",
]

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


EFFICIENCY_GRID = [round(0.02 * k, 2) for k in range(2, 51)]
LATENCY_GRID_US = [9.6, 25, 50, 75, 100, 150, 200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1500, 2000]


def _fit_loss(frame: pd.DataFrame, cluster: str, task: str | None = None, nodes: Sequence[int] | None = None) -> float:
    """Least absolute deviations in log throughput over the multi-node rows of ``cluster`` (of ``task``):
    robust to the rows the paper itself calls anomalous (1-bit Adam at 64 GPUs over Ethernet, slower than at
    32, appendix E), which in a least-squares fit make up two thirds of the Ethernet loss and drag both of
    that link's numbers towards themselves."""
    import math

    rows = frame[(frame["cluster"] == cluster) & (frame["nodes"] > 1)]
    if task is not None:
        rows = rows[rows["task"] == task]
    if nodes is not None:
        rows = rows[rows["nodes"].isin(list(nodes))]
    return sum(abs(math.log(p / t)) for p, t in zip(rows["pred_throughput"], rows["throughput"]))


def fit_link(
    cluster: str,
    task: str | None = None,
    implementation: ImplementationLike = "paper",
    nodes: Sequence[int] | None = None,
    paper_dir: Path = PAPER_DIR,
    base: dict | None = None,
) -> dict[str, float]:
    """The inter-node efficiency and per-step latency of ``cluster`` that best fit (:func:`_fit_loss`: least
    absolute deviations in log throughput) the multi-node rows of Tables 3 and 4 on that interconnect (of
    ``task`` only, and of ``nodes`` only, if given), baselines included; not the target's metric. Coordinate
    descent over EFFICIENCY_GRID x LATENCY_GRID_US from (0.5, 100 us), three sweeps: deterministic. ``base``:
    other cluster spec fields held fixed while the two are fitted (perf.published: the measured all-reduce)."""
    current = {"inter_efficiency": 0.5, "inter_latency_us": 100.0}
    grids = {"inter_efficiency": EFFICIENCY_GRID, "inter_latency_us": LATENCY_GRID_US}
    best_loss = float("inf")
    for _ in range(3):
        for key, grid in grids.items():
            for value in grid:
                trial = {**current, key: value}
                spec = {**(base or {}), **trial}
                frame = validate((3, 4), {cluster: spec}, paper_dir, implementation, clusters=(cluster,))
                loss = _fit_loss(frame, cluster, task, nodes)
                if loss < best_loss - 1e-12:
                    best_loss, best = loss, trial
            current = dict(best)
    return current


def overlap_sweep(overlaps: Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)) -> pd.DataFrame:
    """The paper implementation with its DDP baselines overlapped by each of ``overlaps``
    (implementations.with_overlap), both interconnects' links refitted at each: the fit loss over all
    multi-node rows of Tables 3 and 4 says which overlap the paper's runs had (PAPER_DDP_OVERLAP); the
    target's error is shown beside it, not used."""
    out = []
    for overlap in overlaps:
        impl = with_overlap("paper", overlap)
        links = {c: fit_link(c, implementation=impl) for c in CLUSTERS}
        frame = validate((3, 4), links, implementation=impl)
        losses = {c: _fit_loss(frame, c) for c in CLUSTERS}
        row = {"ddp_overlap": overlap, "loss": sum(losses.values())}
        for c in CLUSTERS:
            row.update(
                {
                    f"{c}_loss": losses[c],
                    f"{c}_efficiency": links[c]["inter_efficiency"],
                    f"{c}_latency_us": links[c]["inter_latency_us"],
                }
            )
        out.append({**row, "median_speedup_error": median_speedup_error(frame)})
    return pd.DataFrame(out)


def cross_validate(implementation: ImplementationLike = "paper") -> pd.DataFrame:
    """Each task's target rows predicted with the link fitted on the OTHER task's rows only (per
    interconnect): how well the fitted links carry over to a workload they were not fitted on."""
    tasks = ("resnet50", "bert_squad")
    out = []
    for cluster in CLUSTERS:
        for train, test in (tasks, tasks[::-1]):
            link = fit_link(cluster, train, implementation)
            frame = target_rows(validate((3, 4), {cluster: link}, implementation=implementation))
            rows = frame[(frame["cluster"] == cluster) & (frame["task"] == test)].assign(fitted_on=train, **link)
            out.append(rows)
    return pd.concat(out, ignore_index=True)


# ------------------------------------------------------------------------------------- out of sample
# What is fitted and how, FIXED before any held-out figure below was computed, and not tuned on one since: the
# out-of-sample functions refit only the two numbers per interconnect (fit_link), never these choices.
FIT_CHOICES = (
    "implementation: paper (Birder's hook and 1-bit Adam's step block the compute stream; so do the DDP "
    "baselines: PAPER_DDP_OVERLAP = 0)",
    "latency form: one inter-node latency per network step of a collective (n-1 per ring or exchange over n nodes)",
    "loss: least absolute deviations in log throughput over the fitted rows, baselines included",
    "search: EFFICIENCY_GRID x LATENCY_GRID_US, coordinate descent from (0.5, 100 us), three sweeps",
)
FIT_CHOICES_NOTE = (
    "These choices were made in an earlier round by looking at all multi-node rows of Tables 3 and 4, so the "
    "held-out rows were not hidden from them; since then they are fixed in code and only the two numbers per "
    "interconnect are refitted on the fitted rows of each protocol below."
)
BASELINES = ("sgdm", "bertadam")
NODE_COUNTS = (2, 4, 8)


def held_out(
    fit_nodes: Sequence[int],
    test_nodes: Sequence[int],
    implementation: ImplementationLike = "paper",
    paper_dir: Path = PAPER_DIR,
) -> pd.DataFrame:
    """Every multi-node row of Tables 3 and 4 at ``test_nodes``, predicted with each interconnect's link
    fitted (:func:`fit_link`) on its rows at ``fit_nodes`` only. Columns of :func:`validate`, plus
    ``fitted_on`` and the fitted ``inter_efficiency`` / ``inter_latency_us`` of the row's interconnect."""
    links = {c: fit_link(c, implementation=implementation, nodes=fit_nodes, paper_dir=paper_dir) for c in CLUSTERS}
    frame = validate((3, 4), links, paper_dir, implementation)
    rows = frame[frame["nodes"].isin(list(test_nodes))].copy()
    rows["fitted_on"] = "+".join(str(n) for n in fit_nodes) + " nodes"
    rows["inter_efficiency"] = rows["cluster"].map(lambda c: links[c]["inter_efficiency"])
    rows["inter_latency_us"] = rows["cluster"].map(lambda c: links[c]["inter_latency_us"])
    return rows.reset_index(drop=True)


def two_node_fit(implementation: ImplementationLike = "paper") -> pd.DataFrame:
    """THE HEADLINE: what a user can do. Each interconnect fitted on its 2-node rows only (two nodes are what a
    user can try), the 4- and 8-node rows predicted."""
    return held_out((2,), (4, 8), implementation)


def leave_one_count_out(implementation: ImplementationLike = "paper") -> pd.DataFrame:
    """Each node count's rows predicted with the links fitted on the other two node counts' rows."""
    folds = [held_out([k for k in NODE_COUNTS if k != out], (out,), implementation) for out in NODE_COUNTS]
    return pd.concat(folds, ignore_index=True)


def table1_128(implementation: ImplementationLike = "paper") -> pd.DataFrame:
    """Table 1's 128-per-GPU multi-node rows, predicted with the shipped links (conf/cluster, fitted on Tables 3
    and 4, all at 32 per GPU for ResNet-50): no fit has ever used them."""
    frame = validate((1,), implementation=implementation)
    return frame[(frame["batch"] == 128) & (frame["nodes"] > 1)].reset_index(drop=True)


def in_sample(implementation: ImplementationLike = "paper") -> pd.DataFrame:
    """Every multi-node row of Tables 3 and 4 with the shipped links, which were fitted on these same rows."""
    frame = validate((3, 4), implementation=implementation)
    return frame[frame["nodes"] > 1].reset_index(drop=True)


def error_summary(frame: pd.DataFrame) -> dict[str, float]:
    """Over ``frame``'s compressed rows (the baselines' speedup is 1 by definition): the median and the largest
    |speedup error| (signed); over every row: the median and the largest |throughput error| (signed)."""
    compressed = frame[~frame["optimizer"].isin(BASELINES)]
    speed, tput = compressed["speedup_error"], frame["throughput_error"]
    return {
        "rows": len(compressed),
        "median": float(speed.abs().median()),
        "worst": float(speed.loc[speed.abs().idxmax()]),
        "throughput_rows": len(frame),
        "throughput_median": float(tput.abs().median()),
        "throughput_worst": float(tput.loc[tput.abs().idxmax()]),
    }


def summary_line(name: str, frame: pd.DataFrame) -> str:
    s = error_summary(frame)
    verdict = "meets" if s["median"] <= TARGET else "MISSES"
    return (
        f"{name}: median |speedup error| {100 * s['median']:.1f}% ({verdict} the {100 * TARGET:.0f}% "
        f"target), worst {100 * s['worst']:+.1f}% ({s['rows']} compressed rows); throughput: median "
        f"{100 * s['throughput_median']:.1f}%, worst {100 * s['throughput_worst']:+.1f}% "
        f"({s['throughput_rows']} rows)"
    )


def out_of_sample_report(implementation: ImplementationLike = "paper") -> tuple[str, int]:
    """What ``make validate`` prints: each protocol's rows and figures, the in-sample figure beside them;
    and whether the headline (the 2-node fit) meets :data:`TARGET` (0) or not (1)."""
    protocols = [
        (
            "HEADLINE, out of sample: each interconnect fitted on its 2-node rows only, 4 and 8 nodes predicted",
            two_node_fit(implementation),
            True,
        ),
        (
            "out of sample: leave one node count out (fitted on the other two node counts' rows)",
            leave_one_count_out(implementation),
            True,
        ),
        (
            "out of sample: Table 1 at 128 per GPU, never fitted (the shipped links, fitted on Tables 3 and 4)",
            table1_128(implementation),
            False,
        ),
        (
            "IN-SAMPLE: the shipped links, fitted on all multi-node rows of Tables 3 and 4, measured on those same "
            "rows",
            in_sample(implementation),
            False,
        ),
    ]
    lines = ["Fitting choices, fixed in code before the held-out rows were predicted:"]
    lines += [f"  - {c}" for c in FIT_CHOICES] + [f"  {FIT_CHOICES_NOTE}"]
    names = (
        "2-node fit -> 4 and 8 nodes (headline)",
        "leave one node count out",
        "Table 1 at 128 per GPU",
        "in-sample (not a prediction)",
    )
    for (title, frame, fitted), name in zip(protocols, names):
        lines += ["", f"## {title}", "", format_table(frame, fitted), "", summary_line(name, frame)]
    lines += ["", f"## Summary (median |speedup error| of the compressed rows; TARGET {100 * TARGET:.0f}%)", ""]
    lines += [f"  {summary_line(name, frame)}" for (_, frame, _), name in zip(protocols, names)]
    headline = error_summary(protocols[0][1])["median"]
    return "\n".join(lines), 0 if headline <= TARGET else 1


def format_table(frame: pd.DataFrame, fitted: bool = False) -> str:
    """Every multi-node row of ``frame``; ``fitted``: with the links each row was predicted with."""
    shown = frame[frame["nodes"] > 1].copy()
    shown["throughput"] = shown["throughput"].map(lambda x: f"{x:.0f}")
    shown["pred_throughput"] = shown["pred_throughput"].map(lambda x: f"{x:.0f}")
    for col in ("throughput_error", "speedup_error"):
        shown[col] = shown[col].map(lambda x: f"{100 * x:+.1f}%")
    shown["speedup"] = shown["speedup"].map(lambda x: f"{x:.2f}x")
    shown["pred_speedup"] = shown["pred_speedup"].map(lambda x: f"{x:.2f}x")
    shown["scale_efficiency"] = shown["scale_efficiency"].map(lambda x: "" if pd.isna(x) else f"{x:.1f}%")
    shown["pred_scale_efficiency"] = shown["pred_scale_efficiency"].map(lambda x: f"{x:.1f}%")
    cols = [
        "table",
        "task",
        "batch",
        "cluster",
        "gpus",
        "optimizer",
        "throughput",
        "pred_throughput",
        "throughput_error",
        "speedup",
        "pred_speedup",
        "speedup_error",
        "scale_efficiency",
        "pred_scale_efficiency",
    ]
    if fitted:
        shown["inter_latency_us"] = shown["inter_latency_us"].map(lambda x: f"{x:g}")
        cols += ["fitted_on", "inter_efficiency", "inter_latency_us"]
    return shown[cols].to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tables",
        default=None,
        help="instead: every row of these paper tables (comma separated) with the shipped links",
    )
    parser.add_argument(
        "--fit",
        action="store_true",
        help="with --tables: refit each interconnect on all multi-node rows of Tables 3-4 first",
    )
    parser.add_argument(
        "--cross-validate",
        action="store_true",
        help="also: each task's rows predicted with the links fitted on the other task's rows",
    )
    parser.add_argument(
        "--overlap-sweep",
        action="store_true",
        help="also: the fit loss with the paper's DDP baselines overlapped 0..1 (links refitted)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when the headline (2-node fit -> 4 and 8 nodes) misses the target"
    )
    parser.add_argument(
        "--implementation",
        default="paper",
        choices=sorted(IMPLEMENTATIONS),
        help="how each scheme runs (birder_repro.perf.implementations); default: the paper's",
    )
    parser.add_argument(
        "--emulated",
        metavar="RUNS_DIR",
        help="instead: multi-node emulated runs under RUNS_DIR predicted from its 1-node runs",
    )
    parser.add_argument(
        "--cluster-spec",
        metavar="YAML",
        default=None,
        help="with --emulated: predict with this cluster spec (birder-repro mode=probe writes one) "
        "instead of conf/cluster/emulated.yaml",
    )
    args = parser.parse_args(argv)
    if args.emulated:
        from .emulated import main_emulated

        impl = "this" if args.implementation == "paper" else args.implementation
        return main_emulated(args.emulated, impl, args.cluster_spec)
    code = 0
    if args.tables:
        links = None
        if args.fit:
            links = {c: fit_link(c, implementation=args.implementation) for c in CLUSTERS}
            print("fitted inter-node links (all multi-node rows of Tables 3-4):", links)
        tables = tuple(int(t) for t in args.tables.split(","))
        frame = validate(tuple(sorted(set(tables) | {3, 4})), links, implementation=args.implementation)
        print(format_table(frame[frame["table"].isin(tables)]))
        print(
            f"\nIN-SAMPLE median |speedup error|, multi-node compressed rows of Tables 3-4 (the rows the links "
            f"were fitted on): {100 * median_speedup_error(frame):.1f}% ({len(target_rows(frame))} rows)"
        )
    else:
        text, code = out_of_sample_report(args.implementation)
        print(text)
    if args.cross_validate:
        cv = cross_validate(args.implementation)
        shown = cv[
            [
                "cluster",
                "task",
                "optimizer",
                "gpus",
                "fitted_on",
                "inter_efficiency",
                "inter_latency_us",
                "speedup",
                "pred_speedup",
                "speedup_error",
            ]
        ].copy()
        shown["speedup_error"] = shown["speedup_error"].map(lambda x: f"{100 * x:+.1f}%")
        print("\ncross-validated (links fitted on the other task's rows of the same interconnect):")
        print(shown.to_markdown(index=False, floatfmt=".2f"))
        print(f"median |speedup error|, cross-validated: {100 * float(cv['speedup_error'].abs().median()):.1f}%")
    if args.overlap_sweep:
        print(
            "\nthe paper's DDP baselines overlapped by a fraction, links refitted (loss: least absolute "
            "deviations in log throughput, all multi-node rows of Tables 3-4):"
        )
        print(overlap_sweep().to_markdown(index=False, floatfmt=".3f"))
    return code if args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
