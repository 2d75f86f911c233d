"""What every command checks before anything is paid for: the task loads and builds its
questions, the harness exists and keeps the run contract, the models exist, a sandbox is there,
the executor can run them. Each refusal is a typed `WhaleError` naming the config field, so
the API raises it and the CLI prints it (exit 2).

Task, harness and models may be given as objects (a `Task`, a harness's source, a `ChatModel`)
instead of the names in the config: the object is used and the config keeps its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from whale.config import ConfigError
from whale.errors import WhaleError
from whale.harness import load_harness as _load_harness_source
from whale.harness.bundle import BundleError
from whale.harness.contract import run_contract_fault
from whale.models import (
    ChatModel,
    ModelConfig,
    ModelError,
    UnknownModel,
    build_model,
    close_model,
)
from whale.tasks import SplitOverlap, Task, UnknownTask
from whale.tasks import load_task as _load_task

__all__ = ["HarnessUnavailable", "SplitRefused", "TaskUnavailable", "check_operator",
           "load_harness", "load_task", "model", "resolve", "task_config"]  # fmt: skip


class TaskUnavailable(WhaleError, ValueError):
    """A task that loads but cannot build its questions (its own config is wrong, its
    dataset is broken): the message names the task and what it raised."""


class HarnessUnavailable(WhaleError, ValueError):
    """A harness that is neither a seed nor a file, or a seed that breaks the run contract."""


class SplitRefused(WhaleError, ValueError):
    """Splits of the sizes asked for cannot be drawn disjoint from the task's questions."""


def load_task(task_id: str, size: int = 100, seed: int = 0,
              config: dict[str, Any] | None = None,
              variant: str = "canonical") -> Task:  # fmt: skip
    """A task by id (`whale tasks` lists them), its questions built and checked now:
    UnknownTask (field `task.id`) or TaskUnavailable (field `task.config`)."""
    try:
        task = _load_task(task_id, size=size, seed=seed, config=config, variant=variant)
    except UnknownTask as e:
        raise e.at("task.id") from None
    _check_questions(task, task_id)
    return task


def _check_questions(task: Task, task_id: str) -> None:
    try:
        task.questions()  # the family's own config is checked when its dataset is built
    except Exception as e:  # noqa: BLE001 - whatever the family raises, before any cost
        raise TaskUnavailable(f"task {task_id}: {type(e).__name__}: {e}").at("task.config") from e


def load_harness(name_or_path: str, field: str = "harness") -> str:
    """The source of a seed harness by name, of a harness file by path, or of a harness
    folder by path (its files as one bundle, `whale.harness.bundle`)."""
    try:
        return _load_harness_source(name_or_path)
    except (FileNotFoundError, BundleError) as e:
        raise HarnessUnavailable(str(e)).at(field) from None


def model(spec: ModelConfig | ChatModel, field: str) -> Any:
    """A chat model from its config (built: UnknownModel or ModelError naming `field`), or the
    model object given."""
    if not isinstance(spec, ModelConfig):
        return spec
    try:
        return build_model(spec)
    except (UnknownModel, ModelError) as e:
        raise e.at(field) from None


def task_config(cfg: Any) -> dict[str, Any]:
    """The task's own config, with `judge = "MODEL"` (judged QA) made into a fixed rubric judge:
    temperature 0, seed 0, the response cache on, the same for the whole run."""
    conf = dict(cfg.task.config)
    if isinstance(conf.get("judge"), str):
        from whale.models import Sampling
        from whale.tasks.judged import RubricJudge

        try:
            judge_model = build_model(ModelConfig(name=conf["judge"]))
        except (UnknownModel, ModelError) as e:
            raise type(e)(f"task.config.judge: {e}").at("task.config.judge") from None
        sampling = Sampling(max_tokens=4, temperature=0.0, seed=0)
        conf["judge"] = RubricJudge(
            lambda p: judge_model.chat([{"role": "user", "content": p}], sampling).text
        )
    return conf


def check_sandbox(cfg: Any, unsafe: bool) -> None:
    """`runtime.sandbox`: "unsafe" only when the caller says so (`unsafe`); else a jail
    backend must be there."""
    from whale.harness.sandbox import Sandbox, SandboxUnavailable

    if unsafe:
        cfg.runtime.sandbox = "unsafe"
    elif cfg.runtime.sandbox == "unsafe":
        raise ConfigError("runtime.sandbox = 'unsafe' runs untrusted code without isolation: "
                          "pass --unsafe-no-sandbox (unsafe_no_sandbox=True from Python)"
                          ).at("runtime.sandbox")  # fmt: skip
    try:
        Sandbox(cfg.runtime.sandbox).resolved()
    except SandboxUnavailable as e:
        raise SandboxUnavailable(f"runtime.sandbox = {cfg.runtime.sandbox!r}: {e}").at(
            "runtime.sandbox") from None  # fmt: skip


def resolve(cfg: Any, unsafe: bool, task: Task | None = None, source: str | None = None,
            backend: ChatModel | None = None, size: int | None = None,
            model_field: str = "model") -> tuple[Task, str, Any]:  # fmt: skip
    """Task, harness source and model of an eval-shaped config (`task`, `harness`, `model`,
    `runtime`, `n`), each checked, before any run directory exists. Objects given replace the
    config's names."""
    check_sandbox(cfg, unsafe)
    if task is None:
        task = load_task(cfg.task.id, size=size or cfg.task.size or cfg.n, seed=cfg.task.seed,
                         config=task_config(cfg), variant=cfg.task.variant)  # fmt: skip
    else:
        _check_questions(task, cfg.task.id)
    if source is None:
        source = load_harness(cfg.harness)
    solver = model(backend if backend is not None else cfg.model, f"{model_field}.name")
    if cfg.runtime.executor.kind != "local":
        from whale.harness.executor import remote_fault

        if (why := remote_fault(solver)) is not None:  # before a run directory exists
            close_model(solver)
            raise ConfigError(why).at("runtime.executor.kind")
    return task, source, solver


def check_operator(cfg: Any, unsafe: bool, splits: Callable[[Task], object],
                   task: Task | None = None, source: str | None = None,
                   solver: ChatModel | None = None,
                   proposer: ChatModel | None = None) -> tuple[Task, str, Any, Any]:  # fmt: skip
    """What `adapt` and `search` check before any cost, on top of `resolve`: the seed keeps the
    run contract, the proposer model exists, and `splits(task)` can draw disjoint splits of
    the sizes asked for."""
    from whale.evaluation import EvalConfig

    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, model=cfg.solver, runtime=cfg.runtime,
                      n=cfg.dev + cfg.eval)  # fmt: skip
    task_obj, seed_source, solver_model = resolve(ecfg, unsafe, task, source, solver,
                                                  model_field="solver")  # fmt: skip
    cfg.runtime.sandbox = ecfg.runtime.sandbox
    fault = run_contract_fault(seed_source)
    if fault is not None:  # a seed that cannot run makes no experiment
        close_model(solver_model)
        raise HarnessUnavailable(f"--harness {cfg.harness}: the seed harness {fault}").at(
            "harness")  # fmt: skip
    try:
        splits(task_obj)
    except (SplitOverlap, ValueError) as e:
        close_model(solver_model)
        raise SplitRefused(str(e)).at("dev") from None
    try:
        proposer_model = model(proposer if proposer is not None else cfg.proposer,
                               "proposer.name")  # fmt: skip
    except WhaleError:
        close_model(solver_model)
        raise
    return task_obj, seed_source, solver_model, proposer_model
