"""A verifiers environment's bar for `correct`: reached by a perfect answer when the reward
weights sum to 1 in floats, refused when no answer could reach it; repeated task ids refused."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("verifiers.v1")

from whale.config import ConfigError  # noqa: E402
from whale.tasks.registry import TaskRequest  # noqa: E402
from whale.tasks.verifiers_env import load_verifiers  # noqa: E402

# Three rewards whose weights sum to 1 on paper (0.6 + 0.3 + 0.1): a perfect answer gets every
# reward, so verifiers' weighted reward is the float sum, 0.9999999999999999.
SPLIT_ENV = '''
import verifiers.v1 as vf


class D(vf.TaskData):
    answer: str


class T(vf.Task[D]):
    @vf.reward(weight=0.6)
    async def a_right(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.3)
    async def b_short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) < 10)

    @vf.reward(weight=0.1)
    async def c_nonempty(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class C(vf.TasksetConfig):
    ids: str = "t{i}"


class S(vf.Taskset[T, C]):
    def load(self):
        return [T(D(id=self.config.ids.format(i=i), prompt=f"Say {i}.", answer=str(i)), self.config.task)
                for i in range(3)]


__all__ = ["S"]
'''

@pytest.fixture(scope="module")
def split_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("vf_bars")
    (root / "bars_split_env").mkdir()
    (root / "bars_split_env" / "__init__.py").write_text(textwrap.dedent(SPLIT_ENV))
    sys.path.insert(0, str(root))
    yield "bars_split_env"
    sys.path.remove(str(root))
    sys.modules.pop("bars_split_env", None)


def _load(env, grader=None, args=None):
    cfg = {"grader": {"in_process": True, **(grader or {})}, "args": args or {}}
    return load_verifiers(TaskRequest(f"verifiers:{env}", env, 50, 0, cfg))


def test_a_perfect_answer_is_correct_when_the_weights_sum_to_one_in_floats(split_env):
    task = _load(split_env)
    assert task.max_reward < 1.0  # 0.9999999999999999
    g = task.grade(task.questions()[1], "1")
    assert g.score == 1.0 and g.correct


def test_an_answer_short_of_the_bar_is_not_correct(split_env):
    task = _load(split_env)
    g = task.grade(task.questions()[1], "2")  # wrong: 0.3 + 0.1 of the weights
    assert not g.correct


def test_a_bar_no_answer_can_reach_is_refused(split_env):
    with pytest.raises(ConfigError) as e:
        _load(split_env, {"max_reward": 0.5})
    assert e.value.field == "task.config.grader.solved_at"


def test_repeated_task_ids_are_refused(split_env):
    with pytest.raises(ConfigError, match="have the same id 'verifiers:bars_split_env:same'"):
        _load(split_env, args={"ids": "same"})


def test_a_scoring_timeout_past_an_hour_is_refused(split_env):
    with pytest.raises(ConfigError) as e:
        _load(split_env, {"timeout_s": 1e300})
    assert e.value.field == "task.config.grader.timeout_s"


@pytest.mark.parametrize("grader", [{"max_reward": 1e10}, {"solved_at": 1e-10}])
def test_the_bar_stays_above_zero(split_env, grader):
    """The slack is relative: a tiny bar is not pushed to zero (every answer correct)."""
    assert _load(split_env, grader).threshold > 0


def test_a_reward_below_the_bar_is_not_correct_under_a_large_max_reward(split_env):
    task = _load(split_env, {"max_reward": 1e10})  # solved_at 1.0 of 1e10
    assert not task.grade(task.questions()[1], "a long wrong answer").correct  # reward 0.1
