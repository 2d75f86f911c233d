"""One test per WHALE rubric category, accepted and rejected."""

import json

import pytest

from whale.tasks import load_task
from whale.tasks.judged import rubric_grade


def test_accepts_an_alias():
    g = rubric_grade("JFK", "John F. Kennedy", ["JFK"])
    assert g.correct and g.feedback == "accept: alias"


def test_accepts_an_abbreviation():
    g = rubric_grade("NASA", "National Aeronautics and Space Administration")
    assert g.correct and g.feedback == "accept: abbreviation"


def test_accepts_punctuation_differences():
    assert rubric_grade("Washington, D.C.", "washington dc").correct


def test_accepts_the_reference_contained_in_a_date():
    g = rubric_grade("April 15, 1912", "1912")
    assert g.correct and g.feedback == "accept: contained in a date or place"


def test_accepts_the_reference_contained_in_a_place():
    assert rubric_grade("Paris, France", "Paris").correct


def test_accepts_unit_variations():
    g = rubric_grade("26.2 miles", "26.2 mi")
    assert g.correct and g.feedback == "accept: unit variation"


def test_rejects_multiple_candidates():
    g = rubric_grade("Paris or Lyon", "Paris")
    assert not g.correct and g.feedback == "reject: multiple candidates"


def test_rejects_a_contradictory_entity():
    g = rubric_grade("not Paris", "Paris")
    assert not g.correct and g.feedback == "reject: contradictory entity"
    assert not rubric_grade("Paris Hilton", "Paris").correct


def test_rejects_passage_dumping():
    dump = "Paris is the capital of France. " * 6
    g = rubric_grade(dump, "Paris")
    assert not g.correct and g.feedback == "reject: passage dumping"


def test_rejects_no_commitment():
    g = rubric_grade("I don't know", "Paris")
    assert not g.correct and g.feedback == "reject: no commitment"


def test_searchqa_file_builds_corpus_and_answer_bearing_golds(tmp_path):
    rec = {
        "id": "7",
        "question": "This city is the capital of France",
        "answer": "Paris",
        "search_results": [
            {"title": "A", "snippet": "Paris is the capital."},
            {"title": "B", "snippet": "Lyon is big."},
        ],
    }
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    task = load_task(f"searchqa:{path}")
    (q,) = task.questions()
    assert q.reference["supporting"] == ["q7-s0"] and len(task.passages) == 2
    assert task.grade(q, "Paris, France").correct and not task.grade(q, "Paris or Lyon").correct


def test_llm_judge_decides_and_falls_back_to_rules_on_a_bad_reply():
    from whale.tasks.judged import RubricJudge

    prompts = []
    judge = RubricJudge(lambda p: prompts.append(p) or "INCORRECT")
    assert (
        not judge.grade("q", "Paris", "Paris", []).correct
        and "Reference answer: Paris" in prompts[0]
    )
    odd = RubricJudge(lambda p: "maybe").grade("q", "Paris", "Paris", [])
    assert odd.correct and "judge said 'maybe'" in odd.feedback
    boom = RubricJudge(lambda p: 1 / 0).grade("q", "Lyon", "Paris", [])
    assert not boom.correct and "judge failed" in boom.feedback


@pytest.mark.parametrize("title", ["No Country for Old Men", "Never Let Me Go"])
def test_an_exact_title_with_a_negation_word_is_accepted(title):
    # Before: the negation rule ran first and called these a "contradictory entity".
    g = rubric_grade(title, title)
    assert g.correct and g.feedback == "accept: exact"


def test_an_exact_title_with_a_no_commitment_word_is_accepted():
    # Before: "unknown" tripped the no-commitment rule first.
    g = rubric_grade("The Unknown Soldier", "The Unknown Soldier")
    assert g.correct and g.feedback == "accept: exact"


def test_an_alias_with_a_negation_word_is_accepted():
    g = rubric_grade("Never Let Me Go", "NLMG", ["Never Let Me Go"])
    assert g.correct and g.feedback == "accept: alias"


def test_a_negation_outside_a_title_is_still_a_contradiction():
    g = rubric_grade("not Never Let Me Go", "Never Let Me Go")
    assert not g.correct and g.feedback == "reject: contradictory entity"


def test_unknown_is_still_no_commitment_when_it_is_not_the_answer():
    g = rubric_grade("unknown", "The Unknown Soldier")
    assert not g.correct and g.feedback == "reject: no commitment"


def test_searchqa_gold_snippets_need_the_answer_as_whole_words(tmp_path):
    # Before: "paris" in "comparisons" made snippet 1 answer-bearing, inflating retrieval accuracy.
    rec = {
        "id": "8",
        "question": "This city is the capital of France",
        "answer": "Paris",
        "search_results": [
            {"title": "A", "snippet": "Paris is the capital."},
            {"title": "B", "snippet": "Comparisons of European capitals."},
        ],
    }
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (q,) = load_task(f"searchqa:{path}").questions()
    assert q.reference["supporting"] == ["q8-s0"]
