"""mode=advise: the answer's rows: each ranked method, every method's inputs and lacks, the target as text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .advice_commands import PROFILE, STEPS_HERE
from .advice_methods import Method
from .advice_render import fmt_number
from .advice_steps import _scored_on_target


def _ranked_row(rank: int, m: Method, priced: dict, best: float, after: bool) -> dict[str, Any]:
    steps: dict[str, Any] = {"value": m.steps, "source": m.source, "runs": m.runs, "reached": m.reached}
    if m.measured is not None:
        s = m.measured
        steps.update(
            seeds=s.seeds,
            run_dirs=s.run_dirs,
            global_batches=s.global_batches,
            at_your_global_batch=s.same_batch,
            on_your_layout=s.same_layout,
        )
    if m.paper is not None:
        steps.update(table=m.paper.row.table, ended_at=m.paper.value)
    p = m.profile
    return {
        "rank": rank,
        "method": m.label,
        "optim": m.optim,
        "variant": m.variant,
        "scheme": m.scheme,
        "freeze": m.freeze,
        "steps": steps,
        "profile": {"name": p.name, "device": p.device, "batch_size": p.batch_size, "source": m.profile_source},
        "warmup_step_s": {"value": priced["warmup_step_s"], "source": "predicted"},
        "step_s": {"value": priced["step_s"], "source": "predicted"},
        "time_to_target_s": {"value": priced["time_to_target_s"], "source": "predicted"},
        "slower_than_best": priced["time_to_target_s"] / best,
        "ranked_after_reliable": after,
        "steps_source": m.steps_text,
    }


def _method_row(m: Method) -> dict[str, Any]:
    """Every method of the answer: ranked (its time predicted) or not, where its inputs come from, what it lacks."""
    lacks = []
    if m.steps is None:
        why = f"0 of {m.runs} reached" if m.runs else "none ran; the papers give no steps for it"
        lacks.append(f"no measured run reaching the target ({why})")
    if m.profile is None:
        lacks.append("no 1-node profile")
    return {
        "method": m.label,
        "optim": m.optim,
        "ranked": m.rankable,
        "steps": m.source if m.steps is not None else "to measure",
        "profile": {"yours": "yours", "given": "given"}.get(m.profile_source, m.profile_source or "to measure"),
        "profile_name": m.profile.name if m.profile is not None else None,
        "lacks": lacks,
    }


def _cannot_rank(methods: Sequence[Method], commands: Sequence[dict]) -> list[dict[str, Any]]:
    """The methods that cannot be ranked, why, and the command that measures what each lacks."""
    by = {(c["what"], label): c["command"] for c in commands for label in c["methods"]}
    out = []
    for m in methods:
        for reason in _method_row(m)["lacks"]:
            what = PROFILE if reason == "no 1-node profile" else STEPS_HERE
            out.append({"method": m.label, "reason": reason, "command": by.get((what, m.label), "")})
    return out


def _target_text(target: tuple[str, float, str] | None) -> str | None:
    """The query's target as ``top1 >= 87``."""
    if target is None:
        return None
    metric, value, direction = target
    return f"{metric} {'<=' if direction == 'lower' else '>='} {fmt_number(value)}"


def _target(runs: Sequence[tuple[Path, dict]], task: str) -> str | None:
    """The target the runs were scored against, as ``top1 >= 87`` (a query without a target of its own)."""
    for _, rec in runs:
        if _scored_on_target(rec, task):
            t = rec["time_to_target"]
            return f"{t['metric']} {'<=' if t.get('direction') == 'lower' else '>='} {fmt_number(t['target'])}"
    return None
