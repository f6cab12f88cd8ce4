"""``birder-repro mode=advise``: which method reaches the task's target first on the user's layout and link.

Nothing is launched. Every method of the field (the task's baseline, docs/time-to-accuracy.md's field, the
paper's methods, any method run or profiled) stays in the answer, with two inputs and where each came from:

- steps to the target: MEASURED, the mean ``time_to_target.step`` over the completed runs of the task of the
  query's model and target, scored on the test set (any link rate: steps do not depend on it), preferring
  runs on the user's layout at its global batch, then runs at that global batch on any layout, then any;
  runs that did not reach the target are counted ("k of n reached") and rank the method after those all of
  whose runs reached it (birder_repro.perf.advise.ranking). Without runs: FROM THE PAPER where it covers the
  task and method (birder_repro.perf.paper_steps, each row cited); else TO MEASURE;
- a 1-node profile: ``predict.profile`` where given (``paper``, a run directory, a profile file), else the
  median of the user's completed 1-node runs of that optimizer and model with a ``profile`` made by the newest
  one's code (by step time; :func:`one_node_profiles`, which report.crossover's predictions use too), else the
  paper's on the paper's clusters (perf.advice_methods), else to measure.

The model (:mod:`birder_repro.perf.advise`, perf.model, as ``predict.implementation`` runs the schemes) turns
them into a step time on the user's nodes x GPUs at the user's link (``cluster.link_mbit``, or
``predict.cluster_spec``'s probed link) and at every rate of a log grid: the time to target is the steps times
the step, 1-bit Adam's first ``freeze`` steps at the fp32 step's time. What a method lacks is printed with the
command that measures it, carrying the query's settings, and its expected time (perf.advice_commands); the
text and the files: perf.advice_render.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .advice_commands import PROFILE, STEPS_HERE, measuring_commands
from .advice_methods import (
    Method,
    comm_rank,
    freeze_step,
    method_inputs,
    optim_label,
    optim_settings,
    paper_node_profile,
    price,
    prices,
    unmeasured,
)
from .advice_query import Layout, layout_of, query_runs
from .advice_render import ADVICE_FILE, advice_figure, fmt_number, format_advice, write_advice
from .advise import ranking, ranking_bands, winner_changes
from .paper_steps import PAPER_METHODS, PAPER_NOTES

__all__ = [
    "ADVICE_FILE",
    "FIELD",
    "MeasuredSteps",
    "Layout",
    "profile_key",
    "one_node_profiles",
    "median_profile_record",
    "freeze_step",
    "comm_rank",
    "load_runs",
    "measured_steps",
    "advise",
    "format_advice",
    "write_advice",
    "advice_figure",
    "layout_of",
    "advice_dir_name",
    "run_advice",
]

# The field of docs/time-to-accuracy.md: named in every answer (with the task's baseline and the paper's
# methods) unless advise.optims names others
FIELD = (
    "sgdm",
    "adamw",
    "sgdm_fp16",
    "sgdm_bf16_2level",
    "sgdm_powersgd",
    "diloco",
    "diloco_1bit",
    "streaming_diloco",
    "onebit_adam",
    "birder",
)


# --------------------------------------------------------------------------------------------------------------
# 1-node profiles (report.crossover and report.tuning price their runs with these too)


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
    from birder_repro.run.record import read_record

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


# --------------------------------------------------------------------------------------------------------------
# Measured steps


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
    from birder_repro.run.record import find_records, read_record

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


# --------------------------------------------------------------------------------------------------------------
# Profiles


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


def _method_inputs(steps: MeasuredSteps) -> dict[str, Any]:
    """What the model needs of a setting besides its profile, read from one of its runs' config."""
    cfg = steps.record.get("config") or {}
    planned = int(steps.record.get("planned_steps") or steps.record.get("steps") or 0)
    return method_inputs(steps.optim, cfg.get("optim") or {}, planned, str(cfg.get("parallel") or "ddp"))


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


# --------------------------------------------------------------------------------------------------------------
# The advice


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


def _field(lay: Layout, found: Sequence[MeasuredSteps], profiles: Mapping[tuple, Any]) -> list[str]:
    """Every method the answer names: the task's baseline, the field of docs/time-to-accuracy.md, the paper's
    methods of the task, and any method with a run or a profile of the task."""
    names = [lay.baseline] if lay.baseline else []
    names += list(FIELD) + [o for t, o in PAPER_METHODS if t == lay.task]
    names += [m.optim for m in found] + [k[1] for k in profiles if k[0] == lay.task]
    return list(dict.fromkeys(n for n in names if n))


def _methods(lay: Layout, kept, optims: Sequence[str] | None, given_profile: Any) -> list[Method]:
    """Every method of the answer with its steps and profile, each from where the module doc says."""
    found = measured_steps(kept, lay.task, lay.global_batch, (lay.nodes, lay.gpus_per_node))
    found = [m for m in found if optims is None or m.optim in optims]
    profiles = one_node_profiles([d for d, _ in kept]) if given_profile is None else {}
    names = list(optims) if optims is not None else _field(lay, found, profiles)
    methods = [_from_measured(m) for m in found]
    methods += [unmeasured(n, lay) for n in names if n not in {m.optim for m in found}]
    paper = paper_node_profile(lay) if given_profile is None else None
    for m in methods:
        if given_profile is not None:
            if prices(given_profile, m.scheme):
                m.profile, m.profile_source = given_profile, "given"
        elif (mine := _user_profile(m, profiles, lay)) is not None:
            m.profile, m.profile_source = mine, "yours"
        elif paper is not None and prices(paper, m.scheme):
            m.profile, m.profile_source = paper, "from the paper"
    return methods


def advise(
    lay: Layout,
    runs: Sequence[tuple[Path, dict]],
    optims: Sequence[str] | None = None,
    given_profile: Any = None,
) -> dict[str, Any]:
    """The advice as a JSON-ready dict: ``ranked`` (fastest first at the user's link), ``methods`` (every method
    with its inputs' sources or what it lacks), ``cannot_rank`` and ``commands`` (what to measure and its
    expected time), the ranking's ``bands`` and ``winner_changes`` over ``lay.links``, and each ranked method's
    predicted times over them (``curves``)."""
    kept, notes = query_runs(runs, lay)
    methods = _methods(lay, kept, optims, given_profile)
    if lay.task in PAPER_NOTES:
        notes.append(PAPER_NOTES[lay.task])
    ranked = [m for m in methods if m.rankable]
    after = frozenset(m.label for m in ranked if not m.every_run_reached)
    here = {m.label: price(m, lay, lay.link_mbit) for m in ranked}
    curves = {m.label: [price(m, lay, x)["time_to_target_s"] for x in lay.links] for m in ranked}
    order = ranking({k: v["time_to_target_s"] for k, v in here.items()}, after)
    best = here[order[0]]["time_to_target_s"] if order else math.nan
    by_label = {m.label: m for m in ranked}
    if any(m.source == "from the paper" and not m.reached and m.paper.value is not None for m in ranked):
        notes.append(
            "the paper's run nearest your global batch ended short of your target: such a method's time is to the "
            "end of the paper's schedule (task.target.value sets another target)"
        )
    commands = measuring_commands(lay, methods)
    position = {label: i for i, label in enumerate(order)}
    listed = sorted(methods, key=lambda m: (position.get(m.label, len(order)), m.label))
    return {
        "task": lay.task,
        "layout": {k: v for k, v in asdict(lay).items() if k not in ("links", "cluster_config", "query")},
        "model": lay.model,
        "target": _target_text(lay.target) or _target(kept, lay.task),
        "notes": notes,
        "ranked": [_ranked_row(i + 1, by_label[x], here[x], best, x in after) for i, x in enumerate(order)],
        "methods": [_method_row(m) for m in listed],
        "cannot_rank": _cannot_rank(methods, commands),
        "commands": commands,
        "links": list(lay.links),
        "curves": curves,
        "bands": ranking_bands(lay.links, curves, after),
        "winner_changes": winner_changes(lay.links, curves, after),
    }


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


# --------------------------------------------------------------------------------------------------------------
# mode=advise


def advice_dir_name(task: str, nodes: int, gpus_per_node: int) -> str:
    """An advice's run folder name: ``advise-<task>-<nodes>x<gpus per node>``, not an optimizer's."""
    return f"advise-{task}-{nodes}x{gpus_per_node}"


def run_advice(cfg: Any, out_dir: Path, query: Sequence[str] = ()) -> int:
    """mode=advise on the resolved config ``cfg`` (``query``: the command line's overrides, which the measuring
    commands carry): print the advice and write it to ``out_dir``. 0 whenever advice is printed, "measure these
    first" included; bad input raises before anything is printed."""
    from omegaconf import OmegaConf

    from birder_repro.run.record import runs_root

    lay = layout_of(cfg, query)
    adv = OmegaConf.select(cfg, "advise", default=None) or {}
    optims = adv.get("optims")
    unknown = [str(o) for o in optims or [] if not optim_settings(lay.task, str(o))]
    if unknown:
        raise ValueError(f"advise.optims: no optimizer {', '.join(unknown)} (conf/optim/ has none of that name)")
    source = OmegaConf.select(cfg, "predict.profile", default=None)
    given = None
    if source is not None:
        given = _given_profile(source, lay.task, lay.batch_size, lay.spec(lay.link_mbit), lay.implementation)
    root = runs_root(adv.get("runs"))
    advice = advise(lay, load_runs(root), list(optims) if optims is not None else None, given)
    advice["runs"] = str(root)
    print(format_advice(advice), flush=True)
    for path in write_advice(advice, out_dir):
        print(f"[birder-repro] advice: {path}", flush=True)
    return 0
