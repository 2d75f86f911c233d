"""evaluate() grades on threads of its own (issue 20); a grader that raises must still end the
call with its error, as it did when grading ran in the calling thread (the hostile review
found it waiting forever for the grade that raised)."""

from __future__ import annotations

import threading

from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.evaluate import evaluate
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
