"""Meta-Harness search as a harness operator (`whale.operators.HarnessOperator`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from whale.harness import Runtime
from whale.models import ChatModel
from whale.operators import OperatorBudget, OperatorRecord
from whale.revise.store import OutcomeStore
from whale.search.agent import AgentConfig, ProposerAgent
from whale.search.archive import Archive
from whale.search.loop import SearchSettings, search
from whale.search.patience import Patience
from whale.search.tools import ArchiveTools
from whale.tasks import Question, Task


class SearchOperator:
    """Each `improve` call searches in its own archive folder under `root` (one per harness
    phase), on the search split only; the rollouts go through the shared `store`."""

    def __init__(self, root: Path, search_set: Sequence[Question], store: OutcomeStore,
                 proposer: ChatModel, settings: SearchSettings | None = None,
                 agent: AgentConfig | None = None) -> None:  # fmt: skip
        self.root, self.search_set, self.store = root, list(search_set), store
        self.proposer = proposer
        self.settings, self.agent_cfg = settings or SearchSettings(), agent or AgentConfig()
        self.calls = 0

    def improve(
        self, task: Task, solver: Runtime, harness: str, budget: OperatorBudget
    ) -> tuple[str, OperatorRecord]:
        self.calls += 1
        archive = Archive(self.root / f"phase_{self.calls:02d}", [q.id for q in self.search_set])
        agent = ProposerAgent(self.proposer, ArchiveTools(archive, task.description),
                              self.agent_cfg,
                              retrieval=getattr(task, "retriever", None) is not None)  # fmt: skip
        before = self.store.used
        cfg = replace(
            self.settings,
            iterations=budget.iterations or self.settings.iterations,
            max_rollouts=None if budget.rollouts is None else before + budget.rollouts,
            patience=Patience(*budget.patience) if budget.patience else self.settings.patience,
            # A seed per phase: a phase that starts where the last one ended (same harness,
            # same weights) would otherwise make the same proposals and learn nothing.
            seed=self.settings.seed + (self.calls - 1) * 7919,
        )
        r = search(task, harness, self.search_set, solver, agent, self.store, archive, cfg,
                   sessions=archive.root.with_name(f"{archive.root.name}-sessions"))
        source = archive.source(r.accepted_id)
        record = OperatorRecord("search", r.seed_hash, r.accepted_hash, r.seed_score,
                                r.accepted_score, self.store.used - before,
                                len(r.iterations), r.stopped,
                                {"archive": str(archive.root),
                                 "iterations": [asdict(i) for i in r.iterations]})  # fmt: skip
        return source, record
