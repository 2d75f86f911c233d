"""Sampling refuses values out of range when it is made (issue 20): no config or request puts
max_tokens <= 0, a temperature of 30 or a top_p of 5 on the wire."""

import math

import pytest

from whale.models.base import MAX_TEMPERATURE, Completion, Sampling


@pytest.mark.parametrize("max_tokens", [0, -1, True, 1.0, "8"])
def test_max_tokens_below_one_or_not_an_int_is_refused(max_tokens):
    with pytest.raises(ValueError, match="max_tokens"):
        Sampling(max_tokens=max_tokens)


@pytest.mark.parametrize("temperature", [30.0, 2.01, -0.5, math.nan, math.inf, True, "0"])
def test_a_temperature_outside_0_to_2_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=temperature)


@pytest.mark.parametrize("top_p", [0.0, 1.5, 5, -1.0, math.nan])
def test_a_top_p_outside_0_to_1_is_refused(top_p):
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=top_p)


@pytest.mark.parametrize(
    "kwargs", [{"stop": ["x"]}, {"stop": ("x", 3)}, {"seed": 1.5}, {"seed": True},
               {"grammar": 3}, {"tools": ["x"]}],
)  # fmt: skip
def test_other_fields_of_the_wrong_type_are_refused(kwargs):
    with pytest.raises(ValueError, match="sampling: "):
        Sampling(**kwargs)


def test_the_ends_of_each_range_are_accepted():
    s = Sampling(max_tokens=1, temperature=MAX_TEMPERATURE, top_p=1.0, stop=("a",), seed=None)
    assert s.key()["temperature"] == 2.0 and Sampling(temperature=0, top_p=1e-9).top_p == 1e-9


def test_a_reply_without_a_completion_count_is_charged_its_ids_else_its_cap():
    counted = Completion("a b", "stop", {"completion_tokens": 2}, token_ids=[1, 2, 3])
    ids_only = Completion("a b", "stop", {}, token_ids=[1, 2, 3])
    nothing = Completion("a b", "stop", {"prompt_tokens": 4})
    assert [c.charged_tokens(64) for c in (counted, ids_only, nothing)] == [2, 3, 64]


def test_a_reply_with_text_that_its_backend_counts_as_zero_is_not_free():
    # A server that does not count, or a reply cached when whale stored a missing count as 0.
    said = Completion("a long reply", "stop", {"completion_tokens": 0})
    empty = Completion("", "stop", {"completion_tokens": 0})
    assert (said.charged_tokens(64), empty.charged_tokens(64)) == (64, 0)
