"""A verifiers environment as a whale task (`verifiers:ENV`): its tasks become questions, its
reward functions the grader.

verifiers 0.4.0 (the `verifiers.v1` stack) has no `SingleTurnEnv`/`Rubric` any more: an
environment is an installed package whose `__all__` exports one `vf.Taskset` subclass. Its
`load()` yields `vf.Task`s, each a row of `vf.TaskData` (`prompt`, `system_prompt`, the
taskset's own fields such as `answer`) plus `@vf.reward` methods `(task, trace[, runtime])`
whose weighted sum is the rollout's reward (`Trace.reward`). ENV is the taskset id verifiers
resolves (`vf.load_taskset`): a module name, or a hub id `owner/name@version` that must already
be installed (nothing is downloaded). `task.config.args` is the taskset's own config (what
`vf-eval` takes as `--env.taskset.*`), checked by its pydantic type.

The mapping:
- question: the task's prompt as the one text a harness receives. A string prompt with a
  system prompt is folded as verifiers folds it for a harness without a separate system
  message (`Harness.resolve_prompt`: "SYSTEM\\n\\nPROMPT"); a message-list prompt (few-shot)
  is written as verifiers' own `Trace.transcript` writes one ("[role]\\ntext" blocks), so the
  harness sees every turn and who said it.
- reference: the task row (`TaskData` in its JSON form), never shown to a harness; `expected`
  is its `answer` field where it has one.
- grade: the harness's answer becomes the model's single reply on a `vf.Trace` holding the
  prompt, and the task's own `Task.score` runs on it, as `vf-replay` re-scores a saved trace
  (`whale.tasks.verifiers_score`). The raw score is the weighted reward over `max_reward`
  (default: the sum of the positive reward weights, the maximum when each reward is in [0, 1]
  as verifiers asks), clamped to [0, 1]; `correct` is a score of at least `solved_at /
  max_reward`, i.e. a weighted reward of at least `solved_at` (default 1.0: the bar
  `vf-validate` uses for a solved task, `SOLVED = 1.0`), so whale's accuracy counts what the
  environment's authors call solved.

Reward functions are Python code that meets untrusted answers, so by default they run out of
process: `jailed_grading` hands `whale.grading` a "call" grader (`graders.JailedCall`) that
loads `verifiers_score.py` by path in the grading jail (it imports verifiers, never whale),
with the environment's package bound read-only where it is not in site-packages; the jail's
zygote imports verifiers and resolves the environment once, and a forked child scores each
answer under `grader.timeout_s` and `grader.memory_mb`. `grader.in_process = true` trusts the
answers: scoring then runs on a thread of this process with the timeout (an awaiting reward is
cancelled, a blocking one keeps its thread and the answer is graded as a timeout) and no
memory cap. Either way a reward that raises, returns a non-number or NaN, or times out is a
zero grade whose feedback says so, with the error's class name only.

Not covered, each refused at load with `EnvironmentNotCovered` naming its kind: multi-agent or
custom episodes (the package exports a `vf.Env`: user simulation, games, best-of-n, judges
played by agents), tasksets that ship their own harness program, tool environments (MCP
`Toolset`s), container/sandbox tasks (`NEEDS_CONTAINER`, an image, setup/finalize hooks),
rewards that need the runtime, plugged LLM judges (`task.judges`: they need a client), request
/response interceptors, skills, tasks a user opens (no prompt), non-text prompts (images),
tool calls in a prompt, a task type the taskset does not declare, rows that do not survive
their JSON form (the jail rebuilds each task from it). Also not covered, unrefused because
they cannot be seen before scoring: a reward that calls an LLM judge from its own code (it
gets no client or network and ends as a scorer error or a timeout); rewards that read more of
the trace than the prompt and the one reply (tool messages, turns, token usage) see a
single-turn trace; `@vf.stop` hooks and metrics are ignored (a whale harness decides when to
stop; metrics are not grades); in the jail, an environment package that imports modules
outside itself and site-packages, or reads files next to it, does not start.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import sysconfig
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.config import ConfigError
from whale.tasks.base import Grade, Question, TaskBase
from whale.tasks.graders import JAIL_USER, GradeOutOfProcess, JailedCall
from whale.tasks.pytasks import TaskRequest, module_file

# The scoring module, self-contained (the jail loads it by path). It imports verifiers (an
# optional extra, seconds to import), so this module imports it only when a task is loaded.
SCORE_FILE = Path(__file__).with_name("verifiers_score.py")

TIMEOUT = "grading timeout"
NOT_A_NUMBER = "scorer error: the reward is not a finite number"
# The scoring thread (in process) is joined this long after the in-loop timeout: an awaiting
# reward is cancelled there first; only a reward that blocks the thread outlives it.
JOIN_MARGIN_S = 0.5
_CONFIG_KEYS = ("args", "grader")
SLACK = 1e-9  # float rounding in a sum of reward weights, never a real difference
_GRADER_KEYS = ("in_process", "timeout_s", "memory_mb", "solved_at", "max_reward")


class EnvironmentNotCovered(ConfigError):
    """A verifiers environment of a kind whale cannot run as a task yet; `kind` names it."""

    def __init__(self, env_id: str, kind: str, detail: str) -> None:
        super().__init__(
            f"verifiers environment {env_id!r}: {kind} is not covered ({detail}); whale loads "
            "single-turn environments whose rewards read the prompt and one reply",
            field="task.id",
        )
        self.kind = kind


@dataclass(frozen=True)
class GraderSettings:
    """`task.config.grader`: how the environment's rewards grade a whale answer."""

    in_process: bool = False  # trust the answers: score them in this process
    timeout_s: float = 10.0  # one answer's scoring
    memory_mb: int | None = None  # the jail's cap per answer; None: whale.grading's default
    solved_at: float = 1.0  # weighted reward at which an answer is correct
    max_reward: float | None = None  # the weighted reward that scores 1.0; None: the weights

    @classmethod
    def parse(cls, raw: Any) -> GraderSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConfigError("must be a table", field="task.config.grader")
        unknown = sorted(set(raw) - set(_GRADER_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {unknown}; known: {list(_GRADER_KEYS)}",
                field=f"task.config.grader.{unknown[0]}",
            )
        in_process = raw.get("in_process", False)
        if not isinstance(in_process, bool):
            raise ConfigError("must be true or false", field="task.config.grader.in_process")
        memory = raw.get("memory_mb")
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                                   or memory < 64):  # fmt: skip
            raise ConfigError(f"must be an integer >= 64 (got {memory!r})",
                              field="task.config.grader.memory_mb")  # fmt: skip
        return cls(
            in_process=in_process,
            timeout_s=_seconds(raw),
            memory_mb=memory,
            solved_at=_positive(raw, "solved_at") or 1.0,
            max_reward=_positive(raw, "max_reward"),
        )


def _seconds(raw: Mapping[str, Any]) -> float:
    t = _positive(raw, "timeout_s") or 10.0
    if t > 3600:  # past an hour, the jail's select() and RLIMIT_CPU overflow
        raise ConfigError(f"must be at most 3600 seconds (got {t!r})",
                          field="task.config.grader.timeout_s")  # fmt: skip
    return t


def _positive(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    field = f"task.config.grader.{key}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"must be a number (got {value!r})", field=field)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"must be a positive finite number (got {value!r})", field=field)
    return float(value)


def load_verifiers(req: TaskRequest) -> VerifiersTask:
    """The task `verifiers:ENV` from `req` (the registry's loader). `req.config`: `args` (the
    taskset's config) and `grader` (GraderSettings). A finite taskset gives all its tasks; an
    infinite one its first `req.size`. ConfigError (EnvironmentNotCovered for a kind whale does
    not run) names the field."""
    try:
        import verifiers.v1  # noqa: F401 - only to say what is missing
    except ImportError as e:
        raise ConfigError(
            f"verifiers:ENV needs the verifiers package ({e}): pip install 'whale[verifiers]'",
            field="task.id",
        ) from e
    config = dict(req.config)
    unknown = sorted(set(config) - set(_CONFIG_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown}; known: {list(_CONFIG_KEYS)} (the environment's own "
            "settings go in task.config.args)",
            field=f"task.config.{unknown[0]}",
        )
    args = config.get("args") or {}
    if not isinstance(args, Mapping):
        raise ConfigError("must be a table (the taskset's config)", field="task.config.args")
    try:
        args_json = json.dumps(args, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"must be plain data (JSON): {e}", field="task.config.args") from e
    settings = GraderSettings.parse(config.get("grader"))
    return VerifiersTask(req.arg, args_json, settings, req.size)


class VerifiersTask(TaskBase):
    """The tasks of one verifiers taskset, graded by their own reward functions."""

    def __init__(self, env_id: str, args_json: str, settings: GraderSettings, size: int) -> None:
        import verifiers.v1 as vf

        self.env_id, self.args_json, self.settings = env_id, args_json, settings
        self.name = f"verifiers:{env_id}"
        config, task_cls, data_cls = _resolve(env_id, args_json)
        _refuse_taskset(env_id, config)
        taskset = vf.load_taskset(config)
        self._questions: list[Question] = []
        first: Any = None
        seen: dict[str, Any] = {}
        for task in taskset if taskset.bounded else taskset.take(size):
            if type(task) is not task_cls:
                raise EnvironmentNotCovered(
                    env_id, "a task type the taskset does not declare",
                    f"it yields {type(task).__name__}, its Taskset declares "
                    f"{task_cls.__name__} (class T(vf.Taskset[MyTask, MyConfig]))",
                )  # fmt: skip
            if first is None:
                _refuse_task(env_id, task)
                first = task
            q = self._question(task, data_cls)
            if q.id in seen:  # splits and the ledger are keyed by question id
                raise ConfigError(
                    f"verifiers environment {env_id!r}: tasks {seen[q.id]} and {task.data.idx} "
                    f"have the same id {q.id!r} (data.id, or the task's key where it has none)",
                    field="task.id",
                )  # fmt: skip
            seen[q.id] = task.data.idx
            self._questions.append(q)
        if first is None:
            raise ConfigError(f"verifiers environment {env_id!r} yields no tasks", "task.id")
        self.rewards = [
            (fn.__name__, float(getattr(fn, "_vf_weight", 1.0)), _first_line(fn))
            for fn in first.hooks("reward")
        ]
        positive = sum(w for _, w, _ in self.rewards if w > 0)
        if not positive and settings.max_reward is None:
            raise ConfigError(f"verifiers environment {env_id!r}: no reward has a positive "
                              "weight, so no answer could be correct; set "
                              "task.config.grader.max_reward", "task.config.grader")  # fmt: skip
        self.max_reward = settings.max_reward or positive
        if settings.solved_at > self.max_reward * (1 + SLACK):
            whence = "grader.max_reward" if settings.max_reward else "the positive weights' sum"
            raise ConfigError(
                f"{settings.solved_at:g} is above the highest weighted reward, "
                f"{self.max_reward:g} ({whence}): no answer could be correct",
                field="task.config.grader.solved_at",
            )
        # `correct` on the [0, 1] score, less a relative SLACK: weights of 0.6, 0.3 and 0.1
        # sum to 0.9999999999999999 in floats, and a perfect answer must still reach the bar.
        self.threshold = settings.solved_at / self.max_reward * (1 - SLACK)
        self.description = _describe(env_id, type(taskset), first, self)
        self._setup = {"env": env_id, "args": json.loads(args_json), "max_reward": self.max_reward}
        self._jail = _jail_spec(env_id, args_json, type(taskset))

    def _question(self, task: Any, data_cls: Any) -> Question:
        env_id, data = self.env_id, task.data
        _refuse_data(env_id, data)
        row = data.model_dump(mode="json")
        if data_cls.model_validate(row) != data:
            raise EnvironmentNotCovered(
                env_id, "task data that does not survive its JSON form",
                f"task {data.idx}: a field is excluded from serialization, so the grader "
                "could not rebuild the task",
            )  # fmt: skip
        qid = data.id if data.id is not None else task.key[:16]
        return Question(
            id=f"{self.name}:{qid}",
            prompt=render_question(data),
            reference=row,
            metadata={"env": env_id, "idx": data.idx, "name": data.name},
        )

    def questions(self) -> list[Question]:
        return list(self._questions)

    def expected(self, question: Question) -> str | None:
        answer = question.reference.get("answer")
        return None if answer is None or isinstance(answer, dict | list) else str(answer)

    def jailed_grading(self, question: Question, answer: str) -> JailedCall | None:
        """Out of process unless `grader.in_process`: the jail calls
        `verifiers_score.jailed_score(setup, answer, row)`."""
        if self.settings.in_process:
            return None
        spec, mounts = self._jail
        s = self.settings
        return JailedCall("call", spec, mounts, (self._setup, question.reference),
                          self.threshold, s.timeout_s, s.memory_mb)  # fmt: skip

    def grade(self, question: Question, answer: str) -> Grade:
        """The environment's rewards on `answer` in this process (`grader.in_process`). A
        reward that raises, returns a non-number or runs past the timeout is a zero grade whose
        feedback says so; the feedback never carries text the answer controls."""
        from whale.tasks.verifiers_score import root_error, score_rubric

        if not self.settings.in_process:
            raise GradeOutOfProcess(f"{self.name} grades out of process: whale.grading.grade, "
                                    "or task.config.grader.in_process = true")  # fmt: skip
        timeout = self.settings.timeout_s
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["reward"] = score_rubric(self.env_id, self._setup["args"],
                                             question.reference, answer, timeout)  # fmt: skip
            except BaseException as e:  # noqa: BLE001 - reported as this answer's grade
                box["error"] = e

        worker = threading.Thread(target=run, daemon=True, name="whale-verifiers-grade")
        worker.start()
        worker.join(timeout + JOIN_MARGIN_S)
        if worker.is_alive() or isinstance(box.get("error"), TimeoutError):
            return Grade(0.0, False, TIMEOUT)
        if "error" in box:
            return Grade(0.0, False, f"scorer error: {type(root_error(box['error'])).__name__}")
        reward = box["reward"]
        if not math.isfinite(reward):
            return Grade(0.0, False, NOT_A_NUMBER)
        score = min(1.0, max(0.0, reward / self.max_reward))  # as `jailed_score` computes it
        return Grade(score, score >= self.threshold)


def render_question(data: Any) -> str:
    """The text a harness receives for a task row (module docstring: the mapping)."""
    from verifiers.v1.types import content_text

    prompt, system = data.prompt, data.system_prompt
    if isinstance(prompt, str):
        return prompt if system is None else f"{system}\n\n{prompt}"
    blocks = [] if system is None else [("system", system)]
    blocks += [(m.role, content_text(m.content)) for m in prompt]
    if len(blocks) == 1 and blocks[0][0] == "user":
        return blocks[0][1]
    return "\n\n".join(f"[{role}]\n{text}" for role, text in blocks)


# --- what a task is made of, and what the jail needs ------------------------------------------


def _resolve(env_id: str, args_json: str) -> tuple[Any, Any, Any]:
    """`verifiers_score.resolve`, its failures as ConfigErrors naming the field."""
    import pydantic

    from whale.tasks.verifiers_score import resolve

    try:
        return resolve(env_id, args_json)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"verifiers environment {env_id!r} is not installed ({e}); install its package "
            "(whale downloads nothing from the verifiers hub)",
            field="task.id",
        ) from e
    except pydantic.ValidationError as e:
        errors = [(".".join(map(str, err["loc"])), err["msg"]) for err in e.errors()]
        shown = "; ".join(f"{loc}: {msg}" for loc, msg in errors)
        raise ConfigError(
            f"verifiers environment {env_id!r}: {e.title} refused the args: {shown}",
            field=f"task.config.args.{errors[0][0]}" if errors else "task.config.args",
        ) from None
    except (AttributeError, TypeError, ValueError) as e:  # __all__ missing or ambiguous
        raise ConfigError(f"verifiers environment {env_id!r}: {e}", field="task.id") from e


def _jail_spec(env_id: str, args_json: str, taskset_cls: type) -> tuple[dict[str, Any], tuple]:
    """The "call" grader the jail loads (`verifiers_score`, bound by path; `warm` names the
    environment its zygote resolves before forking) and the host paths it binds read-only:
    that file, and the environment's package where site-packages (which the jail mounts) does
    not hold it."""
    here = SCORE_FILE.resolve()
    mounts = [(str(here), f"{JAIL_USER}/{here.name}")]
    top = sys.modules.get(taskset_cls.__module__.split(".")[0])
    where = module_file(top) if top is not None else None
    sites = [Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")]
    if where is not None and not any(where.is_relative_to(s) for s in sites):
        where = where.parent if where.name == "__init__.py" else where
        mounts.append((str(where), f"{JAIL_USER}/{where.name}"))
    spec = {"module": here.stem, "function": "jailed_score", "file": False,
            "warm": {"env": env_id, "args": json.loads(args_json)}}  # fmt: skip
    return spec, tuple(mounts)


def _refuse_taskset(env_id: str, config: Any) -> None:
    """EnvironmentNotCovered for a taskset whose episodes are more than one prompt and reply."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import taskset_class

    env_cls = vf.environment_class(env_id)
    if env_cls is not vf.SingleAgentEnv:
        raise EnvironmentNotCovered(
            env_id, "a multi-agent or custom episode",
            f"it exports {env_cls.__name__}, whose run() drives the episode "
            "(user simulation, games, several agents)",
        )  # fmt: skip
    if vf.default_harness_id(env_id) != "bash":
        raise EnvironmentNotCovered(
            env_id, "a taskset with its own harness",
            "it exports a vf.Harness: its tasks are meant for that agent program",
        )  # fmt: skip
    task_cls = vf.task_type(env_id)
    tools = [*taskset_class(env_id).toolsets(config), *task_cls.toolsets(config.task)]
    if tools:
        names = ", ".join(type(t).__name__ for t in tools)
        raise EnvironmentNotCovered(env_id, "a tool environment", f"MCP toolsets: {names}")
    if task_cls.NEEDS_CONTAINER:
        raise EnvironmentNotCovered(env_id, "a container (sandbox) task", "NEEDS_CONTAINER")
    if config.task.judges:
        ids = ", ".join(j.id for j in config.task.judges)
        raise EnvironmentNotCovered(
            env_id, "an LLM judge", f"task.judges: {ids}; a judge needs a model client"
        )


def _refuse_task(env_id: str, task: Any) -> None:
    """EnvironmentNotCovered for a task whose scoring or hooks need a runtime or a rollout."""
    import verifiers.v1 as vf
    from verifiers.v1.utils.decorators import discover_decorated

    from whale.tasks.verifiers_score import runtime_rewards

    hooks = [n for n in ("setup", "finalize", "stage_verifier")
             if getattr(type(task), n) is not getattr(vf.Task, n)]  # fmt: skip
    if hooks:
        raise EnvironmentNotCovered(
            env_id, "a container (sandbox) task", f"{', '.join(hooks)} hooks need a runtime"
        )
    needs = runtime_rewards(task)
    if needs:
        raise EnvironmentNotCovered(
            env_id, "a runtime-scored reward", f"{', '.join(needs)} takes the runtime"
        )
    if discover_decorated(task, "intercept"):
        raise EnvironmentNotCovered(
            env_id, "request/response interceptors", "@vf.intercept rewrites a rollout's calls"
        )


def _refuse_data(env_id: str, data: Any) -> None:
    from verifiers.v1.types import AssistantMessage, TextContentPart, ToolMessage

    where = f"task {data.idx}"
    if data.prompt is None:
        raise EnvironmentNotCovered(env_id, "a conversation a user opens", f"{where} has no prompt")
    if data.image is not None or data.workdir is not None:
        raise EnvironmentNotCovered(env_id, "a container (sandbox) task", f"{where}: an image")
    if data.skills:
        raise EnvironmentNotCovered(env_id, "skills", f"{where} installs skills")
    for m in [] if isinstance(data.prompt, str) else data.prompt:
        if isinstance(m, ToolMessage) or (isinstance(m, AssistantMessage) and m.tool_calls):
            raise EnvironmentNotCovered(env_id, "tool calls in a prompt", where)
        content = m.content
        if not (content is None or isinstance(content, str)) and not all(
            isinstance(p, TextContentPart) for p in content
        ):
            raise EnvironmentNotCovered(env_id, "a non-text prompt", f"{where}: images")


def _describe(env_id: str, taskset_cls: type, task: Any, owner: VerifiersTask) -> str:
    """The task description a proposer reads: the environment's own words, then how an
    answer is scored (the rewards' names, weights and first doc lines)."""
    module = sys.modules.get(taskset_cls.__module__)
    doc = (_paragraph(taskset_cls.__doc__) or _paragraph(getattr(module, "__doc__", None))
           or _paragraph(type(task).__doc__))  # fmt: skip
    lines = [
        f"verifiers environment '{env_id}'. {doc}".strip(),
        "The harness receives the question text (the environment's system prompt and prompt) "
        "and returns one answer string, which the environment's reward functions score as the "
        "model's single reply:",
        *(f"- {name} (weight {w:g}): {line}" for name, w, line in owner.rewards),
        f"The score is the weighted reward over {owner.max_reward:g}, clamped to [0, 1]; an "
        f"answer is correct when the weighted reward is at least {owner.settings.solved_at:g}.",
    ]
    return "\n".join(lines)


def _paragraph(doc: str | None) -> str:
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else ""


def _first_line(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn)
    return doc.strip().splitlines()[0] if doc else "(no description)"
