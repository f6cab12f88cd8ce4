"""The protocol of ``make validate-published`` (perf.published), one for every cluster, fixed in code before any
prediction: which rows are the profile, which the probe, which are predicted; and the targets."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from .shape import Measured

__all__ = ["TARGETS", "split", "measured_table", "relative_error"]

# The targets: every cluster's median error, every row, every claim (absolute relative error).
TARGETS = {"cluster_median": 0.15, "row": 0.35, "claim": 0.25}


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


def measured_table(points: Sequence[Measured]) -> dict[int, list[list[float]]]:
    """Measured all-reduces as ClusterSpec.allreduce_table: [bytes, seconds] per node count."""
    table: dict[int, list[list[float]]] = {}
    for p in points:
        table.setdefault(p.nodes, []).append([p.nbytes, p.seconds])
    return table


def relative_error(pred: float, measured: float) -> float:
    return pred / measured - 1
