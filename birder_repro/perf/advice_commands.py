"""The commands ``mode=advise`` prints to measure what it lacks, carrying the query's own settings.

A command that measures steps to the target must run what the advice was asked about: the query's experiment,
link, model, batch and evaluation cadence. So it starts from the query's command-line overrides (its
``experiment=``, ``data.*`` and the like: nothing of the query is dropped but the advice's own keys and those the
command sets), then sets the resolved values that decide what is measured explicitly. Nothing here reads a
config or a record: the caller passes the query (perf.advice_query.Layout) and the methods
(perf.advice_methods.Method), whose profiles price each command's expected time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .advice_methods import Method, freeze_step, price
from .advice_query import Layout

__all__ = [
    "QUERY_ONLY",
    "STEPS_HERE",
    "STEPS_PROXY",
    "PROFILE",
    "PROFILE_STEPS",
    "SEEDS",
    "carried",
    "command",
    "eval_every_for",
    "flat_overrides",
    "fmt_duration",
    "measuring_commands",
]

# The query's keys that are the advice's own (or that a measuring command sets itself): never carried.
QUERY_ONLY = ("mode", "advise", "predict", "hydra", "dry_run", "optim", "seed", "nodes", "gpus_per_node")
EVALUATIONS = 20  # a run whose own cadence is 0 (only at its end) is evaluated about this often instead
PROFILE_STEPS = 60  # steps of the 1-node profile run the advice asks for (train.eval=false: no evaluation)
SEEDS = (0, 1)  # the seeds a command measuring steps to the target runs
STEPS_HERE = "steps to the target on your layout"
STEPS_PROXY = "steps to the target at your global batch on 2 nodes, by gradient accumulation"
PROFILE = "1-node profiles"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def carried(query: Sequence[str]) -> dict[str, str]:
    """The query's overrides as ``{key: override}``, less the advice's own keys (``mode``, ``advise.*``, ...)."""
    out: dict[str, str] = {}
    for override in query:
        key = _key(override)
        if "=" in override and key.split(".", 1)[0] not in QUERY_ONLY:
            out[key] = override
    return out


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def flat_overrides(prefix: str, node: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model.width": 512, ...}`` of a config section, its null values left out (they are the defaults')."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, Mapping):
            out.update(flat_overrides(f"{prefix}.{k}", v))
        elif v is not None:
            out[f"{prefix}.{k}"] = v
    return out


def command(query: Sequence[str], settings: Mapping[str, Any]) -> str:
    """``birder-repro -m`` with the query's carried overrides, then ``settings`` (``{"optim": "a,b", ...}``), each
    set once: a key the query gave and the command sets takes the command's value."""
    parts = carried(query)
    for key, value in settings.items():
        parts.pop(key, None)
        parts[key] = f"{key}={_value(value)}"
    return "birder-repro -m " + " ".join(parts.values())


def eval_every_for(query_eval_every: int, planned_steps: int | None) -> int:
    """The query's evaluation cadence where it has one; else about ``EVALUATIONS`` evaluations over the run (a
    cadence of 0 evaluates only at the end, so steps to the target could only read as the run's length)."""
    if query_eval_every > 0:
        return int(query_eval_every)
    if planned_steps:
        return max(1, math.ceil(planned_steps / EVALUATIONS))
    return 100


def fmt_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.4 h``, ``2.1 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _run_settings(lay: Layout) -> dict[str, Any]:
    """What a measuring run shares with the query, set explicitly: its task, cluster, link, model, batch."""
    out: dict[str, Any] = {"task": lay.task, "cluster": lay.cluster, "cluster.link_mbit": lay.link_mbit}
    out.update(flat_overrides("model", lay.model or {}))
    out["train.batch_size"] = lay.batch_size // max(lay.accumulate, 1)
    if lay.accumulate != 1:
        out["train.accumulate"] = lay.accumulate
    return out


def _expected(lay: Layout, methods: Sequence[Method], steps: int | None, seeds: int, nodes: int, batch: int) -> str:
    """The training time a command's runs take at most, one after another: each method's ``steps`` (its fp32
    warmup included) at its predicted step on ``nodes`` nodes at ``batch`` a process; where it cannot be known,
    why."""
    total, known, unknown = 0.0, [], []
    for m in methods:
        if steps is None or m.profile is None:
            unknown.append(m.label)
            continue
        run = m.copy(steps=float(steps), freeze=freeze_step({"optim": m.settings}, steps))
        total += seeds * price(run, lay, lay.link_mbit, nodes=nodes, batch=batch)["time_to_target_s"]
        known.append(m)
    text = ""
    if known:
        sources = " and ".join(sorted({m.profile_source for m in known}))
        text = (
            f"at most {fmt_duration(total)} of training ({seeds} x {steps} steps of {len(known)} method"
            f"{'s' if len(known) > 1 else ''} at the predicted step on {nodes} x {lay.gpus_per_node}, profiles "
            f"{sources}; evaluations and start-up not included)"
        )
    if unknown:
        why = "the run's length is not set in steps" if steps is None else "no 1-node profile to price it"
        text += ("; " if text else "") + f"unknown for {', '.join(unknown)} ({why})"
    return text


def _entry(what: str, methods: Sequence[Method], cmd: str, expected: str) -> dict[str, Any]:
    return {"what": what, "methods": [m.label for m in methods], "command": cmd, "expected": expected}


def measuring_commands(lay: Layout, methods: Sequence[Method]) -> list[dict[str, Any]]:
    """The commands that measure what the advice lacks, each with its expected time: first 1-node profiles of the
    methods without one of the user's (60 steps each; they price the rest); then steps to the target on the
    user's layout (and at the same global batch on 2 nodes, by gradient accumulation, where the layout has more
    and an even number), evaluated often enough to see them, each run stopping at the target."""
    no_steps = [m for m in methods if m.steps is None]
    no_profile = [m for m in methods if m.profile_source not in ("yours", "given")]
    out: list[dict[str, Any]] = []
    base = _run_settings(lay)
    if no_profile:
        profile = {
            **base,
            "optim": ",".join(sorted({m.optim for m in no_profile})),
            "nodes": 1,
            "gpus_per_node": lay.gpus_per_node,
            "train.batch_size": lay.batch_size,
            "train.steps": PROFILE_STEPS,
            "train.eval": False,
        }
        if lay.accumulate != 1:
            profile["train.accumulate"] = 1  # a profile times one step of the whole batch a process
        expected = _expected(lay, no_profile, PROFILE_STEPS, 1, 1, lay.batch_size)
        out.append(_entry(PROFILE, no_profile, command(lay.query, profile), expected))
    if no_steps:
        here = {
            **base,
            "optim": ",".join(sorted({m.optim for m in no_steps})),
            "seed": ",".join(map(str, SEEDS)),
            "nodes": lay.nodes,
            "gpus_per_node": lay.gpus_per_node,
            "train.eval": True,
            "train.eval_every": eval_every_for(lay.eval_every, lay.planned_steps),
            "train.stop_at_target": True,
        }
        expected = _expected(lay, no_steps, lay.planned_steps, len(SEEDS), lay.nodes, lay.batch_size)
        out.append(_entry(STEPS_HERE, no_steps, command(lay.query, here), expected))
        if lay.nodes > 2 and lay.nodes % 2 == 0:
            k = lay.nodes // 2
            proxy = {**here, "nodes": 2, "train.accumulate": lay.accumulate * k}
            expected = _expected(lay, no_steps, lay.planned_steps, len(SEEDS), 2, lay.batch_size * k)
            out.append(_entry(STEPS_PROXY, no_steps, command(lay.query, proxy), expected))
    return out
