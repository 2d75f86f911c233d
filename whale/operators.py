"""The seam between WHALE's schedule and its harness phase: a harness operator.

`improve(task, solver, harness, budget) -> (harness, record)`: given the task, the solver (the
runtime that holds the frozen model), the current harness source and a budget, return the
harness to continue with and a record of what was done. Both harness operators implement it:
Meta-Harness search (`whale.metaharness.SearchOperator`) and the revision loop
(`whale.revise.ReviseOperator`), so the schedule calls either as a black box. The budget is
counted in rollouts (as the schedule's ledger counts them) and optionally iterations; an
operator stops when it is spent. An operator never reads the eval split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from whale.harness import Runtime
from whale.tasks import Task


@dataclass(frozen=True)
class OperatorBudget:
    rollouts: int | None = None  # new rollouts this call may pay for; None: no cap
    iterations: int | None = None  # search iterations or revision rounds; None: the operator's
    # (J_min, P_h): stop early when the best training score has not improved for P_h
    # iterations after J_min (WHALE's adaptive harness phase). The search honours it; the
    # revision loop has no such rule and runs its rounds.
    patience: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("rollouts", "iterations"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"budget {name} must be a positive int or None (got {v!r})")
        if self.patience is not None and (self.patience[0] < 0 or self.patience[1] < 1):
            raise ValueError(f"budget patience must be (J_MIN >= 0, P_H >= 1), got {self.patience}")


@dataclass
class OperatorRecord:
    operator: str  # "search" | "revise"
    start_hash: str
    end_hash: str
    start_score: float  # on the operator's own (non-eval) questions
    end_score: float
    rollouts: int  # new rollouts paid in this call
    iterations: int
    stopped: str
    detail: dict[str, Any] = field(default_factory=dict)


class HarnessOperator(Protocol):
    def improve(
        self, task: Task, solver: Runtime, harness: str, budget: OperatorBudget
    ) -> tuple[str, OperatorRecord]: ...
