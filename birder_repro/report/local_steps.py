"""The local-step methods where they should win, and DiLoCo's steps against its replicas: two tables.

``python -m birder_repro.report.local_steps --runs runs/local-steps`` (``make local-steps``): per link and
target, each method's time to the target (mean and 95 % Student t interval over the field's seeds) and, for
each method, its place against DiLoCo and against Birder (the protocol's ``local_steps.compare_to``): "faster"
or "slower" only where the two intervals separate, else "tie" (report.stats.compare); "not reached" where a run
of either never reached the target (its runs are counted, never averaged).

``python -m birder_repro.report.local_steps --replicas runs/diloco-replicas`` (``make diloco-replicas``): per
method and replica count (nodes of one process at the field's global batch), the steps to each target with
their interval and the multiple of Birder's steps (the protocol's ``replicas.base``, the multiple
perf.paper_scale uses): the ratio of the mean steps, and the interval of the per-seed ratios (runs paired by
seed).

Each run's times and steps come from its evaluation curve (report.ladder.run_curve: ``metrics.jsonl``, the
training clock of time_to_target) at every target of its ladder (report.ladder.levels_of).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from birder_repro.run.record import find_records, read_record

from .stats import Interval, compare, t_interval

__all__ = [
    "RunResult",
    "load_results",
    "all_reached",
    "versus",
    "versus_rows",
    "versus_markdown",
    "replica_rows",
    "replicas_markdown",
]

LABELS = {
    "diloco": "DiLoCo",
    "streaming_diloco": "Streaming DiLoCo",
    "diloco_1bit": "1-bit DiLoCo",
    "birder": "Birder",
    "sgdm_bf16_2level": "SGDM + two-level bf16",
    "sgdm": "SGDM",
}


def label(optim: str) -> str:
    return LABELS.get(optim, optim)


@dataclass(frozen=True)
class RunResult:
    """One whole run: its method, link (None: unshaped), nodes, seed, and per target its seconds and steps to it
    (None: never reached)."""

    optim: str
    link_mbit: float | None
    nodes: int
    seed: int
    times: Mapping[float, float | None] = field(default_factory=dict)
    steps: Mapping[float, int | None] = field(default_factory=dict)


def all_reached(values: Sequence[float | None], confidence: float) -> Interval | None:
    """The t interval of ``values`` where every run reached (none is None), else None: a run that never
    reached counts, it is never averaged away."""
    if not values or any(v is None for v in values):
        return None
    return t_interval([float(v) for v in values if v is not None], confidence)


def versus(a: Interval | None, b: Interval | None) -> str:
    """a's time against b's: 'faster' / 'slower' where the intervals separate, 'tie' where they overlap, 'not
    reached' where either has no interval (a run of it never reached the target)."""
    if a is None or b is None:
        return "not reached"
    return {"<": "faster", ">": "slower"}.get(compare(a, b), "tie")


def _levels(results: Sequence[RunResult]) -> list[float]:
    return sorted({level for r in results for level in r.times})


def versus_rows(
    results: Sequence[RunResult], methods: Sequence[str], refs: Sequence[str], confidence: float = 0.95
) -> list[dict[str, Any]]:
    """One row per (link, target, method): the time's interval, its runs, and against each of ``refs``."""
    rows = []
    links = sorted({r.link_mbit for r in results}, key=lambda x: math.inf if x is None else x)
    for link in links:
        at_link = [r for r in results if r.link_mbit == link]
        for level in _levels(at_link):
            intervals = {
                m: all_reached([r.times.get(level) for r in at_link if r.optim == m], confidence) for m in methods
            }
            for m in methods:
                runs = [r for r in at_link if r.optim == m]
                if not runs:
                    continue
                row: dict[str, Any] = {
                    "link_mbit": link,
                    "target": level,
                    "optim": m,
                    "interval": intervals[m],
                    "runs": len(runs),
                    "reached": sum(r.times.get(level) is not None for r in runs),
                }
                for ref in refs:
                    has_ref = any(r.optim == ref for r in at_link)
                    row[f"vs {ref}"] = "" if ref == m or not has_ref else versus(intervals[m], intervals[ref])
                rows.append(row)
    return rows


def _ci(interval: Interval | None, digits: int = 3) -> str:
    if interval is None:
        return "-"
    if math.isinf(interval.half):
        return f"{interval.mean:.{digits}g} (1 run)"
    return f"{interval.mean:.{digits}g} ± {interval.half:.2g}"


def _link_text(link: float | None) -> str:
    return "unshaped" if link is None else f"{link:g} Mbit/s"


def versus_markdown(rows: Sequence[Mapping[str, Any]], refs: Sequence[str]) -> str:
    """Per link, one table: target | method | time to it, s (mean ± 95 % half-width) | reached | against each ref."""
    out = []
    for link in dict.fromkeys(r["link_mbit"] for r in rows):
        out += [f"**{_link_text(link)}** (2 x 2; time to each target, s: mean ± 95 % t half-width over seeds)", ""]
        out.append(
            "| target | method | time to target, s | reached | " + " | ".join(f"vs {label(x)}" for x in refs) + " |"
        )
        out.append("| --- | --- | --- | --- |" + " --- |" * len(refs))
        for r in rows:
            if r["link_mbit"] != link:
                continue
            against = " | ".join(r[f"vs {x}"] or "-" for x in refs)
            cells = f"{r['target']:g} % | {label(r['optim'])} | {_ci(r['interval'])} | {r['reached']} of {r['runs']}"
            out.append(f"| {cells} | {against} |")
        out.append("")
    return "\n".join(out)


def replica_rows(
    results: Sequence[RunResult], methods: Sequence[str], base: str = "birder", confidence: float = 0.95
) -> list[dict[str, Any]]:
    """One row per (method, nodes): per target the steps' interval (every run reached, else None), the multiple
    of ``base``'s mean steps at that node count, and the interval of the per-seed ratios (seeds where both
    reached)."""
    rows = []
    for m in methods:
        for nodes in sorted({r.nodes for r in results if r.optim == m}):
            runs = [r for r in results if r.optim == m and r.nodes == nodes]
            base_runs = {r.seed: r for r in results if r.optim == base and r.nodes == nodes}
            row: dict[str, Any] = {"optim": m, "nodes": nodes, "runs": len(runs), "targets": {}}
            for level in _levels(runs):
                steps = all_reached([r.steps.get(level) for r in runs], confidence)
                base_steps = all_reached([r.steps.get(level) for r in base_runs.values()], confidence)
                ratios = [
                    r.steps[level] / base_runs[r.seed].steps[level]  # type: ignore[operator]
                    for r in runs
                    if r.steps.get(level) and r.seed in base_runs and base_runs[r.seed].steps.get(level)
                ]
                row["targets"][level] = {
                    "steps": steps,
                    "multiple": None if steps is None or base_steps is None else steps.mean / base_steps.mean,
                    "ratio": t_interval(ratios, confidence) if ratios else None,
                }
            rows.append(row)
    return rows


def replicas_markdown(rows: Sequence[Mapping[str, Any]], base: str = "birder") -> str:
    """One table: method | replicas | runs | per target: steps (mean ± 95 %) and the multiple of the base's."""
    levels = sorted({level for r in rows for level in r["targets"]})
    head = "| method | replicas | runs | " + " | ".join(
        f"steps to {x:g} % | x {label(base)}'s (per-seed 95 %)" for x in levels
    )
    lines = [head + " |", "| --- | --- | --- |" + " --- | --- |" * len(levels)]
    for r in rows:
        cells = []
        for level in levels:
            t = r["targets"].get(level) or {}
            multiple = t.get("multiple")
            ratio = t.get("ratio")
            cells.append(_ci(t.get("steps"), 4))
            cells.append(
                "-"
                if multiple is None
                else f"{multiple:.2f}" + ("" if ratio is None or math.isinf(ratio.half) else f" (± {ratio.half:.2f})")
            )
        lines.append(f"| {label(r['optim'])} | {r['nodes']} | {r['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _step_to(curve: Any, level: float, direction: str) -> int | None:
    from .ladder import _reaches

    for step, value in zip(curve["step"], curve["value"]):
        if _reaches(value, level, direction):
            return int(step)
    return None


def with_final(curve: Any, lines: Sequence[Mapping[str, Any]], metric: str, compile_s: Any) -> Any:
    """The curve with the run's final evaluation (``final/<metric>``, logged at its last step: a local-step
    method's synchronised model, train.loop's ``finish()``) where its step has no evaluation yet, at its
    ``train_s`` less the first step's one-time work: the record's time_to_target counts it too."""
    import pandas as pd

    final = [x for x in lines if f"final/{metric}" in x and x.get("train_s") is not None]
    if not final or int(final[-1]["step"]) in set(curve["step"]):
        return curve
    offset = 0.0 if compile_s is None else float(compile_s)
    row = {"step": int(final[-1]["step"]), "t": max(0.0, float(final[-1]["train_s"]) - offset)}
    row["value"] = final[-1][f"final/{metric}"]
    return pd.concat([curve, pd.DataFrame([row])], ignore_index=True)


def load_results(root: Path) -> list[RunResult]:
    """Every completed whole run under ``root`` (no time budget), its times and steps to its ladder's targets."""
    from .clock import read_log
    from .ladder import levels_of, run_curve, time_to_level

    out = []
    for path in find_records(Path(root)):
        rec = read_record(path.parent)
        if not rec or rec.get("status") != "completed":
            continue
        config = rec.get("config") or {}
        if (config.get("tuning") or {}).get("budget_s") is not None:
            continue
        ttt = rec.get("time_to_target") or {}
        metric, direction = str(ttt.get("metric") or rec.get("headline_metric")), str(ttt.get("direction", "higher"))
        curve = run_curve(path.parent, metric, rec.get("compile_s"), rec)
        curve = with_final(curve, read_log(path.parent), metric, rec.get("compile_s"))
        levels = levels_of(config)
        link = (rec.get("cluster") or {}).get("link_mbit")
        out.append(
            RunResult(
                optim=str(rec.get("optim")),
                link_mbit=None if link is None else float(link),
                nodes=int(config.get("nodes") or 1),
                seed=int(config.get("seed") or 0),
                times={x: time_to_level(curve, x, direction) for x in levels},
                steps={x: _step_to(curve, x, direction) for x in levels},
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from .protocol import ProtocolError, load_protocol

    parser = argparse.ArgumentParser(prog="python -m birder_repro.report.local_steps", description=__doc__)
    parser.add_argument("--runs", type=Path, default=None, help="make local-steps' runs")
    parser.add_argument("--replicas", type=Path, default=None, help="make diloco-replicas' runs")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    parser.add_argument("--protocol", type=Path, default=None, help="default: conf/tuning/fashion_mnist.yaml")
    args = parser.parse_args(argv)
    try:
        proto = load_protocol(args.protocol)
    except ProtocolError as exc:
        print(f"[birder-repro] local_steps: {exc}", file=sys.stderr)
        return 2
    confidence = float(proto["confidence"])
    parts = []
    if args.runs is not None:
        spec = proto["local_steps"]
        results = load_results(args.runs)
        if not results:
            print(
                f"[birder-repro] local_steps: no completed run under {args.runs}: run make local-steps", file=sys.stderr
            )
            return 2
        rows = versus_rows(results, spec["methods"], spec["compare_to"], confidence)
        parts.append(
            "## Local steps over slow links (make local-steps)\n\n" + versus_markdown(rows, spec["compare_to"])
        )
    if args.replicas is not None:
        spec = proto["replicas"]
        results = load_results(args.replicas)
        if not results:
            print(
                f"[birder-repro] local_steps: no completed run under {args.replicas}: run make diloco-replicas",
                file=sys.stderr,
            )
            return 2
        rows = replica_rows(results, spec["methods"], spec["base"], confidence)
        parts.append(
            "## DiLoCo's steps against its replicas (make diloco-replicas)\n\n" + replicas_markdown(rows, spec["base"])
        )
    if not parts:
        parser.error("give --runs, --replicas or both")
    text = "\n".join(parts)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
