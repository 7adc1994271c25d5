"""Tests across seeds: is the difference between two models' scores over their seeds larger
than the seeds' own spread? Welch's t-test (unequal variances) and the exact permutation
test of the difference of means. Pure math on lists of floats; no SciPy."""

from __future__ import annotations

import itertools
import math
import random


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz;
    Press et al., Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom (df may be fractional)."""
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def welch_t(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) = mean(b): (t, degrees of freedom, two-sided p). Each side
    needs two values or more; equal constant sides give t = 0, p = 1."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's t-test needs at least two values on each side")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1)
    se2_a, se2_b = var_a / len(a), var_b / len(b)
    if se2_a + se2_b == 0.0:  # no spread on either side: the means decide alone
        df = float(len(a) + len(b) - 2)
        if mean_a == mean_b:
            return 0.0, df, 1.0
        return math.copysign(math.inf, mean_a - mean_b), df, 0.0
    t = (mean_a - mean_b) / math.sqrt(se2_a + se2_b)
    df = (se2_a + se2_b) ** 2 / (se2_a**2 / (len(a) - 1) + se2_b**2 / (len(b) - 1))
    return t, df, student_t_two_sided(t, df)


def t_critical(df: float, level: float = 0.95) -> float:
    """The t with two-sided p = 1 − ``level`` at ``df`` degrees of freedom (bisection on
    ``student_t_two_sided``: 4.30 at df 2, 2.78 at df 4, 1.96 as df grows)."""
    low, high = 0.0, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if student_t_two_sided(mid, df) > 1 - level else (low, mid)
    return (low + high) / 2


def welch_interval(
    a: list[float], b: list[float], level: float = 0.95
) -> tuple[float, float, float]:
    """mean(a) − mean(b) with its Welch ``level`` interval: (difference, low, high)."""
    _, df, _ = welch_t(a, b)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1)
    half = t_critical(df, level) * math.sqrt(var_a / len(a) + var_b / len(b))
    return mean_a - mean_b, mean_a - mean_b - half, mean_a - mean_b + half


def permutation_test(
    a: list[float], b: list[float], *, samples: int = 20_000, seed: int = 0
) -> float:
    """Two-sided p of the difference of means under exchangeability of the pooled values:
    exact over every split when there are at most ``samples`` of them (3+3 seeds: 20 splits,
    so p cannot go below 0.1), else estimated from ``samples`` random splits."""
    pooled = [*a, *b]
    n, observed = len(a), abs(sum(a) / len(a) - sum(b) / len(b))
    total = sum(pooled)

    def extreme(chosen: tuple[int, ...]) -> bool:
        first = sum(pooled[i] for i in chosen)
        diff = abs(first / n - (total - first) / (len(pooled) - n))
        return diff >= observed - 1e-12

    if math.comb(len(pooled), n) <= samples:
        splits = list(itertools.combinations(range(len(pooled)), n))
        return sum(extreme(s) for s in splits) / len(splits)
    rng = random.Random(seed)
    hits = sum(extreme(tuple(rng.sample(range(len(pooled)), n))) for _ in range(samples))
    return (hits + 1) / (samples + 1)


__all__ = [
    "incomplete_beta",
    "permutation_test",
    "student_t_two_sided",
    "t_critical",
    "welch_interval",
    "welch_t",
]
