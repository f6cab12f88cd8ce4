"""Run records (``record.json``, one per run) read back into one pandas DataFrame, one row per run.

The keys a record holds are documented in :mod:`birder_repro.run.schema` (read here through ``schema.get``); this
module is the only place in the report that knows their nesting, so the tables work on flat, named columns.
Bytes become MB (10^6 bytes) and seconds become milliseconds here, once. ``source`` tells measured runs
from predicted records (``status: predicted``, ``birder-repro mode=predict``). Every metric any record has becomes a
column (each task's own, in the order :func:`birder_repro.run.schema.metric_names` gives), after :data:`COLUMNS`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from birder_repro.comm.accounting import allreduce_bytes, flat_allreduce_split
from birder_repro.run import schema
from birder_repro.run.record import RECORD_FILE, find_records, read_record, runs_root
from birder_repro.run.schema import get

from .clock import loop_seconds
from .identity import config_items, config_key

__all__ = [
    "COLUMNS",
    "STAGED_OPTIMIZERS",
    "runs_root",
    "find_records",
    "load_records",
    "flatten_record",
    "metric_column",
    "metric_columns",
    "records_frame",
    "load_frame",
]

# Optimizers whose records split throughput into a warmup and a compression stage.
STAGED_OPTIMIZERS = ("onebit_adam", "onebit_adam_precond", "onebit_lamb")

# The fixed columns; the metric columns follow them.
COLUMNS = (
    "run_dir",
    "status",
    "error",
    "diverged_at_step",
    "source",
    "implementation",
    "task",
    "parallel",
    "optim",
    "variant",
    "baseline",
    "cluster",
    "interconnect",
    "link_mbit",
    "nodes",
    "gpus_per_node",
    "gpus",
    "data_source",
    "model_size",
    "precision",
    "batch_size",
    "global_batch_size",
    "steps",
    "lr",
    "throughput",
    "throughput_warmup",
    "throughput_compression",
    "step_ms_total",
    "step_ms_compute",
    "step_ms_communication",
    "step_ms_compression",
    "step_ms_data_wait",
    "intra_mb_per_step",
    "inter_mb_per_step",
    "fp32_mb_per_step",
    "fp32_inter_mb_per_step",
    "link_mb_per_step",
    "per_node_link_mb",
    "intra_mb_per_step_compression",
    "inter_mb_per_step_compression",
    "headline_metric",
    "device",
    "git_sha",
    "started",
    "ended",
    # time to accuracy (schema key time_to_target, birder_repro.train.target) and what is reported apart from it
    "target_metric",
    "target_value",
    "target_direction",
    "target_reached",
    "target_s",
    "target_step",
    "target_samples",
    "target_wall_s",
    "target_evaluations",
    "startup_s",
    "compile_s",
    "seed",
    # which cell a run is of (birder_repro.report.identity) and how it ran: its length, its attempts (a run
    # stopped and resumed in its own directory), or the step an old-style resume in a new directory began at
    "cell_key",
    "config_items",
    "run_length",
    "eval_every",
    "attempts",
    "resumed_from_step",
    # what it was scored on (data.eval_set: test, or val for tuning), and a run that ended at its target
    # (train.stop_at_target) with the length its schedule was planned for
    "eval_set",
    "stop_at_target",
    "planned_steps",
)


def load_records(root: Path) -> list[tuple[Path, dict]]:
    """(run directory, record) for every readable record under ``root`` (unreadable ones warn, then skip)."""
    pairs = []
    for path in find_records(root):
        record = read_record(path.parent)
        if record is not None and record.get("probe") is None:  # mode=probe measured a link, not a run
            pairs.append((path.parent, record))
    return pairs


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _mean_over_nodes(per_node: Any) -> float | None:
    """Mean of the per-node kernel byte counts (emulated clusters); None where nothing was counted."""
    if not isinstance(per_node, (list, tuple)):
        return None if per_node is None else float(per_node)
    counted = [float(v) for v in per_node if v is not None]
    return sum(counted) / len(counted) if counted else None


def _per_node_text(per_node: Any) -> str | None:
    """ "0.70 / 0.66": each node's kernel-counted MB per step, in node order (emulated clusters)."""
    if not isinstance(per_node, (list, tuple)) or not per_node:
        return None
    return " / ".join("—" if v is None else f"{float(v) * 1e-6:.3g}" for v in per_node)


def fp32_inter_node_bytes(record: dict, world: Any, gpus_per_node: Any) -> float | None:
    """The inter-node share of the fp32 all-reduce a run compares its own bytes with.

    The record's ``fp32_allreduce_inter_node_bytes_per_step`` where written; else split from the total
    ``fp32_allreduce_bytes_per_step`` by :func:`birder_repro.comm.accounting.flat_allreduce_split` (a ring in
    rank order: with more than one node, 1/m of each process's bytes cross nodes, m GPUs per node).
    """
    given = get(record, "fp32_allreduce_inter_node_bytes_per_step")
    if given is not None:
        return float(given)
    total = get(record, "fp32_allreduce_bytes_per_step")
    if total is None or not isinstance(gpus_per_node, int) or not isinstance(world, int) or world < 1:
        return None
    if world == 1:
        return 0.0
    gradient_bytes = float(total) / allreduce_bytes(1, world)  # the all-reduced bytes, from what one process sent
    return flat_allreduce_split(gradient_bytes, world, gpus_per_node)[1]


def default_baseline(task: str | None) -> str:
    """The paper's baseline where a record's config does not name one: BertAdam for BERT, SGDM for the rest."""
    return "bertadam" if str(task or "").startswith("bert") else "sgdm"


def first_line(text: Any) -> str | None:
    if text is None:
        return None
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def metric_column(name: str) -> str:
    """The column of metric ``name``: the name itself, unless a fixed column has it (then ``metric_<name>``)."""
    return f"metric_{name}" if name in COLUMNS else name


def flatten_record(record: dict, run_dir: Path | str) -> dict:
    """One table row from one record: nested keys become the flat columns of ``COLUMNS``, and each metric the
    record has a column of its own (:func:`metric_column`)."""

    def config(*path: str) -> Any:
        return get(record, "config", *path)

    nodes = get(record, "cluster", "nodes", default=config("nodes"))
    gpus_per_node = get(record, "cluster", "gpus_per_node", default=config("gpus_per_node"))
    world = get(record, "world_size")
    if world is None and isinstance(nodes, int) and isinstance(gpus_per_node, int):
        world = nodes * gpus_per_node
    task = get(record, "task", default=config("task", "name"))
    link = get(record, "link_bytes_per_step")
    row = {
        "run_dir": str(run_dir),
        "status": get(record, "status"),
        "error": first_line(get(record, "error")),
        "diverged_at_step": get(record, "diverged_at_step"),
        # measured (a run) | predicted (mode=predict, the performance model): never mixed in one table.
        "source": "predicted" if get(record, "status") == "predicted" else "measured",
        "implementation": get(record, "prediction", "implementation"),
        "task": task,
        # ddp | fsdp: sharded runs are their own setting (their baseline is FSDP's native HSDP)
        "parallel": get(record, "parallel", default=config("parallel")) or "ddp",
        "optim": get(record, "optim", default=config("optim", "name")),
        # Birder's hierarchical / flat / allgather schemes are one optimizer name with different costs.
        "variant": config("optim", "comm", "scheme"),
        "baseline": config("task", "baseline") or default_baseline(task),
        "cluster": get(record, "cluster", "name", default=config("cluster", "name")),
        "interconnect": get(record, "cluster", "interconnect", default=config("cluster", "interconnect")),
        "link_mbit": get(record, "cluster", "link_mbit", default=config("cluster", "link_mbit")),
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "gpus": world,
        "data_source": config("data", "source"),
        # full | tiny (tiny runs are smoke runs, another setting) | w<units> where model.width sets it
        "model_size": f"w{config('model', 'width')}" if config("model", "width") else config("model", "size"),
        # fp32 | bf16 | fp16: records from before train.precision existed ran in fp32
        "precision": get(record, "precision", default=config("train", "precision")) or "fp32",
        "batch_size": get(record, "batch_size", default=config("train", "batch_size")),
        "global_batch_size": get(record, "global_batch_size"),
        "steps": get(record, "steps"),
        "lr": get(record, "lr"),
        "throughput": get(record, "throughput_samples_per_s"),
        "throughput_warmup": get(record, "throughput_by_stage", "warmup"),
        "throughput_compression": get(record, "throughput_by_stage", "compression"),
        "intra_mb_per_step": _scaled(get(record, "intra_node_bytes_per_step"), 1e-6),
        "inter_mb_per_step": _scaled(get(record, "inter_node_bytes_per_step"), 1e-6),
        "fp32_mb_per_step": _scaled(get(record, "fp32_allreduce_bytes_per_step"), 1e-6),
        "fp32_inter_mb_per_step": _scaled(fp32_inter_node_bytes(record, world, gpus_per_node), 1e-6),
        "intra_mb_per_step_compression": _scaled(
            get(record, "intra_node_bytes_per_step_by_stage", "compression"), 1e-6
        ),
        "inter_mb_per_step_compression": _scaled(
            get(record, "inter_node_bytes_per_step_by_stage", "compression"), 1e-6
        ),
        "link_mb_per_step": _scaled(_mean_over_nodes(link), 1e-6),
        "per_node_link_mb": _per_node_text(link),
        "headline_metric": _headline(record),
        "device": get(record, "device"),
        "git_sha": get(record, "git_sha"),
        "started": get(record, "started"),
        "ended": get(record, "ended"),
        **_target_columns(record, run_dir),
        "startup_s": get(record, "startup_s"),
        "compile_s": get(record, "compile_s"),
        "seed": config("seed"),
        **_identity_columns(record, "predicted" if get(record, "status") == "predicted" else "measured"),
    }
    for part in schema.STEP_TIME_PARTS:
        row[f"step_ms_{part}"] = _scaled(get(record, "step_time_s", part), 1e3)
    for name, value in get(record, "metrics", default={}).items():
        row[metric_column(name)] = value
    return row


def optional(record: dict, key: str) -> Any:
    """A key that newer records carry (``attempts``, ``config_digest``): read through ``schema.get`` once the
    schema documents it, plainly before."""
    return get(record, key) if key in schema.NAMES else record.get(key)


def _train_config(record: dict) -> dict:
    config = get(record, "config", default={})
    train = config.get("train") if isinstance(config, dict) else None
    return train if isinstance(train, dict) else {}


def run_length(record: dict) -> str | None:
    """ "60 steps" or "10 epochs": the length the run was asked for (train.steps, else train.epochs), the same
    for every layout of a sweep by epochs; for records without it, the steps the run took. A value that is no
    length (a run refused for ``train.steps=ten`` records it as given) gives none."""
    train = _train_config(record)
    if train.get("steps") is not None:
        steps = train["steps"]
        return f"{steps} steps" if isinstance(steps, int) and not isinstance(steps, bool) else None
    if isinstance(train.get("epochs"), (int, float)):
        return f"{train['epochs']:g} epochs"
    steps = get(record, "steps")
    return None if steps is None else f"{int(steps)} steps"


def _attempt_count(attempts: Any) -> int:
    """How many attempts a run took: its ``attempts`` list's length (a count where one is given), else 1."""
    if isinstance(attempts, list) and attempts:
        return len(attempts)
    return int(attempts) if isinstance(attempts, int) and attempts > 0 else 1


def _identity_columns(record: dict, source: str) -> dict:
    attempts = optional(record, "attempts")
    return {
        "cell_key": config_key(get(record, "config"), source),
        "config_items": config_items(get(record, "config"), source),
        "run_length": run_length(record),
        "eval_every": _train_config(record).get("eval_every"),
        "attempts": _attempt_count(attempts),
        "resumed_from_step": get(record, "resumed_from_step"),
        "eval_set": get(record, "config", "data", "eval_set", default=None),
        "stop_at_target": bool(_train_config(record).get("stop_at_target")),
        "planned_steps": optional(record, "planned_steps") or get(record, "steps"),
    }


def _target_columns(record: dict, run_dir: Path | str) -> dict:
    """The ``target_*`` columns from the record's ``time_to_target`` (all None where it has none); the seconds
    on the loop clock, an older record's re-read from its log (report.clock)."""

    def part(name: str) -> Any:
        return get(record, "time_to_target", name)

    return {
        "target_metric": part("metric"),
        "target_value": part("target"),
        "target_direction": part("direction"),
        "target_reached": part("reached"),
        "target_s": loop_seconds(record, run_dir) if isinstance(record.get("time_to_target"), dict) else None,
        "target_step": part("step"),
        "target_samples": part("samples"),
        "target_wall_s": part("wall_s"),
        "target_evaluations": part("evaluations"),
    }


def _headline(record: dict) -> str | None:
    """The record's headline metric; for records written before it was recorded, its first own metric."""
    own = [m for m in get(record, "metrics", default={}) if m not in schema.LOSS_METRICS]
    return get(record, "headline_metric") or (own[0] if own else None)


def metric_columns(frame: pd.DataFrame) -> list[str]:
    """The metric columns of a frame from :func:`records_frame`, in their order."""
    return list(frame.attrs.get("metric_columns", []))


def _started_time(values: pd.Series) -> pd.Series:
    """``started`` as UTC timestamps, from ISO strings or Unix seconds; unparsable values become NaT."""
    numeric = pd.to_numeric(values, errors="coerce")
    as_epoch = pd.to_datetime(numeric, unit="s", utc=True, errors="coerce")
    as_text = pd.to_datetime(values.where(numeric.isna()), utc=True, errors="coerce", format="mixed")
    return as_epoch.fillna(as_text)


def records_frame(pairs: Iterable[tuple[Path | str, dict]]) -> pd.DataFrame:
    """The flat DataFrame of ``COLUMNS`` then every metric column (one row per run); ``started_at`` holds
    ``started`` as a timestamp. ``frame.attrs["metric_columns"]`` lists the metric columns in order."""
    pairs = list(pairs)
    ordered = sorted(pairs, key=lambda p: (str(get(p[1], "task") or ""), str(p[0])))
    metrics = [metric_column(m) for m in schema.metric_names(record for _, record in ordered)]
    rows = [row for run_dir, record in pairs if (row := _flat_or_skipped(record, run_dir)) is not None]
    frame = pd.DataFrame(rows, columns=[*COLUMNS, *metrics])
    for col in (
        "nodes",
        "gpus_per_node",
        "gpus",
        "batch_size",
        "global_batch_size",
        "steps",
        "target_step",
        "target_samples",
        "target_evaluations",
        "seed",
        "attempts",
        "resumed_from_step",
        "eval_every",
        "planned_steps",
    ):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    numeric = [
        "link_mbit",
        "lr",
        "throughput",
        "throughput_warmup",
        "throughput_compression",
        "target_value",
        "target_s",
        "target_wall_s",
        "startup_s",
        "compile_s",
        *[c for c in COLUMNS if c.startswith(("step_ms_", "intra_", "inter_", "fp32_", "link_mb"))],
        *metrics,
    ]
    for col in numeric:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["started_at"] = _started_time(frame["started"].astype("object"))
    frame.attrs["metric_columns"] = metrics
    return frame


def _flat_or_skipped(record: dict, run_dir: Path | str) -> dict | None:
    """``flatten_record``, or None with a warning naming the record and what in it cannot be read (a run refused
    for a value such as ``train.steps=ten`` records that value; one such record must not stop every table)."""
    try:
        return flatten_record(record, run_dir)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        where = Path(run_dir) / RECORD_FILE
        print(f"skipping run record {where}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return None


def load_frame(root: Path) -> pd.DataFrame:
    """Every readable record under ``root`` as the flat DataFrame."""
    return records_frame(load_records(root))
