"""The executor seam (whale.harness.executor): evaluate() goes through `runtime.executor`,
records each question once whatever the executor yields, and the config selects it."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import pytest

from tests.fakes import ScriptedModel
from whale import config as cfgmod
from whale.evaluation import EvalConfig, Outcome, evaluate, outcome_of
from whale.harness import Runtime, RuntimeConfig, Trajectory, load_harness, make_runtime
from whale.harness import executor as ex
from whale.harness.executor import ExecutorConfig, ExecutorUnavailable, LocalPool, Rollout
from whale.runs import ledger_row
from whale.tasks import load_task


class Replaying:
    """Runs every rollout on the local pool, then yields them last-first, each twice: an
    executor that is out of order and repeats itself."""

    def __init__(self) -> None:
        self.calls = 0

    def stream(
        self, runtime: Runtime, source: str, rollouts: Sequence[Rollout], workers: int,
        retriever: object,
    ) -> Generator[tuple[int, Trajectory], None, None]:  # fmt: skip
        self.calls += 1
        done = list(LocalPool().stream(runtime, source, rollouts, workers, None))
        for i, t in sorted(done, key=lambda d: -d[0]):
            yield i, t
            yield i, t


def test_evaluate_goes_through_the_runtimes_executor_and_records_each_question_once():
    task = load_task("rg:basic_arithmetic", size=4, seed=0)
    qs = task.questions()
    replay = Replaying()
    rt = Runtime(model=ScriptedModel([f"Answer: {qs[0].reference['answer']}"]), executor=replay)
    seen: list[str] = []
    r = evaluate(rt, load_harness("single_call"), task, qs, 2,
                 on_done=lambda o, t: seen.append(o.question_id))  # fmt: skip
    assert replay.calls == 1
    assert sorted(seen) == sorted(q.id for q in qs) and len(seen) == len(qs)
    assert seen[0] == qs[-1].id  # in the order the executor yielded them
    assert [o.question_id for o in r.outcomes] == [q.id for q in qs]  # result in question order
    assert r.outcomes[0].correct and r.rho_run == 1.0


class Forgetful:
    def stream(self, runtime, source, rollouts, workers, retriever):  # noqa: ANN001, ANN201
        yield 0, Trajectory(question_id=rollouts[0].question_id, harness_hash="x")


def test_an_executor_that_drops_a_question_is_an_error_not_a_shorter_result():
    task = load_task("rg:basic_arithmetic", size=3, seed=0)
    with pytest.raises(RuntimeError, match="returned no run"):
        evaluate(Runtime(executor=Forgetful()), "x", task, task.questions(), 1)


def test_the_executor_is_chosen_by_dotted_overrides_and_checked():
    cfg = cfgmod.load(EvalConfig, overrides=[
        "runtime.executor.kind=ray", "runtime.executor.actors=3", "runtime.executor.per_actor=2",
        "runtime.executor.address=auto",
    ])  # fmt: skip
    e = cfg.runtime.executor
    assert (e.kind, e.actors, e.per_actor, e.address) == ("ray", 3, 2, "auto")
    for bad, field in [("kind=spark", "kind"), ("actors=0", "actors"), ("per_actor=0", "per_actor"),
                       ("actor_start_s=0", "actor_start_s")]:  # fmt: skip
        with pytest.raises(cfgmod.ConfigError, match=f"runtime.executor.{field}"):
            cfgmod.load(EvalConfig, overrides=[f"runtime.executor.{bad}"])
    assert cfgmod.load(EvalConfig).runtime.executor.kind == "local"


def test_local_is_the_default_and_attaches_no_executor():
    rt = make_runtime(RuntimeConfig(), None)
    assert rt.executor is None  # evaluate() makes a LocalPool of its workers


def test_ray_asked_for_and_missing_is_a_clear_error_before_any_run(monkeypatch):
    monkeypatch.setattr(ex, "ray_available", lambda: False)
    model = ScriptedModel()
    with pytest.raises(ExecutorUnavailable, match=r"pip install 'whale\[ray\]'"):
        make_runtime(RuntimeConfig(executor=ExecutorConfig(kind="ray")), model)
    assert model.calls == []


def test_cancel_hooks_run_on_cancel_at_once_when_late_and_can_be_removed():
    rt = Runtime()
    calls: list[str] = []
    remove = rt.on_cancel(lambda: calls.append("a"))
    rt.on_cancel(lambda: calls.append("b"))
    remove()
    rt.cancel()
    assert calls == ["b"]
    rt.on_cancel(lambda: calls.append("late"))
    assert calls == ["b", "late"]


def test_retries_is_backward_compatible_in_trajectories_and_ledger_rows():
    old = Trajectory(question_id="q", harness_hash="h").to_dict()
    del old["retries"]
    assert Trajectory.from_dict(old).retries == 0
    t = Trajectory(question_id="q", harness_hash="h", status="crashed", retries=1)
    task = load_task("rg:basic_arithmetic", size=1, seed=0)
    o = outcome_of(task, task.questions()[0], t)
    assert o.retries == 1
    row = {"fingerprint": "f", "harness": "h", "question_id": "q", "answer": None, "score": 0.0,
           "correct": False, "status": "ok"}  # fmt: skip
    _, read = ledger_row(row, "ledger:1")
    assert isinstance(read, Outcome) and read.retries == 0


def test_remote_fault_names_models_that_only_live_in_this_process(tmp_path):
    from tests.fakes import ScriptedModel
    from whale.harness.executor import remote_fault
    from whale.models import CachedModel, Fleet, OpenAICompatible

    assert "executor.kind=local" in (remote_fault(ScriptedModel()) or "")
    assert remote_fault(CachedModel(ScriptedModel(), tmp_path / "c.sqlite")) is not None
    plain = OpenAICompatible("m", "http://127.0.0.1:9/v1")
    fleet = Fleet("m", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"])
    try:
        assert remote_fault(plain) is None and remote_fault(fleet) is None
        assert remote_fault(None) is None
    finally:
        fleet.close()
