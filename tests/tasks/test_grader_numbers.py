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
