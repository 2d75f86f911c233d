"""The statistics every reading of a run needs: a bootstrap interval of a mean, a Wilson interval
of a proportion, the standard error of paired differences and Student's t quantiles. Pure
stdlib, so the package imports without numpy or scipy.

`bootstrap_ci` is the percentile bootstrap of the mean: draw the n values with replacement
`resamples` times, take each draw's mean, and read the (1 - level)/2 and (1 + level)/2
quantiles of those means. The caller passes the `random.Random`, so one seed gives one interval.
What it does not cover: a percentile interval is too narrow for very small n (with n values it
can never reach past their range: an all-correct eval gets [1, 1]), and it assumes the values
are independent draws (questions, not repeated runs of one question). For 0/1 values (eval
accuracy) use `wilson_ci`, which does not collapse at 0 or n successes.

`wilson_ci` is the Wilson score interval of a binomial proportion (Wilson 1927): the set of p
whose score test |p̂ - p| / sqrt(p(1 - p)/n) <= z does not reject, z the normal (1 + level)/2
quantile. Exact arithmetic, no draws. It assumes independent questions, like the bootstrap.

`paired` is the mean of paired differences d_i (subject minus other, on the same unit: a family,
a question) and its standard error, sample SD / sqrt(n) (SD with n - 1), None with fewer than two
differences: one difference says nothing about the noise.

`t_quantile(df, level)` is the `level` quantile of Student's t with `df` degrees of freedom,
for a test on a mean of k = df + 1 differences whose SD is estimated from the same k (with
k = 3 the 97.5% quantile is 4.30, not the normal's 1.96).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


def _finite(values: Sequence[float], what: str) -> list[float]:
    xs = [float(v) for v in values]
    if any(not math.isfinite(x) for x in xs):
        raise ValueError(f"{what} of values that are not all finite numbers (NaN or inf)")
    return xs


def bootstrap_ci(
    values: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    rng: random.Random,
) -> tuple[float, float]:
    """(lo, hi), the percentile bootstrap interval of the mean of `values`.

    The quantiles are read by rank from the sorted resample means m_1 <= ... <= m_B:
    lo = m_j with j = floor(B·(1 - level)/2) + 1 (1-based), hi = m_(B + 1 - j) (symmetric ranks,
    so a symmetric distribution gives a symmetric interval). The floor is of B·(1 - level)/2
    rounded to 9 decimals first: in floating point 1000·(1 - 0.9)/2 is 49.999999999999993, and
    a bare floor would read rank 50 for the 5% quantile that rank 51 is. ValueError for no
    values, a NaN or infinite value, a level outside (0, 1) or fewer than one resample."""
    if not values:
        raise ValueError("bootstrap_ci of no values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), not {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, not {resamples}")
    xs = _finite(values, "bootstrap_ci")
    n = len(xs)
    if min(xs) == max(xs):  # every resample mean is that value; skip the draws
        return xs[0], xs[0]
    means = sorted(math.fsum(rng.choices(xs, k=n)) / n for _ in range(resamples))
    j = min(math.floor(round(resamples * (1.0 - level) / 2.0, 9)), (resamples - 1) // 2)
    return means[j], means[resamples - 1 - j]


def wilson_ci(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """(lo, hi), the Wilson score interval of the proportion successes / n:
    (p̂ + z²/2n ± z·sqrt(p̂(1 - p̂)/n + z²/4n²)) / (1 + z²/n). Unlike the bootstrap it is not
    [1, 1] for n of n (20/20 at 95%: [0.839, 1]). ValueError for n < 1, successes outside
    [0, n], or a level outside (0, 1)."""
    if n < 1:
        raise ValueError(f"wilson_ci needs n >= 1, not {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], not {successes}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), not {level}")
    z = statistics.NormalDist().inv_cdf((1.0 + level) / 2.0)
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Paired:
    """n differences, their mean (nan for none) and its standard error (None for n < 2)."""

    n: int
    mean: float
    se: float | None


def paired(diffs: Sequence[float]) -> Paired:
    """Mean of paired differences and its standard error, sample SD / sqrt(n)."""
    xs = [float(d) for d in diffs]
    n = len(xs)
    mean = sum(xs) / n if n else math.nan
    se = statistics.stdev(xs) / math.sqrt(n) if n >= 2 else None
    return Paired(n, mean, se)


_NORMAL_DF = 100_000  # beyond this many degrees of freedom t is the normal to 5 decimals


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df >= 1, t >= 0: the closed finite series of
    Abramowitz & Stegun 26.7.3-4 in theta = atan(t / sqrt(df)), no special functions."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 1:
        term, total = math.cos(theta), 0.0
        for i in range(1, (df - 1) // 2 + 1):  # cos, (2/3) cos^3, (2·4)/(3·5) cos^5, ...
            total += term
            term *= c2 * (2 * i) / (2 * i + 1)
        return 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    term, total = 1.0, 0.0
    for i in range(1, df // 2 + 1):  # 1, (1/2) cos^2, (1·3)/(2·4) cos^4, ...
        total += term
        term *= c2 * (2 * i - 1) / (2 * i)
    return s * total


@lru_cache(maxsize=256)
def t_quantile(df: int, level: float = 0.975) -> float:
    """The `level` quantile of Student's t with `df` degrees of freedom (df = 1: 12.706,
    2: 4.303, 3: 3.182, 30: 2.042 at 0.975), by bisection on the exact CDF to 1e-12; the
    normal quantile for df over 100 000. ValueError for df < 1 or a level outside (0, 1)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"t_quantile needs an integer df >= 1, not {df!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), not {level}")
    if level == 0.5:
        return 0.0
    if level < 0.5:
        return -t_quantile(df, 1.0 - level)
    if df > _NORMAL_DF:
        return statistics.NormalDist().inv_cdf(level)
    target = 2.0 * level - 1.0  # P(|T| <= t) at the quantile
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < target:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _t_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2.0
