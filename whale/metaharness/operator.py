"""Meta-Harness search as a harness operator (`whale.operators.HarnessOperator`).

One archive for all of a schedule's harness phases (WHALE: "archive 전체에서 최고점 harness를
accepted state로 유지하므로 proposer는 이전 candidate로 되돌아가거나 과거 artifact를 재해석할
수 있다"): `root/archive/` and the agent's sessions in `root/sessions/`. Each `improve` call is
one phase of it (`loop.PhaseStart`): candidate ids and iteration numbers continue, the phase's
start harness is a candidate of it (or, when the archive holds it scored under the same
weights, that candidate), and the phase accepts the best candidate of the whole archive scored
under the current solver, so it may return to one of an earlier phase.

Scores are comparable only under one solver (the store's fingerprint, which the schedule rebinds
to the solver's weights before each phase). Under unchanged weights (harness-only, stagewise's
harness stage, a weight phase that trained nothing) every earlier score stands and costs
nothing. When the weights changed, the previous phase's top `SearchSettings.rescore`
candidates (its accepted one, which is the new start, among them) are scored again under the
new weights at the phase's start, as training rollouts of this phase, so they can be accepted
again; the other earlier candidates stay readable, their scores labelled as measured under
other weights, and are not ranked.

Resume: a killed schedule replays its phases in order through a new operator; every phase
replays from the archive and the sessions (the same ids, the same decisions, no session run
again), because what a phase decides depends only on what this process has replayed so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from whale.harness import Runtime
from whale.metaharness.agent import AgentConfig, ProposerAgent
from whale.metaharness.archive import Archive
from whale.metaharness.loop import PhaseStart, SearchSettings, search
from whale.metaharness.patience import Patience
from whale.metaharness.tools import ArchiveTools
from whale.models import ChatModel
from whale.operators import OperatorBudget, OperatorRecord
from whale.runs import OutcomeStore
from whale.tasks import Question, Task


class SearchOperator:
    """Each `improve` call is one harness phase of the one archive under `root`, on the search
    split only; the rollouts go through the shared `store`."""

    def __init__(self, root: Path, search_set: Sequence[Question], store: OutcomeStore,
                 proposer: ChatModel, settings: SearchSettings | None = None,
                 agent: AgentConfig | None = None) -> None:  # fmt: skip
        self.root, self.search_set, self.store = root, list(search_set), store
        self.proposer = proposer
        self.settings, self.agent_cfg = settings or SearchSettings(), agent or AgentConfig()
        self.calls = 0
        self.archive = Archive(root / "archive", [q.id for q in self.search_set])
        self.next_iteration = 0  # the start iteration of the next phase
        # (solver, top ids) at the end of the previous phase: what is rescored when the
        # weights changed.
        self.last: tuple[str, list[str]] | None = None

    def improve(
        self, task: Task, solver: Runtime, harness: str, budget: OperatorBudget
    ) -> tuple[str, OperatorRecord]:
        self.calls += 1
        fp = self.store.fingerprint
        rescore = tuple(self.last[1]) if self.last is not None and self.last[0] != fp else ()
        tools = ArchiveTools(self.archive, task.description, self.agent_cfg.tool_chars)
        agent = ProposerAgent(self.proposer, tools, self.agent_cfg,
                              retrieval=task.retriever is not None,
                              user_tools=solver.tool_specs(),
                              packages=solver.package_names())  # fmt: skip
        before = self.store.used
        cfg = replace(
            self.settings,
            iterations=budget.iterations or self.settings.iterations,
            max_rollouts=None if budget.rollouts is None else before + budget.rollouts,
            patience=Patience(*budget.patience) if budget.patience else self.settings.patience,
        )
        start = PhaseStart(self.calls, self.next_iteration, rescore)
        r = search(task, harness, self.search_set, solver, agent, self.store, self.archive, cfg,
                   sessions=self.root / "sessions", start=start)  # fmt: skip
        self.next_iteration = r.next_iteration
        self.archive.view(fp, r.next_iteration - 1)
        self.last = (fp, [m.id for m in self.archive.top(self.settings.rescore)])
        # Nothing scored (the budget did not cover the start): the start harness stands.
        source = self.archive.source(r.accepted_id) if r.accepted_id else harness
        record = OperatorRecord("search", r.seed_hash, r.accepted_hash, r.seed_score,
                                r.accepted_score, self.store.used - before,
                                len(r.iterations), r.stopped,
                                {"archive": str(self.archive.root), "harness_phase": self.calls,
                                 "start_id": r.seed_id, "accepted_id": r.accepted_id,
                                 "start_accuracy": r.seed_accuracy,
                                 "end_accuracy": r.accepted_accuracy, "rescored": r.rescored,
                                 "iterations": [asdict(i) for i in r.iterations]})  # fmt: skip
        return source, record
