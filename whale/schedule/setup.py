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


def prepare(cfg: CotrainConfig, unsafe: bool,
            task: Task | None = None) -> tuple[Task, str, Any, Task | None]:  # fmt: skip
    """(task, seed source, proposer model or None, the task validation draws from) of `cfg`,
    each checked; typed WhaleErrors naming the field. The solver is only checked to exist
    (cotrain serves it itself), uncached; `task` replaces the config's task id."""
    ecfg = EvalConfig(task=cfg.task, harness=cfg.harness, runtime=cfg.runtime,
                      model=dataclasses.replace(cfg.solver, cache=False),
                      n=pool_size(cfg))  # fmt: skip
    task_obj, source, solver_check = resolve(ecfg, unsafe, task, model_field="solver")
    close_model(solver_check)
    cfg.runtime.sandbox = ecfg.runtime.sandbox
    fault = run_contract_fault(source)
    if fault is not None:
        raise HarnessUnavailable(f"--harness {cfg.harness}: the seed harness {fault}").at(
            "harness")  # fmt: skip

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
