"""WHALE: optimize (θ, h) together by alternating a weight phase and a harness phase.

Each phase holds the other component frozen: the weight phase (rejection-sampling SFT,
`whale.train.rsft`) trains the solver under the current harness; the harness phase (a
`HarnessOperator`: Meta-Harness search by default) searches harnesses under the current
weights. Schedules (`SCHEDULES`):

- `adaptive`: each phase ends by its patience rule (weight: W = T_min = P_w = 0.2 epoch on the
  weight phase's own reward; harness: (J_min, P_h) = (6, 2) on the archive's best training
  score), capped at `max_weight_epochs` / `max_harness_iters`;
- `fixed`: E epochs, then I iterations, each cycle;
- `weight-only`, `harness-only`: one kind of phase, E epochs or I iterations per cycle;
- `stagewise`: N weight phases of E epochs first, then N harness phases of I iterations.
Every schedule stops when its budget of training rollouts is spent, so that schedules can be
compared at the same rollout budget; fixed and stagewise also after N = `cycles` cycles
(default 3; a given N caps every schedule), and any schedule after a cycle that spent no
rollout (a proposer whose every edit fails would otherwise cycle for ever).

Validation never drives switching: the eval split is scored at every phase boundary for the
curves only, and each read is a line of `reads.jsonl`. Every rollout is one row of the
schedule's ledger (`outcomes.jsonl`, an `OutcomeStore`), tagged with schedule, cycle, phase,
kind (weight_sample, harness_score, eval), step and adapter: training rollouts are the rows of
the first two kinds, counted the same way for every schedule.

Resume replays: a killed run, started again, runs this same loop; every rollout already in the
ledger, every weight step on disk (with its adapter), every archived candidate and proposer
session is answered from its record, so the replay takes the same decisions and pays for
nothing twice, and the run continues at the step where it was killed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale.operators import HarnessOperator, OperatorBudget
from whale.records import JsonlWriter, iter_jsonl
from whale.revise.store import OutcomeStore
from whale.tasks import Question, Task
from whale.train.patience import EPS
from whale.train.rsft import Solver, WeightPhase, WeightStep

SCHEDULES = ("adaptive", "fixed", "weight-only", "harness-only", "stagewise")


@dataclass(frozen=True)
class ScheduleSettings:
    kind: str = "adaptive"
    rollouts: int = 300  # training rollouts (weight samples + harness scoring) of the run
    weight_epochs: float = 0.2  # E: one weight phase of fixed, weight-only, stagewise
    harness_iters: int = 6  # I: one harness phase of fixed, harness-only, stagewise
    # N: the cycles of fixed and stagewise (3 when None); the other schedules run until the
    # rollout budget is spent unless N is given.
    cycles: int | None = None
    patience: tuple[int, int] = (6, 2)  # (J_min, P_h) of an adaptive harness phase
    max_weight_epochs: float = 2.0  # caps of one adaptive phase
    max_harness_iters: int = 20
    # weight-only (and `whale rsft --patience`): end each weight phase by the weight patience
    # rule instead of after E epochs.
    weight_patience: bool = False

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r} ({', '.join(SCHEDULES)})")


@dataclass(frozen=True)
class Phase:
    kind: str  # "weight" | "harness"
    cycle: int
    adaptive: bool


def phases(s: ScheduleSettings) -> Iterator[Phase]:
    """The phases of schedule `s`, in order (the loop also stops at the rollout budget)."""
    adaptive = s.kind == "adaptive"
    n = s.cycles if s.cycles is not None else 3 if s.kind in ("fixed", "stagewise") else 10**6
    if s.kind == "stagewise":
        yield from (Phase("weight", c, False) for c in range(1, n + 1))
        yield from (Phase("harness", c, False) for c in range(n + 1, 2 * n + 1))
        return
    for c in range(1, n + 1):
        if s.kind != "harness-only":
            yield Phase("weight", c, adaptive or s.weight_patience)
        if s.kind != "weight-only":
            yield Phase("harness", c, adaptive)


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
    """One schedule's run in `root`: its ledger, weight steps, archives, reads and phases."""

    def __init__(self, root: Path, name: str, s: ScheduleSettings, task: Task,
                 seed_harness: str, eval_set: list[Question], store: OutcomeStore,
                 solver: Solver, weights: WeightPhase | None,
                 operator: HarnessOperator | None, workers: int,
                 say: Callable[[str], None] = lambda m: None) -> None:  # fmt: skip
        self.root, self.name, self.s, self.task = root, name, s, task
        self.seed_harness, self.eval_set, self.store = seed_harness, eval_set, store
        self.solver, self.weights, self.operator = solver, weights, operator
        self.workers, self.say = workers, say
        self.spent = 0  # training rollouts, as replayed (store.used counts, see OutcomeStore)
        self.k = 0  # global weight step
        self.position = 0  # training prompts consumed
        self.reads = {(r["cycle"], r["boundary"]): r for _, r in iter_jsonl(root / "reads.jsonl")}
        self.finished = {(r["cycle"], r["phase"]) for _, r in iter_jsonl(root / "phases.jsonl")}
        self._reads = JsonlWriter(root / "reads.jsonl")
        self._phases = JsonlWriter(root / "phases.jsonl")

    # -- the loop (the paper's pseudocode) -----------------------------------------------------
    def run(self) -> dict[str, Any]:
        h = self.seed_harness
        self.read_eval(0, "start", h)
        stopped = "all its cycles"
        cycle, at_cycle_start = 0, 0
        for p in phases(self.s):
            if self.spent >= self.s.rollouts:
                stopped = f"rollout budget {self.s.rollouts} spent"
                break
            if p.cycle != cycle:
                if cycle and self.spent == at_cycle_start:  # e.g. every candidate invalid
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
            cap = f"/{self.s.rollouts}" if self.s.rollouts < 10**9 else ""
            self.say(f"[{self.name}] cycle {p.cycle} {p.kind} phase: {rec.stopped}; "
                     f"{self.spent}{cap} training rollouts")  # fmt: skip
            self.read_eval(p.cycle, p.kind, h)
        if self.spent < self.s.rollouts and self.s.rollouts < 10**9:
            stopped += f" ({self.s.rollouts - self.spent} of {self.s.rollouts} rollouts unspent)"
            self.say(f"[{self.name}] ended after {stopped}: compare schedules at equal cost")
        return {"schedule": self.name, "stopped": stopped, "training_rollouts": self.spent,
                "harness": self.store.save_harness(h), "adapter": self.solver.digest,
                "adapter_path": str(self.solver.adapter) if self.solver.adapter else None,
                "reads": list(self.reads.values())}  # in the order read  # fmt: skip

    def weight_phase(self, h: str, p: Phase) -> PhaseRecord:
        assert self.weights is not None
        t0, start, spent0 = time.monotonic(), self.solver.digest, self.spent
        steps: list[WeightStep] = []
        epochs, stopped = 0.0, ""
        patience = self.weights.settings.patience()
        while True:
            left = self.s.rollouts - self.spent
            if left <= 0:
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
            if not p.adaptive and epochs + EPS >= self.s.weight_epochs:
                stopped = f"{self.s.weight_epochs:g} epochs"
                break
            if p.adaptive:
                run, track = 0.0, []
                for x in steps:
                    run += self.weights.epochs(x.consumed)
                    track.append((run, x.reward, x.samples))
                if patience.should_stop(track):
                    stopped = f"patience: no new best reward for {patience.p_w:g} epochs"
                    break
                if epochs + EPS >= self.s.max_weight_epochs:
                    stopped = f"cap of {self.s.max_weight_epochs:g} epochs"
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
            rollouts=self.s.rollouts - self.spent,
            iterations=self.s.max_harness_iters if p.adaptive else self.s.harness_iters,
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

    def read_eval(self, cycle: int, boundary: str, h: str) -> dict[str, Any]:
        """Score the eval split (for the curves only; nothing reads it to decide)."""
        # Tagged with the phase that just ended (its row of phases.csv counts them as
        # eval_rollouts); the start read has no phase: "eval".
        tags = {"schedule": self.name, "cycle": cycle,
                "phase": "eval" if boundary == "start" else boundary, "kind": "eval",
                "step": 0, "adapter": self.solver.digest}  # fmt: skip
        self.store.rebind(self.solver.fingerprint, **tags)
        rt = self.solver.runtime(self.workers)
        try:
            ev = self.store.evaluate(rt, h, self.task, self.eval_set, "eval", self.workers)
        finally:
            rt.close()
        if (cycle, boundary) not in self.reads:
            s = ev.summary()
            row: dict[str, Any] = {"schedule": self.name, "cycle": cycle, "boundary": boundary,
                   "training_rollouts": self.spent, "accuracy": ev.accuracy, "score": ev.score,
                   "n": ev.n, "harness": self.store.save_harness(h),
                   "adapter": self.solver.digest, "truncation_rate": s["truncation_rate"],
                   "format_compliance": 1 - s["format_failures"] / max(1, ev.n),
                   "at": time.time()}  # fmt: skip
            row.update({k: s[k] for k in ("retrieval_accuracy", "answer_extraction") if k in s})
            self._reads.write(row)
            self.reads[(cycle, boundary)] = row
            self.say(f"[{self.name}] eval after {boundary} (cycle {cycle}): accuracy "
                     f"{ev.accuracy:.3f} at {self.spent} training rollouts")  # fmt: skip
        return self.reads[(cycle, boundary)]

    def _tags(self, p: Phase, kind: str, step: int) -> dict[str, Any]:
        return {"schedule": self.name, "cycle": p.cycle, "phase": p.kind, "kind": kind,
                "step": step, "adapter": self.solver.digest}  # fmt: skip

    def close(self) -> None:
        self._reads.close()
        self._phases.close()

