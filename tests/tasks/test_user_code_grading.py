"""A user task's own grade() (and a `py:` grader) is user code that meets untrusted answers:
an answer that makes it raise is a recorded zero grade and the evaluation goes on; a Grade whose
`correct` is not true/false is refused (accuracy stays the binary verifier's); an exception's
message never becomes feedback (it may quote the reference, and feedback reaches x_t)."""

from __future__ import annotations

import textwrap

import pytest

from whale.evaluation import evaluate
from whale.harness import Runtime
from whale.tasks import load_task
from whale.tasks.graders import build_grader, parse_grader

TASKS = textwrap.dedent('''
    from whale.tasks import Grade, Question, TaskBase

    class Numbers(TaskBase):
        name = "numbers"
        description = "Answer with a number."

        def questions(self):
            return [Question(f"n{i}", f"Say {i}.", i) for i in range(3)]

        def grade(self, q, answer):
            ok = float(answer) == q.reference      # raises on a non-number: user code
            return Grade(float(ok), ok)

    class Partial(Numbers):
        def grade(self, q, answer):
            s = 0.5                                 # a partial score handed as `correct`
            return Grade(s, s)

    task = Numbers()
    partial = Partial()
''')

HOSTILE = "def run(question, env):\n    return 'not a number'\n"


@pytest.fixture
def tasks_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "usertasks.py").write_text(TASKS)
    return tmp_path / "usertasks.py"


def test_a_hostile_answer_that_makes_a_py_task_grade_raise_is_a_recorded_error(tasks_file):
    task = load_task(f"py:{tasks_file}")
    rt = Runtime()
    try:
        ev = evaluate(rt, HOSTILE, task, task.questions(), 2)  # raises ValueError today
    finally:
        rt.close()
    assert [o.correct for o in ev.outcomes] == [False, False, False]
    assert all(o.feedback == "grader error: ValueError" for o in ev.outcomes)


def test_a_non_bool_correct_is_refused_not_averaged(tasks_file):
    task = load_task(f"py:{tasks_file}:partial")
    rt = Runtime()
    try:
        ev = evaluate(rt, "def run(question, env):\n    return '1'\n", task, task.questions(), 2)
    finally:
        rt.close()
    # the binary verifier must be 0/1: accuracy 0.5 here would be a mean partial score
    assert ev.accuracy == 0.0
    assert all("not True/False" in o.feedback for o in ev.outcomes)


def test_an_in_process_grader_s_exception_message_is_not_the_feedback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g_review.py").write_text(textwrap.dedent('''
        def score(question, answer, reference):
            assert answer.strip() == reference, f"expected {reference}"
            return True
    '''))
    g = build_grader(parse_grader({"name": "py:g_review.py:score", "in_process": True}))
    grade = g.grade("What is the secret?", "guess", "SECRET-REFERENCE-4711")
    assert not grade.correct
    assert "SECRET-REFERENCE-4711" not in grade.feedback, grade.feedback
