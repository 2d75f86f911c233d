"""Scoring one answer with a verifiers environment's own rewards (`whale.tasks.verifiers_env`).

Self-contained on purpose: it imports only the standard library and verifiers, never whale,
so the grading jail (`whale.grading`, a "call" grader) loads this file by its path and calls
`jailed_score` without importing whale (which the jail does not hold). `score_rubric` is the
same scoring for a caller in process. Both take plain data only: the environment id, its
args, the task row (`TaskData` in its JSON form) and the answer.

The answer is scored as verifiers re-scores a saved trace (`vf-replay`): a `vf.Trace` holding
the prompt's messages and the answer as the model's one sampled reply, stopped as a completed
rollout is when its scoring runs, then the task's own `Task.score` (its `@vf.reward`s, their
weights, plugged rewards from the taskset config), offline (no runtime).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

try:  # verifiers reads Path.home() on import; the grading jail's user has no home
    Path.home()
except RuntimeError:
    os.environ["HOME"] = tempfile.gettempdir()

import verifiers.v1 as vf  # noqa: E402 - once, here: the jail's zygote then forks it warm


def score_rubric(
    env_id: str,
    env_args: Mapping[str, Any],
    question_row: Mapping[str, Any],
    answer: str,
    timeout_s: float | None = None,
) -> float:
    """The weighted reward (`Trace.reward`, verifiers' units) the environment `env_id`, built
    with `env_args`, gives `answer` as the single reply to the task `question_row`. Raises
    what the rewards raise (verifiers wraps it in `TaskError`), TimeoutError past `timeout_s`
    (an awaiting reward is cancelled; a blocking one is not), RuntimeError for rewards that
    need a runtime (verifiers would skip them offline and the reward would read high)."""
    config, task_cls, data_cls = resolve(env_id, json.dumps(dict(env_args), sort_keys=True))
    task = task_cls(data_cls.model_validate(dict(question_row)), config=config.task)
    needs = runtime_rewards(task)
    if needs:
        raise RuntimeError(f"rewards that need a runtime: {', '.join(needs)}")
    trace = single_turn_trace(task, answer)

    async def run() -> None:
        await asyncio.wait_for(task.score(trace), timeout_s)

    asyncio.run(run())
    return float(trace.reward)


def jailed_score(setup: Mapping[str, Any], answer: str, row: Mapping[str, Any]) -> float:
    """The jail's entry, `(question, answer, reference)` as whale's "call" graders are called:
    `setup` holds `env`, `args` and `max_reward`. The weighted reward over `max_reward`,
    clamped to [0, 1]; a reward that is not a finite number comes back as it is, for the
    jail to report (a NaN is an error there, never a clamped score). An error a reward
    raised is raised again unwrapped, so the jail's feedback names its class."""
    try:
        reward = score_rubric(setup["env"], setup["args"], row, answer)
    except Exception as e:
        raise root_error(e) from None
    if not math.isfinite(reward):
        return reward
    return min(1.0, max(0.0, reward / float(setup["max_reward"])))


@functools.lru_cache(maxsize=32)
def resolve(env_id: str, args_json: str) -> tuple[Any, Any, Any]:
    """The taskset's validated config, its Task type and its TaskData type (cached: a grader
    resolves per answer). Raises what verifiers raises: ModuleNotFoundError (not installed),
    AttributeError/TypeError/ValueError (no single Taskset in `__all__`), pydantic's
    ValidationError (args the taskset's config does not take)."""
    config_type = vf.taskset_config_type(env_id)
    task_cls = vf.task_type(env_id)
    config = config_type.model_validate({**json.loads(args_json), "id": env_id})
    return config, task_cls, task_cls.data_type()


def runtime_rewards(task: Any) -> list[str]:
    """The task's rewards that take the runtime (verifiers' own test in `Task.score`: a
    `runtime` parameter without a default)."""
    return [fn.__name__ for fn in task.hooks("reward") if _needs_runtime(fn)]


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def single_turn_trace(task: Any, answer: str) -> Any:
    """A finished single-turn trace: the prompt's messages (the system prompt first), then
    `answer` as the one sampled reply."""
    from verifiers.v1.graph import MessageNode

    data = task.data
    messages: list[Any] = []
    if data.system_prompt is not None:
        messages.append(vf.SystemMessage(content=data.system_prompt))
    prompt = data.prompt
    messages += [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt)
    nodes = [MessageNode(message=m, parent=i - 1 if i else None) for i, m in enumerate(messages)]
    reply = vf.AssistantMessage(content=answer)
    nodes.append(MessageNode(message=reply, parent=len(nodes) - 1 if nodes else None, sampled=True))
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="whale", trainable=False),
        nodes=nodes,
    )
    trace.stop("agent_completed")
    return trace


def root_error(error: BaseException) -> BaseException:
    """The error a reward raised, under verifiers' `TaskError` wrapper (`__cause__` chain)."""
    seen: set[int] = set()
    while error.__cause__ is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__
    return error


def _warm_from_argv() -> None:
    """In the grading jail: resolve the environment named by the zygote's spec (its last
    argument, JSON, whose `warm` this module's caller put there) before the zygote forks, so
    each answer's child does not import the environment again. Best effort: a failure here
    shows again, as that answer's error, when an answer is scored."""
    try:
        warm = json.loads(sys.argv[-1]).get("warm")
        if isinstance(warm, dict):
            resolve(warm["env"], json.dumps(warm["args"], sort_keys=True))
    except Exception:  # noqa: BLE001 - not the zygote, or nothing to warm
        pass


if sys.argv[:1] == ["-c"]:  # loaded by the jailed grader (`python -I -S -c ZYGOTE ...`)
    _warm_from_argv()
