"""whale.stats against worked examples and an exact bootstrap distribution."""

import math
import random

import pytest

from whale.evaluate import EvalResult, Outcome
from whale.stats import Paired, bootstrap_ci, paired


def test_paired_worked_example():
    # diffs [0.1, 0.3, -0.1, 0.5]: mean 0.2; deviations -0.1, 0.1, -0.3, 0.3
    # sd = sqrt((0.01 + 0.01 + 0.09 + 0.09) / 3) = sqrt(0.0667) = 0.2582; se = sd / 2 = 0.1291
    p = paired([0.1, 0.3, -0.1, 0.5])
    assert p.n == 4 and p.mean == pytest.approx(0.2)
    assert p.se == pytest.approx(0.12910, abs=1e-5)


def test_paired_has_no_se_below_two_differences():
    assert paired([0.4]) == Paired(1, 0.4, None)
    empty = paired([])
    assert empty.n == 0 and math.isnan(empty.mean) and empty.se is None


def test_bootstrap_of_a_constant_is_that_constant():
    assert bootstrap_ci([0.7] * 12, rng=random.Random(1)) == (0.7, 0.7)


def test_bootstrap_is_seeded_and_contains_the_mean():
    xs = [0.13, 0.57, 0.91, 0.22, 0.68, 0.05, 0.77, 0.49, 0.31, 0.86]  # distinct: means differ
    a = bootstrap_ci(xs, rng=random.Random(7))
    assert a == bootstrap_ci(xs, rng=random.Random(7))
    assert a != bootstrap_ci(xs, rng=random.Random(8))  # another seed draws other resamples
    lo, hi = a
    assert lo < sum(xs) / len(xs) < hi and 0.0 <= lo and hi <= 1.0
    narrow = bootstrap_ci(xs, level=0.5, rng=random.Random(7))
    assert lo <= narrow[0] <= narrow[1] <= hi


def _exact_quantile(n: int, p: float, q: float) -> float:
    """The q-quantile of Binomial(n, p)/n: the smallest m/n with P(X <= m) >= q."""
    cdf = 0.0
    for m in range(n + 1):
        cdf += math.comb(n, m) * p**m * (1 - p) ** (n - m)
        if cdf >= q - 1e-12:
            return m / n
    return 1.0


def test_bootstrap_of_01_values_matches_the_exact_binomial_quantiles():
    # Resampling n 0/1 values with k ones is Binomial(n, k/n)/n, computed here without sampling.
    n, k = 20, 14
    xs = [1.0] * k + [0.0] * (n - k)
    lo, hi = bootstrap_ci(xs, resamples=20_000, rng=random.Random(3))
    # One step (1/n) of slack: 20 000 draws pin a quantile down to about that
    assert abs(lo - _exact_quantile(n, k / n, 0.025)) <= 1 / n + 1e-9
    assert abs(hi - _exact_quantile(n, k / n, 0.975)) <= 1 / n + 1e-9
    assert (_exact_quantile(n, 0.7, 0.025), _exact_quantile(n, 0.7, 0.975)) == (0.5, 0.9)


def test_bootstrap_refuses_what_has_no_interval():
    for bad in ({"values": []}, {"values": [1.0], "level": 1.0},
                {"values": [1.0], "resamples": 0}):  # fmt: skip
        with pytest.raises(ValueError):
            bootstrap_ci(bad.pop("values"), rng=random.Random(0), **bad)


def test_eval_summary_carries_a_seeded_accuracy_ci():
    outs = [Outcome(f"q{i}", "x", float(i % 3 != 0), i % 3 != 0, "ok") for i in range(30)]
    r = EvalResult(outs, [])
    s = r.summary()
    lo, hi = s["accuracy_ci"]
    assert lo < s["accuracy"] < hi and s["accuracy_ci"] == r.summary()["accuracy_ci"]
    assert EvalResult([], []).summary()["accuracy_ci"] is None
