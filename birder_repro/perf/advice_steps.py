"""mode=advise: the measured steps to the target: the user's runs of the query's task, grouped by optimizer setting.

Per setting the runs on the user's layout at its global batch are used where any, else those at its global
batch on any layout, else all (perf.advisor's docstring); runs that did not reach the target are counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from birder_repro.run.record import find_records, read_record

from .advice_methods import Method, method_inputs, optim_label

__all__ = ["MeasuredSteps", "load_runs", "measured_steps"]


@dataclass
class MeasuredSteps:
    """One optimizer setting's measured steps to the target (the runs used, and what they say)."""

    label: str
    optim: str
    variant: str
    setting: dict[str, Any]
    record: dict[str, Any]  # one run's record: its config says the scheme, freeze and DiLoCo's H
    runs: int
    reached: int
    steps: float | None  # the mean over the runs that reached the target
    seeds: list[int]
    run_dirs: list[str]
    global_batches: list[int]
    same_batch: bool  # the runs used are at the user's global batch
    same_layout: bool = False  # and on the user's nodes x GPUs per node

    @property
    def every_run_reached(self) -> bool:
        return self.reached == self.runs

    def source(self) -> str:
        where = os.path.commonpath(self.run_dirs) if self.run_dirs else "?"
        batch = "" if self.same_batch else f"; global batch {'/'.join(map(str, self.global_batches))}, not yours"
        if self.same_batch and not self.same_layout:
            batch = "; your global batch on another layout"
        seeds = ",".join(map(str, self.seeds))
        return f"measured: {self.reached} of {self.runs} reached, seeds {seeds}, under {where}{batch}"


def _setting(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What changes the steps a method takes: its optimizer, model, schedule and run length (not the layout or
    the link, nor whether the run stopped at its target, nor the seed)."""
    train = cfg.get("train") or {}
    # optim.seed is the run's seed again (the quantizer's draws, ${seed}): seeds are one setting's runs
    optim = {k: v for k, v in (cfg.get("optim") or {}).items() if k != "seed"}
    return {
        "optim": optim,
        "model": cfg.get("model") or {},
        "schedule": train.get("schedule"),
        "steps": train.get("steps"),
        "epochs": train.get("epochs"),
    }


def _scored_on_target(rec: Mapping[str, Any], task: str) -> bool:
    """A completed, measured run of ``task`` scored on the test set that evaluated against a target; not a run
    sized to a time budget (``tuning.budget_s``: its schedule ends at the budget and it is evaluated once, at its
    end, so its steps say nothing of the steps to the target)."""
    config = rec.get("config") or {}
    ttt = rec.get("time_to_target") or {}
    eval_set = (config.get("data") or {}).get("eval_set") or "test"
    return (
        rec.get("status") == "completed"
        and rec.get("task") == task
        and bool(ttt.get("metric"))
        and eval_set != "val"
        and ttt.get("evaluations") != 0  # train.eval=false: a profile run, no time to target
        and (config.get("tuning") or {}).get("budget_s") is None
    )


def load_runs(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(run directory, record) of every readable record under ``root``, at any depth."""
    found = [(path.parent, read_record(path.parent)) for path in find_records(Path(root))]
    return [(d, rec) for d, rec in found if rec]


def measured_steps(
    runs: Sequence[tuple[Path, dict]], task: str, global_batch: int, layout: tuple[int, int] | None = None
) -> list[MeasuredSteps]:
    """Per optimizer setting of ``task``, its steps to the target from the runs on ``layout`` (nodes, GPUs per
    node) at ``global_batch``, else from those at ``global_batch`` on any layout, else from all: Birder's and
    1-bit Adam's error feedback and DiLoCo's workers depend on the layout, not only on the batch."""
    groups: dict[str, list[tuple[Path, dict]]] = {}
    for run_dir, rec in runs:
        if _scored_on_target(rec, task):
            key = json.dumps(_setting(rec.get("config") or {}), sort_keys=True, default=str)
            groups.setdefault(key, []).append((run_dir, rec))
    return _distinct_labels([_steps_of(rows, global_batch, layout) for _, rows in sorted(groups.items())])


def _on_layout(rec: dict, layout: tuple[int, int] | None) -> bool:
    cluster = rec.get("cluster") or {}
    return layout is not None and (cluster.get("nodes"), cluster.get("gpus_per_node")) == tuple(layout)


def _steps_of(rows: list[tuple[Path, dict]], global_batch: int, layout: tuple[int, int] | None) -> MeasuredSteps:
    """One setting's runs: those on ``layout`` at ``global_batch`` where any, else those at ``global_batch``,
    else all; the mean step over those that reached."""
    same = [(d, r) for d, r in rows if r.get("global_batch_size") == global_batch]
    here = [(d, r) for d, r in same if _on_layout(r, layout)]
    used = here or same or rows
    hit = [r["time_to_target"]["step"] for _, r in used if r["time_to_target"].get("reached")]
    first = used[0][1]
    cfg = first.get("config") or {}
    variant = str(((cfg.get("optim") or {}).get("comm") or {}).get("scheme") or "")
    seeds = {(r.get("config") or {}).get("seed") for _, r in used}
    return MeasuredSteps(
        label=optim_label(str(first["optim"]), variant),
        optim=str(first["optim"]),
        variant=variant,
        setting=_setting(cfg),
        record=first,
        runs=len(used),
        reached=len(hit),
        steps=sum(float(s) for s in hit) / len(hit) if hit else None,
        seeds=sorted(int(s) for s in seeds if s is not None),
        run_dirs=sorted(str(d) for d, _ in used),
        global_batches=sorted({int(r["global_batch_size"]) for _, r in used if r.get("global_batch_size")}),
        same_batch=bool(same),
        same_layout=bool(here),
    )


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, Mapping):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _distinct_labels(found: list[MeasuredSteps]) -> list[MeasuredSteps]:
    """Several settings of one optimizer: each label names the keys in which its setting differs."""
    for label in {m.label for m in found}:
        same = [m for m in found if m.label == label]
        if len(same) < 2:
            continue
        flat = [_flat(m.setting) for m in same]
        keys = sorted({k for f in flat for k in f if any(g.get(k) != f.get(k) for g in flat)})
        for m, f in zip(same, flat):
            m.label += " [" + ", ".join(f"{k.split('.', 1)[-1]}={f.get(k)}" for k in keys) + "]"
    return found


def _method_inputs(steps: MeasuredSteps) -> dict[str, Any]:
    """What the model needs of a setting besides its profile, read from one of its runs' config."""
    cfg = steps.record.get("config") or {}
    planned = int(steps.record.get("planned_steps") or steps.record.get("steps") or 0)
    return method_inputs(steps.optim, cfg.get("optim") or {}, planned, str(cfg.get("parallel") or "ddp"))


def _from_measured(m: MeasuredSteps) -> Method:
    """A method with runs of the query's: its steps measured (None where none reached the target)."""
    return Method(
        label=m.label,
        optim=m.optim,
        variant=m.variant,
        **_method_inputs(m),
        steps=m.steps,
        source="measured",
        steps_text=m.source(),
        settings=(m.record.get("config") or {}).get("optim") or {},
        runs=m.runs,
        reached=m.reached,
        measured=m,
    )
