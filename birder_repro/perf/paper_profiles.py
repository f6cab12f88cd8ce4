"""Profiles of the paper's hardware (8 x A100-80GB per node), derived from its 1-node rows only.

The data and the derivation, step by step, are in ``profiles/paper.yaml`` beside this module; the steps are
the functions below. ``predict.profile=paper`` selects them (by task and batch per GPU).

BERT-Large, which the Birder paper does not train, has profiles of the 1-bit Adam paper's V100 nodes (Tang et
al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed", section 3.1,
Table 1's 1-node rows): :func:`v100_profile`, which mode=advise uses for ``model.size=large`` at sequence 128.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from birder_repro.config.resources import paper_tables_dir

from .cluster import ClusterSpec
from .implementations import ImplementationLike
from .model import predict_step
from .profile import Profile
from .schemes import compressed_elements

__all__ = ["paper_profile", "paper_profile_names", "v100_profile", "v100_rows", "PAPER_DEVICE", "PAPER_GPUS_PER_NODE"]

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
def _yaml() -> dict[str, Any]:
    return yaml.safe_load(DATA.read_text())


def _data() -> dict[str, Any]:
    return _yaml()["profiles"]


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


# ---- BERT-Large on the 1-bit Adam paper's V100 nodes ------------------------------------------------------------

V100_SOURCE = "1-bit Adam paper (Tang et al. 2021), section 3.1, Table 1"


def v100_rows() -> dict[str, dict[str, Any]]:
    """paper.yaml's ``v100_profiles``: each with its Table 1 row (tables/paper/onebit_adam_table1.csv) as ``ms``."""
    import csv

    out = {}
    for name, entry in _yaml()["v100_profiles"].items():
        with open(paper_tables_dir() / entry["table"], newline="") as f:
            row = next(r for r in csv.DictReader(f) if int(r["row"]) == int(entry["row"]))
        out[name] = {**entry, "ms": row}
    return out


def _matches(entry: dict[str, Any], task: str, model: Any, seq_length: int | None, precision: str) -> bool:
    model = model or {}
    same_model = all(model.get(k) == v for k, v in entry["model"].items())
    same_run = seq_length == int(entry["max_seq_length"]) and precision == entry["precision"]
    return entry["task"] == task and same_model and same_run


def v100_profile(
    task: str, model: Any, seq_length: int | None, gpus_per_node: int, precision: str = "fp16"
) -> Profile | None:
    """The V100 1-node profile of ``task`` with ``model`` at ``seq_length`` in ``precision`` (train.precision)
    (profiles/paper.yaml's ``v100_profiles``; the one with ``gpus_per_node`` a node where there is one, else 8 a
    node); None where the paper has none of that model, sequence length and precision: its compute is priced only
    as it was measured."""
    found = {k: v for k, v in v100_rows().items() if _matches(v, task, model, seq_length, precision)}
    if not found:
        return None
    name = min(found, key=lambda k: (int(found[k]["gpus_per_node"]) != gpus_per_node, -int(found[k]["gpus_per_node"])))
    return _derive_v100(name, found[name])


def _derive_v100(name: str, entry: dict[str, Any]) -> Profile:
    """The steps of paper.yaml's comment on ``v100_profiles``: compute, its backward share and the optimizer step
    from the row; the compression per element of the A100 profile ``compression_from`` (a lower bound)."""
    ms = entry["ms"]
    m, batch = int(ms["gpus_per_node"]), int(ms["batch_per_gpu"]) * int(ms["accumulation"])
    if int(ms["nodes"]) != 1 or m != int(entry["gpus_per_node"]):
        raise ValueError(f"v100 profile {name!r}: Table 1 row {ms['row']} is not a 1-node row of {m} GPUs")
    forward, backward = float(ms["forward_ms"]) / 1e3, float(ms["backward_else_ms"]) / 1e3
    a100 = paper_profile(name=entry["compression_from"])
    cluster = "InfiniBand" if ms["cluster"] == "infiniband" else "Ethernet"
    return Profile(
        name=f"paper:{name}",
        device=f"{m} x V100 a node ({V100_SOURCE}, its {cluster} cluster: not your GPUs)",
        task=entry["task"],
        batch_size=batch,
        forward_backward_s=forward + backward,
        backward_fraction=backward / (forward + backward),
        optimizer_s=float(ms["step_ms"]) / 1e3,
        parameter_count=int(entry["parameter_count"]),
        compression_s_per_element=dict(a100.compression_s_per_element),
        precision=str(entry["precision"]),
        notes=f"{V100_SOURCE}, row {ms['row']} (1 node x {m} V100, BERT-Large, sequence {entry['max_seq_length']}, "
        f"{entry['precision']}, {batch} a GPU): forward {ms['forward_ms']} + backward-else {ms['backward_else_ms']} "
        f"ms, optimizer step {ms['step_ms']} ms; compression per element from {a100.name} (Birder paper, section "
        "5.3, A100: a lower bound on a V100)",
    )
