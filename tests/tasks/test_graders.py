"""Graders chosen by name (issue 23): each kind accepts and rejects the right answers, keeps the
raw score and the binary verifier; a user's `py:` grader meets hostile answers out of process
(the real jail: bwrap, nsjail where installed), where raising, hanging, allocating without
bound or returning NaN / a non-number is a recorded error and the next answers are graded."""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from whale import grading
from whale.config import ConfigError
from whale.evaluation import evaluate
from whale.harness import Budget, Runtime, Sandbox
from whale.harness.sandbox import nsjail_binary
from whale.tasks import Grade
from whale.tasks.graders import (
    JUDGE_MAX_CHARS,
    GradeOutOfProcess,
    JailedCall,
    build_grader,
    parse_grader,
)
from whale.tasks.registry import TaskRequest

JAILS = [k for k, ok in [("bwrap", shutil.which("bwrap")), ("nsjail", nsjail_binary())] if ok]
JAIL = JAILS[0] if JAILS else "bwrap"


def grader(spec, judge=None):
    return build_grader(parse_grader(spec), judge)


def verdict(spec, answer, reference, judge=None) -> Grade:
    return grader(spec, judge).grade("the question?", answer, reference)


@pytest.fixture(autouse=True, scope="module")
def _close_graders():
    yield
    grading.close_all()


# --- the built-in graders ------------------------------------------------------------------

ACCEPT_REJECT = [
    ("exact", "Paris", "  Paris\n", "paris"),
    ("normalized", "The Eiffel Tower", " the  EIFFEL tower!", "Eiffel Tower"),
    ("normalized", "São Paulo", "SÃO  PAULO.", "Sao Paulo"),
    ("numeric", "42", "\\boxed{42}", "43"),
    ("numeric", "0.5", "1/2", "0.51"),
    ("numeric", "1,000", "1000.", "100"),
    ("contains", "Paris", "It is Paris, France", "Comparisons"),
    ("f1", "the big red dog", "big red dog", "big red"),
    ({"name": "f1", "threshold": 0.5}, "big red dog", "big red", "a cat"),
    ({"name": "regex", "in_process": True}, r"4\d", " 42 ", "420"),
    ({"name": "regex", "in_process": True, "search": True}, r"\bok\b", "it is ok now", "okay"),
    ({"name": "regex", "in_process": True, "pattern": r"(?i)yes"}, "ignored", "YES", "no"),
]


@pytest.mark.parametrize("spec, reference, good, bad", ACCEPT_REJECT)
def test_each_grader_accepts_the_right_answer_and_rejects_the_wrong_one(spec, reference, good, bad):
    g, b = verdict(spec, good, reference), verdict(spec, bad, reference)
    assert g.correct and g.score >= 0.5, g
    assert not b.correct and b.score < 1.0, b


def test_a_list_reference_accepts_any_of_its_answers():
    assert verdict("normalized", "NYC", ["New York City", "NYC"]).correct
    assert not verdict("normalized", "Boston", ["New York City", "NYC"]).correct


def test_f1_keeps_the_raw_score_and_is_correct_only_at_its_threshold():
    partial = verdict("f1", "big red", "big red dog")
    assert partial.score == pytest.approx(0.8) and not partial.correct  # default threshold 1.0
    assert verdict({"name": "f1", "threshold": 0.8}, "big red", "big red dog").correct


def test_numeric_tolerances_are_absolute_and_relative():
    assert not verdict("numeric", "3.14", "3.14159").correct
    assert verdict({"name": "numeric", "tolerance": 0.01}, "3.14", "3.14159").correct
    assert verdict({"name": "numeric", "rel_tolerance": 0.01}, "990", "1000").correct
    assert not verdict({"name": "numeric", "rel_tolerance": 0.001}, "990", "1000").correct


@pytest.mark.parametrize("answer", ["The answer is 42", "42 or 43", "forty-two", ""])
def test_numeric_wants_the_number_alone(answer):
    assert not verdict("numeric", answer, "42").correct


@pytest.mark.parametrize("answer", ["1e999999999", "9" * 100_000, "1/1e999999999", "1e-99999999%"])
def test_numeric_refuses_numbers_that_would_take_minutes_to_build(answer):
    t0 = time.monotonic()
    assert not verdict("numeric", answer, "1").correct
    assert time.monotonic() - t0 < 1.0


def test_exact_is_case_sensitive_where_normalized_is_not():
    assert not verdict("exact", "paris", "Paris").correct
    assert verdict("normalized", "paris", "Paris").correct


# --- the judge -----------------------------------------------------------------------------


class FakeJudge:
    def __init__(self, reply: str = "CORRECT", fail: bool = False) -> None:
        self.reply, self.fail = reply, fail
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if self.fail:
            raise TimeoutError("judge down")
        return self.reply


def test_the_judge_grades_with_the_searchqa_rubric_by_default():
    judge = FakeJudge("INCORRECT")
    g = verdict("judge", "Lyon", "Paris", judge)
    assert g == Grade(0.0, False, "judge: INCORRECT")
    assert "multiple candidates" in judge.prompts[0] and "Lyon" in judge.prompts[0]


def test_a_judge_rubric_of_ones_own_replaces_the_searchqa_one():
    judge = FakeJudge("CORRECT")
    g = verdict({"name": "judge", "rubric": "CORRECT if it names the same city."}, "Paris!",
                ["Paris", "City of Light"], judge)  # fmt: skip
    assert g.correct and g.score == 1.0
    assert "CORRECT if it names the same city." in judge.prompts[0]
    assert "multiple candidates" not in judge.prompts[0]
    assert "Paris | City of Light" in judge.prompts[0]


def test_a_failing_judge_call_is_a_recorded_zero_with_a_custom_rubric():
    g = verdict({"name": "judge", "rubric": "r"}, "Paris", "Paris", FakeJudge(fail=True))
    assert g == Grade(0.0, False, "judge failed: TimeoutError")


def test_an_answer_too_long_for_the_judge_is_rejected_unsent():
    judge = FakeJudge("CORRECT")
    g = verdict("judge", "Paris " * JUDGE_MAX_CHARS, "Paris", judge)
    assert not g.correct and judge.prompts == []


def test_the_judge_grader_needs_a_judge():
    with pytest.raises(ConfigError, match="needs a judge model") as e:
        grader("judge", judge="qwen2.5-0.5b")  # a name is made a judge by the commands
    assert e.value.field == "task.config.judge"


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, field, message",
    [
        ("levenshtein", "task.config.grader", "unknown grader 'levenshtein'"),
        ({"tolerance": 1}, "task.config.grader.name", "expected a grader name"),
        ({"name": "numeric", "tolerence": 1}, "task.config.grader.tolerence", "unknown setting"),
        ({"name": "exact", "tolerance": 1}, "task.config.grader.tolerance", "no such setting"),
        ({"name": "f1", "threshold": 0}, "task.config.grader.threshold", r"in \(0, 1\]"),
        ({"name": "f1", "threshold": 1.5}, "task.config.grader.threshold", r"in \(0, 1\]"),
        ({"name": "numeric", "tolerance": -1}, "task.config.grader.tolerance", "at least 0"),
        ({"name": "numeric", "tolerance": float("nan")}, "task.config.grader.tolerance", "float"),
        ({"name": "regex", "pattern": "(unclosed"}, "task.config.grader.pattern", "not a regular"),
        ({"name": "regex", "search": "yes"}, "task.config.grader.search", "expected bool"),
        ({"name": "regex", "memory_mb": 8}, "task.config.grader.memory_mb", "at least 64"),
        ({"name": "regex", "timeout_s": 0}, "task.config.grader.timeout_s", r"in \(0, 3600\]"),
        ({"name": "regex", "timeout_s": 1e300}, "task.config.grader.timeout_s", r"3600\] sec"),
        (3, "task.config.grader", "expected a grader name or a table"),
    ],
)
def test_a_bad_grader_setting_is_a_config_error_naming_it(spec, field, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_grader(spec)
    assert e.value.field == field


def test_a_numeric_grader_refuses_a_reference_that_is_not_a_number():
    with pytest.raises(ValueError, match="not a number"):
        grader("numeric").check_reference("forty")


@pytest.mark.parametrize("reference", [None, {"a": 1}, True, "", [], ["ok", 3.5j]])
def test_a_built_in_grader_refuses_a_reference_it_cannot_compare(reference):
    with pytest.raises(ValueError):
        grader("normalized").check_reference(reference)


# --- the user's Python grader --------------------------------------------------------------

USER_GRADER = textwrap.dedent(
    """
    import math, time

    def score(question, answer, reference):
        if answer == "raise":
            raise KeyError("the answer was " + answer)
        if answer == "hang":
            while True:
                pass
        if answer == "sleep":
            time.sleep(3600)
        if answer == "allocate":
            hoard = []
            while True:
                hoard.append(bytearray(10**7))
        if answer == "nan":
            return math.nan
        if answer == "text":
            return "1.0"
        if answer == "seven":
            return 7
        if answer == "half":
            return 0.5
        return answer.strip() == str(reference)

    def peek(question, answer, reference):
        return float(open(DATA).read() != "")
    """
)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("user")
    data = d / "data.jsonl"  # a sibling of the grader: the references a jailed grader must not read
    data.write_text('{"question": "q", "answer": "secret"}\n')
    (d / "my_grader.py").write_text(USER_GRADER + f"\nDATA = {str(data)!r}\n")
    return d / "my_grader.py"


def py_grader(user_module: Path, name: str = "score", **settings):
    return grader({"name": f"py:{user_module}:{name}", **settings})


class OneQuestion:
    """Just what whale.grading reads of a task: its jailed spec for the answer."""

    def __init__(self, g, reference="4") -> None:
        self.g, self.reference = g, reference

    def precheck(self, q, answer):
        return None

    def jailed_grading(self, q, answer):
        return self.g.jailed("2 + 2?", answer, self.reference)

    def grade(self, q, answer):
        return self.g.grade("2 + 2?", answer, self.reference)


def jailed(g, answer, sandbox=JAIL) -> Grade:
    return grading.grade(OneQuestion(g), None, answer, sandbox)  # type: ignore[arg-type]


@pytest.mark.parametrize("sandbox", JAILS)
def test_a_user_grader_scores_out_of_process_by_default(user_module, sandbox):
    g = py_grader(user_module)
    spec = g.jailed("2 + 2?", "4", "4")
    assert isinstance(spec, JailedCall) and spec.kind == "call"
    with pytest.raises(GradeOutOfProcess):
        g.grade("2 + 2?", "4", "4")  # never in this process unless the user says so
    assert jailed(g, "4", sandbox) == Grade(1.0, True)
    assert jailed(g, "5", sandbox) == Grade(0.0, False)


HAZARDS = [
    ("raise", f"{grading.SCORER_ERROR}: KeyError"),
    ("hang", grading.TIMEOUT),
    ("sleep", grading.TIMEOUT),
    ("nan", grading.NOT_FINITE),
    ("text", grading.NOT_A_NUMBER),
    ("seven", grading.OUT_OF_RANGE),
]


@pytest.mark.parametrize("answer, feedback", HAZARDS)
def test_a_user_grader_that_fails_is_a_recorded_error_and_the_next_answer_is_graded(
    user_module, answer, feedback
):
    g = py_grader(user_module, timeout_s=1.0)
    t0 = time.monotonic()
    assert jailed(g, answer) == Grade(0.0, False, feedback)
    assert time.monotonic() - t0 < 1.0 + grading.REPLY_MARGIN_S
    assert jailed(g, "4") == Grade(1.0, True)


def test_a_user_grader_that_allocates_without_bound_is_stopped_by_the_memory_cap(user_module):
    g = py_grader(user_module, memory_mb=256, timeout_s=20.0)
    t0 = time.monotonic()
    got = jailed(g, "allocate")
    assert got.score == 0.0 and not got.correct
    assert got.feedback in (f"{grading.SCORER_ERROR}: MemoryError", grading.CRASHED), got
    assert time.monotonic() - t0 < 10  # the cap, not the 20 s timeout, ended it
    assert jailed(g, "4") == Grade(1.0, True)


def test_the_exception_text_never_comes_back_only_its_class(user_module):
    got = jailed(py_grader(user_module), "raise")
    assert "the answer was" not in got.feedback and got.feedback.endswith("KeyError")


def test_a_partial_score_is_kept_and_correct_only_at_the_threshold(user_module):
    assert jailed(py_grader(user_module), "half") == Grade(0.5, False)
    assert jailed(py_grader(user_module, threshold=0.5), "half") == Grade(0.5, True)


def test_the_jail_sees_the_grader_module_but_not_the_files_beside_it(user_module):
    # in process the grader can read the data file next to it; in the jail it is not there
    assert py_grader(user_module, "peek", in_process=True).grade("q", "a", "r").correct
    got = jailed(py_grader(user_module, "peek"), "anything")
    assert got == Grade(0.0, False, f"{grading.SCORER_ERROR}: FileNotFoundError")


def test_in_process_is_the_explicit_opt_in_and_records_the_same_errors(user_module):
    g = py_grader(user_module, in_process=True)
    assert g.jailed("q", "4", "4") is None
    assert g.grade("q", "4", "4") == Grade(1.0, True)
    assert g.grade("q", "nan", "4") == Grade(0.0, False, grading.NOT_FINITE)
    assert g.grade("q", "text", "4") == Grade(0.0, False, "grader returned a non-number (str)")
    raised = g.grade("q", "raise", "4")
    assert not raised.correct and raised.feedback.startswith("grader raised KeyError")


@pytest.mark.parametrize(
    "name, message",
    [("py:no_such_module_xyz:score", "cannot import no_such_module_xyz"),
     ("py:os:no_such_function", "has no 'no_such_function'"),
     ("py:os:sep", "is not callable"),
     ("py:os", "say which function")],
)  # fmt: skip
def test_a_user_grader_that_does_not_load_is_a_config_error_before_any_run(name, message):
    with pytest.raises(ConfigError, match=message) as e:
        grader(name)
    assert e.value.field == "task.config.grader"


def test_an_installed_module_is_not_bound_into_the_jail(tmp_path, monkeypatch):
    # "installed": its folder is one of the site folders the jail mounts anyway
    from whale.tasks import graders

    site = tmp_path / "site-packages"
    (site / "installed_grader_pkg").mkdir(parents=True)
    (site / "installed_grader_pkg" / "__init__.py").write_text(
        "def same(question, answer, reference):\n    return answer == reference\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(graders, "_site_folders", lambda: [site])
    real = grading.site_folders
    monkeypatch.setattr(grading, "site_folders", lambda: [*real(), str(site)])
    g = grader("py:installed_grader_pkg:same")
    spec = g.jailed("q", "4", "4")
    assert spec is not None and spec.mounts == ()
    assert jailed(g, "4") == Grade(1.0, True) and jailed(g, "5") == Grade(0.0, False)


def test_a_user_package_is_bound_whole_and_imported_by_its_dotted_name(tmp_path, monkeypatch):
    pkg = tmp_path / "user_grader_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from user_grader_pkg.sub.rules import same\n")
    (pkg / "sub" / "rules.py").write_text("def same(q, a, r):\n    return a == r\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = grader("py:user_grader_pkg.sub:same")
    spec = g.jailed("q", "4", "4")
    assert spec is not None and spec.mounts == ((str(pkg), "/whale/user/user_grader_pkg"),)
    assert jailed(g, "4") == Grade(1.0, True) and jailed(g, "5") == Grade(0.0, False)


# --- regex answers are hostile too ---------------------------------------------------------


def test_a_catastrophic_regex_answer_times_out_and_the_next_is_graded():
    g = grader({"name": "regex", "pattern": "(a|a)*b", "timeout_s": 1.0})
    t0 = time.monotonic()
    assert jailed(g, "a" * 40) == Grade(0.0, False, grading.TIMEOUT)  # 2**40 steps in re
    assert time.monotonic() - t0 < 1.0 + grading.REPLY_MARGIN_S
    assert jailed(g, "aab") == Grade(1.0, True)


def test_a_regex_reference_is_graded_out_of_process_by_default():
    g = grader("regex")
    with pytest.raises(GradeOutOfProcess):
        g.grade("q", "42", r"4\d")
    assert grading.grade(OneQuestion(g, r"4\d"), None, "42", JAIL).correct  # type: ignore[arg-type]
    assert not grading.grade(OneQuestion(g, r"4\d"), None, "4", JAIL).correct  # type: ignore[arg-type]


# --- through evaluate(): every run is recorded and graded ----------------------------------


def test_evaluate_records_each_user_grader_failure_and_grades_the_rest(user_module, tmp_path):
    from whale.tasks import load_task

    data = tmp_path / "q.jsonl"
    answers = ["4", "raise", "nan", "hang", "text", "5"]
    data.write_text("".join(f'{{"id": "{a}", "question": "say {a}", "answer": "4"}}\n'
                            for a in answers))  # fmt: skip
    task = load_task(f"jsonl:{data}", size=len(answers),
                     config={"grader": {"name": f"py:{user_module}:score", "timeout_s": 1.0}})  # fmt: skip
    source = "def run(question, env):\n    return question.split()[-1]\n"
    rt = Runtime(model=ScriptedModel(), budget=Budget(run_timeout_s=30), sandbox=Sandbox(JAIL))
    result = evaluate(rt, source, task, task.questions(), workers=2)
    by_id = {o.question_id: o for o in result.outcomes}
    assert [by_id[a].status for a in answers] == ["ok"] * len(answers)
    assert (by_id["4"].score, by_id["4"].correct) == (1.0, True)
    assert by_id["raise"].feedback == f"{grading.SCORER_ERROR}: KeyError"
    assert by_id["nan"].feedback == grading.NOT_FINITE
    assert by_id["hang"].feedback == grading.TIMEOUT
    assert by_id["text"].feedback == grading.NOT_A_NUMBER
    assert (by_id["5"].score, by_id["5"].correct, by_id["5"].feedback) == (0.0, False, "")


def test_a_py_grader_gets_the_question_text_not_the_prompt_with_the_instruction(tmp_path):
    (tmp_path / "echo_grader.py").write_text(
        "def score(question, answer, reference):\n    return question == 'What is 2 + 2?'\n"
    )
    from whale.tasks.files import file_task

    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": 4}\n')
    req = TaskRequest(f"jsonl:{data}", str(data), 10, 0,
                      {"instruction": "Digits only.", "grader": {
                          "name": f"py:{tmp_path / 'echo_grader.py'}:score", "in_process": True}})  # fmt: skip
    task = file_task(req, "jsonl")
    (q,) = task.questions()
    assert q.prompt.endswith("Digits only.") and task.grade(q, "4").correct
