"""A resumed search counts the rollouts of its archived work (found by an attack: it counted 0,
ran an extra iteration and spent past its budget)."""

from tests.fakes import ScriptedModel
from tests.metaharness.test_loop import GOOD, WORSE
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.harness import Runtime
from whale.metaharness.loop import SearchSettings
from whale.metaharness.operator import SearchOperator
from whale.operators import OperatorBudget
from whale.runs import OutcomeStore


def improve(tmp_path, replies, budget):
    task = SumTask()
    store = OutcomeStore(tmp_path)
    op = SearchOperator(tmp_path / "archives", task.questions()[:6], store, ScriptedModel(replies),
                        SearchSettings(iterations=5, m=2, workers=2))  # fmt: skip
    try:
        _, rec = op.improve(task, Runtime(model=prose_solver()), SEED,
                            OperatorBudget(rollouts=budget))  # fmt: skip
    finally:
        store.close()
    return rec, store


def test_a_replayed_search_counts_and_decides_what_the_first_did(tmp_path):
    first, _ = improve(tmp_path, [WORSE, GOOD], 7)
    again, store = improve(tmp_path, [WORSE, GOOD] + [WORSE] * 6, 7)  # a fresh process, resumed
    assert (again.rollouts, again.iterations, again.stopped) == \
        (first.rollouts, first.iterations, first.stopped)
    assert store.new_rollouts == 0
