"""Tasks: Reasoning Gym families (more domains join through `load_task`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from whale.tasks.base import (
    EvalAlreadyRead,
    Grade,
    Question,
    SealedSplit,
    SplitOverlap,
    Task,
    UnknownTask,
    check_disjoint,
    dedupe,
    normalize_prompt,
    split,
)


@dataclass
class TaskConfig:
    """The task part of every command's config."""

    id: str = "rg:basic_arithmetic"
    size: int | None = None  # pool size; default: just enough for the command
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # the family's own overrides


def load_task(
    task_id: str, size: int = 100, seed: int = 0, config: dict[str, Any] | None = None
) -> Task:
    """`rg:FAMILY` → a Reasoning Gym task. Raises UnknownTask naming the bad id."""
    kind, _, rest = task_id.partition(":")
    if kind == "rg" and rest:
        from whale.tasks.rg import ReasoningGymTask

        return ReasoningGymTask(rest, size=size, seed=seed, config=config)
    raise UnknownTask(f"unknown task {task_id!r}; task ids look like rg:FAMILY (see `whale tasks`)")


def task_ids() -> list[tuple[str, str]]:
    """(id pattern, one line) for `whale tasks`."""
    return [("rg:FAMILY", "a Reasoning Gym family (see `whale tasks --families`)")]


__all__ = [
    "EvalAlreadyRead",
    "Grade",
    "Question",
    "SealedSplit",
    "SplitOverlap",
    "TaskConfig",
    "Task",
    "UnknownTask",
    "check_disjoint",
    "dedupe",
    "load_task",
    "normalize_prompt",
    "split",
    "task_ids",
]
