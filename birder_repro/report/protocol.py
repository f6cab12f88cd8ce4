"""The Fashion-MNIST field's protocol: its grids, seeds, target rule, budgets and load limit, fixed in advance.

The protocol lives in one file, ``conf/tuning/fashion_mnist.yaml``; this module reads it and holds its rules as
pure functions (AlgoPerf's external tuning ruleset, Dahl et al. "Benchmarking Neural Network Training
Algorithms", 2023, section 4.2: tuning trials on a validation split, the same budget of trials per method,
targets fixed before the measurement; a time budget ends each method's schedule at the budget):

- :func:`grid_points` expands a method's grid (a union of products); :func:`load_protocol` refuses a protocol
  whose grids differ in size or whose field seeds meet its tuning seeds;
- :func:`edges` says, for a tuned pick, which values sit on an edge of what was tried around it and the next
  value to try beyond each (:func:`next_value`), or why none can be tried;
- :func:`target_levels` is the target rule, :func:`budgets_from_times` the budget rule and
  :func:`budget_steps` a run's length for a budget from its step times;
- :func:`load_flag` says whether a run shared its host with more than the stated load.

``python -m birder_repro.report.protocol grid|field|check --runs RUNS`` prints the cells of the tuning grid,
the field (with its budget runs) and the quick check, one ``birder-repro`` argument line each, for
:mod:`birder_repro.sweep` to run in an interleaved order. The field's cells come from the plan that
``python -m birder_repro.report.tuning --plan RUNS`` writes (``RUNS/tuned.yaml``: picks, targets, budgets,
step times); without a plan, the protocol's ``provisional`` values (marked so in every table).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from birder_repro.config.resources import conf_dir

__all__ = [
    "PLAN_FILE",
    "protocol_path",
    "load_protocol",
    "grid_points",
    "Edge",
    "next_value",
    "edges",
    "target_levels",
    "budgets_from_times",
    "budget_steps",
    "load_flag",
    "grid_cells",
    "field_cells",
    "per_process_batch",
    "local_steps_cells",
    "replica_cells",
    "read_plan",
    "write_plan",
]

PLAN_FILE = "tuned.yaml"  # under the runs folder: what make tune-fashion chose, the field's input


class ProtocolError(ValueError):
    """A protocol file that breaks its own rules (one line: what and where)."""


def protocol_path(task: str = "fashion_mnist") -> Path:
    root = conf_dir()
    if root is None:
        raise ProtocolError("no conf/ directory found (birder_repro.config.resources.conf_dir)")
    return root / "tuning" / f"{task}.yaml"


def grid_points(blocks: Sequence[Mapping[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """The union of the blocks' products, in order, each point once: [{"lr": 0.1, "momentum": 0.9}, ...]."""
    points: list[dict[str, Any]] = []
    for block in blocks:
        keys = list(block)
        for values in itertools.product(*(block[k] for k in keys)):
            point = dict(zip(keys, values))
            if point not in points:
                points.append(point)
    return points


def load_protocol(path: Path | None = None) -> dict[str, Any]:
    """The protocol as a dict, checked: every grid has ``trials`` points over keys ``keys`` describes, and the
    field's seeds are none of the tuning's."""
    path = path or protocol_path()
    try:
        proto = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read the protocol ({exc.strerror})") from None
    overlap = sorted(set(proto["field_seeds"]) & set(proto["tuning_seeds"]))
    if overlap:
        raise ProtocolError(f"{path}: field_seeds {overlap} are also tuning_seeds: a field seed must be unseen")
    for method, blocks in proto["grids"].items():
        n = len(grid_points(blocks))
        if n != proto["trials"]:
            raise ProtocolError(f"{path}: grids.{method} has {n} points, not trials={proto['trials']}")
        for block in blocks:
            unknown = sorted(set(block) - set(proto["keys"]))
            if unknown:
                raise ProtocolError(f"{path}: grids.{method} varies {unknown}, which keys does not describe")
    return proto


# --------------------------------------------------------------------------------------------------------------
# Grid edges


@dataclass(frozen=True)
class Edge:
    """A pick's value of ``key`` on an edge (``side``: low or high, or untried: the only value tried around
    the pick) and the value to try next, or None and the ``reason`` it cannot."""

    key: str
    value: Any
    side: str
    next: Any
    reason: str = ""


def next_value(value: float, neighbour: float, spec: Mapping[str, Any]) -> tuple[Any, str]:
    """The value one grid step beyond ``value``, away from ``neighbour`` (the grid's next value inward), by the
    key's ``scale`` (log: the same ratio; log1m: the same ratio of 1 - x; int2: doubled or halved), and ''; or
    (None, why) where it would leave ``spec``'s [min, max] or the scale's domain."""
    scale = spec.get("scale", "log")
    up = value > neighbour
    if scale == "log":
        out: Any = value * (value / neighbour)
    elif scale == "log1m":
        if not (0 < value < 1 and 0 < neighbour < 1):
            return None, f"{value}: a log1m value lies in (0, 1)"
        out = 1.0 - (1.0 - value) * ((1.0 - value) / (1.0 - neighbour))
    elif scale == "int2":
        out = int(value) * 2 if up else int(value) // 2
    else:
        raise ProtocolError(f"scale {scale!r}: one of log, log1m, int2")
    if scale == "int2" and out == int(value):
        return None, f"{value} cannot be halved further"
    lo, hi = spec.get("min"), spec.get("max")
    if hi is not None and out > hi:
        return None, f"{out:g} is above the limit {hi:g}" + (f" ({spec['why']})" if spec.get("why") else "")
    if lo is not None and out < lo:
        return None, f"{out:g} is below the limit {lo:g}"
    if scale == "log":
        out = float(f"{out:.6g}")
    elif scale == "log1m":
        out = float(f"{out:.6g}")
    return out, ""


def edges(pick: Mapping[str, Any], tried: Sequence[Mapping[str, Any]], keys: Mapping[str, Any]) -> list[Edge]:
    """The pick's values that sit on an edge of what was tried around it: for each key, the values tried with
    every other key at the pick's value (the slice through the pick). The smallest or largest of two or more
    is an edge (low / high); a single value (the grid never varied it there) is 'untried', and both
    neighbours are due, one grid step away by the ratio of the key's values tried anywhere."""
    out: list[Edge] = []
    for key, value in pick.items():
        if key not in keys or not isinstance(value, (int, float)):
            continue
        others = {k: v for k, v in pick.items() if k != key}
        along = sorted({t[key] for t in tried if key in t and all(t.get(k) == v for k, v in others.items())})
        spec = keys[key]
        if len(along) >= 2:
            if value == along[0]:
                nxt, why = next_value(value, along[1], spec)
                out.append(Edge(key, value, "low", nxt, why))
            elif value == along[-1]:
                nxt, why = next_value(value, along[-2], spec)
                out.append(Edge(key, value, "high", nxt, why))
            continue
        anywhere = sorted({t[key] for t in tried if key in t})
        if len(anywhere) < 2:
            continue  # the grid never varies this key: not a tuned key of this method
        for below, above in _fake_neighbours(value, anywhere, spec):
            for neighbour, side in ((below, "untried"), (above, "untried")):
                nxt, why = next_value(value, neighbour, spec)
                out.append(Edge(key, value, side, nxt, why))
    return out


# --------------------------------------------------------------------------------------------------------------
# The rules


def _fake_neighbours(value: float, anywhere: Sequence[float], spec: Mapping[str, Any]) -> list[tuple[float, float]]:
    """A value one grid step below and one above ``value`` (the grid's smallest step of this key anywhere), for
    :func:`next_value` to step away from: up from the one below, down from the one above."""
    if spec.get("scale") == "log1m":
        ratio = min((1 - a) / (1 - b) for a, b in itertools.pairwise(anywhere))
        return [(1 - (1 - value) * ratio, 1 - (1 - value) / ratio)]
    ratio = min(b / a for a, b in itertools.pairwise(anywhere) if a > 0)
    return [(value / ratio, value * ratio)]


def target_levels(best_final: float, fractions: Sequence[float]) -> list[float]:
    """The field's targets: each fraction of the best tuned method's final validation metric, rounded down to
    0.01 (a target a hair lower, never one the best method might miss by rounding), ascending."""
    if not math.isfinite(best_final) or best_final <= 0:
        raise ProtocolError(f"best final metric {best_final}: no tuned method finished with a metric")
    return sorted(math.floor(f * best_final * 100 + 1e-9) / 100 for f in fractions)


def budgets_from_times(times: Sequence[float], divisors: Sequence[float]) -> list[float]:
    """The time budgets: the median method's time to the middle target (a method that never reaches it counts
    as infinitely slow), divided by each divisor."""
    if not times:
        raise ProtocolError("no method's time to the middle target: nothing to size the budgets by")
    median = statistics.median(float(t) for t in times)
    if not math.isfinite(median):
        raise ProtocolError("the median method never reaches the middle target: no budget can be set from it")
    return [median / float(d) for d in divisors]


def budget_steps(budget_s: float, step_s: float, warmup_step_s: float | None = None, warmup: float = 0.0) -> int:
    """The steps a run of ``budget_s`` seconds takes: its first ``warmup`` steps (a fraction of the run < 1, or
    a number of steps: 1-bit Adam's freeze, PowerSGD's start) at ``warmup_step_s``, the rest at ``step_s``;
    the largest whole number of steps that fits, at least 1."""
    if budget_s <= 0 or step_s <= 0:
        raise ProtocolError(f"budget {budget_s} s, step {step_s} s: both must be positive")
    warm_s = step_s if warmup_step_s is None else float(warmup_step_s)
    if 0 < warmup < 1:  # a fraction of the run: every step costs the weighted mean
        return max(1, int(budget_s / (warmup * warm_s + (1 - warmup) * step_s) + 1e-9))
    first = int(warmup)
    if first * warm_s >= budget_s:
        return max(1, int(budget_s / warm_s + 1e-9))
    return first + int((budget_s - first * warm_s) / step_s + 1e-9)


def load_flag(host_load: Mapping[str, Any] | None, own_processes: int, limit_per_core: float) -> bool:
    """Whether a run shared its host with more than ``limit_per_core`` x cores of other work: its 1-minute load
    average at the end, less its own processes, above the limit, or at the start above the limit plus as many
    processes (a sweep's previous cell of the same size fading out of the average). No record: not flagged."""
    if not host_load:
        return False
    cpus = host_load.get("cpus") or 1
    limit = limit_per_core * float(cpus)
    start, end = host_load.get("start"), host_load.get("end")
    over_start = start is not None and float(start[0]) > limit + own_processes
    over_end = end is not None and float(end[0]) - own_processes > limit
    return bool(over_start or over_end)


# --------------------------------------------------------------------------------------------------------------
# Cells


def _override(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        text = "[" + ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) + "]"
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = str(value)
    return shlex.quote(f"{key}={text}")


def _values(values: Mapping[str, Any]) -> str:
    return " ".join(_override(f"optim.{k}", v) for k, v in values.items())


def grid_cells(proto: Mapping[str, Any]) -> list[str]:
    """The tuning grid: every method's points at the first tuning seed."""
    seed = proto["tuning_seeds"][0]
    return [
        f"experiment={proto['tuning_experiment']} optim={method} {_values(point)} seed={seed}"
        for method, blocks in proto["grids"].items()
        for point in grid_points(blocks)
    ]


def _warmup(values: Mapping[str, Any]) -> float:
    """The pick's fp32 warmup: 1-bit Adam's freeze or PowerSGD's start (a fraction < 1 or steps); 0 elsewhere."""
    for key in ("freeze", "comm.start_iter"):
        if values.get(key) is not None:
            return float(values[key])
    return 0.0


def field_cells(
    proto: Mapping[str, Any], plan: Mapping[str, Any], methods: Sequence[str] | None = None, seeds=None
) -> list[str]:
    """The field: every method at every seed run whole (time to each target), and once more per budget, sized
    to end there (``train.steps`` from its step times; ``tuning.budget_s`` names the budget in its record),
    evaluated once, at its end (``train.eval_every=0``): its final metric is its metric at the budget."""
    methods = list(methods or proto.get("field_methods") or proto["grids"])
    seeds = list(seeds if seeds is not None else proto["field_seeds"])
    targets = plan["targets"]
    middle = targets[len(targets) // 2]
    target = f"task.target.value={middle:g} {_override('task.target.ladder', list(targets))}"
    link = f"cluster.link_mbit={proto['link_mbit']}"
    cells = []
    for method in methods:
        picks = (plan.get("picks") or {}).get(method) or {}
        step = plan["step_s"][method]
        warm, main = (step, step) if isinstance(step, (int, float)) else step
        base = f"experiment={proto['experiment']} optim={method} {_values(picks)} {link} {target}".replace("  ", " ")
        for seed in seeds:
            cells.append(f"{base} seed={seed}")
            for budget in plan["budgets_s"]:
                steps = budget_steps(budget, main, warm, _warmup(picks))
                cells.append(f"{base} train.steps={steps} train.eval_every=0 tuning.budget_s={budget:.4g} seed={seed}")
    return cells


def _whole_run_base(proto: Mapping[str, Any], plan: Mapping[str, Any], method: str) -> str:
    """A whole field run of ``method`` with its pick and the plan's targets (the middle one its own, the rest its
    ladder), before its link, layout and seed."""
    targets = plan["targets"]
    middle = targets[len(targets) // 2]
    picks = (plan.get("picks") or {}).get(method) or {}
    target = f"task.target.value={middle:g} {_override('task.target.ladder', list(targets))}"
    return f"experiment={proto['experiment']} optim={method} {_values(picks)} {target}".replace("  ", " ")


def local_steps_cells(
    proto: Mapping[str, Any], plan: Mapping[str, Any], links: Sequence[float] | None = None
) -> list[str]:
    """make local-steps: each of ``local_steps.methods`` at each link (``links_mbit``, or ``links``) and field
    seed, a whole run at the field's layout with its tuned pick (the recipe's values where the plan has none)."""
    spec = proto["local_steps"]
    links = list(links if links is not None else spec["links_mbit"])
    return [
        f"{_whole_run_base(proto, plan, method)} cluster.link_mbit={link:g} seed={seed}"
        for method in spec["methods"]
        for link in links
        for seed in proto["field_seeds"]
    ]


def per_process_batch(global_batch: int, nodes: int, gpus_per_node: int = 1) -> int:
    """The per-process batch that keeps ``nodes`` x ``gpus_per_node`` x it at ``global_batch``."""
    processes = nodes * gpus_per_node
    if processes < 1 or global_batch % processes:
        raise ProtocolError(
            f"global batch {global_batch} does not split evenly over {nodes} x {gpus_per_node} processes"
        )
    return global_batch // processes


def replica_cells(proto: Mapping[str, Any], plan: Mapping[str, Any]) -> list[str]:
    """make diloco-replicas: each of ``replicas.methods`` on each of ``replicas.nodes`` nodes of one process, the
    per-process batch keeping the field's global batch, links unshaped (steps do not depend on the link), the
    field's seeds, whole runs (steps to each target)."""
    spec = proto["replicas"]
    cells = []
    for method in spec["methods"]:
        for nodes in spec["nodes"]:
            batch = per_process_batch(int(spec["global_batch"]), int(nodes))
            layout = f"nodes={nodes} gpus_per_node=1 train.batch_size={batch} cluster.link_mbit=null"
            cells += [f"{_whole_run_base(proto, plan, method)} {layout} seed={s}" for s in proto["field_seeds"]]
    return cells


def read_plan(runs: Path, proto: Mapping[str, Any]) -> dict[str, Any]:
    """RUNS/tuned.yaml, or the protocol's provisional values (``provisional: true``) where it is not there."""
    path = Path(runs) / PLAN_FILE
    if path.is_file():
        return yaml.safe_load(path.read_text())
    prov = proto["provisional"]
    return {"provisional": True, "targets": prov["targets"], "budgets_s": prov["budgets_s"], "step_s": prov["step_s"]}


def write_plan(runs: Path, plan: Mapping[str, Any]) -> Path:
    path = Path(runs) / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (
        "# Written by python -m birder_repro.report.tuning --plan (make tune-fashion); read by make time-to-accuracy.\n"
    )
    path.write_text(head + yaml.safe_dump(dict(plan), sort_keys=False))
    return path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _narrowed(proto: dict[str, Any], methods: str | None, seeds: str | None, nodes: str | None) -> dict[str, Any]:
    """The protocol with make local-steps' and make diloco-replicas' methods, field seeds and node counts
    narrowed to those given (a smoke run of the targets' plumbing); each must be one the protocol names."""
    out = {**proto, "local_steps": dict(proto["local_steps"]), "replicas": dict(proto["replicas"])}
    if methods:
        wanted = [m for m in methods.split(",") if m]
        unknown = sorted(set(wanted) - set(proto["local_steps"]["methods"]) - set(proto["replicas"]["methods"]))
        if unknown:
            raise ProtocolError(f"--methods {unknown}: not methods of local_steps or replicas")
        for section in ("local_steps", "replicas"):
            out[section]["methods"] = [m for m in wanted if m in proto[section]["methods"]]
    if seeds:
        out["field_seeds"] = _ints(seeds)
    if nodes:
        out["replicas"]["nodes"] = _ints(nodes)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.report.protocol", description=__doc__)
    parser.add_argument(
        "which", choices=("grid", "field", "check", "local-steps", "replicas"), help="whose cells to print"
    )
    parser.add_argument("--links", default=None, help="local-steps: the links, Mbit/s, comma-separated")
    parser.add_argument("--methods", default=None, help="local-steps, replicas: only these methods (a smoke run)")
    parser.add_argument("--seeds", default=None, help="local-steps, replicas: only these seeds (a smoke run)")
    parser.add_argument("--nodes", default=None, help="replicas: only these node counts (a smoke run)")
    parser.add_argument("--runs", type=Path, default=Path("runs/time-to-accuracy"), help="the runs folder")
    parser.add_argument("--protocol", type=Path, default=None, help="default: conf/tuning/fashion_mnist.yaml")
    args = parser.parse_args(argv)
    try:
        proto = _narrowed(load_protocol(args.protocol), args.methods, args.seeds, args.nodes)
        plan = read_plan(args.runs, proto)
        if args.which == "grid":
            cells = grid_cells(proto)
        elif args.which == "field":
            if plan.get("provisional"):
                raise ProtocolError(f"no {args.runs / PLAN_FILE}: run make tune-fashion first (it writes the plan)")
            cells = field_cells(proto, plan)
        elif args.which == "local-steps":
            links = [float(x) for x in args.links.split(",")] if args.links else None
            cells = local_steps_cells(proto, plan, links)
        elif args.which == "replicas":
            cells = replica_cells(proto, plan)
        else:
            check = proto["check"]
            cells = field_cells(proto, plan, check["methods"], check["seeds"])
    except (ProtocolError, KeyError, ValueError) as exc:
        print(f"[birder-repro] protocol: {exc}", file=sys.stderr, flush=True)
        return 2
    if plan.get("provisional") and args.which != "grid":
        print(
            f"[birder-repro] protocol: no {args.runs / PLAN_FILE}: {args.which} uses the protocol's provisional "
            "targets, budgets and step times and the recipes' values",
            file=sys.stderr,
        )
    print(f"# order-seed: {proto['order_seed']}")
    print("\n".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
