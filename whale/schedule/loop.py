"""WHALE: optimize (θ, h) together by alternating a weight phase and a harness phase.

Each phase holds the other component frozen: the weight phase (rejection-sampling SFT,
`whale.train.rsft`) trains the solver under the current harness; the harness phase (a
`HarnessOperator`: Meta-Harness search by default) searches harnesses under the current
weights (the search keeps ONE archive for all of a schedule's harness phases, under the
schedule's `harness/archive/`, so a later phase can return to any earlier candidate; the
revision loop has no archive). Schedules (`SCHEDULES`):

- `adaptive`: each phase ends by its patience rule (weight: W = T_min = P_w = 0.2 epoch on the
  weight phase's own reward; harness: (J_min, P_h) = (6, 2) on the archive's best training
  score), capped at `max_weight_epochs` / `max_harness_iters`;
- `fixed`: E epochs, then I iterations, each cycle;
- `weight-only`, `harness-only`: one kind of phase, E epochs or I iterations per cycle;
- `stagewise`, as the paper runs it: ONE weight stage of E* epochs, then ONE harness stage of
  I* iterations (`stagewise = (E*, I*)`, its own setting; one cycle).
Every schedule stops when its budget of training rollouts is spent, so that schedules can be
compared at the same rollout budget (None: no cap, as `whale rsft` runs without `--rollouts`;
then N or the schedule itself must end the run); fixed also after N = `cycles` cycles (default
3; a given N caps every schedule), and a schedule with no N to end it after a cycle that spent
no rollout (a proposer whose every edit fails would otherwise cycle for ever). With N given, a
cycle that spent nothing does not end the run: a harness phase whose candidates were all
invalid costs no rollouts, and the next phase (another proposer session) may well make valid
ones, so harness-only still spends the budget the others spend. A harness phase is not
started with fewer rollouts left than one scoring of the search split (`scoring_rollouts`): it
could not pay for one candidate, and scoring its start harness alone would overshoot the
budget.

What is read at a phase boundary (the eval split for the curves, the validation split for the
reported best point) is read by a `BoundaryRead` callback handed to the loop: it gets
(cycle, boundary, harness, training rollouts) and returns nothing, so no read can reach a
switching rule, and the phases themselves never see it (`Reads` is the one cotrain uses; it
writes `reads.jsonl`). Every rollout is one row of the schedule's ledger (`outcomes.jsonl`, an
`OutcomeStore`), tagged with schedule, cycle, phase, kind (weight_sample, harness_score, eval,
validation), step and adapter: training rollouts are the rows of the first two kinds, counted
the same way for every schedule.

Resume replays: a killed run, started again, runs this same loop; every rollout already in the
ledger, every weight step on disk (with its adapter), every archived candidate and proposer
session is answered from its record, so the replay takes the same decisions and pays for
nothing twice, and the run continues at the step where it was killed.
"""

from __future__ import annotations

import itertools
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from whale.evaluation import EvalResult
from whale.operators import HarnessOperator, OperatorBudget
from whale.records import JsonlWriter, iter_jsonl
from whale.runs import OutcomeStore
from whale.tasks import Question, Task
from whale.train.patience import EPS
from whale.train.rsft import Solver, WeightPhase, WeightStep

ScheduleKind = Literal["adaptive", "fixed", "weight-only", "harness-only", "stagewise"]
SCHEDULES: tuple[ScheduleKind, ...] = typing.get_args(ScheduleKind)
# The schedules that end by themselves: fixed after N cycles (3 by default), stagewise after
# its one cycle. The others need a rollout budget or N.
ENDING: tuple[ScheduleKind, ...] = ("fixed", "stagewise")

# (cycle, boundary, harness source, training rollouts spent before the read) -> nothing.
BoundaryRead = Callable[[int, str, str, int], None]


def no_read(cycle: int, boundary: str, h: str, spent: int) -> None:
    """A `BoundaryRead` that reads nothing (a sweep point: scored once, after its run)."""


@dataclass(frozen=True)
class ScheduleSettings:
    kind: ScheduleKind = "adaptive"
    # Training rollouts (weight samples + harness scoring) of the run; None: no cap.
    rollouts: int | None = 300
    weight_epochs: float = 0.2  # E: one weight phase of fixed and weight-only
    harness_iters: int = 6  # I: one harness phase of fixed and harness-only
    # N: the cycles of fixed (3 when None); the other schedules run until the rollout budget
    # is spent unless N is given (stagewise is one cycle).
    cycles: int | None = None
    patience: tuple[int, int] = (6, 2)  # (J_min, P_h) of an adaptive harness phase
    max_weight_epochs: float = 2.0  # caps of one adaptive phase
    max_harness_iters: int = 20
    # weight-only (and `whale rsft --patience`): end each weight phase by the weight patience
    # rule instead of after E epochs.
    weight_patience: bool = False
    stagewise: tuple[float, int] = (0.75, 3)  # (E*, I*): stagewise's one weight + harness stage
    # Rollouts of one harness scoring (the search split): a harness phase with fewer left
    # cannot pay for a candidate, so it is not started.
    scoring_rollouts: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r} ({', '.join(SCHEDULES)})")
        if self.rollouts is None and self.cycles is None and self.kind not in ENDING:
            raise ValueError(f"rollouts: no cap (none) needs cycles (N) for {self.kind}, which "
                             "would otherwise run until a cycle spends nothing")  # fmt: skip

    def left(self, spent: int) -> int | None:
        """Training rollouts the budget still allows after `spent`; None: no cap."""
        return None if self.rollouts is None else self.rollouts - spent


@dataclass(frozen=True)
class Phase:
    kind: str  # "weight" | "harness"
    cycle: int
    adaptive: bool
    epochs: float = 0.0  # weight phase: its length (fixed) or its cap (adaptive)
    iters: int = 0  # harness phase: its iterations (fixed) or its cap (adaptive)


def phases(s: ScheduleSettings) -> Iterator[Phase]:
    """The phases of schedule `s`, in order (the loop also stops at the rollout budget)."""
    if s.kind == "stagewise":  # the whole weight budget once, then the whole harness budget
        yield Phase("weight", 1, False, epochs=s.stagewise[0])
        yield Phase("harness", 1, False, iters=s.stagewise[1])
        return
    adaptive = s.kind == "adaptive"
    n = s.cycles if s.cycles is not None else 3 if s.kind == "fixed" else None
    wp = adaptive or s.weight_patience
    # Without N the loop stops the cycles: at the rollout budget, or after one that spent nothing.
    for c in range(1, n + 1) if n is not None else itertools.count(1):
        if s.kind != "harness-only":
            yield Phase("weight", c, wp, epochs=s.max_weight_epochs if wp else s.weight_epochs)
        if s.kind != "weight-only":
            yield Phase("harness", c, adaptive,
                        iters=s.max_harness_iters if adaptive else s.harness_iters)  # fmt: skip


@dataclass
class PhaseRecord:
    cycle: int
    phase: str
    start_harness: str
    end_harness: str
    start_adapter: str | None
    end_adapter: str | None
    rollouts: int  # training rollouts of the phase
    stopped: str
    steps: int = 0  # weight steps or search iterations
    epochs: float = 0.0
    wall_s: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class Cotrain:
    """One schedule's run in `root`: its ledger, weight steps, archives and phases. What is read
    at each boundary is `read`'s business (`Reads`): the loop hands it the state and gets
    nothing back."""

    def __init__(self, root: Path, name: str, s: ScheduleSettings, task: Task,
                 seed_harness: str, store: OutcomeStore, solver: Solver,
                 weights: WeightPhase | None, operator: HarnessOperator | None, workers: int,
                 read: BoundaryRead = no_read,
                 say: Callable[[str], None] = lambda m: None) -> None:  # fmt: skip
        self.root, self.name, self.s, self.task = root, name, s, task
        self.seed_harness, self.store = seed_harness, store
        self.solver, self.weights, self.operator = solver, weights, operator
        self.workers, self.read, self.say = workers, read, say
        self.spent = 0  # training rollouts, as replayed (store.used counts, see OutcomeStore)
        self.k = 0  # global weight step
        self.position = 0  # training prompts consumed
        self.finished = {(r["cycle"], r["phase"]) for _, r in iter_jsonl(root / "phases.jsonl")}
        self._phases = JsonlWriter(root / "phases.jsonl")

    # -- the loop (the paper's pseudocode) -----------------------------------------------------
    def run(self) -> dict[str, Any]:
        h = self.seed_harness
        self.read(0, "start", h, self.spent)
        stopped = "all its cycles"
        cycle, at_cycle_start = 0, 0
        for p in phases(self.s):
            left = self.s.left(self.spent)
            if left is not None and left <= 0:
                stopped = f"rollout budget {self.s.rollouts} spent"
                break
            if p.kind == "harness" and left is not None and left < self.s.scoring_rollouts:
                stopped = (f"rollout budget {self.s.rollouts}: {left} left, less than one "
                           f"scoring of the search split ({self.s.scoring_rollouts})")  # fmt: skip
                break
            if p.cycle != cycle:
                if cycle and self.spent == at_cycle_start and self._unbounded():  # all invalid
                    stopped = f"cycle {cycle} spent no training rollout (no progress)"
                    break
                cycle, at_cycle_start = p.cycle, self.spent
            if p.kind == "weight":
                rec = self.weight_phase(h, p)
            else:
                rec = self.harness_phase(h, p)
                h = self.store.harness(rec.end_harness)
            if (p.cycle, p.kind) not in self.finished:
                self._phases.write(asdict(rec))
                self.finished.add((p.cycle, p.kind))
            cap = f"/{self.s.rollouts}" if self.s.rollouts is not None else ""
            self.say(f"[{self.name}] cycle {p.cycle} {p.kind} phase: {rec.stopped}; "
                     f"{self.spent}{cap} training rollouts")  # fmt: skip
            self.read(p.cycle, p.kind, h, self.spent)
        else:  # every phase ran: the last one may still have ended at the budget
            left = self.s.left(self.spent)
            if left is not None and left <= 0:
                stopped = f"rollout budget {self.s.rollouts} spent"
        if self.s.rollouts is not None and self.spent < self.s.rollouts:
            stopped += f" ({self.s.rollouts - self.spent} of {self.s.rollouts} rollouts unspent)"
            self.say(f"[{self.name}] ended after {stopped}: compare schedules at equal cost")
        return {"schedule": self.name, "stopped": stopped, "training_rollouts": self.spent,
                "harness": self.store.save_harness(h), "adapter": self.solver.digest,
                "adapter_path": str(self.solver.adapter) if self.solver.adapter else None}

    def _unbounded(self) -> bool:
        """Whether only the budget or a cycle that spent nothing ends the cycles (no N)."""
        return self.s.cycles is None and self.s.kind not in ENDING

    def weight_phase(self, h: str, p: Phase) -> PhaseRecord:
        assert self.weights is not None
        t0, start, spent0 = time.monotonic(), self.solver.digest, self.spent
        steps: list[WeightStep] = []
        epochs, stopped = 0.0, ""
        patience = self.weights.settings.patience()
        while True:
            left = self.s.left(self.spent)
            if left is not None and left <= 0:
                stopped = "rollout budget spent"
                break
            tags = self._tags(p, "weight_sample", self.k)
            st = self.weights.step(h, self.k, self.position, left, tags)
            self.k, self.position = self.k + 1, self.position + st.consumed
            self.spent += st.samples
            steps.append(st)
            epochs += self.weights.epochs(st.consumed)
            self.say(f"[{self.name}] weight step {st.step}: reward {st.reward:.3f} "
                     f"({st.accepted}/{st.samples} accepted"
                     + (f", {len(st.unproven)} without answer provenance" if st.unproven else "")
                     + "), "
                     + (f"loss {st.loss:.3f}" if st.trained else f"skipped: {st.skipped}"))
            if not p.adaptive and epochs + EPS >= p.epochs:
                stopped = f"{p.epochs:g} epochs"
                break
            if p.adaptive:
                run, track = 0.0, []
                for x in steps:
                    run += self.weights.epochs(x.consumed)
                    track.append((run, x.reward, x.samples))
                if patience.should_stop(track):
                    stopped = f"patience: no new best reward for {patience.p_w:g} epochs"
                    break
                if epochs + EPS >= p.epochs:
                    stopped = f"cap of {p.epochs:g} epochs"
                    break
        hh = self.store.save_harness(h)
        return PhaseRecord(p.cycle, "weight", hh, hh, start, self.solver.digest,
                           self.spent - spent0, stopped, len(steps), round(epochs, 4),
                           round(time.monotonic() - t0, 1),
                           {"steps": [asdict(x) for x in steps]})  # fmt: skip

    def harness_phase(self, h: str, p: Phase) -> PhaseRecord:
        assert self.operator is not None
        t0 = time.monotonic()
        budget = OperatorBudget(
            rollouts=self.s.left(self.spent),
            iterations=p.iters,
            patience=self.s.patience if p.adaptive else None,
        )
        self.store.rebind(self.solver.fingerprint, **self._tags(p, "harness_score", p.cycle))
        rt = self.solver.runtime(self.workers)
        try:
            source, rec = self.operator.improve(self.task, rt, h, budget)
        finally:
            rt.close()
        self.spent += rec.rollouts
        end = self.store.save_harness(source)
        return PhaseRecord(p.cycle, "harness", rec.start_hash, end, self.solver.digest,
                           self.solver.digest, rec.rollouts, rec.stopped, rec.iterations,
                           wall_s=round(time.monotonic() - t0, 1),
                           detail={"start_score": rec.start_score, "end_score": rec.end_score,
                                   **rec.detail})  # fmt: skip

    def _tags(self, p: Phase, kind: str, step: int) -> dict[str, Any]:
        return {"schedule": self.name, "cycle": p.cycle, "phase": p.kind, "kind": kind,
                "step": step, "adapter": self.solver.digest}  # fmt: skip

    def close(self) -> None:
        self._phases.close()


class Reads:
    """The reads at phase boundaries of one schedule, a `BoundaryRead`: the eval split (for
    the curves only) and, where there is one, the validation split (to choose the reported best
    point; `whale.schedule.curves`). One row of `reads.jsonl` per (cycle, boundary); the ledger
    rows are of kind "eval" and "validation". A replayed read is answered from the ledger and
    not written again. Nothing here is returned to the loop that calls it."""

    def __init__(self, root: Path, name: str, task: Task, store: OutcomeStore, solver: Solver,
                 workers: int, eval_set: Sequence[Question],
                 validation: Sequence[Question] = (),
                 say: Callable[[str], None] = lambda m: None) -> None:  # fmt: skip
        self.name, self.task, self.store, self.solver = name, task, store, solver
        self.workers, self.eval_set, self.validation = workers, list(eval_set), list(validation)
        self.say = say
        self._rows = {(r["cycle"], r["boundary"]): r for _, r in iter_jsonl(root / "reads.jsonl")}
        self._log = JsonlWriter(root / "reads.jsonl")

    def __call__(self, cycle: int, boundary: str, h: str, spent: int) -> None:
        ev = self.score("eval", self.eval_set, cycle, boundary, h)
        va = self.score("validation", self.validation, cycle, boundary, h) \
            if self.validation else None  # fmt: skip
        if (cycle, boundary) in self._rows:
            return
        s = ev.summary()
        row: dict[str, Any] = {"schedule": self.name, "cycle": cycle, "boundary": boundary,
               "training_rollouts": spent, "accuracy": ev.accuracy, "score": ev.score,
               "n": ev.n, "harness": self.store.save_harness(h), "adapter": self.solver.digest,
               "truncation_rate": s["truncation_rate"],
               "format_compliance": 1 - s["format_failures"] / max(1, ev.n),
               "validation_accuracy": va.accuracy if va else None,
               "validation_n": va.n if va else 0, "at": time.time()}  # fmt: skip
        row.update({k: s[k] for k in ("retrieval_accuracy", "answer_extraction") if k in s})
        self._log.write(row)
        self._rows[(cycle, boundary)] = row
        val = f", validation {va.accuracy:.3f}" if va else ""
        self.say(f"[{self.name}] eval after {boundary} (cycle {cycle}): accuracy "
                 f"{ev.accuracy:.3f}{val} at {spent} training rollouts")  # fmt: skip

    def score(self, kind: str, questions: Sequence[Question], cycle: int, boundary: str,
              h: str) -> EvalResult:  # fmt: skip
        """`h` under the current weights on `questions`, as ledger rows of `kind` tagged with
        the phase that just ended (the start read has no phase: "eval")."""
        return score_split(self.store, self.solver, self.task, h, questions, self.workers,
                           {"schedule": self.name, "cycle": cycle, "kind": kind,
                            "phase": "eval" if boundary == "start" else boundary})  # fmt: skip

    def rows(self) -> list[dict[str, Any]]:
        """The reads, in the order read."""
        return list(self._rows.values())

    def close(self) -> None:
        self._log.close()


def score_split(store: OutcomeStore, solver: Solver, task: Task, h: str,
                questions: Sequence[Question], workers: int,
                tags: dict[str, Any]) -> EvalResult:  # fmt: skip
    """Harness `h` under the solver's current weights on `questions`, through the ledger
    (`tags`: schedule, cycle, phase, kind; its `kind` is also the split name of the rows)."""
    store.rebind(solver.fingerprint, **tags, step=0, adapter=solver.digest)
    rt = solver.runtime(workers)
    try:
        return store.evaluate(rt, h, task, list(questions), tags["kind"], workers)
    finally:
        rt.close()
