"""The short human summary printed at the end of a run, from its record (``record.json``'s keys, DESIGN.md).

Every line tolerates missing keys: a failed run has a status and an error and little else.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

# Metrics in the order the paper's tables give them; others follow alphabetically.
_METRIC_ORDER = ("top1", "top5", "f1", "exact_match", "perplexity", "mlm_loss", "eval_loss")


def human_bytes(n: Optional[float]) -> str:
    """Bytes in binary units (KiB = 1024 B), three significant figures."""
    if n is None or not math.isfinite(n):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def reduction(reference: Optional[float], sent: Optional[float]) -> Optional[float]:
    """How many times fewer bytes were sent than ``reference``; None where either is missing or sent is 0."""
    if reference is None or sent is None or sent <= 0 or not math.isfinite(reference):
        return None
    return reference / sent


def _num(value: Any, fmt: str = ".4g") -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "n/a"


def _ms(seconds: Any) -> str:
    return _num(seconds * 1e3 if isinstance(seconds, (int, float)) else None, ".1f")


def _layout(record: Mapping[str, Any]) -> str:
    cluster = record.get("cluster") or {}
    cfg = record.get("config") or {}
    nodes = cluster.get("nodes", cfg.get("nodes"))
    per_node = cluster.get("gpus_per_node", cfg.get("gpus_per_node"))
    if nodes is None or per_node is None:
        world = record.get("world_size")
        return f"{world} processes" if world is not None else "an unknown layout"
    text = f"{nodes} node{'s' if nodes != 1 else ''} x {per_node} process{'es' if per_node != 1 else ''}"
    where = cluster.get("interconnect") or (cfg.get("cluster") or {}).get("interconnect")
    return f"{text} ({where})" if where else text


def _metrics_line(record: Mapping[str, Any]) -> str:
    metrics = dict(record.get("metrics") or {})
    loss = metrics.pop("loss", record.get("final_loss"))
    parts = [f"loss {_num(loss)}" + (f" ({record['loss_definition']})" if record.get("loss_definition") else "")]
    ordered = [k for k in _METRIC_ORDER if k in metrics] + sorted(k for k in metrics if k not in _METRIC_ORDER)
    parts += [f"{k} {_num(metrics[k])}" for k in ordered]
    return "result:     " + ", ".join(parts)


def _throughput_line(record: Mapping[str, Any]) -> str:
    line = f"throughput: {_num(record.get('throughput_samples_per_s'), '.1f')} samples/s"
    warmup = record.get("timing_warmup_steps")
    if warmup:
        line += f" (first {warmup} steps left out)"
    stages = record.get("throughput_by_stage") or {}
    if stages:
        line += "; by stage: " + ", ".join(f"{k} {_num(v, '.1f')}" for k, v in stages.items())
    return line


def _step_time_line(record: Mapping[str, Any]) -> str:
    st = record.get("step_time_s") or {}
    return (f"step time:  {_ms(st.get('total'))} ms = compute {_ms(st.get('compute'))} + communication "
            f"{_ms(st.get('communication'))} + compression {_ms(st.get('compression'))} ms\n"
            "            (compute: forward+backward calibrated without communication, plus the optimizer step; "
            "communication: the rest, not hidden by compute)")


def _bytes_lines(record: Mapping[str, Any]) -> list[str]:
    intra, inter = record.get("intra_node_bytes_per_step"), record.get("inter_node_bytes_per_step")
    lines = [f"sent/step:  intra-node {human_bytes(intra)}, inter-node {human_bytes(inter)} per process"]
    fp32 = record.get("fp32_allreduce_bytes_per_step")
    if fp32 is not None:
        fp32_inter = record.get("fp32_allreduce_inter_node_bytes_per_step")
        line = f"fp32 all-reduce would send {human_bytes(fp32)} per process"
        if fp32_inter is not None:
            line += f" ({human_bytes(fp32_inter)} inter-node)"
        ratios = []
        total_ratio = reduction(fp32, (intra or 0.0) + (inter or 0.0))
        if total_ratio is not None:
            ratios.append(f"{total_ratio:.3g}x less in all")
        inter_ratio = reduction(fp32_inter, inter)
        if inter_ratio is not None:
            ratios.append(f"{inter_ratio:.3g}x less inter-node")
        lines.append(f"            {line}" + (f": this run sent {', '.join(ratios)}" if ratios else ""))
    link = record.get("link_bytes_per_step")
    if link:  # emulated clusters: what each node's link really carried (kernel counters, headers included)
        per_node = ", ".join(human_bytes(b) for b in link)
        lines.append(f"            each node's link carried (kernel count): {per_node} per step")
    return lines


def format_summary(record: Mapping[str, Any]) -> str:
    """A few lines: what ran, on what data, how it ended, how fast, how well, and what it sent."""
    cfg = record.get("config") or {}
    task = record.get("task") or (cfg.get("task") or {}).get("name")
    optim = record.get("optim") or (cfg.get("optim") or {}).get("name")
    lines = [f"run:        {task} with {optim} on {_layout(record)}"]
    data = record.get("data") or (cfg.get("data") or {}).get("source")
    if data:
        lines.append(f"data:       {data}")
    status = record.get("status", "completed")
    status_line = f"status:     {status}"
    if record.get("steps") is not None:
        status_line += f", {record['steps']} steps"
    if record.get("samples") is not None:
        status_line += f", {record['samples']} samples"
    if record.get("global_batch_size") is not None:
        status_line += f" (global batch {record['global_batch_size']})"
    lines.append(status_line)
    if record.get("error"):
        lines.append(f"error:      {str(record['error']).strip().splitlines()[-1]}")
    if record.get("throughput_samples_per_s") is None:
        return "\n".join(lines)
    lines += [_throughput_line(record), _metrics_line(record), _step_time_line(record), *_bytes_lines(record)]
    return "\n".join(lines)
