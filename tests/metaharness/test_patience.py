import pytest

from whale.metaharness import Patience


def test_never_stops_before_j_min():
    assert not Patience(6, 2).should_stop([0.1] * 5, start=0.1)


def test_stops_at_j_min_when_nothing_improved_for_p_h():
    assert Patience(6, 2).should_stop([0.1] * 6, start=0.1)


def test_a_late_improvement_resets_the_count():
    best = [0.1, 0.1, 0.1, 0.1, 0.1, 0.2]  # new best at iteration 6
    assert not Patience(6, 2).should_stop(best, start=0.1)
    assert not Patience(6, 2).should_stop(best + [0.2], start=0.1)
    assert Patience(6, 2).should_stop(best + [0.2, 0.2], start=0.1)


def test_any_improvement_counts():
    assert not Patience(2, 2).should_stop([0.5, 0.5 + 1e-9], start=0.5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Patience(6, 0)
