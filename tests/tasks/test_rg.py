"""The Reasoning Gym adapter over every family the package offers.

Grading goes through `whale.grading.grade`, as the evaluator's does: in process for the audited
scorers, in the grading jail for the others (whose `task.grade` refuses to run them here)."""

import pytest

from whale import grading
from whale.tasks import UnknownTask, load_task, rg
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


@pytest.fixture(autouse=True, scope="module")
def _close_graders():
    yield
    grading.close_all()  # leave no jailed grader running after these tests


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
            got = grading.grade(task, q, str(ref))
            assert got.correct, f"{family}: reference graded wrong: {got}"
        wrong = grading.grade(task, q, WRONG)
        assert not wrong.correct and wrong.score < 1.0


def test_family_with_no_reference_answer_is_graded_by_the_scorer():
    # Families with answer=None are graded by the package's scorer from metadata.
    none_families = []
    for family in families():
        task = load_task(f"rg:{family}", size=1, seed=0, config=CONFIGS.get(family))
        if task.questions()[0].reference["answer"] is None:
            none_families.append(family)
            assert not grading.grade(task, task.questions()[0], WRONG).correct
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


@pytest.mark.parametrize("family", sorted(rg.JAILED))
def test_jailed_family_refuses_to_grade_in_process(family):
    task = load_task(f"rg:{family}", size=1, seed=0, config=CONFIGS.get(family))
    with pytest.raises(rg.GradeInJail, match=f"rg:{family} is graded out of process"):
        task.grade(task.questions()[0], "1")


def test_composite_screens_each_entry_by_its_own_family():
    # A composite of countdown: the entry's source family decides the screen.
    config = {"datasets": [{"name": "countdown", "weight": 1, "config": {}}]}
    task = load_task("rg:composite", size=2, seed=0, config=config)
    q = task.questions()[0]
    spec = task.jailed_grading(q, 'exec("import os") or 1')
    assert spec is not None and spec.screen == "sympy"
    assert grading.grade(task, q, 'exec("import os") or 1').feedback == grading.REJECTED


def test_config_that_is_not_plain_data_is_refused():
    with pytest.raises(UnknownTask, match="plain data"):
        load_task("rg:basic_arithmetic", config={"min_terms": object()})
