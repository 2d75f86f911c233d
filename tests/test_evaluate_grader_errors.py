"""evaluate() grades on threads of its own (issue 20); a grader that raises must still end the
call with its error, as it did when grading ran in the calling thread (the hostile review
found it waiting forever for the grade that raised)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.evaluation import evaluate
from whale.harness import Runtime


class _Raising(SumTask):
    def grade(self, q, answer):  # type: ignore[no-untyped-def]
        if q.id == "s1":
            raise RuntimeError("scorer bug")
        return super().grade(q, answer)


def test_a_grader_that_raises_ends_evaluate_with_its_error():
    task = _Raising(n=4)
    ended: list[str] = []

    def go() -> None:
        try:
            evaluate(Runtime(model=prose_solver()), SEED, task, task.questions(), 2)
            ended.append("returned")
        except RuntimeError as e:
            ended.append(str(e))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)  # a hang guard only: the error comes back as soon as the runs are graded
    assert ended == ["scorer bug"]


def test_a_grader_error_stops_new_runs_and_keeps_those_paid_for():
    # The second hostile review: while evaluate() waited for a slow grade before raising a
    # grader's error, the stream kept starting runs, and 21 were paid for, 2 recorded.
    paid: list[int] = []

    def reply(messages, sampling):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        paid.append(1)
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"{a + b}"

    class Slow(SumTask):
        def grade(self, q, answer):  # type: ignore[no-untyped-def]
            if q.id == "s0":
                raise RuntimeError("scorer bug")
            if q.id == "s1":
                time.sleep(3)  # a jailed grade running to its timeout
            return super().grade(q, answer)

    task, recorded = Slow(n=24), []
    with pytest.raises(RuntimeError, match="scorer bug"):
        evaluate(Runtime(model=ScriptedModel(reply)), SEED, task, task.questions(), 2,
                 on_done=lambda o, t: recorded.append(o.question_id))  # fmt: skip
    # lost: the run whose grade raised, and at most the 2 workers' runs in flight at the close
    assert len(paid) - len(recorded) <= 3, (len(paid), recorded)
