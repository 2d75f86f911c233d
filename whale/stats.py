"""The statistics every reading of a run needs: a bootstrap interval of a mean and the standard
error of paired differences. Pure stdlib, so the package imports without numpy.

`bootstrap_ci` is the percentile bootstrap of the mean: draw the n values with replacement
`resamples` times, take each draw's mean, and read the (1 - level)/2 and (1 + level)/2
quantiles of those means. The caller passes the `random.Random`, so one seed gives one interval.
What it does not cover: a percentile interval is too narrow for very small n (with n values it
can never reach past their range), and it assumes the values are independent draws (questions,
not repeated runs of one question).

`paired` is the mean of paired differences d_i (subject minus other, on the same unit: a family,
a question) and its standard error, sample SD / sqrt(n) (SD with n - 1), None with fewer than two
differences: one difference says nothing about the noise.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


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
    so a symmetric distribution gives a symmetric interval). ValueError for no values, a level
    outside (0, 1) or fewer than one resample."""
    if not values:
        raise ValueError("bootstrap_ci of no values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), not {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, not {resamples}")
    xs = [float(v) for v in values]
    n = len(xs)
    if min(xs) == max(xs):  # every resample mean is that value; skip the draws
        return xs[0], xs[0]
    means = sorted(math.fsum(rng.choices(xs, k=n)) / n for _ in range(resamples))
    j = min(math.floor(resamples * (1.0 - level) / 2.0), (resamples - 1) // 2)
    return means[j], means[resamples - 1 - j]


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
