"""evaluate() grades on threads of its own (issue 20). A grader that raises meets an answer it
cannot read (issue 23: a task's grade may be the user's code, and every answer is untrusted):
that outcome is a recorded error, evaluate returns (the hostile review of issue 20 found it
waiting forever for the grade that raised), and every run paid for is recorded."""

from __future__ import annotations

import re
import threading
import time

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.evaluation import evaluate
from whale.harness import Runtime


class _Raising(SumTask):
    def grade(self, q, answer):  # type: ignore[no-untyped-def]
        if q.id == "s1":
            raise RuntimeError("scorer bug")
        return super().grade(q, answer)


def test_a_grader_that_raises_is_that_outcome_s_recorded_error():
    task = _Raising(n=4)
    ended: list[object] = []

    def go() -> None:
        ended.append(evaluate(Runtime(model=prose_solver()), SEED, task, task.questions(), 2))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)  # a hang guard only
    (ev,) = ended
    by_id = {o.question_id: o for o in ev.outcomes}  # type: ignore[attr-defined]
    assert len(by_id) == 4 and by_id["s1"].feedback == "grader error: RuntimeError"
    assert not by_id["s1"].correct
    # the others still graded by the task
    assert not any(o.feedback.startswith("grader error") for q, o in by_id.items() if q != "s1")


def test_a_grader_error_loses_no_run_paid_for():
    # The second hostile review of issue 20: while evaluate() waited for a slow grade before
    # raising a grader's error, the stream kept starting runs, 21 paid for and 2 recorded.
    paid: list[int] = []

    def reply(messages, sampling):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        paid.append(1)
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"{a + b}"

    class Slow(SumTask):
        def grade(self, q, answer):  # type: ignore[no-untyped-def]
            if q.id == "s0":
                raise RuntimeError("scorer bug")
            if q.id == "s1":
                time.sleep(1)  # a slow grade
            return super().grade(q, answer)

    task, recorded = Slow(n=12), []
    ev = evaluate(Runtime(model=ScriptedModel(reply)), SEED, task, task.questions(), 2,
                  on_done=lambda o, t: recorded.append(o.question_id))  # fmt: skip
    assert len(paid) == len(recorded) == len(ev.outcomes) == 12
    assert [o.feedback for o in ev.outcomes if o.question_id == "s0"] == [
        "grader error: RuntimeError"]
