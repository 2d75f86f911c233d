"""Tasks from Python and from packages (issue 23): `py:module:factory`, `py:file.py[:NAME]`, and
the `whale.tasks` entry-point group. The package is "installed" for real: a dist-info folder
(METADATA + entry_points.txt) and its module on sys.path, found by importlib.metadata; it is
listed by `whale tasks` with its distribution, loads and is graded; a broken entry point is
listed with its error and breaks nothing else; entry points are read lazily, once."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

import pytest
from typer.testing import CliRunner

from whale import grading
from whale.cli import app
from whale.config import ConfigError
from whale.tasks import ENTRY_POINT_GROUP, Grade, TaskBase, UnknownTask, load_task, register_task
from whale.tasks import registry as reg

PLUGIN = textwrap.dedent(
    '''
    from whale.tasks import Grade, Question, TaskBase, TaskEntry

    LOADS = []  # each import of this module appends here

    class Doubling(TaskBase):
        description = "Double the number. Answer with the number only."

        def __init__(self, req):
            self.name = req.id
            self._qs = [Question(f"d{i}", f"Double {i}.", str(2 * i)) for i in range(req.size)]

        def questions(self):
            return list(self._qs)

        def grade(self, question, answer):
            ok = answer.strip() == question.reference
            return Grade(float(ok), ok)

    def load(req):
        """Doubling questions, from the whale-demo-tasks package."""
        return Doubling(req)

    ENTRIES = [TaskEntry("demosplit:SPLIT", "doubling by split (whale-demo-tasks)", load)]
    LOADS.append(1)
    '''
)
ENTRY_POINTS = """\
[whale.tasks]
demo = whale_demo_tasks:load
demosplit = whale_demo_tasks:ENTRIES
demobroken = whale_demo_missing_module:load
mhqa = whale_demo_tasks:load
demowrong = whale_demo_tasks:LOADS
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """whale-demo-tasks 1.0 installed on sys.path, and a registry of the built-ins that has
    not read its entry points yet."""
    built_ins = [e for e in reg.REGISTRY.entries() if e.source == "built-in"]
    info = tmp_path / "whale_demo_tasks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: whale-demo-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (tmp_path / "whale_demo_tasks.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh = reg.TaskRegistry(built_ins, group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(reg, "REGISTRY", fresh)
    yield fresh
    sys.modules.pop("whale_demo_tasks", None)


def test_importlib_metadata_finds_the_installed_package(installed):
    eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert eps["demo"].value == "whale_demo_tasks:load"
    assert eps["demo"].dist.name == "whale-demo-tasks"


def test_the_package_is_listed_with_its_distribution_and_description(installed):
    out = CliRunner().invoke(app, ["tasks"]).output
    lines = {ln.split()[0]: ln for ln in out.splitlines()}
    assert "entry point whale-demo-tasks 1.0" in lines["demo"]
    assert lines["demo"].endswith("Doubling questions, from the whale-demo-tasks package.")
    assert lines["demosplit:SPLIT"].endswith("doubling by split (whale-demo-tasks)")
    assert lines["rg:FAMILY"].split()[1] == "built-in"


def test_the_packages_task_loads_and_is_graded(installed):
    task = load_task("demo", size=3, seed=0)
    assert isinstance(task, TaskBase) and task.name == "demo"
    q = task.questions()[2]
    assert grading.grade(task, q, "4") == Grade(1.0, True)
    assert grading.grade(task, q, "5") == Grade(0.0, False)
    assert load_task("demosplit:test", size=2).name == "demosplit:test"


def test_a_broken_entry_point_is_listed_with_its_error_and_the_others_work(installed):
    listed = {e.pattern: e for e in installed.entries()}
    assert "ModuleNotFoundError" in listed["demobroken"].description
    assert "expected a loader" in listed["demowrong"].description  # a list of ints
    clash = [e for e in installed.entries() if e.error and e.kind == "mhqa"]
    assert clash and "already registered" in clash[0].description
    with pytest.raises(UnknownTask, match="demobroken.*does not load.*ModuleNotFoundError"):
        load_task("demobroken")
    assert load_task("demo", size=1).questions()[0].prompt == "Double 0."
    assert load_task("mhqa", size=2, config={"passages": 2000}).name != "demo"  # built-in wins


def test_entry_points_are_read_lazily_and_once(installed):
    load_task("rg:basic_arithmetic", size=1)
    assert "whale_demo_tasks" not in sys.modules  # a built-in id reads no entry point
    load_task("demo", size=1)
    module = sys.modules["whale_demo_tasks"]
    installed.entries()
    load_task("demosplit:x", size=1)
    assert module.LOADS == [1]  # imported once


def test_register_task_is_listed_as_registered_in_python(installed):
    register_task("mine", lambda req: load_task("demo", size=1), "my own")
    (entry,) = [e for e in installed.entries() if e.pattern == "mine"]
    assert entry.source == "registered in Python"


# --- py: task ids ------------------------------------------------------------------------

USER_TASKS = textwrap.dedent(
    """
    from whale.tasks import Grade, Question, TaskBase

    class Echo(TaskBase):
        name = "echo"
        description = "Repeat the word."

        def __init__(self, n=2, seed=0):
            self.n, self.seed = n, seed

        def questions(self):
            return [Question(f"e{i}", f"Say w{i + self.seed}.", f"w{i + self.seed}")
                    for i in range(self.n)]

        def grade(self, question, answer):
            ok = answer.strip() == question.reference
            return Grade(float(ok), ok)

    task = Echo()

    def factory(req):
        return Echo(req.size, req.seed)

    def not_a_task(req):
        return "nope"

    class Nameless(TaskBase):
        def questions(self):
            return []

        def grade(self, question, answer):
            return Grade(0.0, False)
    """
)


@pytest.fixture
def user_tasks(tmp_path, monkeypatch):
    (tmp_path / "user_tasks_mod.py").write_text(USER_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "user_tasks_mod.py"
    sys.modules.pop("user_tasks_mod", None)


def test_a_factory_named_by_module_gets_the_request(user_tasks):
    task = load_task("py:user_tasks_mod:factory", size=3, seed=5)
    assert [q.reference for q in task.questions()] == ["w5", "w6", "w7"]
    assert task.grade(task.questions()[0], "w5").correct


def test_a_file_path_gives_its_task_object_by_default(user_tasks):
    task = load_task(f"py:{user_tasks}")
    assert task.name == "echo" and len(task.questions()) == 2


def test_a_class_with_no_required_argument_is_called_with_none(user_tasks):
    task = load_task(f"py:{user_tasks}:Echo")
    assert len(task.questions()) == 2


def test_a_relative_file_path_is_read_from_the_current_directory(user_tasks, monkeypatch):
    monkeypatch.chdir(user_tasks.parent)
    assert load_task("py:user_tasks_mod.py:factory", size=1).questions()[0].reference == "w0"


@pytest.mark.parametrize(
    "arg, message",
    [("user_tasks_mod:not_a_task", "returned a str, not a task"),
     ("user_tasks_mod:nothing_here", "has no 'nothing_here'"),
     ("user_tasks_mod:Nameless", "has no text 'name'"),
     ("no_such_user_module_z:factory", "cannot import no_such_user_module_z"),
     ("nope.py", "no such file"),
     ("user_tasks_mod:bad-name", "is not a Python name"),
     ("9lives:factory", "expected a dotted module name")],
)  # fmt: skip
def test_a_py_task_that_does_not_load_is_a_config_error(user_tasks, arg, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_task(f"py:{arg}")
    assert e.value.field == "task.id"
