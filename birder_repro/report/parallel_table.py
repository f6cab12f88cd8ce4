"""DDP against FSDP side by side: ``python -m birder_repro.report.parallel_table --runs DIR``.

One markdown row per configuration under ``DIR`` (its newest completed run; a configuration is the resolved
config less the seed and the settings that cannot change a result, birder_repro.report.identity, so runs of
another length or learning rate are rows of their own, with their steps shown; smoke runs, at most a tenth of
the steps of the longest run of their task, parallelism, layout and link, are left out as in the main tables,
birder_repro.report.cells): throughput, the step-time split,
bytes per step and per process inside and across nodes, and memory per
process (the largest over the processes: parameters, gradients, optimizer state with the hook's, peak).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from birder_repro.report.cells import SMOKE_FRACTION
from birder_repro.report.identity import config_key
from birder_repro.report.records import load_records
from birder_repro.run.schema import get

__all__ = ["rows", "markdown", "main"]

HEADER = (
    "task",
    "optim",
    "parallel",
    "layout",
    "link Mbit/s",
    "steps",
    "samples/s",
    "step ms",
    "compute",
    "communication",
    "compression",
    "intra KiB/step",
    "inter KiB/step",
    "params MiB",
    "grads MiB",
    "optim state MiB",
    "peak MiB",
)


def _max_memory(record: dict, key: str) -> float | None:
    memory = get(record, "memory")
    return max(m[key] for m in memory) / 2**20 if memory else None


def _row(record: dict) -> tuple:
    step = get(record, "step_time_s") or {}
    ms = [None if step.get(k) is None else 1e3 * step[k] for k in ("total", "compute", "communication", "compression")]
    kib = [
        None if get(record, k) is None else get(record, k) / 1024
        for k in ("intra_node_bytes_per_step", "inter_node_bytes_per_step")
    ]
    cluster = get(record, "cluster") or {}
    return (
        get(record, "task"),
        get(record, "optim"),
        get(record, "parallel") or "ddp",
        f"{cluster.get('nodes')}x{cluster.get('gpus_per_node')}",
        cluster.get("link_mbit"),
        get(record, "steps"),
        get(record, "throughput_samples_per_s"),
        *ms,
        *kib,
        *(_max_memory(record, k) for k in ("parameters", "gradients", "optimizer_state", "peak")),
    )


def rows(records: Iterable[dict]) -> list[tuple]:
    """The newest completed record of each configuration (seed left out), as table rows; smoke runs left out."""
    newest = _newest(records)
    return [row for row in newest if not _is_smoke(row, _longest(newest))]


def smoke_runs(records: Iterable[dict]) -> list[tuple]:
    """The rows :func:`rows` leaves out as smoke runs."""
    newest = _newest(records)
    return [row for row in newest if _is_smoke(row, _longest(newest))]


def _newest(records: Iterable[dict]) -> list[tuple]:
    newest: dict[tuple, dict] = {}
    for rec in sorted(records, key=lambda r: str(get(r, "started") or "")):
        if get(rec, "status") != "completed":
            continue
        newest[(*_row(rec)[:5], config_key(get(rec, "config")))] = rec
    return sorted((_row(r) for r in newest.values()), key=lambda r: tuple(str(x) for x in r[:6]))


_STEPS = HEADER.index("steps")
_WHERE = (0, 2, 3, 4)  # task, parallel, layout, link: the cell whose longest run a smoke run is measured against


def _longest(table: Sequence[tuple]) -> dict[tuple, int]:
    longest: dict[tuple, int] = {}
    for row in table:
        where = tuple(row[i] for i in _WHERE)
        longest[where] = max(longest.get(where, 0), int(row[_STEPS] or 0))
    return longest


def _is_smoke(row: tuple, longest: dict[tuple, int]) -> bool:
    return int(row[_STEPS] or 0) <= SMOKE_FRACTION * longest[tuple(row[i] for i in _WHERE)]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def markdown(table: Sequence[tuple]) -> str:
    return tabulate([[_cell(v) for v in row] for row in table], headers=HEADER, tablefmt="pipe", disable_numparse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m birder_repro.report.parallel_table", description=__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="searched for record.json at any depth")
    args = parser.parse_args(argv)
    records = [rec for _, rec in load_records(args.runs)]
    print(markdown(rows(records)))
    for row in smoke_runs(records):
        print(f"left out: {row[1]} {row[2]} {row[3]}, {row[_STEPS]} steps: a smoke run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
