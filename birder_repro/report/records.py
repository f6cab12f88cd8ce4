"""Run records (``record.json``, one per run) read back into one pandas DataFrame, one row per run.

The keys a record holds are fixed by ``DESIGN.md`` ("Run records and tables"); this module is the only place
that knows their nesting, so the tables work on flat, named columns. Bytes become MB (10^6 bytes) and seconds
become milliseconds here, once.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional

import pandas as pd

RECORD_NAME = "record.json"
DEFAULT_RUNS = "runs"

# Every metric a task may report (DESIGN.md); each gets a column even when no run has it.
METRICS = ("top1", "top5", "f1", "exact_match", "perplexity", "mlm_loss", "loss")

# Optimizers whose records split throughput into a warmup and a compression stage (issue 3, part 3).
STAGED_OPTIMIZERS = ("onebit_adam", "onebit_lamb")

COLUMNS = (
    "run_dir", "status", "error", "task", "optim", "variant", "baseline",
    "cluster", "interconnect", "link_mbit", "nodes", "gpus_per_node", "gpus",
    "data_source", "model_size", "batch_size", "global_batch_size", "steps", "lr",
    "throughput", "throughput_warmup", "throughput_compression",
    "step_ms_total", "step_ms_compute", "step_ms_communication", "step_ms_compression",
    "intra_mb_per_step", "inter_mb_per_step", "fp32_mb_per_step", "fp32_inter_mb_per_step", "link_mb_per_step",
    "per_node_link_mb",
    "intra_mb_per_step_compression", "inter_mb_per_step_compression",
    *METRICS, "device", "git_sha", "started", "ended",
)


def runs_root(cli_arg: Optional[str] = None) -> Path:
    """Where the records live: ``--runs DIR``, else ``$BIRDER_RUNS``, else ``runs/`` (as the Hydra config)."""
    return Path(cli_arg or os.environ.get("BIRDER_RUNS") or DEFAULT_RUNS)


def find_records(root: Path) -> list[Path]:
    """Every ``record.json`` under ``root``, at any depth (single runs and multirun sweeps alike)."""
    root = Path(root)
    return sorted(root.rglob(RECORD_NAME)) if root.is_dir() else []


def read_record(path: Path) -> Optional[dict]:
    """One record, or None with a warning naming the file when it cannot be read as a JSON object.

    A run killed while writing leaves a truncated file; one bad file must not hide every other run.
    """
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        warnings.warn(f"skipping unreadable run record {path}: {err}", stacklevel=2)
        return None
    if not isinstance(record, dict):
        warnings.warn(f"skipping run record {path}: not a JSON object", stacklevel=2)
        return None
    return record


def load_records(root: Path) -> list[tuple[Path, dict]]:
    """(run directory, record) for every readable record under ``root``."""
    pairs = []
    for path in find_records(root):
        record = read_record(path)
        if record is not None:
            pairs.append((path.parent, record))
    return pairs


def _get(d: Any, *keys: str, default: Any = None) -> Any:
    """``d[k1][k2]...`` or ``default`` where any level is missing or not a dict."""
    for key in keys:
        if not isinstance(d, dict) or d.get(key) is None:
            return default
        d = d[key]
    return d


def _scaled(value: Any, factor: float) -> Optional[float]:
    return None if value is None else float(value) * factor


def _mean_over_nodes(per_node: Any) -> Optional[float]:
    """Mean of the per-node kernel byte counts (emulated clusters); None where nothing was counted."""
    if not isinstance(per_node, (list, tuple)):
        return None if per_node is None else float(per_node)
    counted = [float(v) for v in per_node if v is not None]
    return sum(counted) / len(counted) if counted else None


def _per_node_text(per_node: Any) -> Optional[str]:
    """"0.70 / 0.66": each node's kernel-counted MB per step, in node order (emulated clusters, issue 5)."""
    if not isinstance(per_node, (list, tuple)) or not per_node:
        return None
    return " / ".join("—" if v is None else f"{float(v) * 1e-6:.3g}" for v in per_node)


def fp32_inter_node_bytes(record: dict, gpus_per_node: Any) -> Optional[float]:
    """The inter-node share of the fp32 all-reduce a run compares its own bytes with.

    The record's ``fp32_allreduce_inter_node_bytes_per_step`` where written; else split from the total
    ``fp32_allreduce_bytes_per_step`` as a rank-ordered ring does: with more than one node, 1/m of each
    process's bytes cross nodes (m GPUs per node; birder_repro.comm.accounting.flat_allreduce_split).
    """
    if record.get("fp32_allreduce_inter_node_bytes_per_step") is not None:
        return float(record["fp32_allreduce_inter_node_bytes_per_step"])
    total, nodes = record.get("fp32_allreduce_bytes_per_step"), _get(record, "cluster", "nodes")
    if total is None or not isinstance(gpus_per_node, int) or not isinstance(nodes, int):
        return None
    return float(total) / gpus_per_node if nodes > 1 else 0.0


def default_baseline(task: Optional[str]) -> str:
    """The paper's baseline where a record's config does not name one: BertAdam for BERT, SGDM for the rest."""
    return "bertadam" if str(task or "").startswith("bert") else "sgdm"


def first_line(text: Any) -> Optional[str]:
    if text is None:
        return None
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def flatten_record(record: dict, run_dir: Path | str) -> dict:
    """One table row from one record: nested keys become the flat columns of ``COLUMNS``."""
    cfg = record.get("config") or {}
    cluster = record.get("cluster") or {}
    nodes = cluster.get("nodes", _get(cfg, "nodes"))
    gpus_per_node = cluster.get("gpus_per_node", _get(cfg, "gpus_per_node"))
    world = record.get("world_size")
    if world is None and isinstance(nodes, int) and isinstance(gpus_per_node, int):
        world = nodes * gpus_per_node
    stages = record.get("throughput_by_stage") or {}
    step = record.get("step_time_s") or {}
    metrics = record.get("metrics") or {}
    task = record.get("task", _get(cfg, "task", "name"))
    row = {
        "run_dir": str(run_dir),
        "status": record.get("status"),
        "error": first_line(record.get("error")),
        "task": task,
        "optim": record.get("optim", _get(cfg, "optim", "name")),
        # Birder's hierarchical / flat / allgather schemes are one optimizer name with different costs.
        "variant": _get(cfg, "optim", "comm", "scheme"),
        "baseline": _get(cfg, "task", "baseline") or default_baseline(task),
        "cluster": cluster.get("name", _get(cfg, "cluster", "name")),
        "interconnect": cluster.get("interconnect", _get(cfg, "cluster", "interconnect")),
        "link_mbit": cluster.get("link_mbit", _get(cfg, "cluster", "link_mbit")),
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "gpus": world,
        "data_source": _get(cfg, "data", "source"),
        "model_size": _get(cfg, "model", "size"),  # full | tiny: tiny runs are smoke runs, another setting
        "batch_size": record.get("batch_size", _get(cfg, "train", "batch_size")),
        "global_batch_size": record.get("global_batch_size"),
        "steps": record.get("steps"),
        "lr": record.get("lr"),
        "throughput": record.get("throughput_samples_per_s"),
        "throughput_warmup": stages.get("warmup"),
        "throughput_compression": stages.get("compression"),
        "intra_mb_per_step": _scaled(record.get("intra_node_bytes_per_step"), 1e-6),
        "inter_mb_per_step": _scaled(record.get("inter_node_bytes_per_step"), 1e-6),
        "fp32_mb_per_step": _scaled(record.get("fp32_allreduce_bytes_per_step"), 1e-6),
        "fp32_inter_mb_per_step": _scaled(fp32_inter_node_bytes(record, gpus_per_node), 1e-6),
        "intra_mb_per_step_compression": _scaled(
            _get(record, "intra_node_bytes_per_step_by_stage", "compression"), 1e-6),
        "inter_mb_per_step_compression": _scaled(
            _get(record, "inter_node_bytes_per_step_by_stage", "compression"), 1e-6),
        "link_mb_per_step": _scaled(_mean_over_nodes(record.get("link_bytes_per_step")), 1e-6),
        "per_node_link_mb": _per_node_text(record.get("link_bytes_per_step")),
        "device": record.get("device"),
        "git_sha": record.get("git_sha"),
        "started": record.get("started"),
        "ended": record.get("ended"),
    }
    for part in ("total", "compute", "communication", "compression"):
        row[f"step_ms_{part}"] = _scaled(step.get(part), 1e3)
    for name in METRICS:
        row[name] = metrics.get(name)
    return row


def _started_time(values: pd.Series) -> pd.Series:
    """``started`` as UTC timestamps, from ISO strings or Unix seconds; unparsable values become NaT."""
    numeric = pd.to_numeric(values, errors="coerce")
    as_epoch = pd.to_datetime(numeric, unit="s", utc=True, errors="coerce")
    as_text = pd.to_datetime(values.where(numeric.isna()), utc=True, errors="coerce", format="mixed")
    return as_epoch.fillna(as_text)


def records_frame(pairs: Iterable[tuple[Path | str, dict]]) -> pd.DataFrame:
    """The flat DataFrame of ``COLUMNS`` (one row per run); ``started_at`` holds ``started`` as a timestamp."""
    rows = [flatten_record(record, run_dir) for run_dir, record in pairs]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("nodes", "gpus_per_node", "gpus", "batch_size", "global_batch_size", "steps"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    numeric = ["link_mbit", "lr", "throughput", "throughput_warmup", "throughput_compression",
               *[c for c in COLUMNS if c.startswith(("step_ms_", "intra_", "inter_", "fp32_", "link_mb"))],
               *METRICS]
    for col in numeric:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["started_at"] = _started_time(frame["started"].astype("object"))
    return frame


def load_frame(root: Path) -> pd.DataFrame:
    """Every readable record under ``root`` as the flat DataFrame."""
    return records_frame(load_records(root))
