"""``birder-repro mode=advise``: which method reaches the task's target first on the user's layout and link.

Nothing is launched. Per optimizer setting (the ``optim.*``, ``model.*`` and run-length keys of its runs'
configs), two inputs, both the user's own, never made up:

- steps to the target: the mean ``time_to_target.step`` over the completed, measured runs of the task scored
  on the test set (any link rate: steps do not depend on it), preferring runs at the user's global batch;
  runs that did not reach the target are counted ("k of n reached") and rank the method after those all of
  whose runs reached it (birder_repro.perf.advise.ranking);
- a 1-node profile: ``predict.profile`` where given (``paper``, a run directory, a profile file), else the
  median of the completed 1-node runs of that optimizer with a ``profile`` made by the newest one's code (by
  step time; :func:`one_node_profiles`, which report.crossover's predictions use too).

The model (:mod:`birder_repro.perf.advise`, perf.model, as ``predict.implementation`` runs the schemes) turns
them into a step time on the user's nodes x GPUs at the user's link (``cluster.link_mbit``, or
``predict.cluster_spec``'s probed link) and at every rate of a log grid: the time to target is the steps times
the step, 1-bit Adam's first ``freeze`` steps at the fp32 step's time.
A method missing either input is listed as not rankable with the one command that measures it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from birder_repro.summary import fmt_number  # link rates and times: the summary's and the tables' format

from .advise import LINK_GRID, ranking, ranking_bands, step_times, time_to_target, winner_changes
from .cluster import ClusterSpec

__all__ = [
    "ADVICE_FILE",
    "MeasuredSteps",
    "Layout",
    "profile_key",
    "one_node_profiles",
    "median_profile_record",
    "freeze_step",
    "load_runs",
    "measured_steps",
    "advise",
    "format_advice",
    "run_advice",
]

ADVICE_FILE = "advice.json"
# The methods advised on where the runs hold none of the task and advise.optims is null (docs/time-to-accuracy.md)
FIELD = ("sgdm", "adamw", "sgdm_fp16", "sgdm_bf16_2level", "sgdm_powersgd", "diloco", "onebit_adam", "birder")
PROFILE_STEPS = 60  # steps of the 1-node profile run the advice asks for (train.eval=false: no evaluation)


def optim_label(name: str, variant: str = "") -> str:
    """``birder``, or ``birder (flat)`` for a Birder scheme other than its default."""
    return f"{name} ({variant})" if variant else name


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
    from birder_repro.record import read_record

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


def freeze_step(cfg: dict, planned_steps: int) -> int:
    """The steps a method runs the fp32 exchange before its own: 1-bit Adam's freeze step (``optim.freeze``),
    PowerSGD's start iteration (``optim.comm.start_iter``, at least 2 as its hook reads it:
    birder_repro.comm.powersgd.start_iter_from_config); 0 for other optimizers."""
    from birder_repro.schedule import steps_of

    optim = cfg.get("optim") or {}
    freeze, start = optim.get("freeze"), (optim.get("comm") or {}).get("start_iter")
    if freeze is not None:
        return steps_of(float(freeze), planned_steps, "optim.freeze")
    if start is not None:
        return max(2, steps_of(float(start), planned_steps, "optim.comm.start_iter"))
    return 0


def comm_rank(cfg: dict) -> int:
    """PowerSGD's rank (``optim.comm.rank``), which sets its bytes and its compression work; 1 elsewhere."""
    return int(((cfg.get("optim") or {}).get("comm") or {}).get("rank") or 1)


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
    """A completed, measured run of ``task`` scored on the test set that evaluated against a target."""
    ttt = rec.get("time_to_target") or {}
    eval_set = ((rec.get("config") or {}).get("data") or {}).get("eval_set") or "test"
    return (
        rec.get("status") == "completed"
        and rec.get("task") == task
        and bool(ttt.get("metric"))
        and eval_set != "val"
        and ttt.get("evaluations") != 0  # train.eval=false: a profile run, no time to target
    )


def load_runs(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(run directory, record) of every readable record under ``root``, at any depth."""
    from birder_repro.record import find_records, read_record

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


@dataclass
class Layout:
    """The user's layout and link, as the advice is priced on it."""

    task: str
    nodes: int
    gpus_per_node: int
    batch_size: int  # per process and micro-batch step, times accumulate
    global_batch: int
    cluster: str
    cluster_config: dict[str, Any]
    link_mbit: float
    implementation: str = "this"
    links: list[float] = field(default_factory=lambda: [float(x) for x in LINK_GRID])

    def spec(self, link: float) -> ClusterSpec:
        return ClusterSpec.from_config({**self.cluster_config, "link_mbit": float(link)})


def _method_inputs(steps: MeasuredSteps) -> dict[str, Any]:
    """What the model needs of a setting besides its profile, read from one of its runs' config."""
    from .schemes import scheme_for_optim

    cfg = steps.record.get("config") or {}
    optim = cfg.get("optim") or {}
    comm = optim.get("comm") or {}
    planned = int(steps.record.get("planned_steps") or steps.record.get("steps") or 0)
    return {
        "scheme": scheme_for_optim(steps.optim, comm.get("scheme"), str(cfg.get("parallel") or "ddp")),
        "freeze": freeze_step(cfg, planned),
        "local_steps": int(optim.get("local_steps") or 1),
        "rank": comm_rank(cfg),
    }


def _price(steps: MeasuredSteps, profile, lay: Layout, link: float) -> dict[str, float]:
    """The model's step times of this setting at ``link``, and its time to target from its measured steps."""
    m = _method_inputs(steps)
    warm, main, share = step_times(
        profile,
        lay.spec(link),
        lay.nodes,
        lay.gpus_per_node,
        m["scheme"],
        lay.batch_size,
        freeze=m["freeze"],
        local_steps=m["local_steps"],
        rank=m["rank"],
        implementation=lay.implementation,
    )
    assert steps.steps is not None
    return {
        "warmup_step_s": warm,
        "step_s": main,
        "comm_share": share,
        "time_to_target_s": time_to_target(steps.steps, m["freeze"], warm, main),
    }


def _command(task: str, optims: Sequence[str], extra: str) -> str:
    return f"birder-repro -m task={task} optim={','.join(sorted(set(optims)))} {extra}".rstrip()


def advise(
    lay: Layout,
    runs: Sequence[tuple[Path, dict]],
    optims: Sequence[str] | None = None,
    given_profile: Any = None,
) -> dict[str, Any]:
    """The advice as a JSON-ready dict: ``ranked`` (fastest first at the user's link), ``cannot_rank`` with the
    commands that would make them rankable, the ranking's ``bands`` and ``winner_changes`` over ``lay.links``,
    and each ranked method's predicted times over them (``curves``)."""
    found = measured_steps(runs, lay.task, lay.global_batch, (lay.nodes, lay.gpus_per_node))
    found = [m for m in found if optims is None or m.optim in optims]
    profiles = one_node_profiles([d for d, _ in runs]) if given_profile is None else {}
    ranked, missing_steps, missing_profile = [], [], []
    for m in found:
        profile = given_profile or _profile_for(m, profiles, lay.batch_size, lay.cluster)
        if m.steps is None:
            missing_steps.append((m.label, m.optim, f"no measured run reaching the target (0 of {m.runs} reached)"))
        if profile is None:
            missing_profile.append((m.label, m.optim, "no 1-node profile"))
        if m.steps is not None and profile is not None:
            ranked.append((m, profile))
    profiled = {k[1] for k in profiles if k[0] == lay.task}
    # with nothing of the task measured and no methods named, the field a user would compare: what to run
    candidates = set(optims) if optims is not None else (profiled or (set() if found else set(FIELD)))
    for name in sorted(candidates - {m.optim for m in found}):
        missing_steps.append((optim_label(name), name, "no measured run reaching the target (none ran)"))
        if given_profile is None and name not in profiled:
            missing_profile.append((optim_label(name), name, "no 1-node profile"))
    after = frozenset(m.label for m, _ in ranked if not m.every_run_reached)
    here = {m.label: _price(m, p, lay, lay.link_mbit) for m, p in ranked}
    curves = {m.label: [_price(m, p, lay, x)["time_to_target_s"] for x in lay.links] for m, p in ranked}
    order = ranking({k: v["time_to_target_s"] for k, v in here.items()}, after)
    best = here[order[0]]["time_to_target_s"] if order else math.nan
    by_label = {m.label: m for m, _ in ranked}
    profile_of = {m.label: p for m, p in ranked}
    return {
        "task": lay.task,
        "layout": {k: v for k, v in asdict(lay).items() if k not in ("links", "cluster_config")},
        "target": _target(runs, lay.task),
        "ranked": [
            _ranked_row(i + 1, by_label[label], profile_of[label], here[label], best, label in after)
            for i, label in enumerate(order)
        ],
        "cannot_rank": _cannot_rank(lay, missing_steps, missing_profile, _model_args(found)),
        "links": list(lay.links),
        "curves": curves,
        "bands": ranking_bands(lay.links, curves, after),
        "winner_changes": winner_changes(lay.links, curves, after),
    }


def _ranked_row(rank: int, m: MeasuredSteps, profile, priced: dict, best: float, after: bool) -> dict[str, Any]:
    inputs = _method_inputs(m)
    return {
        "rank": rank,
        "method": m.label,
        "optim": m.optim,
        "variant": m.variant,
        "scheme": inputs["scheme"],
        "freeze": inputs["freeze"],
        "steps": {
            "value": m.steps,
            "source": "measured",
            "runs": m.runs,
            "reached": m.reached,
            "seeds": m.seeds,
            "run_dirs": m.run_dirs,
            "global_batches": m.global_batches,
            "at_your_global_batch": m.same_batch,
            "on_your_layout": m.same_layout,
        },
        "profile": {"name": profile.name, "device": profile.device, "batch_size": profile.batch_size},
        "warmup_step_s": {"value": priced["warmup_step_s"], "source": "predicted"},
        "step_s": {"value": priced["step_s"], "source": "predicted"},
        "time_to_target_s": {"value": priced["time_to_target_s"], "source": "predicted"},
        "slower_than_best": priced["time_to_target_s"] / best,
        "ranked_after_reliable": after,
        "steps_source": m.source(),
    }


def _model_args(found: Sequence[MeasuredSteps]) -> str:
    """The measured runs' model as overrides (``model.width=512 ...``): a profile of another model would not be
    the profile of their setting (profile_key)."""
    model = next((m.setting.get("model") for m in found if m.setting.get("model")), None) or {}
    return " ".join(f"model.{k}={'null' if v is None else v}" for k, v in sorted(_flat(model).items()) if k)


def _cannot_rank(lay: Layout, missing_steps: list, missing_profile: list, model_args: str = "") -> list[dict[str, Any]]:
    """The methods that cannot be ranked (``(label, optim, reason)`` each), why, and the one command per missing
    input that measures it for all of them: seeds at the user's layout (so at its global batch), or a short
    1-node run of the measured runs' model, batch and cluster that writes a profile and evaluates nothing."""
    steps_cmd = _command(
        lay.task,
        [optim for _, optim, _ in missing_steps],
        f"seed=0,1 nodes={lay.nodes} gpus_per_node={lay.gpus_per_node} cluster={lay.cluster}",
    )
    profile_cmd = _command(
        lay.task,
        [optim for _, optim, _ in missing_profile],
        f"{model_args} nodes=1 gpus_per_node={lay.gpus_per_node} cluster={lay.cluster} "
        f"train.batch_size={lay.batch_size} train.steps={PROFILE_STEPS} train.eval=false".lstrip(),
    )
    return [{"method": label, "reason": why, "command": steps_cmd} for label, _, why in missing_steps] + [
        {"method": label, "reason": why, "command": profile_cmd} for label, _, why in missing_profile
    ]


def _target(runs: Sequence[tuple[Path, dict]], task: str) -> str | None:
    """The target the runs were scored against, as ``top1 >= 87``."""
    for _, rec in runs:
        if _scored_on_target(rec, task):
            t = rec["time_to_target"]
            return f"{t['metric']} {'<=' if t.get('direction') == 'lower' else '>='} {fmt_number(t['target'])}"
    return None


# --------------------------------------------------------------------------------------------------------------
# What is printed and written


def format_advice(advice: Mapping[str, Any]) -> str:
    """The ranked table, where the ranking changes with the link, and what cannot be ranked (with commands)."""
    lay = advice["layout"]
    lines = [
        f"advice: {advice['task']} to {advice['target'] or '(no target measured)'} on {lay['nodes']} nodes x "
        f"{lay['gpus_per_node']} GPUs, cluster {lay['cluster']}, link {fmt_number(lay['link_mbit'])} Mbit/s, "
        f"global batch {lay['global_batch']}",
    ]
    if advice["ranked"]:
        lines += ["", _table(advice["ranked"]), ""]
        lines += [
            f"  {r['method']}: steps {r['steps_source']}; profile {r['profile']['name']}" for r in advice["ranked"]
        ]
        if any(r["ranked_after_reliable"] for r in advice["ranked"]):
            lines.append("  (a method some of whose runs did not reach the target ranks after those all of whose did)")
        lines += ["", *_bands_text(advice)]
    for c in advice["cannot_rank"]:
        lines.append(f"cannot rank {c['method']}: {c['reason']}")
    for command in dict.fromkeys(c["command"] for c in advice["cannot_rank"]):
        lines.append(f"  to measure it: {command}")
    return "\n".join(lines)


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The ranked methods as a Markdown table, every number marked measured or predicted."""
    header = ["#", "method", "steps to target", "step time", "time to target", "x #1's time"]
    shown = [header, ["---"] * len(header)]
    for r in rows:
        step = f"{1e3 * r['step_s']['value']:.2f} ms (predicted)"
        if r["freeze"]:
            step += f"; first {r['freeze']} at {1e3 * r['warmup_step_s']['value']:.2f} ms (fp32, predicted)"
        s = r["steps"]
        shown.append(
            [
                str(r["rank"]),
                r["method"] + (" (not every run reached)" if r["ranked_after_reliable"] else ""),
                f"{fmt_number(s['value'])} (measured, {s['reached']} of {s['runs']} reached, "
                f"seeds {','.join(map(str, s['seeds']))})",
                step,
                f"{fmt_number(r['time_to_target_s']['value'], 3)} s (predicted)",
                f"{r['slower_than_best']:.2f}x",
            ]
        )
    return "\n".join("| " + " | ".join(cells) + " |" for cells in shown)


def _bands_text(advice: Mapping[str, Any]) -> list[str]:
    links = advice["links"]
    lines = [f"the ranking over {fmt_number(links[0])} to {fmt_number(links[-1])} Mbit/s (predicted):"]
    for b in advice["bands"]:
        lines.append(f"  {fmt_number(b['from'], 3)} - {fmt_number(b['to'], 3)} Mbit/s: " + " < ".join(b["order"]))
    if not advice["winner_changes"]:
        lines.append("  the fastest method is the same at every link rate")
    for w in advice["winner_changes"]:
        lines.append(
            f"  the winner changes at about {fmt_number(w['link'], 3)} Mbit/s: {w['below']} below, {w['above']} above"
        )
    return lines


def write_advice(advice: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """advice.json and the figure ``advise_<task>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ADVICE_FILE
    path.write_text(json.dumps(advice, indent=2, default=str) + "\n")
    written = [path]
    if advice["ranked"]:
        written.append(advice_figure(advice, out_dir / f"advise_{advice['task']}.png"))
    return written


def advice_figure(advice: Mapping[str, Any], path: Path) -> Path:
    """Predicted time to target against the link rate, one line per ranked method, log-log; the user's link as a
    vertical line."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes or CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, r in enumerate(advice["ranked"]):
        after = r["ranked_after_reliable"]  # dashed: not every run reached the target
        label = r["method"] + (f" ({r['steps']['reached']} of {r['steps']['runs']} reached)" if after else "")
        # ten colours; past ten methods the line style tells them apart (the field has eleven)
        style = "--" if after else ("-" if i < 10 else "-.")
        ax.plot(
            advice["links"],
            advice["curves"][r["method"]],
            label=label,
            linewidth=1.4,
            color=f"C{i % 10}",
            linestyle=style,
        )
    link = advice["layout"]["link_mbit"]
    ax.axvline(link, color="0.3", linewidth=0.9, linestyle=":")
    ax.text(link, 1.0, f" your link: {fmt_number(link)} Mbit/s", transform=ax.get_xaxis_transform(), va="top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("inter-node link, Mbit/s")
    ax.set_ylabel("predicted time to target, s")
    lay = advice["layout"]
    ax.set_title(f"{advice['task']}: {lay['nodes']} x {lay['gpus_per_node']}, to {advice['target']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------
# mode=advise


def layout_of(cfg: Any) -> Layout:
    """The user's layout from the resolved config: nodes, GPUs, batch, cluster and its link (``predict.cluster_spec``,
    a probed link, in place of the cluster config's perf block where given, as mode=predict reads it)."""
    from omegaconf import OmegaConf

    from birder_repro.config import global_batch, resolve_gpus_per_node

    c: dict[str, Any] = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    predict, adv = c.get("predict") or {}, c.get("advise") or {}
    if predict.get("cluster_spec"):
        from .probe import load_cluster_spec

        cluster_config = dict(load_cluster_spec(predict["cluster_spec"]))
    else:
        cluster_config = dict(c["cluster"])
    accumulate = int((c.get("train") or {}).get("accumulate") or 1)
    return Layout(
        task=c["task"]["name"],
        nodes=int(c["nodes"]),
        gpus_per_node=resolve_gpus_per_node(c["gpus_per_node"]),
        batch_size=int(c["train"]["batch_size"]) * accumulate,
        global_batch=global_batch(cfg),
        cluster=str(c["cluster"].get("name")),
        cluster_config=cluster_config,
        link_mbit=float(ClusterSpec.from_config(cluster_config).inter_mbit),
        implementation=str(predict.get("implementation") or "this"),
        links=[float(x) for x in (adv.get("links") or LINK_GRID)],
    )


def run_advice(cfg: Any, out_dir: Path) -> int:
    """mode=advise on the resolved config ``cfg``: print the advice, write it to ``out_dir``; 0 where at least
    one method could be ranked, else 2 (the commands that measure what is missing are printed)."""
    from omegaconf import OmegaConf

    from birder_repro.record import runs_root

    lay = layout_of(cfg)
    adv = OmegaConf.select(cfg, "advise", default=None) or {}
    optims = adv.get("optims")
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
    return 0 if advice["ranked"] else 2
