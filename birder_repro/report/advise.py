"""``birder-repro mode=advise``: which method reaches the task's target first on the user's layout and link.

Nothing is launched. Per optimizer setting (the ``optim.*``, ``model.*`` and run-length keys of its runs'
configs), two inputs, both the user's own, never made up:

- steps to the target: the mean ``time_to_target.step`` over the completed, measured runs of the task scored
  on the test set (any link rate: steps do not depend on it), preferring runs at the user's global batch;
  runs that did not reach the target are counted ("k of n reached") and rank the method after those all of
  whose runs reached it (birder_repro.perf.advise.ranking);
- a 1-node profile: ``predict.profile`` where given (``paper``, a run directory, a profile file), else the
  newest completed 1-node run of that optimizer with a ``profile`` (report.crossover.one_node_profiles).

The model (birder_repro.perf.advise, perf.model) turns them into a step time on the user's nodes x GPUs at the
user's link (``cluster.link_mbit``, or ``predict.cluster_spec``'s probed link) and at every rate of a log grid:
the time to target is the steps times the step, 1-bit Adam's first ``freeze`` steps at the fp32 step's time.
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

import pandas as pd

from .crossover import GRID, _profile_key, freeze_step, one_node_profiles
from .display import fmt_number, optim_label

__all__ = ["MeasuredSteps", "measured_steps", "advise", "format_advice", "ADVICE_FILE"]

ADVICE_FILE = "advice.json"
SETTING_PREFIXES = ("optim.", "model.", "train.schedule.")  # keys that change the steps a method takes
SETTING_KEYS = ("train.steps", "train.epochs")
PROFILE_STEPS = 60  # steps of the 1-node profile run the advice asks for (train.eval=false: no evaluation)


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

    @property
    def every_run_reached(self) -> bool:
        return self.reached == self.runs

    def source(self) -> str:
        where = os.path.commonpath(self.run_dirs) if self.run_dirs else "?"
        batch = "" if self.same_batch else f"; global batch {'/'.join(map(str, self.global_batches))}, not yours"
        seeds = ",".join(map(str, self.seeds))
        return f"measured: {self.reached} of {self.runs} reached, seeds {seeds}, under {where}{batch}"


def _setting(items: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in items.items() if k.startswith(SETTING_PREFIXES) or k in SETTING_KEYS}


def _target_runs(frame: pd.DataFrame, task: str) -> pd.DataFrame:
    """The completed, measured test-set runs of ``task`` that evaluated against a target."""
    if frame.empty or "target_metric" not in frame:
        return frame.iloc[0:0]
    eval_set = frame["eval_set"].astype("object").fillna("test") if "eval_set" in frame else "test"
    runs = frame[
        (frame["source"] == "measured")
        & (frame["status"] == "completed")
        & (frame["task"] == task)
        & frame["target_metric"].notna()
        & (eval_set != "val")
        & (frame["target_evaluations"].fillna(-1) != 0)  # train.eval=false: a profile run, no time to target
    ]
    return runs.assign(setting=[json.dumps(_setting(i or {}), sort_keys=True, default=str) for i in runs["config_items"]])


def measured_steps(frame: pd.DataFrame, task: str, global_batch: int) -> list[MeasuredSteps]:
    """Per optimizer setting of ``task``, its steps to the target from the runs at ``global_batch`` (those at
    other global batches where it has none)."""
    from birder_repro.record import read_record

    out = []
    for _, rows in _target_runs(frame, task).groupby("setting", sort=True):
        same = rows[rows["global_batch_size"] == global_batch]
        used = same if not same.empty else rows
        hit = used[used["target_reached"] == True]  # noqa: E712 - an object column of True / False / None
        first = used.iloc[0]
        out.append(
            MeasuredSteps(
                label=optim_label(first["optim"], first["variant"] or ""),
                optim=str(first["optim"]),
                variant=str(first["variant"] or ""),
                setting=json.loads(first["setting"]),
                record=read_record(Path(first["run_dir"])) or {},
                runs=len(used),
                reached=len(hit),
                steps=float(hit["target_step"].astype(float).mean()) if len(hit) else None,
                seeds=sorted({int(s) for s in used["seed"].dropna()}),
                run_dirs=sorted(str(d) for d in used["run_dir"]),
                global_batches=sorted({int(b) for b in used["global_batch_size"].dropna()}),
                same_batch=not same.empty,
            )
        )
    return _distinct_labels(out)


def _distinct_labels(found: list[MeasuredSteps]) -> list[MeasuredSteps]:
    """Several settings of one optimizer: each label names the keys in which its setting differs."""
    for label in {m.label for m in found}:
        same = [m for m in found if m.label == label]
        if len(same) < 2:
            continue
        keys = sorted({k for m in same for k in m.setting if any(o.setting.get(k) != m.setting.get(k) for o in same)})
        for m in same:
            m.label += " [" + ", ".join(f"{k.split('.', 1)[1]}={m.setting.get(k)}" for k in keys) + "]"
    return found


# --------------------------------------------------------------------------------------------------------------
# Profiles


def _profile_for(steps: MeasuredSteps, profiles: Mapping[tuple, Any], batch: int, cluster: str) -> Any:
    """The 1-node profile of this setting's optimizer, scheme, model and precision: at the user's batch and
    cluster where one exists, else at another batch (the model scales the compute linearly), else on another
    cluster; None where there is none."""
    want = _profile_key(steps.record)
    same = [k for k in profiles if k[:4] == want[:4] and k[5] == want[5]]
    if not same:
        return None
    best = min(same, key=lambda k: (k[4] != batch, k[6] != cluster))
    return profiles[best]


def _given_profile(source: Any, task: str, batch: int, cluster, implementation: str) -> Any:
    """``predict.profile`` as mode=predict reads it (paper, a run directory, a record or a profile file)."""
    from birder_repro.perf.paper_profiles import paper_profile
    from birder_repro.perf.profile import load_profile

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
    links: list[float] = field(default_factory=lambda: [float(x) for x in GRID])

    def spec(self, link: float):
        from birder_repro.perf.cluster import ClusterSpec

        return ClusterSpec.from_config({**self.cluster_config, "link_mbit": float(link)})


def _method_inputs(steps: MeasuredSteps) -> dict[str, Any]:
    """What the model needs of a setting besides its profile, read from one of its runs' config."""
    from birder_repro.perf.schemes import scheme_for_optim

    cfg = steps.record.get("config") or {}
    optim = cfg.get("optim") or {}
    comm = optim.get("comm") or {}
    planned = int(steps.record.get("planned_steps") or steps.record.get("steps") or 0)
    return {
        "scheme": scheme_for_optim(steps.optim, comm.get("scheme"), str(cfg.get("parallel") or "ddp")),
        "freeze": freeze_step(cfg, planned),
        "local_steps": int(optim.get("local_steps") or 1),
        "rank": int(comm.get("rank") or 1),
    }


def _price(steps: MeasuredSteps, profile, lay: Layout, link: float) -> dict[str, float]:
    from birder_repro.perf.advise import step_times, time_to_target

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
    frame: pd.DataFrame,
    optims: Sequence[str] | None = None,
    given_profile: Any = None,
) -> dict[str, Any]:
    """The advice as a JSON-ready dict: ``ranked`` (fastest first at the user's link), ``cannot_rank`` with the
    commands that would make them rankable, the ranking's ``bands`` and ``winner_changes`` over ``lay.links``,
    and each ranked method's predicted times over them (``curves``)."""
    from birder_repro.perf.advise import ranking, ranking_bands, winner_changes

    found = [m for m in measured_steps(frame, lay.task, lay.global_batch) if optims is None or m.optim in optims]
    profiles = one_node_profiles(frame["run_dir"]) if given_profile is None and not frame.empty else {}
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
    for name in sorted((set(optims) if optims is not None else profiled) - {m.optim for m in found}):
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
        "target": _target(frame, lay.task),
        "ranked": [
            _ranked_row(i + 1, by_label[label], profile_of[label], here[label], best, label in after)
            for i, label in enumerate(order)
        ],
        "cannot_rank": _cannot_rank(lay, missing_steps, missing_profile),
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
        },
        "profile": {"name": profile.name, "device": profile.device, "batch_size": profile.batch_size},
        "warmup_step_s": {"value": priced["warmup_step_s"], "source": "predicted"},
        "step_s": {"value": priced["step_s"], "source": "predicted"},
        "time_to_target_s": {"value": priced["time_to_target_s"], "source": "predicted"},
        "slower_than_best": priced["time_to_target_s"] / best,
        "ranked_after_reliable": after,
        "steps_source": m.source(),
    }


def _cannot_rank(lay: Layout, missing_steps: list, missing_profile: list) -> list[dict[str, Any]]:
    """The methods that cannot be ranked (``(label, optim, reason)`` each), why, and the one command per missing
    input that measures it for all of them: seeds at the user's layout (so at its global batch), or a short
    1-node run that writes a profile and evaluates nothing."""
    steps_cmd = _command(
        lay.task,
        [optim for _, optim, _ in missing_steps],
        f"seed=0,1 nodes={lay.nodes} gpus_per_node={lay.gpus_per_node} cluster={lay.cluster}",
    )
    profile_cmd = _command(
        lay.task, [optim for _, optim, _ in missing_profile], f"nodes=1 train.steps={PROFILE_STEPS} train.eval=false"
    )
    return [{"method": label, "reason": why, "command": steps_cmd} for label, _, why in missing_steps] + [
        {"method": label, "reason": why, "command": profile_cmd} for label, _, why in missing_profile
    ]


def _target(frame: pd.DataFrame, task: str) -> str | None:
    runs = _target_runs(frame, task)
    if runs.empty:
        return None
    first = runs.iloc[0]
    sign = "<=" if first["target_direction"] == "lower" else ">="
    return f"{first['target_metric']} {sign} {fmt_number(first['target_value'])}"


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
        lines += [f"  {r['method']}: steps {r['steps_source']}; profile {r['profile']['name']}" for r in advice["ranked"]]
        lines += ["", *_bands_text(advice)]
    for c in advice["cannot_rank"]:
        lines.append(f"cannot rank {c['method']}: {c['reason']}")
    for command in dict.fromkeys(c["command"] for c in advice["cannot_rank"]):
        lines.append(f"  to measure it: {command}")
    return "\n".join(lines)


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    from .display import to_markdown

    shown = []
    for r in rows:
        step = f"{1e3 * r['step_s']['value']:.2f} ms (predicted)"
        if r["freeze"]:
            step += f"; first {r['freeze']} at {1e3 * r['warmup_step_s']['value']:.2f} ms (fp32, predicted)"
        s = r["steps"]
        shown.append(
            {
                "#": r["rank"],
                "method": r["method"] + (" (not every run reached)" if r["ranked_after_reliable"] else ""),
                "steps to target": f"{fmt_number(s['value'])} (measured, {s['reached']} of {s['runs']} reached, "
                f"seeds {','.join(map(str, s['seeds']))})",
                "step time": step,
                "time to target": f"{fmt_number(r['time_to_target_s']['value'], 3)} s (predicted)",
                "x slower than the best": f"{r['slower_than_best']:.2f}x",
            }
        )
    return to_markdown(pd.DataFrame(shown))


def _bands_text(advice: Mapping[str, Any]) -> list[str]:
    links = advice["links"]
    lines = [f"the ranking over {fmt_number(links[0])} to {fmt_number(links[-1])} Mbit/s (predicted):"]
    for b in advice["bands"]:
        lines.append(f"  {fmt_number(b['from'], 3)} - {fmt_number(b['to'], 3)} Mbit/s: " + " < ".join(b["order"]))
    if not advice["winner_changes"]:
        lines.append("  the fastest method is the same at every link rate")
    for w in advice["winner_changes"]:
        lines.append(f"  the winner changes at about {fmt_number(w['link'], 3)} Mbit/s: {w['below']} below, {w['above']} above")
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
    from .figstyle import optim_style, pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for r in advice["ranked"]:
        style = optim_style(r["optim"], r["variant"])
        ax.plot(advice["links"], advice["curves"][r["method"]], label=r["method"], linewidth=1.4, **style)
    link = advice["layout"]["link_mbit"]
    ax.axvline(link, color="0.3", linewidth=0.9, linestyle=":")
    ax.text(link, 1.0, f" your link: {fmt_number(link)} Mbit/s", transform=ax.get_xaxis_transform(), va="top", fontsize=7)
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

    from birder_repro.config import global_batch
    from birder_repro.perf.cluster import ClusterSpec

    c = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    predict, adv = c.get("predict") or {}, c.get("advise") or {}
    if predict.get("cluster_spec"):
        from birder_repro.perf.probe import load_cluster_spec

        cluster_config = dict(load_cluster_spec(predict["cluster_spec"]))
    else:
        cluster_config = dict(c["cluster"])
    accumulate = int((c.get("train") or {}).get("accumulate") or 1)
    return Layout(
        task=c["task"]["name"],
        nodes=int(c["nodes"]),
        gpus_per_node=int(c["gpus_per_node"]),
        batch_size=int(c["train"]["batch_size"]) * accumulate,
        global_batch=global_batch(cfg),
        cluster=str(c["cluster"].get("name")),
        cluster_config=cluster_config,
        link_mbit=float(ClusterSpec.from_config(cluster_config).inter_mbit),
        implementation=str(predict.get("implementation") or "this"),
        links=[float(x) for x in (adv.get("links") or GRID)],
    )


def run_advice(cfg: Any, out_dir: Path) -> int:
    """mode=advise on the resolved config ``cfg``: print the advice, write it to ``out_dir``; 0 where at least
    one method could be ranked, else 2 (the commands that measure what is missing are printed)."""
    from omegaconf import OmegaConf

    from birder_repro.record import runs_root

    from .records import load_frame

    lay = layout_of(cfg)
    adv = OmegaConf.select(cfg, "advise", default=None) or {}
    optims = adv.get("optims")
    source = OmegaConf.select(cfg, "predict.profile", default=None)
    given = None
    if source is not None:
        given = _given_profile(source, lay.task, lay.batch_size, lay.spec(lay.link_mbit), lay.implementation)
    runs = runs_root(adv.get("runs"))
    frame = load_frame(runs) if runs.is_dir() else pd.DataFrame()
    advice = advise(lay, frame, list(optims) if optims is not None else None, given)
    advice["runs"] = str(runs)
    print(format_advice(advice), flush=True)
    for path in write_advice(advice, out_dir):
        print(f"[birder-repro] advice: {path}", flush=True)
    return 0 if advice["ranked"] else 2
