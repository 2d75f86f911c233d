"""The Task protocol's optional capabilities (issue 22): `TaskBase` gives each a "not offered"
default, every built-in task inherits it, wrappers forward each capability of the task they
wrap, and the callers read them as plain attributes. The runs use a scripted model."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import whale
import whale.tasks
from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED
from whale.evaluation import evaluate
from whale.grading import grade
from whale.harness import Runtime
from whale.tasks import CAPABILITIES, Grade, Question, Task, TaskBase, WrappedTask, load_task
from whale.tasks.variants import RG_RULES, VariantTask


class Minimal(TaskBase):
    """A user's task: the four required members and nothing else."""

    name = "user:add"
    description = "Add two integers. Answer with the number only."

    def questions(self) -> list[Question]:
        return [Question(f"u{i}", f"What is {i} + {i}?", 2 * i) for i in range(3)]

    def grade(self, question: Question, answer: str) -> Grade:
        ok = answer.strip() == str(question.reference)
        return Grade(float(ok), ok)


def doubling(messages, sampling):  # the scripted solver: right on every question
    a = int(re.findall(r"\d+", messages[-1]["content"])[0])
    return str(2 * a)


def test_a_task_with_only_the_required_members_runs_through_evaluate():
    task = Minimal()
    res = evaluate(Runtime(model=ScriptedModel(doubling)), SEED, task, task.questions(), 2)
    assert [o.correct for o in res.outcomes] == [True, True, True]
    assert all(o.format_ok for o in res.outcomes)  # the default check: a non-blank answer
    assert all(o.retrieval_hit is None for o in res.outcomes)  # no gold passages, no hit rate


def test_the_defaults_say_not_offered():
    task, q = Minimal(), Minimal().questions()[0]
    assert task.retriever is None
    assert task.expected(q) is None
    assert task.format_ok(q, " 4 ") and not task.format_ok(q, "  \n")
    assert task.gold_passages(q) == []
    assert task.precheck(q, "4") is None
    assert task.jailed_grading(q, "4") is None
    assert grade(task, q, "0") == Grade(1.0, True)  # graded in process by the task's grade()


def test_a_subclass_without_a_grader_is_refused_when_made():
    class NoGrade(TaskBase):
        name, description = "user:none", "d"

        def questions(self) -> list[Question]:
            return []

    with pytest.raises(TypeError, match="grade"):
        NoGrade()  # type: ignore[abstract]


def test_the_capabilities_are_the_bases_optional_members():
    optional = {n for n in vars(TaskBase) if not n.startswith("_")} - {"questions", "grade"}
    assert optional == set(CAPABILITIES)


def _task_classes() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(whale.tasks.__path__, "whale.tasks."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls is not Task and cls.__module__ == module.__name__ and callable(getattr(cls, "questions", None)) \
                    and callable(getattr(cls, "grade", None)):  # fmt: skip
                found.append(cls)
    return found


def test_every_built_in_task_class_is_a_task_base():
    classes = _task_classes()
    names = {c.__name__ for c in classes}
    assert {"ReasoningGymTask", "MultiHopTask", "JudgedQATask", "MathTask", "VariantTask"} <= names
    assert [c.__name__ for c in classes if not issubclass(c, TaskBase)] == []


def test_the_built_in_tasks_keep_their_own_capabilities():
    mhqa = load_task("mhqa", size=2, seed=1, config={"passages": 2000})
    q = mhqa.questions()[0]
    assert mhqa.retriever is not None
    assert mhqa.gold_passages(q) == q.reference["supporting"] != []
    assert mhqa.expected(q) == q.reference["answer"]
    assert not mhqa.format_ok(q, "one\ntwo")  # its own check, not the default's
    rg = load_task("rg:basic_arithmetic", size=2)
    q = rg.questions()[0]
    assert rg.expected(q) == str(q.reference["answer"])
    assert not rg.format_ok(q, "The answer is 12.")


class Offering(TaskBase):
    """Every capability answers with a value of its own, never a default's."""

    name, description = "user:offering", "d"

    def questions(self) -> list[Question]:
        return [Question("o0", "What is 1 + 1?", {"answer": "2", "supporting": ["p1"]})]

    def grade(self, question: Question, answer: str) -> Grade:
        return Grade(0.25, False, "inner grade")

    @property
    def retriever(self):
        return self  # any object; the wrapper must hand out this one

    def expected(self, question):
        return "expected:" + question.id

    def format_ok(self, question, answer):
        return answer == "exactly this"

    def gold_passages(self, question):
        return ["p1", "p2"]

    def precheck(self, question, answer):
        return Grade(0.5, False, "precheck:" + answer)

    def jailed_grading(self, question, answer):
        return ("jail", question.id, answer)

    def retrieve(self, query, k):
        return []


def _read(task, name):
    q = Question("o0", "What is 1 + 1?", {"answer": "2"})
    member = getattr(task, name)
    if not callable(member) or name == "retriever":
        return member
    args = (q,) if name in ("expected", "gold_passages") else (q, "some answer")
    return member(*args)


def _wrappers(inner):
    from whale.analysis.diagnose import Excluding  # the diagnose command's pool wrapper

    rule = RG_RULES[sorted(RG_RULES)[0]]
    return {
        "WrappedTask": WrappedTask(inner),
        "VariantTask": VariantTask(inner, "rg:x", rule, 0),
        "Excluding": Excluding(inner, []),
    }


@pytest.mark.parametrize("wrapper", ["WrappedTask", "VariantTask", "Excluding"])
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_a_wrapper_forwards_each_capability(wrapper, capability):
    inner = Offering()
    outer = _wrappers(inner)[wrapper]
    assert _read(outer, capability) == _read(inner, capability)
    assert _read(outer, capability) != _read(Minimal(), capability)  # not the default's


def test_a_wrapper_forwards_the_required_members_too():
    inner = Offering()
    outer = WrappedTask(inner)
    q = inner.questions()[0]
    assert (outer.name, outer.description) == (inner.name, inner.description)
    assert outer.questions() == inner.questions()
    assert outer.grade(q, "x") == inner.grade(q, "x")


def test_evaluate_reads_the_tasks_own_format_check_and_gold_passages():
    class Checked(Offering):
        def precheck(self, question, answer):
            return None  # let grade() decide

        def jailed_grading(self, question, answer):
            return None

    task = Checked()
    res = evaluate(Runtime(model=ScriptedModel(["2"])), SEED, task, task.questions(), 1)
    (o,) = res.outcomes
    assert o.format_ok is False  # "2" is not "exactly this"
    assert o.retrieval_hit is False  # gold p1, p2 never retrieved
    assert o.feedback == "inner grade"


def test_grading_reads_the_tasks_precheck():
    task = Offering()
    q = task.questions()[0]
    assert grade(task, q, "abc") == Grade(0.5, False, "precheck:abc")


def test_no_capability_is_probed_with_getattr_in_the_package():
    names = "|".join(CAPABILITIES)
    probe = re.compile(rf"""getattr\([^)]*["']({names})["']""")
    root = Path(whale.__file__).parent
    found = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert found == []
