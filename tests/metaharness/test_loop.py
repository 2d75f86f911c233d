"""The search loop with scripted models: archive, acceptance, duplicates, patience, resume."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.harness import Runtime
from whale.metaharness import Archive, ArchiveTools, Patience
from whale.metaharness.agent import ProposerAgent
from whale.metaharness.loop import SearchSettings, search
from whale.runs import OutcomeStore

GOOD = (
    'CALL submit {"base": "c0000", "hypothesis": "take the last number"}\n'
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    import re\n    return re.findall(r'-?\\d+', reply.text)[-1]\n>>>>>>> REPLACE\n"
)
BROKEN = GOOD.replace("    return reply.text.strip()\n=", "    return missing()\n=")
WORSE = (
    'CALL submit {"base": "c0000", "hypothesis": "answer zero"}\n'
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n    return '0'\n>>>>>>> REPLACE\n"
)


def run(tmp_path, replies, iterations=2, m=2, patience=None, solver=None, agent_model=None,
        n=6):
    task = SumTask()
    qs = task.questions()[:n]
    store = OutcomeStore(tmp_path)
    archive = Archive(tmp_path / "archive", [q.id for q in qs])
    model = agent_model or ScriptedModel(replies)
    agent = ProposerAgent(model, ArchiveTools(archive, task.description))
    try:
        r = search(task, SEED, qs, Runtime(model=solver or prose_solver()), agent, store, archive,
                   SearchSettings(iterations=iterations, m=m, patience=patience, workers=3))
    finally:
        store.close()
    return r, archive, store, model


def test_the_archive_best_is_accepted(tmp_path):
    r, archive, _, _ = run(tmp_path, [GOOD, WORSE, WORSE, WORSE])
    assert r.seed_score == 0.0 and r.accepted_id == "c0100" and r.accepted_score == 1.0
    assert [m.id for m in archive.candidates()] == ["c0000", "c0100", "c0101", "c0200", "c0201"]


def test_an_invalid_candidate_is_archived_with_its_reason_and_no_score(tmp_path):
    r, archive, _, _ = run(tmp_path, [BROKEN], iterations=1, m=1)
    bad = archive.get("c0100")
    assert not bad.valid and "not found" in bad.reason and bad.score is None
    assert r.iterations[0].valid == 0 and r.accepted_id == "c0000"


def test_a_duplicate_is_not_rescored(tmp_path):
    _, archive, store, _ = run(tmp_path, [GOOD, GOOD], iterations=1, m=2)
    assert archive.get("c0100").hash == archive.get("c0101").hash
    assert store.new_rollouts == 6 + 6  # the seed and one candidate, not two


def test_patience_stops_the_search(tmp_path):
    r, _, _, model = run(tmp_path, [WORSE], iterations=10, m=1, patience=Patience(3, 2))
    assert len(r.iterations) == 3 and r.stopped.startswith("patience")
    assert len(model.calls) == 3


def test_a_resumed_search_pays_for_nothing_twice(tmp_path):
    run(tmp_path, [GOOD, WORSE], iterations=1, m=2)
    r, archive, store, model = run(tmp_path, [WORSE, WORSE], iterations=2, m=2)
    # only iteration 2's agent sessions are new; their candidate repeats c0101, so no rollout
    assert len(model.calls) == 2 and store.new_rollouts == 0 and r.accepted_id == "c0100"
    assert [m.id for m in archive.candidates()] == ["c0000", "c0100", "c0101", "c0200", "c0201"]


def test_a_kill_after_the_session_reuses_the_session(tmp_path):
    class Killed(BaseException):
        pass

    def dying(messages, sampling):
        raise Killed()

    # the seed is scored; the agent's session is saved; then the solver dies while scoring
    calls = {"n": 0}

    def solver_reply(messages, sampling):
        calls["n"] += 1
        if calls["n"] > 6:
            raise Killed()
        return "The answer is 1."

    with pytest.raises(Killed):
        run(tmp_path, [GOOD], iterations=1, m=1, solver=ScriptedModel(solver_reply))
    assert json.loads((tmp_path / "sessions/c0100.json").read_text())["ended"] == "submitted"
    r, _, _, model = run(tmp_path, [], iterations=1, m=1, agent_model=ScriptedModel(dying))
    assert len(model.calls) == 0 and r.accepted_id == "c0100"


def test_the_search_operator_respects_its_rollout_budget(tmp_path):
    from whale.metaharness.operator import SearchOperator
    from whale.operators import OperatorBudget

    task = SumTask()
    qs = task.questions()[:6]
    store = OutcomeStore(tmp_path)
    op = SearchOperator(tmp_path / "archives", qs, store, ScriptedModel([WORSE, GOOD]),
                        SearchSettings(iterations=5, m=2, workers=3))
    try:
        source, rec = op.improve(task, Runtime(model=prose_solver()), SEED,
                                 OperatorBudget(rollouts=7))
    finally:
        store.close()
    # the cap is hard: the seed (6) leaves 1, less than one candidate's scoring (6), so no
    # candidate is started (before issue 21 one was, and the phase spent 12 of 7)
    assert rec.rollouts == 6 and rec.iterations == 0 and "not started" in rec.stopped
    assert source == SEED and rec.end_hash == rec.start_hash and rec.operator == "search"


def test_a_candidate_that_hard_codes_search_answers_is_invalid_and_unscored(tmp_path):
    echo = (
        'CALL submit {"base": "c0000", "hypothesis": "look up"}\n'
        "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
        "    table = {'What is 1 + 3?': '4', 'What is 2 + 5?': '7', 'What is 3 + 7?': '10'}\n"
        "    return table.get(question, reply.text.strip())\n>>>>>>> REPLACE\n"
    )
    _, archive, store, _ = run(tmp_path, [echo], iterations=1, m=1)
    c = archive.get("c0100")
    assert not c.valid and c.reason.startswith("answer echo") and c.score is None
    assert store.new_rollouts == 6  # the seed only


def test_an_echo_cannot_be_laundered_through_a_chain_of_candidates(tmp_path):
    # c0100 hard-codes two distinctive answers (under the screen's threshold of three); c0200,
    # built on it, adds one more: against its base that is one answer, against the seed three.
    two = (
        'CALL submit {"base": "c0000", "hypothesis": "a"}\n'
        "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
        "    known = ['13', '19']\n    return reply.text.strip()\n>>>>>>> REPLACE\n"
    )
    three = (
        'CALL submit {"base": "c0100", "hypothesis": "b"}\n'
        "<<<<<<< SEARCH\n    known = ['13', '19']\n=======\n"
        "    known = ['13', '19', '22']\n>>>>>>> REPLACE\n"
    )
    _, archive, _, _ = run(tmp_path, [two, three], iterations=2, m=1, n=10)
    assert archive.get("c0100").valid
    c = archive.get("c0200")
    assert not c.valid and c.reason.startswith("answer echo") and "the seed did not" in c.reason


def test_a_seed_that_does_not_load_stops_the_search_before_the_proposer_is_asked(tmp_path):
    from whale.metaharness.loop import SearchStopped

    task = SumTask()
    qs = task.questions()[:4]
    store = OutcomeStore(tmp_path)
    archive = Archive(tmp_path / "archive", [q.id for q in qs])
    model = ScriptedModel([GOOD])
    seed = "import numpy\n\n\ndef run(question, env):\n    return '1'\n"
    try:
        with pytest.raises(SearchStopped, match="seed harness is not usable: does not load"):
            search(task, seed, qs, Runtime(model=prose_solver()), ProposerAgent(
                model, ArchiveTools(archive, "d")), store, archive, SearchSettings(iterations=1))
    finally:
        store.close()
    assert model.calls == []


def test_a_proposer_error_stops_the_search_and_is_asked_again_on_resume(tmp_path):
    from whale.metaharness.loop import SearchStopped
    from whale.models.base import ModelError

    class Down:
        name = "down"

        def chat(self, messages, sampling, timeout=None):
            raise ModelError("connection refused")

    with pytest.raises(SearchStopped, match="proposer failed in session c0100"):
        run(tmp_path, [], iterations=1, m=1, agent_model=Down())
    assert not (tmp_path / "sessions/c0100.json").exists()
    r, _, _, model = run(tmp_path, [GOOD], iterations=1, m=1)
    assert len(model.calls) == 1 and r.accepted_id == "c0100"


def test_an_archive_folder_of_another_seed_is_refused(tmp_path):
    from whale.metaharness.loop import SearchStopped

    run(tmp_path, [WORSE], iterations=1, m=1)
    task = SumTask()
    qs = task.questions()[:6]
    store = OutcomeStore(tmp_path)
    archive = Archive(tmp_path / "archive", [q.id for q in qs])
    other = SEED.replace("strip()", "strip().lower()")
    try:
        with pytest.raises(SearchStopped, match="holds a search from seed"):
            search(task, other, qs, Runtime(model=prose_solver()), ProposerAgent(
                ScriptedModel([GOOD]), ArchiveTools(archive, "d")), store, archive,
                SearchSettings(iterations=1))
    finally:
        store.close()


def test_a_session_killed_mid_way_resumes_from_its_last_step(tmp_path):
    class Killed(BaseException):
        pass

    def dies_at_second_reply(messages, sampling):
        if sum(m["role"] == "assistant" for m in messages) >= 1:
            raise Killed()
        return 'CALL top {"k": 2}'

    with pytest.raises(Killed):
        run(tmp_path, [], iterations=1, m=1, agent_model=ScriptedModel(dies_at_second_reply))
    from whale.metaharness.loop import _replay

    assert not (tmp_path / "sessions/c0100.json").exists()  # the session never finished
    saved = _replay(tmp_path / "sessions/c0100.steps.jsonl")  # but its first step was logged
    assert saved.ended == "" and [c["name"] for c in saved.calls] == ["top"]
    r, _, _, model = run(tmp_path, [GOOD], iterations=1, m=1)
    assert len(model.calls) == 1  # only the reply that was in flight is asked again
    assert model.calls[0][1].seed == 100 + 1  # with the seed of step 2
    assert r.accepted_id == "c0100"


def test_a_kill_while_the_seed_is_scored_pays_nothing_twice(tmp_path):
    class Killed(BaseException):
        pass

    calls = {"n": 0}

    def dies_after_three(messages, sampling):
        calls["n"] += 1
        if calls["n"] > 3:
            raise Killed()
        return "The answer is 1."

    solver = ScriptedModel(dies_after_three)
    with pytest.raises(Killed):
        run(tmp_path, [GOOD], iterations=1, m=1, solver=solver)
    paid = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines() if x]
    assert 0 < len(paid) < 6 and not (tmp_path / "archive/c0000").exists()
    _, archive, store, _ = run(tmp_path, [GOOD], iterations=1, m=1)
    assert store.new_rollouts == 6 - len(paid) + 6  # the rest of the seed, then the candidate
    keys = [(r["harness"], r["question_id"]) for r in
            (json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines() if x)]
    assert len(keys) == len(set(keys)) == 12 and archive.get("c0000").n_scored == 6


def test_a_finished_session_leaves_no_steps_log(tmp_path):
    run(tmp_path, ['CALL top {"k": 2}', GOOD], iterations=1, m=1)
    assert (tmp_path / "sessions/c0100.json").exists()
    assert not (tmp_path / "sessions/c0100.steps.jsonl").exists()
