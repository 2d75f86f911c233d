"""Select's answer-echo screen: hard-coded dev answers and questions make a candidate invalid."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, prose_solver
from whale.harness import Runtime, load_harness, seed_names
from whale.revise.edits import apply_edits
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import Proposer
from whale.revise.report import ReportConfig
from whale.revise.run import AdaptConfig, split_pools
from whale.revise.screens import AnswerEchoScreen, screen_questions
from whale.runs import OutcomeStore
from whale.tasks import SealedSplit, TaskConfig, load_task

TABLE_EDIT = (
    "Known answers first.\n<<<<<<< SEARCH\n    reply = env.llm(question)\n=======\n"
    '    table = {"What is 3 + 7?": "10", "What is 4 + 9?": "13", "What is 5 + 11?": "16"}\n'
    "    if question in table:\n        return table[question]\n"
    "    reply = env.llm(question)\n>>>>>>> REPLACE\n"
)
IN_TEST_EDIT = (
    "Special case.\n<<<<<<< SEARCH\n    reply = env.llm(question)\n=======\n"
    '    if "3 + 7" in question:\n        return "10"\n'
    "    reply = env.llm(question)\n>>>>>>> REPLACE\n"
)


def candidate(edit, parent=SEED):
    r = apply_edits(parent, edit)
    assert r.ok, r.reason
    return r.source


@pytest.fixture
def screen(task):
    qs = task.questions()
    return AnswerEchoScreen(task, screen_questions(qs[:10], qs[:10]))


def test_a_lookup_table_of_dev_questions_is_an_answer_echo(screen):
    # The input: {"What is 3 + 7?": "10", ...} (SumTask's s3 is "What is 3 + 7?" -> 10).
    why = screen.check(candidate(TABLE_EDIT), SEED)
    assert why is not None and why.startswith("answer echo") and "s3, s4, s5" in why


def test_an_in_test_on_a_question_fragment_is_an_answer_echo(screen):
    # The input: if "3 + 7" in q: return "10"
    why = screen.check(candidate(IN_TEST_EDIT), SEED)
    assert why is not None and "answer together with question text of s3" in why


def test_what_the_parent_already_held_is_not_counted(screen):
    parent = candidate(IN_TEST_EDIT)
    more = "Shorter.\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n    return reply\n"
    assert screen.check(candidate(more + ">>>>>>> REPLACE\n", parent), parent) is None


def test_text_outside_the_constants_is_not_counted(screen):
    # Comments and names are no constants: only ast.Constant values are read.
    edit = (
        "x\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
        "    # What is 3 + 7? 10. What is 4 + 9? 13. What is 5 + 11? 16.\n"
        "    s3_10 = reply.text.strip()\n    return s3_10\n>>>>>>> REPLACE\n"
    )
    assert screen.check(candidate(edit), SEED) is None


def test_short_answers_alone_never_count(screen):
    # s0..s2 answer 1, 4, 7; "yes" and True are no answers at all here.
    edit = (
        "x\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
        '    tries, k, n = 1, 4, 7\n    flag = ("yes", True)\n'
        "    return reply.text.strip()\n>>>>>>> REPLACE\n"
    )
    assert screen.check(candidate(edit), SEED) is None


def test_three_distinctive_answers_count_and_two_do_not(screen):
    # s3, s4, s6 answer 10, 13, 19 (10 is a round knob, so not distinctive); s7 answers 22.
    two = "    caps = [13, 19]\n"
    three = "    caps = [13, 19, 22]\n"
    base = "x\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n{}    return str(caps)\n"
    assert screen.check(candidate(base.format(two) + ">>>>>>> REPLACE\n"), SEED) is None
    why = screen.check(candidate(base.format(three) + ">>>>>>> REPLACE\n"), SEED)
    assert why is not None and "reference answers of 3 questions: s4, s6, s7" in why


@pytest.mark.parametrize("task_id", ["rg:basic_arithmetic", "rg:maze", "mhqa"])
def test_no_seed_is_an_answer_echo_on_the_dev_questions_adapt_draws(task_id):
    task = load_task(task_id, size=100, seed=0)
    fb, score, _ = split_pools(task, AdaptConfig(task=TaskConfig(id=task_id)))
    screen = AnswerEchoScreen(task, screen_questions(fb, score))
    assert len(screen.devs) == 25
    assert [screen.check(load_harness(n), "") for n in seed_names()] == [None] * len(seed_names())


def test_a_copied_maze_grid_is_question_text_but_its_template_is_not():
    task = load_task("rg:maze", size=100, seed=0)
    fb, score, _ = split_pools(task, AdaptConfig(task=TaskConfig(id="rg:maze")))
    screen = AnswerEchoScreen(task, screen_questions(fb, score))
    q = score[0]
    grid = q.prompt.split("```")[1]
    template = "What is the minimum number of steps to reach the goal?\nGive only the number"
    src = f"def run(question, env):\n    return env.llm({template!r} + question).text\n"
    assert screen.check(src, "") is None
    copied = f"def run(question, env):\n    return env.llm({('Example:' + grid)!r} + question)\n"
    why = screen.check(copied, "")
    assert why is not None and f"question text of {q.id}" in why


def run_loop(task, tmp_path, proposal, report=None):
    qs = task.questions()
    store = OutcomeStore(tmp_path)
    rt = Runtime(model=prose_solver())
    try:
        return adapt(
            task, SEED, qs[:10], qs[:10], SealedSplit(qs[10:14], tmp_path / "eval_read.json"),
            rt, Proposer(ScriptedModel([proposal])), store,
            LoopSettings(rounds=1, feedback=4, workers=4, report=report or ReportConfig()),
        )  # fmt: skip
    finally:
        store.close()
        rt.close()


def test_adapt_refuses_an_echo_candidate_before_scoring_it(task, tmp_path):
    r = run_loop(task, tmp_path, TABLE_EDIT)
    (c,) = r.rounds[0].candidates
    assert not c.valid and c.reason.startswith("answer echo") and c.accuracy is None
    assert r.rounds[0].decision.chosen is None
    saved = json.loads((tmp_path / "round_01" / "candidates.json").read_text())
    assert saved[0]["reason"] == c.reason


def test_a_legitimate_edit_passes_the_screen_in_adapt(task, tmp_path):
    (c,) = run_loop(task, tmp_path, GOOD_EDIT).rounds[0].candidates
    assert c.valid and c.accuracy == 1.0


def test_the_screen_can_be_switched_off(task, tmp_path):
    r = run_loop(task, tmp_path, TABLE_EDIT, ReportConfig(answer_echo_screen=False))
    (c,) = r.rounds[0].candidates
    assert c.valid and c.accuracy is not None
