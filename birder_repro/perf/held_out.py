"""validate: the held-out protocols: the paper's rows predicted with links fitted on other rows, or on none.

The fitting choices are fixed (:data:`FIT_CHOICES`) before any held-out row is predicted; each protocol refits
only the two numbers per interconnect (``perf.link_fit``) on its own fitted rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .implementations import ImplementationLike
from .link_fit import fit_link
from .validate_rows import CLUSTERS, PAPER_DIR, validate

__all__ = ["FIT_CHOICES", "held_out", "two_node_fit", "leave_one_count_out", "table1_128", "in_sample"]

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
