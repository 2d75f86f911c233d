"""The execution reward of one edit, shared by the teacher filter, GRPO and the evaluation.

r = J(h'; Q_score) + v, v = 0.05·[parses] + 0.10·[runnable] + 0.15·ρ_run (`revise.select`),
J the accuracy: the fraction the task's binary verifier accepts (the mean partial score is
recorded as `mean_score` and decides nothing). The proposal is applied to its context's parent
(`revise.edits.apply_edits`), screened before any rollout is paid (interface violations: a
changed `run` contract, forbidden imports, file, network or environment access; answer echo of
the family's dev questions), then run through the isolated runtime on the context's scoring
questions. An edit that does not apply, or that a screen stops, is invalid and earns validity
credit only (0.05 when it parses, as in `adapt`).

`ExecutionReward` is GRPO's reward function: a batch of (context id, completion) pairs, the
distinct candidates of the batch scored concurrently (two samples that make the same harness
share one scoring through the family's ledger, never paying twice), every result appended to
`rewards.jsonl`, and the best candidate per context (highest accuracy, the first found among
equals) kept for the multistep phases. It also sums, over the rollouts it ran, the time spent
in solver calls against the rollouts' wall time (`solver_fraction`): how much of the reward
execution is waiting on the solver.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from whale.harness import Failure, Runtime, harness_hash
from whale.records import JsonlWriter, iter_jsonl
from whale.revise.code_screens import interface_violations
from whale.revise.edits import apply_edits
from whale.revise.screens import AnswerEchoScreen, screen_questions
from whale.revise.select import ValidityWeights, reward
from whale.train.proposer.contexts import Family, RevisionContext

WEIGHTS = ValidityWeights()  # the Reasoning Gym recipe


@dataclass
class EditResult:
    context: str
    valid: bool
    reason: str  # why it is invalid ("" when valid)
    stage: str  # "apply" | "interface" | "answer_echo" | "scored"
    hash: str | None  # the candidate harness (None when Apply failed)
    parses: bool
    runnable: bool
    rho_run: float
    accuracy: float | None  # J on the questions it was scored on: the fraction correct
    reward: float  # J + v
    n_scored: int = 0
    solver_s: float = 0.0  # solver-call time in its rollouts
    run_s: float = 0.0  # wall time of its rollouts
    mean_score: float | None = None  # mean partial score there: recorded, never decides


def echo_screen(family: Family, baseline: str) -> AnswerEchoScreen:
    """The family's answer-echo screen over every dev question a proposer may have seen."""
    return AnswerEchoScreen(family.task, screen_questions(family.feedback_pool, family.scoring),
                            baseline=baseline)  # fmt: skip


def candidate_of(ctx: RevisionContext, text: str, echo: AnswerEchoScreen | None
                 ) -> tuple[str | None, EditResult | None]:  # fmt: skip
    """The candidate's source, or the invalid result that stops it before any rollout."""
    res = apply_edits(ctx.parent_source, text)
    if not res.ok:
        v = reward(None, res.syntax_ok, False, 0.0)
        return None, EditResult(ctx.id, False, f"apply: {res.reason}", "apply", None,
                                res.syntax_ok, False, 0.0, None, v)  # fmt: skip
    h = harness_hash(res.source)
    faults = interface_violations(res.source, ctx.parent_source)
    if faults:
        return None, EditResult(ctx.id, False, "interface: " + "; ".join(faults), "interface", h,
                                True, False, 0.0, None, reward(None, True, False, 0.0))  # fmt: skip
    echo_why = echo.check(res.source) if echo is not None else None
    if echo_why is not None:
        return None, EditResult(ctx.id, False, f"answer_echo: {echo_why}", "answer_echo", h,
                                True, False, 0.0, None, reward(None, True, False, 0.0))  # fmt: skip
    return res.source, None


def score_source(ctx: RevisionContext, source: str, family: Family, runtime: Runtime,
                 workers: int, weights: ValidityWeights = WEIGHTS,
                 question_ids: Sequence[str] | None = None) -> EditResult:  # fmt: skip
    """Run a valid candidate on the context's scoring questions (or `question_ids`)."""
    qs = family.questions(question_ids if question_ids is not None else ctx.scoring_ids)
    ev = family.store.evaluate(runtime, source, family.task, qs, "score", workers)
    runnable = not all(o.failure is Failure.LOAD for o in ev.outcomes)
    solver_s = sum(float(e.get("latency_s") or 0.0) for t in ev.trajectories for e in t.events
                   if e.get("kind") == "model" and not e.get("cached"))  # fmt: skip
    run_s = sum(t.wall_s for t in ev.trajectories)
    r = reward(ev.accuracy, True, runnable, ev.rho_run, weights)
    return EditResult(ctx.id, True, "", "scored", harness_hash(source), True, runnable,
                      ev.rho_run, ev.accuracy, r, len(ev.outcomes), solver_s, run_s,
                      ev.score)  # fmt: skip


def score_edit(ctx: RevisionContext, text: str, family: Family, runtime: Runtime, workers: int,
               echo: AnswerEchoScreen | None, weights: ValidityWeights = WEIGHTS,
               question_ids: Sequence[str] | None = None) -> EditResult:  # fmt: skip
    source, invalid = candidate_of(ctx, text, echo)
    if invalid is not None:
        invalid.reward = reward(None, invalid.parses, False, 0.0, weights)
        return invalid
    assert source is not None
    return score_source(ctx, source, family, runtime, workers, weights, question_ids)


class ExecutionReward:
    """GRPO's reward: `reward(context_ids, completions) -> [r]`, concurrently."""

    def __init__(self, contexts: Sequence[RevisionContext], families: Mapping[str, Family],
                 runtime: Runtime, log: Path, workers: int = 4,
                 weights: ValidityWeights = WEIGHTS,
                 echo: Mapping[str, AnswerEchoScreen] | None = None) -> None:  # fmt: skip
        self.contexts = {c.id: c for c in contexts}
        self.families, self.runtime, self.weights = families, runtime, weights
        self.workers = workers
        self.echo = dict(echo or {})
        self.calls = 0
        self.solver_s = 0.0
        self.run_s = 0.0
        self.best: dict[str, tuple[float, str]] = {}  # context -> (accuracy, candidate source)
        self._lock = threading.Lock()
        self._resume(log)
        self.log = JsonlWriter(log)

    def _resume(self, log: Path) -> None:
        """A resumed phase keeps what its earlier samples found (the multistep advance reads
        `best`) and numbers its calls on from the log's last one. Rows of an update killed
        before its checkpoint stay in the log (their rollouts stay paid); `call` tells them
        apart from the redone update's. A row without `accuracy` (written when J was the mean
        partial score) offers no candidate: that score may not decide the advance."""
        for _, row in iter_jsonl(log):
            self.calls = max(self.calls, int(row.get("call") or 0))
            ctx = self.contexts.get(str(row.get("context")))
            acc, h = row.get("accuracy"), row.get("hash")
            if ctx is None or not row.get("valid") or not isinstance(acc, int | float) or not h:
                continue
            if acc > self.best.get(ctx.id, (-1.0, ""))[0]:
                self.best[ctx.id] = (float(acc), self.families[ctx.family].store.harness(h))

    def add_contexts(self, contexts: Sequence[RevisionContext]) -> None:
        self.contexts.update({c.id: c for c in contexts})

    def __call__(self, context_ids: Sequence[str], texts: Sequence[str]) -> list[float]:
        self.calls += 1
        unknown = sorted({c for c in context_ids if c not in self.contexts})
        if unknown:
            raise KeyError(f"reward asked for unknown context(s) {unknown[:3]}")
        prepared: list[tuple[RevisionContext, str | None, EditResult | None]] = []
        for cid, text in zip(context_ids, texts, strict=True):
            ctx = self.contexts[cid]
            src, bad = candidate_of(ctx, text, self.echo.get(ctx.family))
            if bad is not None:
                bad.reward = reward(None, bad.parses, False, 0.0, self.weights)
            prepared.append((ctx, src, bad))
        # One scoring per distinct (family, candidate, scoring set): the same harness from two
        # samples (or two contexts of one family) is one ledger key, and two concurrent
        # evaluations of one key would both pay.
        def key(ctx: RevisionContext, src: str) -> tuple[str, str, tuple[str, ...]]:
            return ctx.family, harness_hash(src), ctx.scoring_ids

        todo = {key(ctx, src): (ctx, src) for ctx, src, bad in prepared if src is not None}

        def run(item: tuple[RevisionContext, str]) -> EditResult:
            ctx, src = item
            return score_source(ctx, src, self.families[ctx.family], self.runtime, self.workers,
                                self.weights)  # fmt: skip

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(todo) or 1))) as pool:
            scored = dict(zip(todo, pool.map(run, todo.values()), strict=True))
        results = []
        for ctx, src, bad in prepared:
            if bad is not None:
                results.append(bad)
                continue
            assert src is not None
            results.append(replace(scored[key(ctx, src)], context=ctx.id))
        with self._lock:
            for res in scored.values():
                self.solver_s += res.solver_s
                self.run_s += res.run_s
            for (ctx, src, _), res in zip(prepared, results, strict=True):
                if src is not None and res.accuracy is not None \
                        and res.accuracy > self.best.get(ctx.id, (-1.0, ""))[0]:  # fmt: skip
                    self.best[ctx.id] = (res.accuracy, src)
            for i, res in enumerate(results):
                self.log.write({"call": self.calls, "sample": i, **asdict(res)})
        return [r.reward for r in results]

    @property
    def solver_fraction(self) -> float:
        return self.solver_s / self.run_s if self.run_s else 0.0

    def stats(self) -> dict[str, Any]:
        return {"calls": self.calls, "solver_s": round(self.solver_s, 3),
                "run_s": round(self.run_s, 3), "solver_fraction": round(self.solver_fraction, 4)}

    def close(self) -> None:
        self.log.close()
