"""Profiles of the paper's hardware (8 x A100-80GB per node), derived from its 1-node rows only.

The data and the derivation, step by step, are in ``profiles/paper.yaml`` beside this module; the steps are
the functions below. ``predict.profile=paper`` selects them (by task and batch per GPU).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .cluster import ClusterSpec
from .implementations import ImplementationLike
from .model import predict_step
from .profile import Profile
from .schemes import compressed_elements

__all__ = ["paper_profile", "paper_profile_names", "PAPER_DEVICE", "PAPER_GPUS_PER_NODE"]

PAPER_DEVICE = "8 x Nvidia Tesla A100-80GB per node (Birder paper, section 5.1)"
PAPER_GPUS_PER_NODE = 8
DATA = Path(__file__).with_name("profiles") / "paper.yaml"
# One node: only the intra-node link matters; any cluster's intra-node values will do for the derivation.
_ONE_NODE = ClusterSpec(
    name="paper-node",
    inter_mbit=1.0,
    inter_latency_us=0.0,
    inter_efficiency=1.0,
    intra_mbit=2_400_000.0,
    intra_latency_us=3.4,
    intra_efficiency=0.78,
)


@cache
def _data() -> dict[str, Any]:
    return yaml.safe_load(DATA.read_text())["profiles"]


def paper_profile_names() -> list[str]:
    return sorted(_data())


def paper_profile(
    task: str | None = None,
    batch_size: int | None = None,
    name: str | None = None,
    node: ClusterSpec | None = None,
    implementation: ImplementationLike = "paper",
) -> Profile:
    """The paper profile ``name``, or the one of ``task`` at ``batch_size`` per GPU (the nearest batch if
    the paper has no row for it; the model scales compute linearly from there). Its scheme overheads are
    derived for ``implementation`` (birder_repro.perf.implementations), so that the model run with the same
    implementation gives back the paper's 1-node rows."""
    data = _data()
    if name is None:
        same_task = {k: v for k, v in data.items() if v["task"] == task}
        if not same_task:
            raise ValueError(
                f"no paper profile for task {task!r}; the paper has {sorted({v['task'] for v in data.values()})}"
            )
        name = min(same_task, key=lambda k: abs(same_task[k]["batch_size"] - (batch_size or 0)))
    if name not in data:
        raise ValueError(f"no paper profile {name!r}; known: {', '.join(sorted(data))}")
    return _derive(name, data[name], node or _ONE_NODE, implementation)


def _derive(name: str, row: dict[str, Any], node: ClusterSpec, implementation: ImplementationLike) -> Profile:
    m = PAPER_GPUS_PER_NODE
    params, batch = int(row["parameter_count"]), int(row["batch_size"])
    step = {scheme: m * batch / float(tput) for scheme, tput in row["throughput_1node"].items()}
    # Step 2: Birder's compression per element from section 5.3; 1-bit Adam's taken equal.
    per_element = float(row["birder_compression_s"]) / compressed_elements("hierarchical", params, 1, m)
    profile = Profile(
        name=f"paper:{name}",
        device=PAPER_DEVICE,
        task=row["task"],
        batch_size=batch,
        forward_backward_s=step["fp32"],
        parameter_count=params,
        compression_s_per_element={"birder": per_element, "onebit": per_element},
        notes="derived from the Birder paper's 1-node rows and section 5.3 "
        f"(birder_repro/perf/profiles/paper.yaml), for implementation "
        f"{implementation if isinstance(implementation, str) else 'custom'!r}",
    )
    # Step 1: forward + backward such that the model reproduces the baseline's 1-node row.
    for _ in range(5):
        exposed = (
            predict_step(profile, node, 1, m, "fp32", implementation=implementation).total_s
            - profile.forward_backward_s
        )
        profile.forward_backward_s = step["fp32"] - exposed
    # Step 3: 1-bit Adam's compression-stage step from its whole-run row.
    f = float(row["onebit_warmup_fraction"])
    step["onebit"] = (step["onebit"] - f * step["fp32"]) / (1 - f)
    # Step 4: what each compressed scheme adds on one node beyond the model's own prediction.
    for scheme in ("onebit", "hierarchical"):
        predicted = predict_step(profile, node, 1, m, scheme, implementation=implementation).total_s
        profile.scheme_overhead_s[scheme] = step[scheme] - predicted
    profile.scheme_overhead_s["flat"] = profile.scheme_overhead_s["allgather"] = profile.scheme_overhead_s[
        "hierarchical"
    ]  # the same optimizer, other collectives
    return profile
