"""The one table ``make gpu-check`` writes: a row per check, its verdict, markdown and JSON, the exit code.

Like NVIDIA's nccl-tests, every row says what was checked, what was measured against what was expected, and a
wrong result fails the command: :func:`exit_code` is non-zero as soon as one row failed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, SKIP = "pass", "FAIL", "skip"
TABLE_MD, TABLE_JSON = "gpu-check.md", "gpu-check.json"


@dataclass
class Check:
    """One row: ``section`` (kernels, runs, hooks), what was checked, its verdict, the measured value against
    the expected one (as text: numbers with their units), and a detail (why it failed, or what it covers)."""

    section: str
    name: str
    status: str
    measured: str = ""
    expected: str = ""
    detail: str = ""
    numbers: dict = field(default_factory=dict)  # the raw figures behind ``measured`` (JSON only)

    def __post_init__(self):
        if self.status not in (PASS, FAIL, SKIP):
            raise ValueError(f"a check's status is one of {PASS}, {FAIL}, {SKIP}; got {self.status!r}")


def verdict(ok: bool) -> str:
    return PASS if ok else FAIL


def failed_scenario(per_rank: list[dict], name: str) -> Check | None:
    """The hook check's one FAIL row for scenario ``name`` where a rank's run of it raised (its last line); None
    where every rank ran it."""
    for rank, r in enumerate(per_rank):
        if "error" in r[name]:
            return Check("hooks", name, FAIL, detail=f"rank {rank}: {r[name]['error'].strip().splitlines()[-1]}")
    return None


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def exit_code(checks: list[Check]) -> int:
    """1 if any check failed, or if nothing was checked at all (a check that ran nothing proves nothing)."""
    if failed(checks) or not any(c.status == PASS for c in checks):
        return 1
    return 0


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(checks: list[Check], header: str = "") -> str:
    """The table as markdown, a summary line first."""
    n_fail, n_pass = len(failed(checks)), sum(c.status == PASS for c in checks)
    n_skip = sum(c.status == SKIP for c in checks)
    lines = [
        "# gpu-check",
        "",
        header,
        "",
        f"**{'FAILED' if exit_code(checks) else 'PASSED'}**: {n_pass} passed, {n_fail} failed, {n_skip} skipped",
        "",
        "| section | check | result | measured | expected | detail |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {_cell(c.section)} | {_cell(c.name)} | {c.status} | {_cell(c.measured)} | {_cell(c.expected)} | "
        f"{_cell(c.detail)} |"
        for c in checks
    ]
    return "\n".join(lines) + "\n"


def _finite(obj):
    """JSON has no NaN or Infinity: they become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write(checks: list[Check], out_dir: Path, header: str = "", environment: dict | None = None) -> tuple[Path, Path]:
    """``gpu-check.md`` and ``gpu-check.json`` in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / TABLE_MD, out_dir / TABLE_JSON
    md.write_text(markdown(checks, header))
    payload = {
        "passed": exit_code(checks) == 0,
        "environment": environment or {},
        "checks": [asdict(c) for c in checks],
    }
    js.write_text(json.dumps(_finite(payload), indent=1) + "\n")
    return md, js
