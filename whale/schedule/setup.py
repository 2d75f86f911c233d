"""What `cotrain` and `rsft` check before anything is paid for, and the inputs they start
from: the task (at the size a run without validation loads: the same train and eval), the
seed harness (it keeps the run contract), where validation questions come from, the splits
(disjoint, of the sizes asked for), and the proposer when a schedule has a harness phase."""

from __future__ import annotations

import dataclasses
from typing import Any

from whale.evaluation import EvalConfig
from whale.harness.contract import run_contract_fault
from whale.models import close_model
from whale.runs.setup import (
    HarnessUnavailable,
    SplitRefused,
    load_task,
    model,
    resolve,
    task_config,
)
from whale.schedule.cotrain import (
    CotrainConfig,
    cotrain_splits,
    needs_proposer,
    pool_size,
    validation_source,
)
from whale.tasks import Task


def seed_and_task(cfg: Any, unsafe: bool, n: int,
                  task: Task | None = None) -> tuple[Task, str, EvalConfig]:  # fmt: skip
    """(task, seed source, the eval-shaped config they were checked under) of a config that
    trains its own solver (cotrain, rsft, diagnose): the task loaded at `n` questions (or the
    object given), the seed keeping the run contract, the solver only checked to exist (the
    run serves it itself), uncached."""
    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, runtime=cfg.runtime,
                      model=dataclasses.replace(cfg.solver, cache=False), n=n)  # fmt: skip
    task_obj, source, solver_check = resolve(ecfg, unsafe, task, model_field="solver")
    close_model(solver_check)
    fault = run_contract_fault(source)
    if fault is not None:
        raise HarnessUnavailable(f"--harness {cfg.harness}: the seed harness {fault}").at(
            "harness")  # fmt: skip
    return task_obj, source, ecfg


def prepare(cfg: CotrainConfig, unsafe: bool,
            task: Task | None = None) -> tuple[Task, str, Any, Task | None]:  # fmt: skip
    """(task, seed source, proposer model or None, the task validation draws from) of `cfg`,
    each checked; typed WhaleErrors naming the field. The task is loaded at the size a run
    without validation loads (the same train and eval); `task` replaces the config's id."""
    task_obj, source, ecfg = seed_and_task(cfg, unsafe, pool_size(cfg), task)

    def larger(size: int) -> Task:  # the same task with more questions, for validation
        if task is not None:
            return task  # a task object is as large as it is
        return load_task(cfg.task.id, size=size, seed=cfg.task.seed, config=task_config(ecfg),
                         variant=cfg.task.variant)  # fmt: skip

    try:
        more = validation_source(task_obj, cfg, larger)
        cotrain_splits(task_obj, cfg, more)
    except ValueError as e:
        raise SplitRefused(str(e)).at("train") from None
    proposer = model(cfg.proposer, "proposer.name") if needs_proposer(cfg) else None
    return task_obj, source, proposer, more
