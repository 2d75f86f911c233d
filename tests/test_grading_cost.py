"""What a hostile answer may cost grading (issue 20, "Grading cost of a hostile answer").

`((((9**99)**99)**99)**99)**99` passed the sympy screen (its "no power towers" check read only
`a**b**c`) and cost the full 10 s grading timeout; answers of one dataset were graded one at a
time whatever `--workers` was. The screen now bounds powers structurally
(`whale.tasks.expr_bounds`), and the jailed grader scores up to the run's workers at once.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.fakes import ScriptedModel
from whale import grading
from whale.evaluation import evaluate
from whale.harness import Budget, Runtime, Sandbox
from whale.harness.sandbox import nsjail_binary
from whale.tasks import load_task, rg
from whale.tasks.expr_bounds import bounded_powers

TOWER = "((((9**99)**99)**99)**99)**99"  # the issue's answer: 9 to the 99**5, 9.5e9 digits
KIND = "nsjail" if nsjail_binary() is not None else "bwrap"


@pytest.fixture(autouse=True)
def _fresh_graders():
    grading.close_all()  # each test reads the peak of graders it started itself
    yield
    grading.close_all()


# --- the screen ----------------------------------------------------------------------------


def test_the_issues_parenthesized_tower_is_refused_by_the_screen():
    task = load_task("rg:countdown", size=2, seed=0)
    q = task.questions()[0]
    assert not rg.plain_expression(TOWER)
    g = grading.grade(task, q, TOWER, KIND)
    assert g == grading.Grade(0.0, False, grading.REJECTED)
    assert grading.live_zygotes() == []  # refused before any jail: nothing was sent


@pytest.mark.parametrize(
    "answer",
    [
        "(((9^99)^99)^99)",  # the same tower in ^
        "((9**99)**(99))**99",  # parenthesized exponents
        "9**(99*99*99)",  # a product in the exponent: 9**970299
        "9**(99/0.001)",  # a division in the exponent
        "9**(-(-99*99))",  # unary signs in the exponent
        "((-(-(9**99)))**99)**99",  # a tower behind signs
        "((9**99)*(9**99))**99",  # a product raised again: 117612 bits
        "(9**99 9**99)**99",  # juxtaposition read as a product
        "((x+1)**99+1)**99",  # an expansion of 9801 terms
        "(a+b+c+d+e+f+g+h)**99",  # 2.3e10 terms
        "exp(exp(exp(9)))",  # countdown's float() and puzzle24's int() evaluate it
        "sinh(sinh(sinh(9)))",
        "exp(1/(31415926535897932384626433832795028841-pi*10**37))",  # e to a huge 1/tiny
        "2**(1/x)",  # an exponent that may divide by 0
        "(" * 400 + "1" + ")" * 400,  # deeper than the bound reads
    ],
)
def test_powers_that_grow_past_the_bound_are_refused_whatever_the_parenthesization(answer):
    assert not rg.plain_expression(answer)


@pytest.mark.parametrize(
    "answer",
    ["(9**99)**99", "(x+1)**99", "x**(3/2)", "exp(-x**2/2)", "2 x^2 + 3x - 1",
     "-6*x**5 + 3*x**2/2 + C", "sqrt(x)**3", "log(x, 2)", "9**(200-150)", "(x+y+z)**40",
     "(sin(x)+cos(x)+tan(x))**30"],
)  # fmt: skip
def test_bounded_powers_pass(answer):
    assert bounded_powers(answer)


# --- grading in parallel -------------------------------------------------------------------

# passes the screen, yet sympy simplifies its derivative for minutes: each grade lasts the
# grader's timeout, so grades that run at once overlap for all of it
SLOW = "(sin(x)+cos(x)+tan(x))**30"


def slow_eval(monkeypatch, workers: int, timeout_s: float = 1.0):
    monkeypatch.setattr(grading, "LIMITS", grading.GradingLimits(timeout_s=timeout_s))
    task = load_task("rg:simple_integration", size=4, seed=0)
    rt = Runtime(model=ScriptedModel(), budget=Budget(run_timeout_s=20), sandbox=Sandbox(KIND))
    try:
        # in the question's own variable (x or X), else its derivative is 0 at once
        source = ("def run(question, env):\n    v = 'X' if 'X' in question.splitlines()[0] else 'x'\n"
                  f"    return {SLOW!r}.replace('x', v)\n")  # fmt: skip
        return evaluate(rt, source, task, task.questions(), workers=workers)
    finally:
        rt.close()


@pytest.mark.skipif(not (nsjail_binary() or shutil.which("bwrap")), reason="no jail installed")
def test_a_datasets_answers_are_graded_in_parallel_up_to_the_workers(monkeypatch):
    # Each grade lasts its 4 s timeout, so grades that start up to 4 s apart (the runs end at
    # different times on a loaded machine) still overlap: a count, with room for the load.
    result = slow_eval(monkeypatch, workers=4, timeout_s=4.0)
    assert [o.feedback for o in result.outcomes] == [grading.TIMEOUT] * 4
    assert grading.peak_parallel() > 1  # the grader said several answers were scoring at once
    assert grading.peak_parallel() <= 4


@pytest.mark.skipif(not (nsjail_binary() or shutil.which("bwrap")), reason="no jail installed")
def test_one_worker_grades_one_answer_at_a_time(monkeypatch):
    result = slow_eval(monkeypatch, workers=1)
    assert [o.feedback for o in result.outcomes] == [grading.TIMEOUT] * 4
    assert grading.peak_parallel() == 1


# --- the reply protocol --------------------------------------------------------------------


def test_replies_are_read_by_line_and_matched_by_id():
    r, w = os.pipe()
    try:
        os.write(w, b"7 2 ok 1.0\n3 1 timeout\n")
        lines = grading._Lines(r)
        got = [grading._split_reply(lines.next(None)) for _ in range(2)]
        assert got == [(7, 2, b"ok 1.0"), (3, 1, b"timeout")]
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("line", [b"ok 1.0", b"x 1 ok 1.0", b"7 ok", b"-1 1 ok 1.0", b""])
def test_a_reply_out_of_form_breaks_the_grader(line):
    with pytest.raises(grading._Broken):
        grading._split_reply(line)


def test_an_over_long_reply_line_breaks_the_grader():
    r, w = os.pipe()
    try:
        os.write(w, b"1 1 ok " + b"9" * 100 + b"\n")
        with pytest.raises(grading._Broken):
            grading._Lines(r).next(None)
    finally:
        os.close(r)
        os.close(w)
