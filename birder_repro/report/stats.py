"""Intervals over seeds and the orders they allow: a pure function each.

A method's time to a target (or its accuracy at a budget) over n seeds is summarised by its mean and the 95 %
confidence interval of Student's t: mean ± t(1 - alpha/2, n - 1) x sd / sqrt(n), sd the sample standard
deviation (Student, "The probable error of a mean", Biometrika 6, 1908; as Henderson et al., "Deep Reinforcement
Learning that Matters", AAAI 2018, section "Reporting Evaluation Metrics", recommend for a handful of seeds).
Two methods are ordered only where their intervals do not overlap
(a conservative test: overlapping 95 % intervals can still differ at 5 %, separated ones always do); otherwise
the comparison is a tie. One seed has no interval (its half-width is infinite), so it ties with everything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")

__all__ = ["Interval", "t_quantile", "t_interval", "compare", "order_with_ties"]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method; Press et al., "Numerical
    Recipes", 3rd ed., section 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Numerical Recipes, section 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: int) -> float:
    """Student's t distribution's CDF: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF, to 1e-12)."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile(p={p}, df={df}): p in (0, 1) and df >= 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


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
    quantile = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1)
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


def order_with_ties(
    intervals: Mapping[K, Interval | None], lower_is_better: bool = True
) -> list[tuple[K, str, K | None]]:
    """The names by mean, best first, each with its relation to the next one: ('a', 'ahead of', 'b') where the
    two intervals separate, ('a', 'tie with', 'b') where they overlap; the last one ('z', '', None). Names
    without an interval go last, as (name, 'no interval', None)."""
    ranked = sorted((k for k, v in intervals.items() if v is not None), key=lambda k: intervals[k].mean)  # type: ignore[union-attr]
    if not lower_is_better:
        ranked.reverse()
    better = "<" if lower_is_better else ">"
    out: list[tuple[K, str, K | None]] = []
    for name, nxt in zip(ranked, [*ranked[1:], None]):
        if nxt is None:
            out.append((name, "", None))
        else:
            ahead = compare(intervals[name], intervals[nxt]) == better
            out.append((name, "ahead of" if ahead else "tie with", nxt))
    return out + [(k, "no interval", None) for k, v in intervals.items() if v is None]
