"""The task registry (issue 22): `load_task` dispatches through it, `whale tasks` prints it,
and `register_task` adds a user's task (the door issue 23 uses)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from whale.tasks import (
    DuplicateTask,
    Grade,
    Question,
    TaskBase,
    TaskRequest,
    UnknownTask,
    load_task,
    register_task,
    task_ids,
)
from whale.tasks import registry as reg


@pytest.fixture
def fresh(monkeypatch):
    """The built-in registry copied, so that a test's registrations end with it."""
    copy = reg.TaskRegistry(reg.REGISTRY.entries())
    monkeypatch.setattr(reg, "REGISTRY", copy)
    return copy


class Counting(TaskBase):
    description = "Count to n."

    def __init__(self, req: TaskRequest) -> None:
        self.name, self.req = req.id, req
        self._qs = [Question(f"{req.id}:{i}", f"Say {i}.", str(i)) for i in range(req.size)]

    def questions(self) -> list[Question]:
        return list(self._qs)

    def grade(self, question: Question, answer: str) -> Grade:
        ok = answer.strip() == question.reference
        return Grade(float(ok), ok)


def _whale_tasks_lines() -> list[str]:
    from whale.cli import app

    result = CliRunner().invoke(app, ["tasks"])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_whale_tasks_prints_the_registry_in_order():
    lines = _whale_tasks_lines()
    assert [ln.split()[0] for ln in lines] == [p for p, _ in task_ids()]
    assert all(ln.endswith(d) for ln, (_, d) in zip(lines, task_ids(), strict=True))


def test_task_ids_are_the_registry_entries():
    assert task_ids() == [(e.pattern, e.description) for e in reg.REGISTRY.entries()]
    assert [p for p, _ in task_ids()][:2] == ["rg:FAMILY", "mhqa"]


def test_an_unknown_id_names_every_registered_pattern():
    with pytest.raises(UnknownTask, match="unknown task 'nope:thing'") as e:
        load_task("nope:thing")
    assert all(p in str(e.value) for p, _ in task_ids())


@pytest.mark.parametrize("task_id", ["rg:", "mhqa:extra", "champ:x", "math"])
def test_an_id_of_the_wrong_form_is_unknown(task_id):
    with pytest.raises(UnknownTask, match="unknown task"):
        load_task(task_id)


def test_a_registered_user_task_loads_by_id_with_its_request(fresh):
    register_task("count:N", Counting, "count to N (a user's task)")
    task = load_task("count:7", size=3, seed=5, config={"k": 1})
    assert isinstance(task, Counting)
    assert task.req == TaskRequest("count:7", "7", 3, 5, {"k": 1})
    assert [q.id for q in task.questions()] == ["count:7:0", "count:7:1", "count:7:2"]
    assert task.retriever is None  # a TaskBase: the capabilities it does not offer default


def test_a_registered_user_task_is_listed_by_whale_tasks(fresh):
    register_task("count:N", Counting, "count to N (a user's task)")
    assert task_ids()[-1] == ("count:N", "count to N (a user's task)")
    assert _whale_tasks_lines()[-1].split() == ["count:N", "registered", "in", "Python", "count",
                                                 "to", "N", "(a", "user's", "task)"]  # fmt: skip


def test_a_duplicate_registration_is_refused_naming_the_taken_pattern(fresh):
    n = len(reg.REGISTRY.entries())
    with pytest.raises(DuplicateTask, match=r"'rg:OTHER' is already registered as 'rg:FAMILY'"):
        register_task("rg:OTHER", Counting, "another rg")
    with pytest.raises(DuplicateTask, match="'mhqa'"):
        register_task("mhqa", Counting, "another mhqa")
    assert len(task_ids()) == len(reg.REGISTRY.entries()) == n  # nothing was added


def test_a_kind_may_take_an_argument_and_not_each_with_its_own_loader(fresh):
    register_task("count", lambda req: Counting(TaskRequest("count", "", req.size, 0)), "bare")
    register_task("count:N", Counting, "with N")
    assert load_task("count", size=1).name == "count"
    assert load_task("count:4", size=1).name == "count:4"


@pytest.mark.parametrize("pattern", ["", "my task", ":x", "a:", "a:b c", "a\nb"])
def test_a_malformed_pattern_is_refused(fresh, pattern):
    with pytest.raises(ValueError, match="expected KIND or KIND:ARG"):
        register_task(pattern, Counting, "d")


def test_a_description_must_be_one_line(fresh):
    with pytest.raises(ValueError, match="one line"):
        register_task("count", Counting, "two\nlines")


def test_a_loaders_value_error_comes_back_as_unknown_task_naming_the_id(fresh):
    def broken(req: TaskRequest) -> Counting:
        raise ValueError(f"{req.arg}: record 3: missing field 'n'")

    register_task("broken:PATH", broken, "d")
    with pytest.raises(UnknownTask, match=r"task broken:f.jsonl: f.jsonl: record 3: missing"):
        load_task("broken:f.jsonl")


def test_a_bad_size_is_refused_before_the_loader_runs(fresh):
    called = []
    register_task("count:N", lambda req: called.append(req) or Counting(req), "d")
    with pytest.raises(UnknownTask, match="size must be a positive integer"):
        load_task("count:1", size=0)
    assert called == []


def test_the_kind_that_names_task_objects_is_reserved():
    """A run of a task object records `object:NAME@DIGEST`: no registered loader may answer
    that id, or a resume from the CLI would load something else under the object's ledger."""
    from whale.tasks.registry import TaskRegistry

    with pytest.raises(ValueError, match="object"):
        TaskRegistry().register("object:NAME", lambda req: None, "anything")  # type: ignore[arg-type,return-value]
