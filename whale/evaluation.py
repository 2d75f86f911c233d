"""Run a harness over questions concurrently, grade in the parent, aggregate.

`evaluate()` never raises for a per-question failure: a bad run is an `Outcome` with a status
and an error naming its boundary. Grading happens here, in the parent, after the run; the
harness never sees the reference or the grader. `EvalResult.score` is J(h; Q), the mean raw
score; `rho_run` is the fraction of runs that finished (status ok). `summary()` adds
`accuracy_ci`, the 95% Wilson score interval of the accuracy (`whale.stats.wilson_ci`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, field
from typing import Any

from whale import grading, records, stats
from whale.config import at_least
from whale.harness import Failure, Runtime, RuntimeConfig, Trajectory
from whale.harness.broker import Retriever
from whale.harness.executor import LocalPool, Rollout
from whale.models import ModelConfig
from whale.tasks import Question, Task, TaskConfig


@dataclass
class EvalConfig:
    """Config of `whale eval`."""

    task: TaskConfig = field(default_factory=TaskConfig)
    harness: str = "single_call"
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    n: int = 20
    workers: int = 4
    out: str | None = None

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` on load (types are checked there too)."""
        at_least(self, 1, "n", "workers")


@dataclass
class Outcome:
    question_id: str
    answer: str | None
    score: float
    correct: bool
    status: str
    error: str | None = None
    format_ok: bool = False
    truncated: bool = False
    model_calls: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    feedback: str = ""
    # Retrieval tasks: were all gold passages (any, for answer-bearing golds) retrieved at
    # some hop? None where the task has no gold passages.
    retrieval_hit: bool | None = None
    # Runs again after the executor lost the worker running it (its trajectory's `retries`).
    retries: int = 0
    # The kind of a failed run (whale.harness.Failure: LOAD, HARNESS, RUNTIME), its
    # trajectory's; None for a run that ended ok or was ended by the broker (see Failure).
    failure: Failure | None = None


@dataclass
class EvalResult:
    """A harness's outcomes on some questions: J (`score`), accuracy, rho_run, capabilities.
    `accuracy_ci` is the Wilson score interval of the accuracy (95% in `summary()`), not a
    bootstrap; `whale.stats.bootstrap_ci` stays for non-binary values such as `score`."""

    outcomes: list[Outcome]
    trajectories: list[Trajectory] = field(repr=False)
    wall_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def score(self) -> float:
        return sum(o.score for o in self.outcomes) / self.n if self.n else 0.0

    @property
    def accuracy(self) -> float:
        return sum(o.correct for o in self.outcomes) / self.n if self.n else 0.0

    @property
    def rho_run(self) -> float:
        return sum(o.status == "ok" for o in self.outcomes) / self.n if self.n else 0.0

    def capabilities(self) -> dict[str, float]:
        """WHALE's capability metrics where they apply: retrieval accuracy (all gold passages
        retrieved at some hop) and answer extraction (correct, given the gold was retrieved)."""
        judged = [o for o in self.outcomes if o.retrieval_hit is not None]
        if not judged:
            return {}
        hits = [o for o in judged if o.retrieval_hit]
        return {
            "retrieval_accuracy": len(hits) / len(judged),
            "answer_extraction": sum(o.correct for o in hits) / len(hits) if hits else 0.0,
        }

    def accuracy_ci(self, level: float = 0.95) -> list[float] | None:
        """Wilson score interval of the accuracy over these questions (`whale.stats.wilson_ci`);
        None with no outcomes. Not the bootstrap: correctness is 0/1, and a percentile
        bootstrap of n of n correct is [1, 1], which claims no uncertainty at all; Wilson's
        gives 20/20 at 95% [0.839, 1]. It is the noise of drawing the questions, not of
        resampling the model's answers to them."""
        if not self.n:
            return None
        lo, hi = stats.wilson_ci(sum(bool(o.correct) for o in self.outcomes), self.n, level)
        return [lo, hi]

    def summary(self) -> dict[str, Any]:
        n = max(self.n, 1)
        return {
            "n": self.n,
            "accuracy": self.accuracy,
            "accuracy_ci": self.accuracy_ci(),
            "score": self.score,
            "rho_run": self.rho_run,
            "format_failures": sum(not o.format_ok for o in self.outcomes),
            "truncation_rate": sum(o.truncated for o in self.outcomes) / n,
            "status": dict(Counter(o.status for o in self.outcomes)),
            "rollouts": self.n,
            **self.capabilities(),
            "model_calls": sum(o.model_calls for o in self.outcomes),
            "tokens": sum(o.tokens for o in self.outcomes),
            "wall_s": round(self.wall_s, 3),
        }


def outcome_of(task: Task, q: Question, t: Trajectory) -> Outcome:
    """Grade a finished run. Scorers not audited as pure string handling run out of process,
    in a jail of the run's own kind, with a timeout (`whale.grading`)."""
    calls = t.model_calls()
    truncated = any(c.finish_reason == "length" for c in calls)
    if t.status == "ok" and t.answer is not None:
        g = grading.grade(task, q, t.answer, sandbox=t.sandbox or "auto")
        try:  # a user task's own code, on an untrusted answer
            fmt = bool(task.format_ok(q, t.answer))
        except (Exception, SystemExit):  # noqa: BLE001 - an answer its check cannot read
            fmt = False
        score, correct, feedback = g.score, g.correct, g.feedback
    else:
        score, correct, fmt, feedback = 0.0, False, False, f"not graded: run status {t.status}"
    return Outcome(
        retrieval_hit=retrieval_hit(task, q, t),
        question_id=q.id, answer=t.answer, score=score, correct=correct, status=t.status,
        error=t.error, format_ok=fmt, truncated=truncated, model_calls=len(calls),
        tokens=t.tokens(), wall_s=round(t.wall_s, 4), feedback=feedback, retries=t.retries,
        failure=t.failure,
    )  # fmt: skip


def retrieval_hit(task: Task, q: Question, t: Trajectory) -> bool | None:
    gold = set(task.gold_passages(q))
    if not gold:
        return None
    seen = {p.get("id") for c in t.tool_calls() if c.name == "retrieve" for p in (c.result or [])}
    if q.reference.get("retrieval") == "any":
        return bool(gold & seen)
    return gold <= seen


def evaluate(
    runtime: Runtime,
    source: str,
    task: Task,
    questions: Sequence[Question],
    workers: int = 4,
    retriever: Retriever | None = None,
    on_done: Callable[[Outcome, Trajectory], None] | None = None,
) -> EvalResult:
    """Run `source` on each question, `workers` at a time; `on_done` is called as each ends
    (from the calling thread, in completion order, once per question) so that callers can
    persist as they go. The runs go through `runtime.executor` (whale.harness.executor; None:
    a `LocalPool` of `workers` threads); whatever runs them, grading is done here, on up to
    `workers` threads (a dataset's jailed grades run in parallel, `whale.grading`).

    Stopping: on KeyboardInterrupt (Ctrl-C) or SystemExit (the CLI's SIGTERM) in the calling
    thread, no further run starts, `runtime.cancel()` kills the runs in flight, and the
    exception is re-raised at once, without waiting for them. `on_done` is never called for a
    run that did not finish before the interrupt (a resume runs it again, it is not recorded
    as killed). Not covered: an interrupt that lands inside `on_done` itself stops it between
    two of its statements (a line itself is written whole)."""
    t0 = time.monotonic()
    if retriever is None:
        retriever = task.retriever  # retrieval tasks bring their index
    results: dict[int, tuple[Outcome, Trajectory]] = {}
    executor = runtime.executor or LocalPool()
    rollouts = [Rollout(q.id, q.prompt) for q in questions]
    runs = executor.stream(runtime, source, rollouts, workers, retriever)
    # Grading runs on `workers` threads of its own: a jailed grade can take up to its timeout
    # (`whale.grading`), and one slow answer must not hold up the others' grades.
    graders = _Graders(task, questions, max(1, min(workers, len(questions))))
    seen: set[int] = set()

    def record(item: tuple[int, Trajectory, Outcome | BaseException]) -> None:
        i, traj, out = item
        if isinstance(out, BaseException):
            seen.discard(i)  # never recorded: the drain below must not wait for it
            raise out
        results[i] = (out, traj)
        if on_done is not None:
            on_done(out, traj)

    with closing(runs):
        try:
            for i, traj in runs:
                if i in seen:  # an executor's bug must not record a question twice
                    continue
                seen.add(i)
                graders.submit(i, traj)
                while (item := graders.next(block=False)) is not None:
                    record(item)
            while len(results) < len(seen):
                item = graders.next(block=True)
                assert item is not None
                record(item)
        except (KeyboardInterrupt, SystemExit):
            runtime.cancel()  # before closing the stream: it then does not wait for the runs
            raise
        except Exception:
            # The executor failed (e.g. ExecutorUnavailable) or a grade raised: no further run
            # starts (closing the stream; a no-op on a stream that raised), and the runs already
            # returned, paid for, are graded and recorded before the error goes up, so that a
            # resume does not pay for them again. Ctrl-C meanwhile cancels as above.
            try:
                runs.close()
                while len(results) < len(seen):
                    item = graders.next(block=True)
                    assert item is not None
                    if isinstance(item[2], BaseException):
                        seen.discard(item[0])  # the first error is the one raised
                    else:
                        record(item)
            except (KeyboardInterrupt, SystemExit):
                runtime.cancel()
                raise
            raise
        finally:
            graders.stop()
    missing = [questions[i].id for i in range(len(questions)) if i not in results]
    if missing:
        raise RuntimeError(f"the executor returned no run for {missing[:3]} ({len(missing)})")
    ordered = [results[i] for i in range(len(questions))]
    return EvalResult([o for o, _ in ordered], [t for _, t in ordered], time.monotonic() - t0)


class _Graders:
    """Daemon threads that grade finished runs (`outcome_of`), so that a dataset's jailed
    grades run in parallel. Daemons, not a ThreadPoolExecutor: its threads are joined at
    exit, and an interrupted command would wait there for a jailed grade to time out."""

    def __init__(self, task: Task, questions: Sequence[Question], n: int) -> None:
        self.task, self.questions = task, questions
        self.todo: queue.SimpleQueue[tuple[int, Trajectory] | None] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[int, Trajectory, Outcome | BaseException]] = (
            queue.SimpleQueue()
        )
        self.threads = [threading.Thread(target=self._loop, daemon=True, name="whale-grade")
                        for _ in range(n)]  # fmt: skip
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        while (item := self.todo.get()) is not None:
            i, traj = item
            try:
                self.done.put((i, traj, outcome_of(self.task, self.questions[i], traj)))
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread, raised there
                self.done.put((i, traj, e))

    def submit(self, i: int, traj: Trajectory) -> None:
        self.todo.put((i, traj))

    def next(self, block: bool) -> tuple[int, Trajectory, Outcome | BaseException] | None:
        """A finished grade; None when none is ready (block=False). Blocking waits in short
        steps, so that Ctrl-C reaches the calling thread at once."""
        while True:
            try:
                return self.done.get(timeout=0.2) if block else self.done.get_nowait()
            except queue.Empty:
                if not block:
                    return None

    def stop(self) -> None:
        """No new grade starts; a grade in progress ends on its own (its thread is a daemon)."""
        while True:
            try:
                self.todo.get_nowait()
            except queue.Empty:
                break
        for _ in self.threads:
            self.todo.put(None)


# The record files live in whale.records; re-exported here, where callers have found them.
JsonlWriter = records.JsonlWriter
RecordError = records.RecordError
read_jsonl = records.read_jsonl


def outcome_record(o: Outcome) -> dict[str, Any]:
    return asdict(o)
