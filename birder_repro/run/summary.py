"""The short human summary printed at the end of a run, from its record (keys: :mod:`birder_repro.run.schema`).

Every line tolerates missing keys: a failed run has a status and an error and little else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from birder_repro.optim import get_optim_info
from birder_repro.run import schema
from birder_repro.run.schema import get


def fmt_number(x: Any, digits: int = 4, missing: str = "—") -> str:
    """A number in ``digits`` significant figures, never with an exponent for a large one: whole numbers from
    10^(digits-1) up (1010 MiB, not 1.01e+03; 3261 samples/s; 1054 Mbit/s). ``missing`` for None, NaN and
    anything that is no number. The one format of the summary, the tables (report.display) and the advice
    (perf.advisor)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return missing
    if math.isnan(x):
        return missing
    return f"{x:.0f}" if abs(x) >= 10 ** (digits - 1) else f"{x:.{digits}g}"


def human_bytes(n: float | None) -> str:
    """Bytes in binary units (KiB = 1024 B), three significant figures (1010 MiB below 1 GiB)."""
    if n is None or not math.isfinite(n):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{fmt_number(n, 3)} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def reduction(reference: float | None, sent: float | None) -> float | None:
    """How many times fewer bytes were sent than ``reference``; None where either is missing or sent is 0."""
    if reference is None or sent is None or sent <= 0 or not math.isfinite(reference):
        return None
    return reference / sent


def compared(ratio: float, what: str) -> str:
    """``ratio`` (reference / sent) in words: "32x less inter-node", "1.5x more in all", or "the same ..."
    where the two agree to the 3 figures shown (an uncompressed optimizer sends what fp32 sends)."""
    if f"{ratio:.3g}" == "1":
        return f"the same as fp32 {what}"
    return f"{ratio:.3g}x less {what}" if ratio > 1 else f"{1 / ratio:.3g}x more {what}"


def _num(value: Any, fmt: str = ".4g") -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "n/a"


def _ms(seconds: Any) -> str:
    return _num(seconds * 1e3 if isinstance(seconds, (int, float)) else None, ".1f")


def _layout(record: Mapping[str, Any]) -> str:
    nodes = get(record, "cluster", "nodes", default=get(record, "config", "nodes"))
    per_node = get(record, "cluster", "gpus_per_node", default=get(record, "config", "gpus_per_node"))
    if nodes is None or per_node is None:
        world = get(record, "world_size")
        return f"{world} processes" if world is not None else "an unknown layout"
    text = f"{nodes} node{'s' if nodes != 1 else ''} x {per_node} process{'es' if per_node != 1 else ''}"
    where = get(record, "cluster", "interconnect") or get(record, "config", "cluster", "interconnect")
    return f"{text} ({where})" if where else text


def _metrics_line(record: Mapping[str, Any]) -> str:
    metrics = dict(get(record, "metrics", default={}))
    loss = metrics.pop("loss", get(record, "final_loss"))
    definition = get(record, "loss_definition")
    parts = [f"loss {_num(loss)}" + (f" ({definition})" if definition else "")]
    ordered = schema.ordered_metrics(metrics, metrics.keys(), get(record, "headline_metric"))
    parts += [f"{k} {_num(v)}" for k, v in ordered.items()]
    return "result:     " + ", ".join(parts)


def _throughput_line(record: Mapping[str, Any]) -> str:
    line = f"throughput: {_num(get(record, 'throughput_samples_per_s'), '.1f')} samples/s"
    warmup = get(record, "timing_warmup_steps")
    if warmup:
        line += f" (first {warmup} steps left out)"
    stages = get(record, "throughput_by_stage", default={})
    if stages:
        line += "; by stage: " + ", ".join(f"{k} {_num(v, '.1f')}" for k, v in stages.items())
    return line


def target_text(record: Mapping[str, Any]) -> str | None:
    """ "top1 >= 98: 4.21 s (step 40, 5120 samples; wall-clock 5.02 s)" or "top1 >= 98: not reached (12
    evaluations)"; None without a target (time to accuracy, birder_repro.train.target)."""
    t = get(record, "time_to_target")
    if not t:
        return None
    goal = f"{t['metric']} {'>=' if t['direction'] == 'higher' else '<='} {t['target']:g}"
    if not t.get("reached"):
        return f"{goal}: not reached ({t.get('evaluations', 0)} evaluations)"
    return (
        f"{goal}: {_num(t['seconds'], '.3g')} s (step {t['step']}, {t['samples']} samples; "
        f"wall-clock {_num(t['wall_s'], '.3g')} s)"
    )


def _target_line(record: Mapping[str, Any]) -> str | None:
    text = target_text(record)
    if text is None:
        return None
    startup, compile_s = get(record, "startup_s"), get(record, "compile_s")
    return (
        f"target:     {text}\n            (training clock from the first step; apart: start-up "
        f"{_num(startup, '.3g')} s, the first step's one-time work {_num(compile_s, '.3g')} s)"
    )


def _step_time_line(record: Mapping[str, Any]) -> str:
    total, compute, communication, compression, data_wait = (
        get(record, "step_time_s", part) for part in schema.STEP_TIME_PARTS
    )
    return (
        f"step time:  {_ms(total)} ms = compute {_ms(compute)} + communication {_ms(communication)} + "
        f"compression {_ms(compression)}{'' if data_wait is None else f' + data wait {_ms(data_wait)}'} ms\n"
        "            (compute: forward+backward calibrated without communication, plus the optimizer step; "
        "communication: the rest, not hidden by compute)"
    )


def _bytes_lines(record: Mapping[str, Any]) -> list[str]:
    intra, inter = get(record, "intra_node_bytes_per_step"), get(record, "inter_node_bytes_per_step")
    lines = [f"sent/step:  intra-node {human_bytes(intra)}, inter-node {human_bytes(inter)} per process"]
    fp32 = get(record, "fp32_allreduce_bytes_per_step")
    if fp32 is not None:
        fp32_inter = get(record, "fp32_allreduce_inter_node_bytes_per_step")
        line = f"fp32 all-reduce would send {human_bytes(fp32)} per process"
        if fp32_inter is not None:
            line += f" ({human_bytes(fp32_inter)} inter-node)"
        ratios = []
        total_ratio = reduction(fp32, (intra or 0.0) + (inter or 0.0))
        if total_ratio is not None:
            ratios.append(compared(total_ratio, "in all"))
        inter_ratio = reduction(fp32_inter, inter)
        if inter_ratio is not None:
            ratios.append(compared(inter_ratio, "inter-node"))
        lines.append(f"            {line}" + (f": this run sent {', '.join(ratios)}" if ratios else ""))
    link = get(record, "link_bytes_per_step")
    if link:  # emulated clusters: what each node's link really carried (kernel counters, headers included)
        per_node = ", ".join(human_bytes(b) for b in link)
        lines.append(f"            each node's link carried (kernel count): {per_node} per step")
    return lines


def _attempts_text(record: Mapping[str, Any]) -> str:
    """ ", over 2 attempts (resumed at step 59)" for a run resumed in its own directory: steps, samples and the
    time to target above count across them."""
    attempts = get(record, "attempts", default=[])
    if len(attempts) < 2:
        return ""
    resumed = [a.get("from_step") for a in attempts[1:] if a.get("from_step")]
    at = f" (resumed at step {', '.join(map(str, resumed))})" if resumed else ""
    return f", over {len(attempts)} attempts{at}"


def format_summary(record: Mapping[str, Any]) -> str:
    """A few lines: what ran, on what data, how it ended, how fast, how well, and what it sent."""
    task = get(record, "task") or get(record, "config", "task", "name")
    optim = get(record, "optim") or get(record, "config", "optim", "name")
    precision = get(record, "precision") or get(record, "config", "train", "precision") or "fp32"
    parallel = get(record, "parallel", default="ddp") or "ddp"
    lines = [
        f"run:        {task} with {optim} on {_layout(record)}, {precision}"
        + (f", parallel: {_parallel(parallel, optim)}" if parallel != "ddp" else "")
    ]
    data = get(record, "data") or get(record, "config", "data", "source")
    if data:
        lines.append(f"data:       {data}")
    status_line = f"status:     {get(record, 'status', default='completed')}"
    if get(record, "steps") is not None:
        status_line += f", {record['steps']} steps"
        if get(record, "stopped_at_target"):
            status_line += f" (ended at its target: train.stop_at_target; {get(record, 'planned_steps')} planned)"
    if get(record, "samples") is not None:
        status_line += f", {record['samples']} samples"
    if get(record, "global_batch_size") is not None:
        status_line += f" (global batch {record['global_batch_size']})"
    status_line += _attempts_text(record)
    lines.append(status_line)
    if get(record, "error"):
        lines.append(f"error:      {str(record['error']).strip().splitlines()[-1]}")
    if get(record, "throughput_samples_per_s") is None:
        return "\n".join(lines)
    lines += [_throughput_line(record), _metrics_line(record)]
    lines += [line for line in (_target_line(record),) if line]
    lines += [_step_time_line(record), *_bytes_lines(record)]
    memory = get(record, "memory")
    if memory:  # the largest over the processes
        parts = {k: max(m[k] for m in memory) for k in ("parameters", "gradients", "optimizer_state", "peak")}
        lines.append(
            "memory:     per process (max over processes): "
            + ", ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in parts.items())
        )
    return "\n".join(lines)


def _parallel(parallel: str, optim: str) -> str:
    """ddp, or fsdp with how the nodes communicate."""
    if parallel != "fsdp":
        return "ddp"

    try:
        scheme = get_optim_info(optim).comm
    except KeyError:
        return "fsdp"
    return (
        "fsdp (native HSDP: fp32 all-reduce across nodes)"
        if scheme == "allreduce"
        else f"fsdp (sharded in each node; {scheme}'s 1-bit exchange across nodes in its all-reduce hook)"
    )
