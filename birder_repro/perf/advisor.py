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

Its parts, one job each: ``advice_steps`` (the measured steps), ``advice_profiles`` (which 1-node profile prices
a method), ``advice_rows`` (the answer's rows), beside ``advice_query``, ``advice_methods``, ``advice_commands``,
``advice_render``; this module assembles the advice and runs the mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from birder_repro.run.record import runs_root

from .advice_commands import measuring_commands
from .advice_methods import Method, optim_settings, paper_node_profile, price, prices, unmeasured
from .advice_profiles import _given_profile, _user_profile, one_node_profiles
from .advice_query import Layout, layout_of, query_runs
from .advice_render import format_advice, write_advice
from .advice_rows import _cannot_rank, _method_row, _ranked_row, _target, _target_text
from .advice_steps import MeasuredSteps, _from_measured, load_runs, measured_steps
from .advise import ranking, ranking_bands, winner_changes
from .paper_steps import PAPER_METHODS, PAPER_NOTES

__all__ = ["FIELD", "advise", "advice_dir_name", "run_advice"]

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
