"""Intervals over seeds and the orders they allow: a pure function each.

A method's time to a target (or its accuracy at a budget) over n seeds is summarised by its mean and the 95 %
confidence interval of Student's t: mean ± t(1 - alpha/2, n - 1) x sd / sqrt(n), sd the sample standard
deviation (Student, "The probable error of a mean", Biometrika 6, 1908; the rule AlgoPerf's and the
Henderson et al. "Deep Reinforcement Learning that Matters" (AAAI 2018, section "Reporting evaluation
metrics") recommend for a handful of seeds). Two methods are ordered only where their intervals do not overlap
(a conservative test: overlapping 95 % intervals can still differ at 5 %, separated ones always do); otherwise
the comparison is a tie. One seed has no interval (its half-width is infinite), so it ties with everything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy_stats

__all__ = ["Interval", "t_interval", "compare", "order_with_ties"]


@dataclass(frozen=True)
class Interval:
    """The mean of ``n`` values and its confidence interval [lo, hi] (``half`` = hi - mean; inf for n < 2)."""

    mean: float
    half: float
    n: int

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """Student's t interval of the mean of ``values``; None for no values, an infinite half-width for one."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence}: a fraction in (0, 1), e.g. 0.95")
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return None
    mean = sum(xs) / n
    if n == 1:
        return Interval(mean, math.inf, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    quantile = float(_scipy_stats.t.ppf(1.0 - (1.0 - confidence) / 2.0, n - 1))
    return Interval(mean, quantile * sd / math.sqrt(n), n)


def compare(a: Interval | None, b: Interval | None) -> str:
    """'<' where a's interval lies wholly below b's, '>' wholly above, else 'tie' (also where either is None)."""
    if a is None or b is None:
        return "tie"
    if a.hi < b.lo:
        return "<"
    if a.lo > b.hi:
        return ">"
    return "tie"


def order_with_ties(intervals: dict[str, Interval | None], lower_is_better: bool = True) -> list[tuple[str, str]]:
    """The names by mean, best first, each with its relation to the next: 'ahead of X' where the two intervals
    separate, 'tie with X' where they overlap; the last one ''. Names without an interval go last, unranked."""
    ranked = sorted((k for k, v in intervals.items() if v is not None), key=lambda k: intervals[k].mean)  # type: ignore[union-attr]
    if not lower_is_better:
        ranked.reverse()
    out = []
    for i, name in enumerate(ranked):
        if i + 1 == len(ranked):
            out.append((name, ""))
            continue
        nxt = ranked[i + 1]
        better = "<" if lower_is_better else ">"
        verdict = compare(intervals[name], intervals[nxt])
        out.append((name, f"ahead of {nxt}" if verdict == better else f"tie with {nxt}"))
    return out + [(k, "no value") for k, v in intervals.items() if v is None]
