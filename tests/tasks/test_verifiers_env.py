"""A real verifiers (0.4.0) environment loaded as a whale task (issue 23): packages written
here with the real library (a `vf.Taskset` over a `datasets.Dataset`, `vf.Task`s with real
`@vf.reward` functions), importable the way verifiers finds environments (a module on
sys.path whose `__all__` exports the Taskset), loaded through `load_verifiers` and graded by
their own rewards."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from whale import grading  # noqa: E402
from whale.config import ConfigError  # noqa: E402
from whale.harness.sandbox import nsjail_binary  # noqa: E402
from whale.tasks import registry as reg  # noqa: E402
from whale.tasks.base import Question  # noqa: E402
from whale.tasks.graders import GradeOutOfProcess, JailedCall  # noqa: E402
from whale.tasks.registry import TaskRequest  # noqa: E402
from whale.tasks.verifiers_env import (  # noqa: E402
    NOT_A_NUMBER,
    TIMEOUT,
    EnvironmentNotCovered,
    VerifiersTask,
    load_verifiers,
    render_question,
)
from whale.tasks.verifiers_score import score_rubric  # noqa: E402

JAIL = "nsjail" if nsjail_binary() is not None else "bwrap" if shutil.which("bwrap") else None

SUM_ENV = '''
"""Sums of two numbers, answered inside <answer></answer> tags."""
import re

import verifiers.v1 as vf
from datasets import Dataset


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the number inside <answer>...</answer> is the sum."""
        m = re.search(r"<answer>(.*?)</answer>", trace.last_reply, re.S)
        return float(m is not None and m.group(1).strip() == self.data.answer)

    @vf.reward(weight=0.25)
    async def formatted(self, trace: vf.Trace) -> float:
        """1 when the reply holds exactly one <answer> block."""
        return float(trace.last_reply.count("<answer>") == 1)


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 3
    few_shot: bool = False


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        rows = Dataset.from_list(
            [{"id": f"sum-{a}", "question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)}
             for a in range(10)]
        )
        shots = [vf.UserMessage(content="What is 5 + 5?"),
                 vf.AssistantMessage(content="<answer>10</answer>")]
        for row in rows.select(range(self.config.num_tasks)):
            ask = vf.UserMessage(content=row["question"])
            yield SumTask(
                SumData(
                    id=row["id"],
                    system_prompt="Put the final answer inside <answer></answer>.",
                    prompt=[*shots, ask] if self.config.few_shot else row["question"],
                    answer=row["answer"],
                ),
                self.config.task,
            )


__all__ = ["SumTaskset"]
'''

# One reward whose behaviour the answer picks: the attacks a grader meets.
TROUBLE_ENV = """
import asyncio
import threading

import verifiers.v1 as vf

RELEASE = threading.Event()


class D(vf.TaskData):
    answer: str


class T(vf.Task[D]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        if reply.startswith("raise"):
            raise ValueError(f"cannot read {reply}")
        if reply == "nan":
            return float("nan")
        if reply == "word":
            return "high"
        if reply == "block":
            RELEASE.wait(60)  # blocks the thread: no event loop can cancel it
        if reply == "await":
            await asyncio.sleep(60)  # awaits: cancelled at the timeout
        if reply == "hog":
            hoard = []
            while True:  # allocates without bound
                hoard.append(bytearray(64 << 20))
        return float(reply == self.data.answer)


class C(vf.TasksetConfig):
    pass


class S(vf.Taskset[T, C]):
    def load(self):
        return [T(D(id=str(i), prompt=f"Say {i}.", answer=str(i)), self.config.task)
                for i in range(3)]


__all__ = ["S"]
"""

# A minimal environment for each kind whale does not run; {fields}, {task}, {data}, {generic},
# {extra} and {exports} are filled per kind.
KIND_ENV = """
import pydantic
import verifiers.v1 as vf


class D(vf.TaskData):
    answer: str = "1"
{fields}


class T(vf.Task[D]):
{task}
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class C(vf.TasksetConfig):
    pass


class S(vf.Taskset{generic}):
    def load(self):
        return [T(D({data}), self.config.task)]

{extra}

__all__ = [{exports}]
"""

# A taskset that never ends: whale takes the pool size from it.
ENDLESS_ENV = """
import itertools

import verifiers.v1 as vf


class T(vf.Task[vf.TaskData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == "ok")


class S(vf.Taskset[T, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        for i in itertools.count():
            yield T(vf.TaskData(id=str(i), prompt=f"Say ok ({i})."), self.config.task)


__all__ = ["S"]
"""

KINDS = {
    # module: (kind, task body, data, extra, exports); fields and generic in ODD below
    "kind_multi_agent": (
        "a multi-agent or custom episode", "", "prompt='hi'",
        "class E(vf.Env[vf.EnvConfig]):\n    async def run(self, task, agents):\n"
        "        pass", '"S", "E"',
    ),
    "kind_own_harness": (
        "a taskset with its own harness", "", "prompt='hi'",
        "class H(vf.Harness[vf.HarnessConfig]):\n    async def launch(self, *args):\n"
        "        pass", '"S", "H"',
    ),
    "kind_tools": (
        "a tool environment",
        "    @classmethod\n    def toolsets(cls, config):\n"
        "        return [Echo(vf.ToolsetConfig())]\n",
        "prompt='hi'",
        "class Echo(vf.Toolset[vf.ToolsetConfig]):\n    @vf.tool\n"
        "    def echo(self, text: str) -> str:\n        return text", '"S"',
    ),
    "kind_container": (
        "a container (sandbox) task", "    NEEDS_CONTAINER = True\n", "prompt='hi'", "", '"S"'
    ),
    "kind_image": (
        "a container (sandbox) task", "", "prompt='hi', image='python:3.11'", "", '"S"'
    ),
    "kind_setup": (
        "a container (sandbox) task",
        "    async def setup(self, trace, runtime):\n        pass\n", "prompt='hi'", "", '"S"',
    ),
    "kind_runtime_reward": (
        "a runtime-scored reward",
        "    @vf.reward\n    async def ran(self, trace, runtime) -> float:\n"
        "        return 1.0\n", "prompt='hi'", "", '"S"',
    ),
    "kind_intercept": (
        "request/response interceptors",
        "    @vf.intercept\n    async def rewrite(self, request: vf.Request):\n"
        "        return None\n", "prompt='hi'", "", '"S"',
    ),
    "kind_user_opens": ("a conversation a user opens", "", "prompt=None", "", '"S"'),
    "kind_image_prompt": (
        "a non-text prompt", "",
        "prompt=[vf.UserMessage(content=[vf.ImageUrlContentPart("
        "image_url={'url': 'http://x/y.png'})])]", "", '"S"',
    ),
    "kind_tool_call_prompt": (
        "tool calls in a prompt", "",
        "prompt=[vf.UserMessage(content='hi'), vf.AssistantMessage(tool_calls=["
        "vf.ToolCall(id='1', name='f', arguments='{}')]), "
        "vf.ToolMessage(tool_call_id='1', content='2')]", "", '"S"',
    ),
    "kind_undeclared_type": (
        "a task type the taskset does not declare", "", "prompt='hi'", "", '"S"'
    ),
    "kind_lossy_row": (
        "task data that does not survive its JSON form", "", "prompt='hi', kept='y'", "", '"S"'
    ),
}  # fmt: skip
# module: (D's extra fields, the Taskset's generic parameters) where they differ
ODD = {
    "kind_undeclared_type": ("", ""),  # a bare vf.Taskset: verifiers cannot tell the task type
    "kind_lossy_row": ("    kept: str = pydantic.Field(default='x', exclude=True)", "[T, C]"),
}

TRUST = {"grader": {"in_process": True}}


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """The environment packages on sys.path for this module's tests, removed after."""
    root: Path = tmp_path_factory.mktemp("vf_envs")
    sources = {"mini_sum_env": SUM_ENV, "mini_trouble_env": TROUBLE_ENV, "endless_env": ENDLESS_ENV}
    for name, (_, task, data, extra, exports) in KINDS.items():
        fields, generic = ODD.get(name, ("", "[T, C]"))
        sources[name] = KIND_ENV.format(fields=fields, task=task, data=data, generic=generic,
                                        extra=extra, exports=exports)  # fmt: skip
    for name, src in sources.items():
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(textwrap.dedent(src))
    sys.path.insert(0, str(root))
    yield root
    grading.close_all()
    sys.path.remove(str(root))
    for name in sources:
        sys.modules.pop(name, None)


def _load(env: str, config: dict | None = None, size: int = 50) -> VerifiersTask:
    cfg = dict(TRUST) if config is None else config
    return load_verifiers(TaskRequest(f"verifiers:{env}", env, size, 0, cfg))


def _q(task: VerifiersTask, i: int) -> Question:
    return task.questions()[i]


def test_the_taskset_rows_become_questions(envs):
    task = _load("mini_sum_env", {"args": {"num_tasks": 3}, **TRUST})
    qs = task.questions()
    assert [q.id for q in qs] == [f"verifiers:mini_sum_env:sum-{a}" for a in range(3)]
    assert [task.expected(q) for q in qs] == ["1", "3", "5"]
    # the system prompt folded over the prompt, as verifiers folds it for a text-only harness
    assert qs[1].prompt == "Put the final answer inside <answer></answer>.\n\nWhat is 1 + 2?"


def test_the_environment_args_reach_the_taskset(envs):
    assert len(_load("mini_sum_env", {"args": {"num_tasks": 7}, **TRUST}).questions()) == 7


def test_an_endless_taskset_gives_the_pool_size(envs):
    task = _load("endless_env", size=5)
    assert [q.prompt for q in task.questions()] == [f"Say ok ({i})." for i in range(5)]
    assert task.grade(task.questions()[4], "ok").correct


def test_a_few_shot_prompt_keeps_its_turns_and_roles(envs):
    task = _load("mini_sum_env", {"args": {"few_shot": True}, **TRUST})
    assert _q(task, 0).prompt == (
        "[system]\nPut the final answer inside <answer></answer>.\n\n[user]\nWhat is 5 + 5?"
        "\n\n[assistant]\n<answer>10</answer>\n\n[user]\nWhat is 0 + 1?"
    )


def test_the_reference_is_not_in_the_question_text(envs):
    task = _load("mini_sum_env", {"args": {"num_tasks": 10}, **TRUST})
    q = _q(task, 9)  # What is 9 + 10? -> 19
    assert q.reference["answer"] == "19" and "19" not in q.prompt


def test_a_correct_answer_in_the_rubrics_format_is_correct_with_full_score(envs):
    task = _load("mini_sum_env")
    g = task.grade(_q(task, 1), "The sum is <answer>3</answer>")
    assert (g.score, g.correct, g.feedback) == (1.0, True, "")


def test_a_correct_number_outside_the_format_is_wrong(envs):
    g = (task := _load("mini_sum_env")).grade(_q(task, 1), "3")
    assert (g.score, g.correct) == (0.0, False)


def test_a_wrong_answer_in_format_keeps_the_format_reward_as_raw_score(envs):
    # weighted reward 0.25 (formatted) over the weights' sum 1.25
    g = (task := _load("mini_sum_env")).grade(_q(task, 1), "<answer>4</answer>")
    assert g.score == pytest.approx(0.2) and not g.correct


def test_solved_at_sets_the_bar_of_the_binary_verifier(envs):
    task = _load("mini_sum_env", {"grader": {"in_process": True, "solved_at": 1.25}})
    q = _q(task, 1)
    assert task.grade(q, "<answer>3</answer>").correct  # 1.25: both rewards
    assert not task.grade(q, "<answer>3</answer><answer>3</answer>").correct  # 1.0


def test_max_reward_sets_the_scale_of_the_raw_score(envs):
    task = _load("mini_sum_env", {"grader": {"in_process": True, "max_reward": 2.5}})
    assert task.grade(_q(task, 1), "<answer>3</answer>").score == pytest.approx(0.5)


def test_the_description_names_the_rewards_and_the_format(envs):
    d = _load("mini_sum_env").description
    assert "Sums of two numbers, answered inside <answer></answer> tags." in d
    assert "- correct (weight 1): 1 when the number inside <answer>...</answer> is the sum." in d
    assert "- formatted (weight 0.25)" in d


def test_score_rubric_is_plain_data_in_and_the_weighted_reward_out(envs):
    task = _load("mini_sum_env")
    row = json.loads(json.dumps(_q(task, 2).reference))  # what crosses a process boundary
    assert score_rubric("mini_sum_env", {}, row, "<answer>5</answer>") == 1.25
    assert score_rubric("mini_sum_env", {}, row, "<answer>6</answer>") == 0.25


def test_the_built_in_registry_loads_it_by_a_verifiers_pattern(envs):
    """`--task verifiers:ENV` works out of the box, and `whale tasks` lists the kind."""
    task = reg.load_task("verifiers:mini_sum_env", 10, 0, {"args": {"num_tasks": 2}, **TRUST})
    assert task.name == "verifiers:mini_sum_env" and len(task.questions()) == 2
    assert [e.source for e in reg.REGISTRY.entries() if e.pattern == "verifiers:ENV"] == [
        "built-in"
    ]


# --- the grader meets untrusted answers --------------------------------------------------------


def test_by_default_the_rewards_are_not_run_in_this_process(envs):
    task = _load("mini_sum_env", {})
    q = _q(task, 1)
    assert isinstance(task.jailed_grading(q, "<answer>3</answer>"), JailedCall)
    with pytest.raises(GradeOutOfProcess):
        task.grade(q, "<answer>3</answer>")


def test_in_process_is_the_opt_in_that_scores_here(envs):
    task = _load("mini_sum_env")
    assert task.jailed_grading(_q(task, 1), "x") is None


def test_a_reward_that_raises_is_an_error_grade_and_the_next_answer_is_graded(envs):
    task = _load("mini_trouble_env")
    g = task.grade(_q(task, 1), "raise SECRET-TEXT")
    assert (g.score, g.correct) == (0.0, False) and g.feedback == "scorer error: ValueError"
    assert "SECRET" not in g.feedback  # the answer's own text never comes back
    assert task.grade(_q(task, 1), "1").correct


def test_a_nan_reward_is_an_error_grade(envs):
    g = (task := _load("mini_trouble_env")).grade(_q(task, 1), "nan")
    assert (g.score, g.correct, g.feedback) == (0.0, False, NOT_A_NUMBER)


def test_a_non_number_reward_is_an_error_grade(envs):
    g = (task := _load("mini_trouble_env")).grade(_q(task, 1), "word")
    assert (g.correct, g.feedback) == (False, "scorer error: ValueError")


def test_an_awaiting_reward_is_cancelled_at_the_timeout(envs):
    task = _load("mini_trouble_env", {"grader": {"in_process": True, "timeout_s": 0.5}})
    t0 = time.monotonic()
    g = task.grade(_q(task, 1), "await")
    assert g.feedback == TIMEOUT and time.monotonic() - t0 < 5
    time.sleep(0.5)
    assert not [t for t in threading.enumerate() if t.name == "whale-verifiers-grade"]
    assert task.grade(_q(task, 2), "2").correct


def test_a_blocking_reward_is_a_timeout_and_the_next_answer_is_graded(envs):
    task = _load("mini_trouble_env", {"grader": {"in_process": True, "timeout_s": 0.5}})
    release = sys.modules["mini_trouble_env"].RELEASE
    try:
        t0 = time.monotonic()
        g = task.grade(_q(task, 1), "block")
        assert g.feedback == TIMEOUT and time.monotonic() - t0 < 5
        assert task.grade(_q(task, 2), "2").correct
    finally:
        release.set()  # the stuck thread (in-process trusts the answers) ends with the test


# --- config ------------------------------------------------------------------------------------


def test_an_unknown_config_key_is_refused_naming_it(envs):
    with pytest.raises(ConfigError) as e:
        _load("mini_sum_env", {"num_tasks": 3, **TRUST})
    assert e.value.field == "task.config.num_tasks" and "task.config.args" in str(e.value)


def test_args_the_taskset_does_not_take_are_refused_naming_the_arg(envs):
    with pytest.raises(ConfigError) as e:
        _load("mini_sum_env", {"args": {"num_taks": 3}, **TRUST})
    assert e.value.field == "task.config.args.num_taks"


@pytest.mark.parametrize("bad", [{"timeout_s": 0}, {"max_reward": -1}, {"solved_at": "x"},
                                 {"solved_at": 0}, {"in_process": "yes"}, {"memory_mb": 1.5},
                                 {"retries": 2}])  # fmt: skip
def test_bad_grader_settings_are_refused_naming_the_field(envs, bad):
    with pytest.raises(ConfigError) as e:
        _load("mini_sum_env", {"grader": {"in_process": True, **bad}})
    assert e.value.field == f"task.config.grader.{next(iter(bad))}"


def test_without_verifiers_installed_the_loader_says_what_to_install(envs, monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # an import of it fails
    with pytest.raises(ConfigError, match=r"whale\[verifiers\]") as e:
        _load("mini_sum_env")
    assert e.value.field == "task.id"


def test_an_environment_that_is_not_installed_is_refused(envs):
    with pytest.raises(ConfigError, match="not installed") as e:
        _load("owner/no_such_env_here@1.0")
    assert e.value.field == "task.id"


# --- the kinds whale does not run ----------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(KINDS))
def test_a_kind_not_covered_is_refused_naming_the_kind(envs, module):
    kind = KINDS[module][0]
    with pytest.raises(EnvironmentNotCovered) as e:
        _load(module)
    assert e.value.kind == kind and kind in str(e.value)


def test_a_plugged_llm_judge_is_refused(envs):
    args = {"task": {"judges": [{"id": "reference"}]}}
    with pytest.raises(EnvironmentNotCovered) as e:
        _load("mini_sum_env", {"args": args, **TRUST})
    assert e.value.kind == "an LLM judge" and "reference" in str(e.value)


def test_render_question_of_a_single_user_message_is_its_text(envs):
    import verifiers.v1 as vf

    data = vf.TaskData(prompt=[vf.UserMessage(content="What is 2 + 2?")])
    assert render_question(data) == "What is 2 + 2?"


# --- out of process: the grading jail -----------------------------------------------------------


def jailed(test):  # type: ignore[no-untyped-def]
    """A test through the grading jail: slow (each jail imports verifiers), skipped without one."""
    return pytest.mark.slow(pytest.mark.skipif(JAIL is None, reason="no jail installed")(test))


def _jailed(env: str, **grader: object) -> VerifiersTask:
    return _load(env, {"grader": grader})


@jailed
def test_in_the_jail_the_rubric_grades_as_it_does_in_process(envs):
    jail, here = _jailed("mini_sum_env"), _load("mini_sum_env")
    for answer in ["<answer>3</answer>", "3", "<answer>4</answer>", "<answer>3</answer> " * 2]:
        g = grading.grade(jail, _q(jail, 1), answer, sandbox=JAIL)
        assert g == here.grade(_q(here, 1), answer), answer


@jailed
def test_in_the_jail_a_reward_that_raises_is_named_and_the_next_answer_is_graded(envs):
    task = _jailed("mini_trouble_env", timeout_s=5)
    g = grading.grade(task, _q(task, 1), "raise SECRET-TEXT", sandbox=JAIL)
    assert not g.correct and g.feedback.endswith(": ValueError") and "SECRET" not in g.feedback
    assert grading.grade(task, _q(task, 1), "1", sandbox=JAIL).correct


@jailed
def test_in_the_jail_a_nan_reward_is_an_error(envs):
    task = _jailed("mini_trouble_env", timeout_s=5)
    g = grading.grade(task, _q(task, 1), "nan", sandbox=JAIL)
    assert (g.score, g.correct, g.feedback) == (0.0, False, grading.NOT_FINITE)


@jailed
def test_in_the_jail_a_blocking_reward_times_out_and_the_next_answer_is_graded(envs):
    task = _jailed("mini_trouble_env", timeout_s=5)
    grading.grade(task, _q(task, 0), "0", sandbox=JAIL)  # the jail started (verifiers imported)
    t0 = time.monotonic()
    g = grading.grade(task, _q(task, 1), "block", sandbox=JAIL)
    assert g.feedback == grading.TIMEOUT and time.monotonic() - t0 < 5 + grading.REPLY_MARGIN_S
    assert grading.grade(task, _q(task, 2), "2", sandbox=JAIL).correct


@jailed
def test_in_the_jail_a_reward_that_allocates_without_bound_is_stopped(envs):
    task = _jailed("mini_trouble_env", timeout_s=5)
    g = grading.grade(task, _q(task, 1), "hog", sandbox=JAIL)
    assert (g.score, g.correct) == (0.0, False) and g.feedback
    assert grading.grade(task, _q(task, 2), "2", sandbox=JAIL).correct
