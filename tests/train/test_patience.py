"""WHALE's weight patience (W = T_min = P_w = 0.2 epoch): stops exactly where it should."""

import pytest

from whale.train.patience import WeightPatience


def track(rewards, step=0.2, n=10):
    return [(round(step * (i + 1), 6), r, n) for i, r in enumerate(rewards)]


def test_first_step_never_stops():
    assert not WeightPatience().should_stop(track([0.5]))


def test_stops_one_window_after_the_last_new_best():
    p = WeightPatience()
    assert not p.should_stop(track([0.1, 0.2, 0.3]))  # every step a new best
    assert p.should_stop(track([0.1, 0.2, 0.3, 0.3]))  # equal is not a new best


def test_any_improvement_is_a_new_best():
    assert not WeightPatience().should_stop(track([0.3, 0.3000001]))


def test_t_min_holds_the_phase_open():
    p = WeightPatience(window=0.2, t_min=0.8, p_w=0.2)
    assert not p.should_stop(track([0.5, 0.1, 0.1]))  # 0.6 epochs < T_min
    assert p.should_stop(track([0.5, 0.1, 0.1, 0.1]))


def test_longer_patience_waits_for_it():
    p = WeightPatience(window=0.2, t_min=0.2, p_w=0.6)
    assert not p.should_stop(track([0.5, 0.1, 0.1]))
    assert p.should_stop(track([0.5, 0.1, 0.1, 0.1]))
    assert not p.should_stop(track([0.5, 0.1, 0.1, 0.6]))


def test_window_averages_the_steps_inside_it_weighted_by_samples():
    p = WeightPatience(window=0.4, t_min=0.0, p_w=0.2)
    steps = [(0.2, 1.0, 10), (0.4, 0.0, 30), (0.6, 0.5, 10)]
    assert p.window_rewards(steps) == pytest.approx([1.0, 0.25, 0.125])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        WeightPatience(window=0.0)
    with pytest.raises(ValueError):
        WeightPatience(p_w=-1)

