"""The arithmetic of ``mode=advise`` (and of report.crossover's StepModel): a method's predicted time to a target
at a link, and how the ranking of several methods changes with the link rate.

    time to target = min(S, F) x warmup step + max(0, S - F) x step

S: the measured steps to the target; F: 1-bit Adam's freeze step (0 for every other optimizer), whose steps run
the fp32 exchange; the step times are the model's (birder_repro.perf.model.predict_step) on the training clock:
with the training loop's own collectives (perf.model.loop_collectives_s) and its other work a step, measured
on the 1-node profile (Profile.loop_overhead_s). Nothing here reads a
record or a config: the caller says which steps, which profile and which cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .cluster import ClusterSpec
from .model import loop_collectives_s, predict_step
from .profile import Profile

__all__ = ["LINK_GRID", "time_to_target", "step_times", "ranking", "ranking_bands", "winner_changes"]

LINK_GRID = np.logspace(1, 5, 161)  # 10 Mbit/s to 100 Gbit/s: where mode=advise and the crossover read a ranking


def time_to_target(steps: float, freeze: float, warmup_step_s: float, step_s: float) -> float:
    """Seconds to reach the target in ``steps`` steps when the first ``freeze`` of them cost ``warmup_step_s``
    (1-bit Adam's fp32 warmup) and the rest ``step_s``: a target reached inside the warmup costs warmup steps
    only."""
    first = min(float(steps), float(max(freeze, 0)))
    return first * warmup_step_s + max(0.0, float(steps) - first) * step_s


def step_times(
    profile: Profile,
    cluster: ClusterSpec,
    nodes: int,
    gpus_per_node: int,
    scheme: str,
    batch_size: int,
    *,
    freeze: int = 0,
    local_steps: int = 1,
    rank: int = 1,
    implementation: str = "this",
    loop: bool = True,
) -> tuple[float, float, float]:
    """(warmup step s, step s, communication share of the step) of ``scheme`` on this layout, as
    ``implementation`` runs it (perf.implementations): the warmup step is the fp32 exchange's where the method
    has a warmup (``freeze`` > 0), else the step itself. ``loop``: each a step of the training clock, the
    training loop's own collectives included (perf.model.loop_collectives_s); else the timed step alone."""
    main = predict_step(
        profile, cluster, nodes, gpus_per_node, scheme, batch_size, rank, implementation, local_steps=local_steps
    )
    warm = (
        main
        if freeze <= 0 or scheme == "fp32"
        else predict_step(profile, cluster, nodes, gpus_per_node, "fp32", batch_size, implementation=implementation)
    )
    # the training clock: the loop's own collectives on this layout, and its other work a step as the 1-node
    # profile measured it (Profile.loop_overhead_s: charged as measured, like the scheme's leftover)
    extra = loop_collectives_s(cluster, nodes, gpus_per_node) + profile.loop_overhead_s if loop else 0.0
    total = main.total_s + extra
    return warm.total_s + extra, total, (main.communication_s + extra) / total


def ranking(times: Mapping[str, float], after: frozenset[str] = frozenset()) -> list[str]:
    """The methods fastest first. Those in ``after`` (some of whose runs never reached the target) come after
    every method all of whose runs did, whatever their time: a mean over the seeds that reached it flatters
    them. Equal times keep the name order, so that the ranking is reproducible."""
    return sorted(times, key=lambda m: (m in after, times[m], m))


def ranking_bands(
    links: Sequence[float], times: Mapping[str, Sequence[float]], after: frozenset[str] = frozenset()
) -> list[dict]:
    """The link range (``from``, ``to``: grid points) over which the order of the methods stays the same, and
    that order; ``times[m][i]`` is method m's time at ``links[i]``."""
    bands: list[dict] = []
    for i, link in enumerate(links if times else []):
        order = ranking({m: t[i] for m, t in times.items()}, after)
        if bands and bands[-1]["order"] == order:
            bands[-1]["to"] = float(link)
        else:
            bands.append({"from": float(link), "to": float(link), "order": order})
    return bands


def _equal_times_link(x0: float, x1: float, r0: float, r1: float) -> float:
    """Where log(t_a / t_b), ``r0`` at link ``x0`` and ``r1`` at ``x1``, is 0: interpolated in log link rate."""
    if r1 == r0:
        return math.sqrt(x0 * x1)
    a, b = math.log(x0), math.log(x1)
    return math.exp(a + (0.0 - r0) * (b - a) / (r1 - r0))


def winner_changes(
    links: Sequence[float], times: Mapping[str, Sequence[float]], after: frozenset[str] = frozenset()
) -> list[dict]:
    """Each link rate where the fastest method changes: ``link`` (where the two predicted times are equal,
    interpolated in log link rate between the grid points around it), the winner ``below`` it and ``above``."""
    out: list[dict] = []
    for i in range(len(links) - 1 if times else 0):
        lo = ranking({m: t[i] for m, t in times.items()}, after)[0]
        hi = ranking({m: t[i + 1] for m, t in times.items()}, after)[0]
        if lo == hi:
            continue
        r0 = math.log(times[lo][i] / times[hi][i])
        r1 = math.log(times[lo][i + 1] / times[hi][i + 1])
        link = _equal_times_link(float(links[i]), float(links[i + 1]), r0, r1)
        out.append({"link": link, "below": lo, "above": hi})
    return out
