"""Tasks: Reasoning Gym families, multi-hop QA, judged QA, math, the user's own files
(`jsonl:PATH`, ... with named graders) and Python (`py:`), found by id through the registry
(`whale.tasks.registry`: `load_task`, `task_ids`, `register_task`, and the `whale.tasks` entry
points of installed packages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from whale.config import at_least
from whale.tasks.base import (
    CAPABILITIES,
    EvalAlreadyRead,
    Grade,
    Question,
    SealedSplit,
    SplitOverlap,
    Task,
    TaskBase,
    UnknownTask,
    WrappedTask,
    check_disjoint,
    dedupe,
    normalize_prompt,
    split,
)
from whale.tasks.registry import (
    ENTRY_POINT_GROUP,
    DuplicateTask,
    TaskEntry,
    TaskRequest,
    load_task,
    register_task,
    task_entries,
    task_ids,
)
from whale.tasks.variants import VARIANTS, VariantRefused, refusal


@dataclass
class TaskConfig:
    """The task part of every command's config."""

    id: str = "rg:basic_arithmetic"
    size: int | None = None  # pool size; default: just enough for the command
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # the family's own overrides
    # "canonical": the questions as the family writes them; "format": the same questions
    # reworded (whale.tasks.variants; offered per family, refused elsewhere)
    variant: str = "canonical"

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build`. The family's own `config` is checked by
        the family when the task is loaded (`load_task`)."""
        if not self.id.strip():
            raise ValueError("id: must not be empty")
        at_least(self, 1, "size")
        why = refusal(self.id, self.variant)
        if why is not None:
            raise ValueError(why)


__all__ = [
    "CAPABILITIES",
    "DuplicateTask",
    "ENTRY_POINT_GROUP",
    "EvalAlreadyRead",
    "Grade",
    "Question",
    "SealedSplit",
    "SplitOverlap",
    "TaskConfig",
    "Task",
    "TaskBase",
    "TaskEntry",
    "TaskRequest",
    "UnknownTask",
    "VARIANTS",
    "VariantRefused",
    "WrappedTask",
    "check_disjoint",
    "dedupe",
    "load_task",
    "normalize_prompt",
    "register_task",
    "split",
    "task_entries",
    "task_ids",
]
