"""The proposer prompt documents the tools a run of the task really gets."""

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED
from whale.harness import Budget, Runtime
from whale.retrieval import Passage
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import Proposer, task_tools
from whale.runs import OutcomeStore
from whale.tasks import Question, SealedSplit
from whale.tasks.mhqa import MultiHopTask

BUDGET = Budget(model_calls=7, tool_calls=5, retrievals=9)


@pytest.fixture
def qa_task(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE", str(tmp_path / "cache"))  # the BM25 index lands here
    passages = [Passage(f"p{i}", f"T{i}", f"Town {i} lies on river R{i}.") for i in range(6)]
    qs = [
        Question(f"qa{i}", f"Which river is town {i} on?", {"answer": f"R{i}", "supporting": []})
        for i in range(6)
    ]
    return MultiHopTask("test:qa", "Answer from the corpus.", qs, passages)


def _prompt(task):
    p = Proposer(ScriptedModel(["x"]))
    return p.prompt(task.description, SEED, "report", BUDGET, task_tools(task))


def test_a_retrieval_tasks_prompt_documents_retrieve_and_its_budget(qa_task):
    # Before: the prompt said "Nothing else exists on env" and never named retrieve.
    prompt = _prompt(qa_task)
    assert "`env.tools.retrieve(query, k=5)`" in prompt
    assert "Budget per question: 7 model calls, 5 python calls, 9 retrievals" in prompt
    assert "`.retrievals`" in prompt


def test_an_rg_tasks_prompt_does_not_mention_retrieve(task):
    prompt = _prompt(task)  # SumTask, like a Reasoning Gym task, has no retriever
    assert task_tools(task) == ("python",)
    assert "retriev" not in prompt.lower()
    assert "Budget per question: 7 model calls, 5 python calls;" in prompt


def test_adapt_writes_the_retrieval_api_into_the_round_prompt(qa_task, tmp_path):
    qs = qa_task.questions()
    store = OutcomeStore(tmp_path / "run")
    rt = Runtime(model=ScriptedModel(["R1"]))
    try:
        adapt(
            qa_task, SEED, qs[:3], qs[:3], SealedSplit(qs[3:], tmp_path / "run" / "eval.json"),
            rt, Proposer(ScriptedModel(["no edit"])), store,
            LoopSettings(rounds=1, feedback=2, workers=2),
        )  # fmt: skip
    finally:
        store.close()
        rt.close()
    prompt = (tmp_path / "run" / "round_01" / "prompt.txt").read_text()
    assert "env.tools.retrieve(query, k=5)" in prompt
