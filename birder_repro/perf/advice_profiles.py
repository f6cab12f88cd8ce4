"""mode=advise: which 1-node profile prices a method: the median of the user's 1-node runs, one given, or none.

report.crossover and report.tuning price their runs with these profiles too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from birder_repro.run.record import read_record

from .advice_methods import Method
from .advice_query import Layout
from .advice_steps import MeasuredSteps

__all__ = ["profile_key", "one_node_profiles", "median_profile_record"]


def profile_key(rec: dict) -> tuple:
    """What a 1-node profile is the profile of: (task, optim, scheme, model, batch, precision, cluster)."""
    cfg = rec.get("config") or {}
    model = json.dumps(cfg.get("model") or {}, sort_keys=True, default=str)
    return (
        rec.get("task"),
        rec.get("optim"),
        ((cfg.get("optim") or {}).get("comm") or {}).get("scheme"),
        model,
        rec.get("batch_size"),
        rec.get("precision") or "fp32",
        (rec.get("cluster") or {}).get("name"),
    )


def one_node_profiles(run_dirs) -> dict[tuple, Any]:
    """Per (task, optim, scheme, model, batch, precision, cluster): the profile of the median one of its
    completed 1-node runs made by the newest one's code (:func:`median_profile_record`)."""
    from .profile import load_profile

    found: dict[tuple, list[dict]] = {}
    for run_dir in run_dirs:
        rec = read_record(Path(run_dir))
        if not rec or rec.get("status") != "completed" or (rec.get("cluster") or {}).get("nodes") != 1:
            continue
        if not rec.get("profile"):
            continue
        found.setdefault(profile_key(rec), []).append(rec)
    return {k: load_profile(median_profile_record(recs)) for k, recs in found.items()}


def median_profile_record(records: Sequence[dict]) -> dict:
    """Of several 1-node runs of one setting, those made by the same code as the newest (``git_sha``: a profile
    stores what that code measured and derived, and profiles made before a fix are made again, not pooled), and
    of them the one whose timed step (``step_time_s.total``) is the median: the middle one, or the newer of the
    two middle ones for an even count. A profile is taken whole, not averaged field by field: its parts
    (compute, compression per element, the leftover) were measured together. MEASURED: one 60-step profile of
    DiLoCo (18.5 ms a step) came out 14-24 % under three later runs of the same command (21.5, 22.6, 24.3 ms),
    and its 2 x 2 runs were predicted 13-23 % short; a single profile carries such a draw into every prediction
    (``make time-to-accuracy`` makes three, ``TTA_PROFILE_SEEDS``)."""
    if not records:
        raise ValueError("no 1-node run to take a profile from")
    newest = max(records, key=lambda r: str(r.get("started")))
    same_code = [r for r in records if r.get("git_sha") == newest.get("git_sha")]
    ordered = sorted(same_code, key=lambda r: float((r.get("step_time_s") or {}).get("total") or math.inf))
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    return max(middle, key=lambda r: str(r.get("started")))


def _profile_for(steps: MeasuredSteps, profiles: Mapping[tuple, Any], batch: int, cluster: str) -> Any:
    """The 1-node profile of this setting's optimizer, scheme, model and precision: at the user's batch and
    cluster where one exists, else at another batch (the model scales the compute linearly), else on another
    cluster; None where there is none."""
    want = profile_key(steps.record)
    same = [k for k in profiles if k[:4] == want[:4] and k[5] == want[5]]
    if not same:
        return None
    best = min(same, key=lambda k: (k[4] != batch, k[6] != cluster))
    return profiles[best]


def _given_profile(source: Any, task: str, batch: int, cluster, implementation: str) -> Any:
    """``predict.profile`` as mode=predict reads it (paper, a run directory, a record or a profile file)."""
    from .paper_profiles import paper_profile
    from .profile import load_profile

    if source == "paper":
        return paper_profile(task=task, batch_size=batch, node=cluster, implementation=implementation)
    profile = load_profile(source)
    if profile.task != task:
        raise ValueError(f"profile {profile.name!r} is for task {profile.task!r}, not {task!r}")
    return profile


def _user_profile(m: Method, profiles: Mapping[tuple, Any], lay: Layout) -> Any:
    """Your 1-node profile of this method (``profiles``: of the query's model only, perf.advice_query.query_runs:
    a profile of another width is not this width's): at your batch and cluster where one exists, else at another
    batch, else on another cluster."""
    if m.measured is not None:
        return _profile_for(m.measured, profiles, lay.batch_size, lay.cluster)
    same = [k for k in profiles if k[0] == lay.task and k[1] == m.optim and not k[2]]  # of the query's model
    if not same:
        return None
    return profiles[min(same, key=lambda k: (k[4] != lay.batch_size, k[6] != lay.cluster))]
