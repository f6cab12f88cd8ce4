"""DiLoCo's steps against its replicas: the measured multiples and the rule that carries them past 8 replicas.

DiLoCo's replicas are its nodes (each node's processes are one data-parallel replica; the outer step averages
the nodes' pseudo-gradients: Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
Models", 2023, section 3, whose Figure 5 / Table 4 show more replicas at a fixed global batch needing more
steps). ``make diloco-replicas`` runs DiLoCo, the 1-bit DiLoCo and Birder on 2, 4 and 8 nodes of one process at
the Fashion-MNIST field's global batch; from those runs:

- :func:`replica_multiples` is each method's mean steps to the run's own target over the base method's (Birder),
  per replica count, over the runs that reached it (a ratio of means);
- :func:`extrapolate_multiple` is the stated rule for a replica count outside the measured ones: at or below
  the fewest measured, the fewest's multiple; between two measured, linear in log2(replicas); beyond the most,
  the least-squares line of the multiple against log2(replicas) through every measured point, but never below
  the last measured multiple (a method whose multiple fell with replicas is held at its last value: the
  conservative choice for the method, never a gain measured nowhere).

``perf.paper_scale`` prices DiLoCo's steps at n nodes as Birder's steps (the field's, over SGDM's) x this
multiple at n (docs/performance-model.md, "At the paper's scale").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from birder_repro.run.record import find_records, read_record

__all__ = ["log2_fit", "extrapolate_multiple", "replica_multiples", "load_replica_runs", "RULE"]

RULE = (
    "a replica count beyond the measured ones: the least-squares line of the multiple against log2(replicas) "
    "through the measured ones, held at the last measured multiple where the line falls below it"
)


def log2_fit(points: Mapping[int, float]) -> tuple[float, float]:
    """The least-squares line m = a + b log2(n) through ``points`` {n: m}: (a, b); b = 0 for one point."""
    if not points:
        raise ValueError("log2_fit: no measured multiple")
    xs = [math.log2(n) for n in points]
    ys = list(points.values())
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    if sxx == 0:
        return y_mean, 0.0
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sxx
    return y_mean - slope * x_mean, slope


def extrapolate_multiple(points: Mapping[int, float], replicas: int) -> float:
    """The multiple at ``replicas`` from the measured ``points`` {replicas: multiple} (the module's rule)."""
    if replicas < 1:
        raise ValueError(f"replicas={replicas}: at least 1")
    if not points:
        raise ValueError("extrapolate_multiple: no measured multiple")
    known = sorted(points)
    if replicas in points:
        return float(points[replicas])
    if replicas < known[0]:
        return float(points[known[0]])
    if replicas < known[-1]:
        lo = max(n for n in known if n < replicas)
        hi = min(n for n in known if n > replicas)
        w = (math.log2(replicas) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        return float(points[lo] + w * (points[hi] - points[lo]))
    a, b = log2_fit(points)
    return max(float(points[known[-1]]), a + b * math.log2(replicas))


def _steps(rec: Mapping[str, Any]) -> float | None:
    ttt = rec.get("time_to_target") or {}
    if rec.get("status") != "completed" or not ttt.get("reached") or ttt.get("step") is None:
        return None
    return float(ttt["step"])


def replica_multiples(
    records: Iterable[Mapping[str, Any]], base: str = "birder", task: str = "fashion_mnist"
) -> dict[str, dict[int, float]]:
    """{method: {nodes: its mean steps to the target / the base's}} over the completed one-process-a-node runs
    of ``task`` that reached their target; a node count without a base run that did is left out."""
    steps: dict[str, dict[int, list[float]]] = {}
    for rec in records:
        config = rec.get("config") or {}
        gpus = (rec.get("cluster") or {}).get("gpus_per_node", config.get("gpus_per_node"))
        value = _steps(rec)
        if rec.get("task") != task or int(gpus or 1) != 1 or value is None:
            continue
        nodes = int(config.get("nodes") or (rec.get("cluster") or {}).get("nodes") or 1)
        steps.setdefault(str(rec.get("optim")), {}).setdefault(nodes, []).append(value)
    base_steps = {n: statistics.fmean(v) for n, v in steps.get(base, {}).items()}
    return {
        method: {n: statistics.fmean(v) / base_steps[n] for n, v in sorted(by_nodes.items()) if n in base_steps}
        for method, by_nodes in steps.items()
    }


def load_replica_runs(root: Path) -> list[dict[str, Any]]:
    """Every readable record under ``root`` (make diloco-replicas' runs folder); [] where it does not exist."""
    if not Path(root).is_dir():
        return []
    return [rec for rec in (read_record(p.parent) for p in find_records(Path(root))) if rec]
