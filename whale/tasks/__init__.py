"""Tasks: Reasoning Gym families (more domains join through `load_task`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from whale.config import at_least
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
from whale.tasks.variants import VARIANTS, VariantRefused, refusal, with_variant


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


TASK_IDS = [
    ("rg:FAMILY", "a Reasoning Gym family, 106 of them (`whale tasks --families`)"),
    ("mhqa", "whale's GENERATED offline multi-hop QA benchmark (50k+ passages, BM25)"),
    ("hotpotqa:PATH", "HotpotQA distractor/fullwiki JSON (fullwiki: task.config.abstracts=PATH)"),
    ("musique:PATH", "MuSiQue JSONL with its paragraphs"),
    ("2wiki:PATH", "2WikiMultihopQA JSON"),
    ("searchqa:PATH", "SearchQA-style JSON/JSONL, graded by the WHALE rubric"),
    ("math:PATH", "GSM8K- or MATH-format JSONL"),
    ("champ", "the 270 competition math problems of champ-dataset"),
]


def load_task(
    task_id: str,
    size: int = 100,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    variant: str = "canonical",
) -> Task:
    """A task from its id (see TASK_IDS), its questions worded as `variant` says (see
    `whale.tasks.variants`). Raises UnknownTask naming the bad id (VariantRefused, also a
    ConfigError, for a variant the task does not offer); a dataset file that does not load
    raises UnknownTask naming the file, the record and the field."""
    why = refusal(task_id, variant)
    if why is not None:  # before any dataset is read
        raise VariantRefused(why)
    return with_variant(_load(task_id, size, seed, config), task_id, variant, seed)


def _load(task_id: str, size: int, seed: int, config: dict[str, Any] | None) -> Task:
    kind, _, rest = task_id.partition(":")
    config = dict(config or {})
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UnknownTask(f"task {task_id}: size must be a positive integer (got {size!r})")
    try:
        if kind == "rg" and rest:
            from whale.tasks.rg import ReasoningGymTask

            return ReasoningGymTask(rest, size=size, seed=seed, config=config)
        if kind == "mhqa" and not rest:
            from whale.tasks.mhqa import generated_task

            unknown = sorted(set(config) - {"passages"})
            if unknown:
                raise UnknownTask(f"mhqa: unknown config field(s) {unknown}; known: ['passages']")
            return generated_task(seed=seed, size=size, passages=config.get("passages"))
        if kind in ("hotpotqa", "musique", "2wiki", "searchqa", "math") and rest:
            from whale.tasks import judged, math, qa_files

            loaders: dict[str, Any] = {
                "hotpotqa": lambda p: qa_files.hotpotqa(p, config.get("abstracts")),
                "musique": qa_files.musique,
                "2wiki": qa_files.twowiki,
                "searchqa": lambda p: judged.searchqa(p, judge=config.get("judge")),
                "math": math.math_file,
            }
            return loaders[kind](rest)  # type: ignore[no-any-return]
        if kind == "champ" and not rest:
            from whale.tasks.math import champ

            return champ()
    except UnknownTask:
        raise
    except ValueError as e:  # DatasetError and friends name the file, record and field
        raise UnknownTask(f"task {task_id}: {e}") from None
    raise UnknownTask(f"unknown task {task_id!r}; known: {', '.join(p for p, _ in TASK_IDS)}")


def task_ids() -> list[tuple[str, str]]:
    """(id pattern, one line) for `whale tasks`."""
    return list(TASK_IDS)


__all__ = [
    "EvalAlreadyRead",
    "Grade",
    "Question",
    "SealedSplit",
    "SplitOverlap",
    "TaskConfig",
    "Task",
    "UnknownTask",
    "VARIANTS",
    "VariantRefused",
    "check_disjoint",
    "dedupe",
    "load_task",
    "normalize_prompt",
    "split",
    "task_ids",
]
