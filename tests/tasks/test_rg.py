"""The Reasoning Gym adapter over every family the package offers."""

import pytest

from whale.tasks import UnknownTask, load_task
from whale.tasks.rg import families

WRONG = "\u2603 definitely not the answer \u2603"
CONFIGS = {
    "composite": {
        "datasets": [
            {"name": "basic_arithmetic", "weight": 1, "config": {}},
            {"name": "maze", "weight": 1, "config": {}},
        ]
    }
}


def test_there_are_over_100_families():
    assert len(families()) >= 100


@pytest.mark.parametrize("family", families())
def test_family_grades_reference_right_and_nonsense_wrong(family):
    task = load_task(f"rg:{family}", size=3, seed=7, config=CONFIGS.get(family))
    qs = task.questions()
    assert len(qs) == 3 and len({q.id for q in qs}) == 3
    for q in qs:
        ref = q.reference["answer"]
        if ref is not None:
            assert task.grade(q, str(ref)).correct, f"{family}: reference graded wrong"
        wrong = task.grade(q, WRONG)
        assert not wrong.correct and wrong.score < 1.0


def test_family_with_no_reference_answer_is_graded_by_the_scorer():
    # Families with answer=None are graded by the package's scorer from metadata.
    none_families = []
    for family in families():
        task = load_task(f"rg:{family}", size=1, seed=0, config=CONFIGS.get(family))
        if task.questions()[0].reference["answer"] is None:
            none_families.append(family)
            assert not task.grade(task.questions()[0], WRONG).correct
    assert none_families, "expected at least one family without a single reference answer"


def test_partial_score_is_kept_but_not_correct():
    task = load_task("rg:basic_arithmetic", size=20, seed=1)
    grades = [task.grade(q, str(q.reference["answer"]) + "0") for q in task.questions()]
    assert all(not g.correct for g in grades)
    assert all(0.0 <= g.score < 1.0 for g in grades)


def test_same_seed_same_questions():
    a = [q.prompt for q in load_task("rg:maze", size=5, seed=3).questions()]
    b = [q.prompt for q in load_task("rg:maze", size=5, seed=3).questions()]
    assert a == b


def test_config_overrides_reach_the_family():
    task = load_task("rg:basic_arithmetic", size=5, seed=0, config={"min_terms": 5, "max_terms": 5})
    assert all(q.reference["metadata"]["num_terms"] == 5 for q in task.questions())


def test_unknown_family_is_named():
    with pytest.raises(UnknownTask, match="no_such_family"):
        load_task("rg:no_such_family")


def test_unknown_config_field_is_named():
    with pytest.raises(UnknownTask, match="bogus"):
        load_task("rg:basic_arithmetic", config={"bogus": 1})


def test_unknown_task_kind_is_named():
    with pytest.raises(UnknownTask, match="nope:thing"):
        load_task("nope:thing")


def test_composite_without_datasets_says_what_it_needs():
    with pytest.raises(UnknownTask, match="datasets="):
        load_task("rg:composite")


def test_game_of_life_halting_rejects_the_opposite_word():
    task = load_task("rg:game_of_life_halting", size=6, seed=7)
    for q in task.questions():
        opposite = "False" if q.reference["answer"] == "True" else "True"
        assert not task.grade(q, opposite).correct
