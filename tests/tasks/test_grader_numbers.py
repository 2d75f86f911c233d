"""The user graders keep numbers whole (a sign, a decimal point, a fraction bar), refuse a
reference with no letter or digit, and a JSONL file splits on newlines only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale.tasks import load_task
from whale.tasks.graders import build_grader, parse_grader


def grade(name, answer, reference):
    return build_grader(parse_grader(name)).grade("q", answer, reference)


# --- the default grader accepts wrong numbers ---------------------------------------------------
@pytest.mark.parametrize("answer,reference", [
    ("5", "-5"),        # sign dropped (U+002D is punctuation, category Pd)
    ("314", "3.14"),    # decimal point dropped
    ("12", "1/2"),      # fraction bar dropped
    ("15", "1.5"),
    ("1000", "10.00"),
])
def test_normalized_the_default_rejects_a_different_number(answer, reference):
    assert not grade("normalized", answer, reference).correct


@pytest.mark.parametrize("grader", ["contains", "f1"])
def test_contains_and_f1_reject_a_different_number(grader):
    assert not grade(grader, "5", "-5").correct
    assert not grade(grader, "314", "3.14").correct


def test_a_punctuation_only_reference_is_refused_or_not_matched_by_an_empty_answer():
    """A reference of "-" (or "?") normalizes to "": the empty answer then matches."""
    assert not grade("normalized", "", "-").correct


# --- a valid JSONL file that does not load -----------------------------------------------------
def test_jsonl_with_a_line_separator_inside_a_string_loads(tmp_path: Path):
    """json.dumps(..., ensure_ascii=False) writes U+2028 raw; it is valid JSON and one JSON
    Lines record, but str.splitlines() cuts the line there."""
    rows = [{"id": "a", "question": "first\u2028line", "answer": "x"},
            {"id": "b", "question": "two", "answer": "y"}]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    task = load_task(f"jsonl:{p}")
    assert [q.id for q in task.questions()] == ["a", "b"]


# --- two numbers never merge into one, one number never reads as another ---------------------


def ok(name: str, answer: str, reference: str) -> bool:
    return grade(name, answer, reference).correct


GRADERS = ["normalized", "contains", "f1"]


@pytest.mark.parametrize("name", GRADERS)
@pytest.mark.parametrize(("answer", "reference"), [
    ("11-2", "1-12"),            # Nov 2 for Jan 12: the hyphen is deleted, both read "112"
    ("54", "5-4"),               # textmatch's own docstring: "5-4" is 5 and 4
    ("20260103", "2026-01-03"),  # a date as one number
    ("1)2", "12"),
    ("1_2", "12"),
    ("34", "3–4"),               # an en-dash range
])
def test_punctuation_between_digits_does_not_merge_two_numbers(name, answer, reference):
    assert not ok(name, answer, reference)


@pytest.mark.parametrize(("answer", "reference"), [
    ("12", "1, 2"),      # a list of two numbers (parse_number drops every comma and space)
    ("1, 2", "12"),
    ("10", "1 0"),
    ("23", "2 3"),
    ("5", "0,5"),        # "0,5" is not a thousands comma
    ("15", "1,5"),
])
def test_two_numbers_are_not_one_number_by_value(answer, reference):
    assert not ok("normalized", answer, reference)


@pytest.mark.parametrize("name", GRADERS)
@pytest.mark.parametrize(("answer", "reference"), [("2⁵", "25"), ("10²", "102")])
def test_a_power_is_not_its_digits_run_together(name, answer, reference):
    """NFKC turns a superscript into a plain digit: 2^5 = 32 reads as 25."""
    assert not ok(name, answer, reference)


@pytest.mark.parametrize("name", GRADERS)
def test_an_en_dash_minus_is_not_dropped_as_punctuation(name):
    """The provenance rule reads U+2013 as a minus sign (provenance._MINUS); the graders drop
    it, so "–5" is accepted for 5."""
    assert not ok(name, "–5", "5")


def test_a_long_answer_is_graded_in_linear_time():
    """parse_number runs `\\\\(?:text|mathrm)\\{[^}]*\\}` over the whole answer before its
    200-character cap (answers.py:78): "\\text{" repeated, no closing brace, scans to the end
    from every occurrence. 100,000 characters (the default answer_chars) take over a second
    on one core; 1,000,000 (a raised cap), minutes."""
    import time

    from whale.tasks.textmatch import same_text

    answer = "\\text{" * (100_000 // 6)
    t0 = time.process_time()
    same_text(answer, "5")
    assert time.process_time() - t0 < 0.3


@pytest.mark.parametrize(("answer", "reference"), [
    ("1,000", "1000"), ("10.00", "10"), ("1/2", "0.5"), ("1e3", "1000"), ("50%", "0.5"),
    ("-5", "−5"), ("–5", "-5"), ("Apollo 11", "apollo-11"), ("don't", "dont"),
])
def test_what_stays_equal(answer, reference):
    assert ok("normalized", answer, reference)
