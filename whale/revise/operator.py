"""The revision loop as a harness operator (`whale.operators.HarnessOperator`).

Harness Learning's loop keeps no archive: each round's Select compares candidates with the
round's parent only, so there is no earlier candidate to return to and each `improve` call (one
harness phase) runs its rounds in a folder of its own, `root/phase_NN/round_MM/`. Across phases
it is coherent with the search operator where it can be: J is the accuracy (the verifier's,
as Select decides on it), the mean partial score is an extra column, and the rollout cap is
hard (a phase whose start harness cannot be scored within its budget is not started).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from whale.harness import Runtime, harness_hash
from whale.operators import OperatorBudget, OperatorRecord
from whale.revise.loop import LoopSettings, revise
from whale.revise.proposer import Proposer
from whale.runs import OutcomeStore
from whale.tasks import Question, Task


class ReviseOperator:
    """Each `improve` call runs revision rounds in its own folder under `root` (one per
    harness phase), drawing feedback from `feedback_pool` and scoring on `score_set`; the
    rollouts go through the shared `store`. Never reads an eval split."""

    def __init__(self, root: Path, feedback_pool: Sequence[Question],
                 score_set: Sequence[Question], store: OutcomeStore, proposer: Proposer,
                 settings: LoopSettings | None = None) -> None:  # fmt: skip
        self.root, self.store, self.proposer = root, store, proposer
        self.feedback_pool, self.score_set = list(feedback_pool), list(score_set)
        self.settings = settings or LoopSettings()
        self.calls = 0

    def improve(
        self, task: Task, solver: Runtime, harness: str, budget: OperatorBudget
    ) -> tuple[str, OperatorRecord]:
        self.calls += 1
        before = self.store.used
        cfg = replace(self.settings, rounds=budget.iterations or self.settings.rounds)
        cap = None if budget.rollouts is None else before + budget.rollouts
        h0 = harness_hash(harness)
        cost = self.store.unused(h0, [q.id for q in self.score_set])
        if budget.rollouts is not None and cost > budget.rollouts:  # hard cap: not started
            why = (f"rollout budget: {budget.rollouts} left, scoring the start harness takes "
                   f"{cost} (not started)")  # fmt: skip
            return harness, OperatorRecord("revise", h0, h0, 0.0, 0.0, 0, 0, why, {"rounds": []})
        start = self.store.evaluate(solver, harness, task, self.score_set, "score", cfg.workers)
        h, rounds = revise(task, harness, self.feedback_pool, self.score_set, solver,
                           self.proposer, self.store, cfg, max_rollouts=cap,
                           rounds_dir=self.root / f"phase_{self.calls:02d}")  # fmt: skip
        source = self.store.harness(h)
        end = self.store.evaluate(solver, source, task, self.score_set, "score", cfg.workers)
        spent = cap is not None and self.store.used >= cap
        stopped = "rollout budget spent" if spent else f"{len(rounds)} rounds"
        record = OperatorRecord(
            "revise", h0, h, start.score, end.score, self.store.used - before, len(rounds),
            stopped, {"start_accuracy": start.accuracy, "end_accuracy": end.accuracy,
                      "rounds": [asdict(r.decision) for r in rounds]},
        )  # fmt: skip
        return source, record
