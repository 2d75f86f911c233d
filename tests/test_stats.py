"""whale.stats against worked examples, an exact bootstrap distribution and t tables."""

import math
import random

import pytest

from whale.evaluation import EvalResult, Outcome
from whale.stats import Paired, bootstrap_ci, paired, t_quantile, wilson_ci


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


def test_bootstrap_reads_the_exact_rank_despite_float_error():
    # level 0.9, B = 1000: the 5% quantile is rank 51 (0-based 50) and its mirror 0-based 949;
    # in floating point 1000 * (1 - 0.9) / 2 = 49.99999999999999, whose bare floor is 49
    xs = [0.13, 0.57, 0.91, 0.22, 0.68, 0.05, 0.77, 0.49, 0.31, 0.86]
    assert 1000 * (1 - 0.9) / 2 < 50
    draw = random.Random(11)
    means = sorted(math.fsum(draw.choices(xs, k=len(xs))) / len(xs) for _ in range(1000))
    assert means[49] != means[50]  # the two ranks differ here, so the test can tell them apart
    assert bootstrap_ci(xs, level=0.9, resamples=1000, rng=random.Random(11)) == (
        means[50], means[949])  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_bootstrap_refuses_nan_and_inf(bad):
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci([0.5, bad, 0.7], rng=random.Random(0))
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci([bad] * 3, rng=random.Random(0))  # "constant": no shortcut past the check


def test_wilson_worked_example():
    # 14/20 at 95%: z = 1.959964, z^2 = 3.841459, p = 0.7; denominator 1 + z^2/20 = 1.192073;
    # centre (0.7 + z^2/40) / 1.192073 = 0.796036 / 1.192073 = 0.667774;
    # half z/1.192073 * sqrt(0.21/20 + z^2/1600) = 1.644166 * 0.113582 = 0.186748
    lo, hi = wilson_ci(14, 20)
    assert lo == pytest.approx(0.4810, abs=1e-4) and hi == pytest.approx(0.8545, abs=1e-4)
    assert (lo + hi) / 2 == pytest.approx(0.667774, abs=1e-6)


def test_wilson_is_not_degenerate_at_the_ends():
    # all correct: lower end n / (n + z^2) = 20 / 23.841459 = 0.838875; the bootstrap says [1, 1]
    lo, hi = wilson_ci(20, 20)
    assert lo == pytest.approx(20 / (20 + 1.959964**2), abs=1e-6) and hi == 1.0
    assert bootstrap_ci([1.0] * 20, rng=random.Random(0)) == (1.0, 1.0)
    lo0, hi0 = wilson_ci(0, 20)
    assert lo0 == 0.0 and hi0 == pytest.approx(1 - 0.838875, abs=1e-6)
    half, full = wilson_ci(14, 20, level=0.5), wilson_ci(14, 20)
    assert full[0] < half[0] < 0.7 < half[1] < full[1]  # a lower level, a narrower interval
    for bad in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson_ci(*bad)
    with pytest.raises(ValueError):
        wilson_ci(3, 5, level=1.0)


# Student's t 97.5% quantiles, df 1..30 (any printed t table, e.g. NIST/SEMATECH 1.3.6.7.2)
T975 = [12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423]  # fmt: skip


def test_t_quantile_matches_the_table():
    for df, t in enumerate(T975, start=1):
        assert t_quantile(df) == pytest.approx(t, abs=1e-4), df
    assert t_quantile(1, 0.95) == pytest.approx(6.3138, abs=1e-4)
    assert t_quantile(10, 0.995) == pytest.approx(3.1693, abs=1e-4)
    assert t_quantile(60) == pytest.approx(2.0003, abs=1e-4)
    assert t_quantile(1000) == pytest.approx(1.9623, abs=1e-4)
    assert t_quantile(10**6) == pytest.approx(1.95996, abs=1e-5)
    assert t_quantile(3, 0.025) == -t_quantile(3) and t_quantile(7, 0.5) == 0.0
    for bad in ({"df": 0}, {"df": 2, "level": 1.0}, {"df": 1.5}):
        with pytest.raises(ValueError):
            t_quantile(**bad)


def test_eval_summary_carries_the_wilson_accuracy_ci():
    outs = [Outcome(f"q{i}", "x", float(i % 3 != 0), i % 3 != 0, "ok") for i in range(30)]
    r = EvalResult(outs, [])
    s = r.summary()
    assert s["accuracy"] == pytest.approx(20 / 30)
    assert s["accuracy_ci"] == pytest.approx(list(wilson_ci(20, 30)))
    all_right = EvalResult([Outcome(f"q{i}", "x", 1.0, True, "ok") for i in range(20)], [])
    lo, hi = all_right.summary()["accuracy_ci"]
    assert lo == pytest.approx(0.838875, abs=1e-6) and hi == 1.0  # not the bootstrap's [1, 1]
    assert EvalResult([], []).summary()["accuracy_ci"] is None
