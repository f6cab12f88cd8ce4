"""The paper's question at its scale, predicted: which method reaches the target first for ResNet-50 and BERT on
nodes of 8 A100s, over 1-100 Gbit/s links and 2-64 nodes.

    python -m birder_repro.perf.paper_scale [--runs runs/time-to-accuracy] [--layout 2x2]

Every number is PREDICTED, from three inputs, none measured at this scale:

- the step: the performance model (birder_repro.perf.model, this project's hooks: implementation ``this``) on
  the paper's 1-node profiles (birder_repro.perf.paper_profiles: ResNet-50 at 32 and BERT at 3 per GPU, derived
  from the paper's 1-node rows) and the ``ethernet_10g`` cluster (the paper's testbed, its fitted NCCL
  efficiency and latency) at each link rate;
- the steps to the target: each method's over SGDM's on the Fashion-MNIST field (the tuned recipes,
  docs/time-to-accuracy.md), at ``--layout``: ASSUMPTION, a method needs the same multiple of SGDM's steps on
  the paper's tasks and at any node count as there (1-bit Adam's fp32 warmup and DiLoCo's H as tuned there);
- DiLoCo's and the 1-bit DiLoCo's steps at n nodes (n replicas): with ``make diloco-replicas``' runs
  (``--replicas``), the field's (2 replicas) times m(n) / m(2), m the method's measured multiple of Birder's
  steps (2, 4 and 8 nodes of one process at the field's global batch), past 8 by the rule of
  birder_repro.perf.replica_steps (a log2-linear fit, held at the last measured value where it falls): Birder's
  own multiple of SGDM's is held at the field's (ASSUMPTION); without the runs, the field's 2-replica multiple
  at every node count: ASSUMPTION;
- the 16-bit casts (the fp16 hook, the two-level bf16 all-reduce): ASSUMPTION, memory-bound at the A100-80GB's
  2039 GB/s, 6 bytes read and written an element a cast (the paper profiles have no cost for them).

PowerSGD is left out: its compression on an A100 (small matrix products and orthogonalization) has no measured
or published cost to price it with. Time to target is given over SGDM's (its flat fp32 all-reduce, NCCL's
two-level one on these clusters), so the unknown absolute number of steps cancels.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from tabulate import tabulate

from .advise import step_times, time_to_target
from .cluster import CLUSTER_DIR, ClusterSpec
from .paper_profiles import PAPER_GPUS_PER_NODE, paper_profile
from .profile import Profile
from .replica_steps import extrapolate_multiple, load_replica_runs, replica_multiples

__all__ = ["PAPER_TASKS", "LINKS_MBIT", "NODES", "CAST_S_PER_ELEMENT", "Method", "relative_times", "scale_markdown"]

# BERT-Base fine-tuned on SQuAD: the Birder paper's Table 2 (section 5.1), the only BERT task with 1-node rows
PAPER_TASKS = {"ResNet-50 (ImageNet, 32 a GPU)": "resnet50_b32", "BERT-Base (SQuAD, 3 a GPU)": "bert_squad_b3"}
LINKS_MBIT = (1_000.0, 10_000.0, 25_000.0, 100_000.0)
NODES = (2, 4, 8, 16, 32, 64)
# ASSUMPTION (module doc): a cast reads 4 and writes 2 bytes (or the reverse) at the A100-80GB's HBM2e bandwidth
# (NVIDIA A100 datasheet: 2039 GB/s); the model counts 2 casts an element (perf.schemes.compressed_elements).
CAST_S_PER_ELEMENT = 6 / 2039e9
SKIPPED = {"sgdm_powersgd", "adamw_powersgd"}  # no A100 cost for PowerSGD's compression (module doc)


@dataclass(frozen=True)
class Method:
    """One method as the Fashion-MNIST field ran it: its scheme, and its steps to the target over SGDM's."""

    label: str
    scheme: str
    steps: float  # relative to SGDM's steps to the target (SGDM: 1)
    freeze: float = 0.0  # the fp32 warmup, in the same units (1-bit Adam's freeze)
    local_steps: int = 1  # DiLoCo's H
    optim: str = ""  # the optimizer's config name (diloco, birder, ...)
    # measured against replicas (make diloco-replicas): ((replicas, multiple of Birder's steps), ...), and the
    # field's replicas (its nodes) ``steps`` was measured at; empty: ``steps`` at every node count
    replicas: tuple[tuple[int, float], ...] = ()
    field_replicas: int = 2

    def steps_at(self, nodes: int) -> float:
        """Steps to the target over SGDM's at ``nodes`` replicas: the field's, times the growth of the measured
        multiple of Birder's steps from the field's replica count to ``nodes`` (perf.replica_steps' rule)."""
        if not self.replicas:
            return self.steps
        points = dict(self.replicas)
        return self.steps * extrapolate_multiple(points, nodes) / extrapolate_multiple(points, self.field_replicas)


def _priced(profile: Profile) -> Profile:
    return replace(profile, compression_s_per_element={**profile.compression_s_per_element, "fp16": CAST_S_PER_ELEMENT})


def relative_times(
    methods: Sequence[Method], profile: Profile, cluster: ClusterSpec, nodes: int, gpus_per_node: int
) -> dict[str, float]:
    """Each method's predicted time to the target over SGDM's (the method labelled ``SGDM``, scheme fp32)."""
    profile = _priced(profile)
    times = {}
    for m in methods:
        warm, main, _ = step_times(
            profile,
            cluster,
            nodes,
            gpus_per_node,
            m.scheme,
            profile.batch_size,
            freeze=1 if m.freeze > 0 else 0,  # a warmup exists; its length is m.freeze below
            local_steps=m.local_steps,
            loop=False,  # the paper's step: its runs had none of this runner's per-step loop collectives
        )
        times[m.label] = time_to_target(m.steps_at(nodes), m.freeze, warm, main)  # in units of SGDM's steps
    base = times.get("SGDM")
    if not base:
        raise ValueError("relative_times needs SGDM (scheme fp32) among the methods: times are over its")
    return {k: v / base for k, v in times.items()}


def fashion_methods(runs: Path, layout: tuple[int, int]) -> list[Method]:
    """The Fashion-MNIST field's methods at ``layout``: steps to the target over SGDM's, from the measured runs."""
    from .advice_steps import _method_inputs, _on_layout, load_runs, measured_steps

    records = load_runs(runs)
    batches = Counter(
        r.get("global_batch_size") for _, r in records if r.get("task") == "fashion_mnist" and _on_layout(r, layout)
    )
    if not batches:
        raise SystemExit(
            f"paper_scale: no run of fashion_mnist at {layout[0]}x{layout[1]} under {runs}: the steps to the target "
            "come from the Fashion-MNIST field; run `make time-to-accuracy` first (it makes them there), or give --runs"
        )
    batch = int(batches.most_common(1)[0][0])
    found = [
        s
        for s in measured_steps(records, "fashion_mnist", batch, layout)
        if s.same_layout and s.steps and s.optim not in SKIPPED
    ]
    sgdm = [s for s in found if s.optim == "sgdm" and not s.variant]
    if not sgdm:
        raise SystemExit(
            f"paper_scale: no SGDM run of fashion_mnist at {layout[0]}x{layout[1]} under {runs} reached the target: "
            "run `make time-to-accuracy` first (its field has SGDM), or give --runs"
        )
    base = float(sgdm[0].steps or 0)
    out = []
    for s in found:
        inputs = _method_inputs(s)
        label = "SGDM" if s is sgdm[0] else s.label
        out.append(
            Method(
                label,
                inputs["scheme"],
                float(s.steps or 0) / base,
                inputs["freeze"] / base,
                inputs["local_steps"],
                optim=s.optim,
            )
        )
    return out


def with_replicas(
    methods: Sequence[Method], multiples: dict[str, dict[int, float]], field_replicas: int = 2, base: str = "birder"
) -> list[Method]:
    """The local-step methods with their measured multiples of ``base``'s steps against replicas
    (perf.replica_steps), anchored at the field's ``field_replicas``; the others as given."""
    out = []
    for m in methods:
        points = multiples.get(m.optim) or {}
        if points and m.optim != base and m.local_steps > 1:
            m = replace(m, replicas=tuple(sorted(points.items())), field_replicas=field_replicas)
        out.append(m)
    return out


def _cluster(link_mbit: float) -> ClusterSpec:
    config = yaml.safe_load((CLUSTER_DIR / "ethernet_10g.yaml").read_text())
    return ClusterSpec.from_config({**config, "link_mbit": float(link_mbit)})


def scale_markdown(methods: Sequence[Method]) -> str:
    """One table a task: per node count and link rate, the first two methods and their time over SGDM's."""
    lines = []
    for title, name in PAPER_TASKS.items():
        profile = paper_profile(name=name, implementation="this")
        lines += [f"**{title}**, {PAPER_GPUS_PER_NODE} GPUs a node (predicted; time to the target over SGDM's)", ""]
        header = ["nodes", *(f"{x / 1000:g} Gbit/s" for x in LINKS_MBIT)]
        rows = []
        for n in NODES:
            cells = [str(n)]
            for link in LINKS_MBIT:
                rel = relative_times(methods, profile, _cluster(link), n, PAPER_GPUS_PER_NODE)
                first, second = sorted(rel, key=rel.get)[:2]
                cells.append(f"{first} {rel[first]:.2f}; {second} {rel[second]:.2f}")
            rows.append(cells)
        lines += [tabulate(rows, headers=header, tablefmt="pipe", disable_numparse=True), ""]
    return "\n".join(lines)


def _methods_text(methods: Sequence[Method]) -> str:
    return "\n".join(
        f"- {m.label}: scheme {m.scheme}, {m.steps:.2f}x SGDM's steps"
        + (f", the first {m.freeze:.2f} in fp32" if m.freeze else "")
        + (f", H = {m.local_steps}" if m.local_steps > 1 else "")
        for m in methods
    )


def replicas_line(methods: Sequence[Method], source: str) -> str:
    """What the local-step methods' steps at each node count come from: the measured multiples and the rule, or
    the ASSUMPTION and the make target that measures them."""
    from .replica_steps import RULE

    measured = [m for m in methods if m.replicas]
    if not measured:
        return (
            f"ASSUMPTION: no DiLoCo runs against replicas under {source}: DiLoCo keeps the field's 2-replica multiple "
            "of SGDM's steps at every node count (make diloco-replicas measures them at 2, 4 and 8)"
        )
    parts = [f"{m.label} " + ", ".join(f"{n}: {x:.2f}x" for n, x in m.replicas) + " Birder's steps" for m in measured]
    return f"Measured against replicas ({source}): " + "; ".join(parts) + f"; {RULE}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m birder_repro.perf.paper_scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", default="runs/time-to-accuracy", help="the Fashion-MNIST field's runs")
    parser.add_argument("--layout", default="2x2", help="the field's layout the steps come from, nodes x processes")
    parser.add_argument(
        "--replicas", default="runs/diloco-replicas", help="make diloco-replicas' runs: DiLoCo's steps against replicas"
    )
    args = parser.parse_args(argv)
    nodes, gpus = (int(x) for x in args.layout.split("x"))
    methods = fashion_methods(Path(args.runs), (nodes, gpus))
    multiples = replica_multiples(load_replica_runs(Path(args.replicas)))
    methods = with_replicas(methods, multiples, field_replicas=nodes)
    print(replicas_line(methods, args.replicas) + "\n")
    print(f"Steps to the target over SGDM's, from the Fashion-MNIST field at {args.layout} (measured):\n")
    print(_methods_text(methods) + "\n")
    print(scale_markdown(methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
