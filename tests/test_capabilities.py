"""Capability metrics: retrieval accuracy and answer extraction, per question and aggregated."""

from whale.evaluation import evaluate
from whale.harness import Runtime
from whale.retrieval import Passage
from whale.tasks import Question, load_task
from whale.tasks.mhqa import MultiHopTask

PASSAGES = [
    Passage("a", "Alpha", "Alpha was written by Beta Person."),
    Passage("b", "Beta Person", "Beta Person was born in Gamma City."),
    Passage("c", "Delta", "Delta is unrelated."),
]


def tiny_task():
    q = Question(
        "q1",
        "Where was the author of Alpha born?",
        {"answer": "Gamma City", "supporting": ["a", "b"]},
    )
    return MultiHopTask("tiny", "d", [q], PASSAGES)


def run(src):
    task = tiny_task()
    return evaluate(Runtime(model=None), src, task, task.questions())


def test_one_hop_misses_the_second_gold_passage():
    r = run("def run(q, env):\n    env.tools.retrieve('Alpha written', 1)\n    return 'x'\n")
    assert r.outcomes[0].retrieval_hit is False and r.summary()["retrieval_accuracy"] == 0.0


def test_two_hops_retrieve_all_gold_passages():
    src = (
        "def run(q, env):\n"
        "    env.tools.retrieve('Alpha written', 1)\n"
        "    env.tools.retrieve('Beta Person born', 1)\n"
        "    return 'Gamma City'\n"
    )
    r = run(src)
    s = r.summary()
    assert r.outcomes[0].retrieval_hit is True
    assert s["retrieval_accuracy"] == 1.0 and s["answer_extraction"] == 1.0


def test_answer_extraction_counts_wrong_answers_after_a_hit():
    src = (
        "def run(q, env):\n"
        "    env.tools.retrieve('Alpha written', 1)\n"
        "    env.tools.retrieve('Beta Person born', 1)\n"
        "    return 'Delta'\n"
    )
    assert run(src).summary()["answer_extraction"] == 0.0


def test_tasks_without_gold_passages_report_no_retrieval_metrics():
    task = load_task("rg:basic_arithmetic", size=2)
    r = evaluate(Runtime(model=None), "def run(q, env):\n    return '1'\n", task, task.questions())
    assert "retrieval_accuracy" not in r.summary()
