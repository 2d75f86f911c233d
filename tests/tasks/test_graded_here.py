"""The guard around a task's own code on an untrusted answer (tasks.base.graded_here and
checked_grade, grading.grade, evaluation.outcome_of): `grade()`, `precheck`, `jailed_grading`
and `format_ok` that raise (SystemExit too) or return what is not a plain binary Grade give a
zero grade, never an error out of evaluate."""

from __future__ import annotations

import sys

from whale import grading
from whale.evaluation import outcome_of
from whale.harness.trajectory import Trajectory
from whale.tasks import Grade, Question, TaskBase

Q = Question("q0", "Say 1.", 1)


class _Task(TaskBase):
    name = "hostile"
    description = "Answer with a number."

    def questions(self):
        return [Q]

    def grade(self, q, answer):
        return Grade(1.0, True)


def _outcome(task, answer="1"):
    return outcome_of(task, Q, Trajectory("q0", "h", answer=answer))


def test_a_huge_int_score_is_a_zero_grade_not_an_overflow():
    """float(10**400) raises OverflowError outside graded_here's try (base.py:67)."""
    class Huge(_Task):
        def grade(self, q, answer):
            return Grade(10**400, True)

    o = _outcome(Huge())
    assert not o.correct and o.score == 0.0


def test_a_grade_whose_correct_property_raises_is_a_zero_grade():
    """g.correct is read outside the try (base.py:59)."""
    class Raising(Grade):
        @property
        def correct(self):  # type: ignore[override]
            raise RuntimeError("boom")

    class T(_Task):
        def grade(self, q, answer):
            g = object.__new__(Raising)
            object.__setattr__(g, "score", 1.0)
            object.__setattr__(g, "feedback", "")
            return g

    o = _outcome(T())
    assert not o.correct


def test_a_precheck_grade_with_a_partial_correct_is_refused_like_grade_s():
    """precheck's verdict is returned unchecked (grading.py:126): a partial score handed as
    `correct` turns accuracy into a mean score, what graded_here refuses for grade()."""
    class T(_Task):
        def precheck(self, q, answer):
            return Grade(0.5, 0.5)  # type: ignore[arg-type]

    o = _outcome(T())
    assert o.correct is False


def test_a_precheck_that_returns_no_grade_is_a_zero_grade_not_a_crash():
    class T(_Task):
        def precheck(self, q, answer):
            return "rejected"

    o = _outcome(T())
    assert o.correct is False


def test_a_grade_that_calls_sys_exit_does_not_end_whale():
    """SystemExit is not an Exception: graded_here lets it through and the evaluation (and the
    whole search) ends. The docs promise "an exception is a zero grade"."""
    class T(_Task):
        def grade(self, q, answer):
            sys.exit(3)

    o = _outcome(T())
    assert not o.correct


def test_jailed_grading_raising_is_a_zero_grade():
    """jailed_grading is the task's own code too (a capability a py: task may override), run
    on the untrusted answer outside any guard (grading.py:128)."""
    class T(_Task):
        def jailed_grading(self, q, answer):
            return int(answer)  # raises on "x"

    g = grading.grade(T(), Q, "x")
    assert not g.correct
