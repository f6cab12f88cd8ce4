"""The performance model against every published real-cluster measurement: ``make validate-published``; the report
(the clusters' rows: perf.published_v100 and perf.published_birder; the claims: perf.published_claims).

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

THE PROTOCOL, one for every cluster, fixed in code (perf.published_protocol.split) before any prediction:

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

- on the V100 clusters the 1-bit exchange (DeepSpeed's compressed all-reduce: an all-to-all of the signs and an
  all-gather over every GPU) is priced at the rate the probe's all-reduce reached through a node's link, per byte
  that crosses it (the papers publish no 1-bit row, so no exchange of theirs is measured) and its compression at 0
  (no V100 figure is published): a predicted claim is an upper bound in that; where a claim is missed, what the
  exchange would have had to reach is printed;
- the V100 rows' compute has one micro-batch size at one node: linear in the batch from there (rows at another
  micro-batch are marked);
- on the Birder paper's clusters the probe's all-reduce is the baseline's step growth over its 1-node step (its
  DDP did not overlap, perf.implementations "paper"), and each compressed exchange (1-bit Adam's over every GPU,
  Birder's among the nodes) is measured on its own method's probe rows, what a user's probe of that method would
  time (perf.published_birder.exchange_samples): its shape and rate found as the probe finds them
  (perf.exchange_shape), never the all-reduce's.

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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .published_birder import BIRDER_GROUPS, birder_frame, load_birder_rows
from .published_birder import _birder_probed as _birder_probed
from .published_claims import _end_to_end, _stage_speedup, claims_frame, load_claims
from .published_protocol import TARGETS, split
from .published_v100 import BERT_LARGE_PARAMS, V100_FILES, load_v100_rows, v100_frame, v100_probe, v100_profile
from .validate_rows import PAPER_DIR

__all__ = [
    "TARGETS",
    "BERT_LARGE_PARAMS",
    "BIRDER_GROUPS",
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
    "exchange_table",
    "route_bands",
    "Summary",
    "summarize",
    "published_report",
    "format_last_line",
    "main",
    "_birder_probed",
    "_end_to_end",
    "_stage_speedup",
]

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


def exchange_table(fits: dict[str, dict]) -> pd.DataFrame:
    """A row per cluster and exchange group whose exchange was measured: the shape found, the runner-up and how
    many times the best's residual it left, a step's latency and the rate."""
    out = []
    for cluster, f in fits.items():
        for group, ranked in (f.get("link") or {}).get("exchange_ranked", {}).items():
            best, runner_up = ranked[0], ranked[1]
            margin = runner_up.residual / best.residual if best.residual > 0 else math.inf
            out.append(
                {
                    "cluster": cluster,
                    "exchange": group,
                    "shape (runner-up x)": f"{best.shape} ({runner_up.shape} {margin:.3g}x)",
                    "alpha us": f"{1e6 * best.alpha_s:.1f}",
                    # an infinite rate: the times grew with the latency steps alone (latency-bound)
                    "rate Gbit/s": f"{8 * best.bytes_per_s / 1e9:.2f}"
                    if math.isfinite(best.bytes_per_s)
                    else "latency only",
                    "samples": best.points,
                }
            )
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
        "the compressed exchanges on the Birder paper's clusters, each measured on its own method's probe rows "
        "(perf.exchange_shape; world: 1-bit Adam's all-to-all + all-gather, inter: Birder's):",
        exchange_table(birder_fits).to_string(index=False),
        "",
        "claims (probed route; the V100 papers publish no 1-bit row, so no exchange of theirs is measured: it is "
        "priced at the all-reduce's measured rate through a node's link, its compression free):",
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
