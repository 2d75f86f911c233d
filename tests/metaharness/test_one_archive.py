"""One archive for a schedule's harness phases (issue 21): a later phase can accept an earlier
phase's candidate; scores measured under other weights never rank, and the previous phase's
top candidates are scored again under the new weights; a replay takes the same decisions."""

import re

import pytest

from tests.fakes import ScriptedModel
from tests.metaharness.test_loop import GOOD, WORSE
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.harness import Runtime, harness_hash
from whale.metaharness.loop import SearchSettings
from whale.metaharness.operator import SearchOperator
from whale.metaharness.tools import ToolCall
from whale.operators import OperatorBudget
from whale.runs import OutcomeStore

# Take the first number of the reply instead of the last.
FIRST = GOOD.replace("take the last number", "take the first number").replace(
    "reply.text)[-1]", "reply.text)[0]")
OTHER_START = SEED.replace("strip()", "strip().lower()")  # as wrong as the seed


def equation_solver():
    """Other weights: 'N = a + b'. The first number is the answer, the last one is not."""

    def reply(messages, sampling):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"{a + b} = {a} + {b}"

    return ScriptedModel(reply)


def operator(root, store, replies, m=1):
    task = SumTask()
    model = replies if isinstance(replies, ScriptedModel) else ScriptedModel(replies)
    op = SearchOperator(root / "harness", task.questions()[:6], store, model,
                        SearchSettings(iterations=1, m=m, workers=2))  # fmt: skip
    return op, task, model


def improve(op, task, start, solver=None, rollouts=None):
    rt = Runtime(model=solver or prose_solver())
    return op.improve(task, rt, start, OperatorBudget(rollouts=rollouts, iterations=1))


def test_a_harness_only_second_phase_accepts_a_candidate_of_the_first(tmp_path):
    store = OutcomeStore(tmp_path, "fp")
    op, task, _ = operator(tmp_path, store, [GOOD, WORSE])
    try:
        good, first = improve(op, task, SEED)
        assert first.detail["accepted_id"] == "c0100"
        # phase 2 starts from another harness (as wrong as the seed); its proposal is worse
        source, second = improve(op, task, OTHER_START)
    finally:
        store.close()
    assert second.detail["start_id"] == "c0200"  # the start is a candidate of the phase
    assert op.archive.get("c0200").origin == "start" and op.archive.get("c0200").phase == 2
    assert op.archive.get("c0300").phase == 2  # ids and iterations continue
    assert second.detail["accepted_id"] == "c0100" and source == good  # phase 1's candidate
    assert second.detail["rescored"] == []  # same weights: phase 1's scores stand


def test_under_the_same_weights_the_start_is_the_archived_candidate_and_costs_nothing(tmp_path):
    store = OutcomeStore(tmp_path, "fp")
    op, task, _ = operator(tmp_path, store, [GOOD, WORSE])
    try:
        good, _ = improve(op, task, SEED)
        _, second = improve(op, task, good)  # the schedule hands phase 1's accepted harness on
    finally:
        store.close()
    assert second.detail["start_id"] == "c0100" and "c0200" in op.archive  # no start copy
    assert second.rollouts == 6  # the one proposal; the start was answered from the archive


def test_ranking_uses_the_verifier_not_the_partial_score(tmp_path):
    """The seed's answers hold the right number in prose (partial credit 0.9 each, none
    correct); the candidate is right on half the questions and gets nothing on the rest."""

    class PartialSum(SumTask):
        def grade(self, q, answer):
            from whale.tasks import Grade

            if answer.strip() == str(q.reference):
                return Grade(1.0, True)
            return Grade(0.9 if str(q.reference) in re.findall(r"-?\d+", answer) else 0.0, False)

    half = GOOD.replace("    return re.findall(r'-?\\d+', reply.text)[-1]\n",
                        "    n = re.findall(r'-?\\d+', reply.text)[-1]\n"
                        "    return n if int(n) % 2 == 0 else '0'\n")
    store = OutcomeStore(tmp_path, "fp")
    op, _, _ = operator(tmp_path, store, [half])
    try:
        source, rec = op.improve(PartialSum(), Runtime(model=prose_solver()), SEED,
                                 OperatorBudget(iterations=1))  # fmt: skip
    finally:
        store.close()
    seed, cand = op.archive.get("c0000"), op.archive.get("c0100")
    assert seed.score > cand.score and seed.accuracy < cand.accuracy  # the premise
    assert rec.detail["accepted_id"] == "c0100" and "% 2" in source


def test_the_rollout_cap_is_hard(tmp_path):
    store = OutcomeStore(tmp_path, "fp")
    op, task, model = operator(tmp_path, store, [WORSE, GOOD], m=2)
    try:
        _, rec = op.improve(task, Runtime(model=prose_solver()), SEED,
                            OperatorBudget(rollouts=15, iterations=5))  # fmt: skip
    finally:
        store.close()
    # the seed (6) and one candidate (6) fit in 15; the next would take 6 of the 3 left
    assert rec.rollouts == 12 and "not started" in rec.stopped
    assert len(model.calls) == 1  # no session for a candidate that could not be scored
    assert not (tmp_path / "harness/sessions/c0101.json").exists()


def test_a_phase_whose_start_does_not_fit_its_budget_leaves_the_harness_unchanged(tmp_path):
    store = OutcomeStore(tmp_path, "fp")
    op, task, model = operator(tmp_path, store, [GOOD])
    try:
        source, rec = improve(op, task, SEED, rollouts=5)
    finally:
        store.close()
    assert source == SEED and rec.rollouts == 0 and "not started" in rec.stopped
    assert model.calls == [] and len(op.archive) == 0


def test_changed_weights_rescore_the_previous_top_so_they_can_be_accepted_again(tmp_path):
    store = OutcomeStore(tmp_path, "fp-A")
    op, task, _ = operator(tmp_path, store, [GOOD, FIRST, WORSE], m=2)
    try:
        good, first = improve(op, task, SEED)  # c0100 last number, c0101 first number: both 1.0
        assert first.detail["accepted_id"] == "c0100"
        store.rebind("fp-B")  # a weight phase trained the solver
        source, second = improve(op, task, good, solver=equation_solver())
    finally:
        store.close()
    a = op.archive
    start, again = a.get("c0200"), a.get("c0201")
    assert (start.origin, start.parent_id, start.solver) == ("start", "c0100", "fp-B")
    assert (again.origin, again.parent_id, again.hash) == ("rescore", "c0101",
                                                           a.get("c0101").hash)
    assert second.detail["rescored"] == ["c0201"]
    # under the new weights the last number is wrong and the first is right: the rescored
    # candidate of phase 1 is accepted, and phase 1's own 1.0 (other weights) is not ranked
    assert start.accuracy < 0.5 and again.accuracy == 1.0
    assert second.detail["accepted_id"] == "c0201" and source == a.source("c0101")
    assert a.get("c0100").accuracy == 1.0 and "c0100" not in [m.id for m in a.top(10)]
    assert second.rollouts == 6 + 6 + 6  # start, rescore, one proposal (its other duplicate)


def test_the_agent_sees_current_scores_first_and_earlier_ones_labelled(tmp_path):
    store = OutcomeStore(tmp_path, "fp-A")
    op, task, _ = operator(tmp_path, store, [GOOD, FIRST, WORSE], m=2)
    try:
        good, _ = improve(op, task, SEED)
        store.rebind("fp-B")
        improve(op, task, good, solver=equation_solver())
    finally:
        store.close()
    from whale.metaharness.tools import ArchiveTools

    tools = ArchiveTools(op.archive, "d")
    top = tools.call(ToolCall("top", {"k": 3}))
    current, earlier = top.split("scored under earlier weights")
    assert current.startswith("c0201\taccuracy 1.000 (6/6 correct)")
    rows = [line.split("\t")[0] for line in current.splitlines()]
    assert "c0100" not in rows and "\nc0100\t" in earlier and "harness phase 1" in earlier
    listing = tools.call(ToolCall("list", {}))
    assert re.search(r"c0100/\tdir\t\d+\taccuracy 1.000 .* under the weights of harness phase 1",
                     listing)  # fmt: skip
    fails = tools.call(ToolCall("failures", {"id": "c0100"}))
    assert fails.startswith("c0100 was scored again under the current weights as c0200")


@pytest.mark.parametrize(("fp_b", "accepted"), [("fp-A", "c0200"), ("fp-B", "c0300")])
def test_a_replay_of_two_phases_takes_the_same_decisions_from_the_records(tmp_path, fp_b,
                                                                          accepted):
    """Phase 2 archives a better candidate than phase 1 found: replaying phase 1 must not see
    it (the archive already holds it when the killed schedule runs again). Under the same
    weights phase 2 starts from c0000 as archived; under other ones it scores a start (c0200)
    and a rescore (c0201) first."""

    def two_phases(model):
        store = OutcomeStore(tmp_path, "fp-A")
        op, task, _ = operator(tmp_path, store, model)
        try:
            _, r1 = improve(op, task, SEED)
            store.rebind(fp_b)
            _, r2 = improve(op, task, SEED)
        finally:
            store.close()
        return [r1, r2], store, op

    want, _, op = two_phases(ScriptedModel([WORSE, GOOD]))
    assert want[0].detail["accepted_id"] == "c0000" and want[1].detail["accepted_id"] == accepted

    def dead(messages, sampling):
        raise AssertionError("a replayed session was run again")

    model = ScriptedModel(dead)
    got, store, again = two_phases(model)
    assert [(r.end_hash, r.rollouts, r.iterations, r.stopped, r.detail) for r in got] == \
        [(r.end_hash, r.rollouts, r.iterations, r.stopped, r.detail) for r in want]
    assert store.new_rollouts == 0 and model.calls == []
    assert [m.id for m in again.archive.candidates()] == [m.id for m in op.archive.candidates()]


def test_phase_seeds_differ_so_a_repeated_start_is_not_a_repeated_session(tmp_path):
    store = OutcomeStore(tmp_path, "fp")
    op, task, model = operator(tmp_path, store, [WORSE])
    try:
        improve(op, task, SEED)
        improve(op, task, SEED)
    finally:
        store.close()
    seeds = [s.seed for _, s in model.calls]
    assert len(seeds) == 2 and seeds[0] != seeds[1]


@pytest.mark.parametrize("k", [0, 1])
def test_rescore_counts_the_previous_phase_top_k(tmp_path, k):
    store = OutcomeStore(tmp_path, "fp-A")
    task = SumTask()
    op = SearchOperator(tmp_path / "harness", task.questions()[:6], store,
                        ScriptedModel([GOOD, FIRST, WORSE]),
                        SearchSettings(iterations=1, m=2, workers=2, rescore=k))  # fmt: skip
    try:
        good, _ = improve(op, task, SEED)
        store.rebind("fp-B")
        _, rec = improve(op, task, good, solver=equation_solver())
    finally:
        store.close()
    # k = 1: the top one is phase 1's accepted one, the new start: nothing more to rescore
    assert rec.detail["rescored"] == [] and rec.detail["start_id"] == "c0200"
    assert harness_hash(good) == op.archive.get("c0200").hash


def test_an_echo_cannot_be_laundered_across_phases(tmp_path):
    """Phase 1 accepts a candidate with two hard-coded answers (under the screen's threshold of
    three); phase 2 starts from it and adds one more: against its start that is one answer,
    against the archive's seed three."""
    two = ('CALL submit {"base": "c0000", "hypothesis": "a"}\n'
           "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
           "    known = ['13', '19']\n    import re\n"
           "    return re.findall(r'-?\\d+', reply.text)[-1]\n>>>>>>> REPLACE\n")
    three = ('CALL submit {"base": "c0100", "hypothesis": "b"}\n'
             "<<<<<<< SEARCH\n    known = ['13', '19']\n=======\n"
             "    known = ['13', '19', '22']\n>>>>>>> REPLACE\n")
    store = OutcomeStore(tmp_path, "fp")
    task = SumTask()
    op = SearchOperator(tmp_path / "harness", task.questions()[:10], store,
                        ScriptedModel([two, three]), SearchSettings(iterations=1, m=1, workers=2))
    try:
        accepted, _ = improve(op, task, SEED)
        assert "known = ['13', '19']" in accepted  # phase 1 accepted it (it is right)
        improve(op, task, accepted)
    finally:
        store.close()
    c = op.archive.get("c0200")
    assert not c.valid and c.reason.startswith("answer echo") and "the seed did not" in c.reason


# Half right: keeps the last number when it is even (4, 10, 16 of the first six sums), else "0".
HALF = GOOD.replace("    return re.findall(r'-?\\d+', reply.text)[-1]\n",
                    "    n = re.findall(r'-?\\d+', reply.text)[-1]\n"
                    "    return n if int(n) % 2 == 0 else '0'\n")  # fmt: skip
GOOD_SOURCE = SEED.replace("    return reply.text.strip()\n",
                           "    import re\n    return re.findall(r'-?\\d+', reply.text)[-1]\n")


def test_a_replayed_phase_with_patience_ranks_only_what_it_had_seen(tmp_path):
    """Patience reads the best before the phase and after each iteration; on a replay the
    archive already holds the later phase's better candidates, and a ranking that saw them
    would stop (and accept) otherwise.

    Phase 1 (patience J_min 1, P_h 2): c0100 worse (0), c0200 half right (a new best), c0300
    and c0400 worse: it stops after 4 and accepts c0200. Phase 2 starts from a new harness,
    all right (c0500, 1.0), and its proposal c0600 is worse: no new best over its start, so
    patience (1, 1) stops it after one iteration, accepting c0500. Seen by phase 1's replay,
    c0500 would be a best from iteration 1 (stop after 3), or its start (stop after 2)."""

    def two_phases(model):
        store = OutcomeStore(tmp_path, "fp")
        op, task, _ = operator(tmp_path, store, model)
        rt = Runtime(model=prose_solver())
        try:
            _, r1 = op.improve(task, rt, SEED, OperatorBudget(iterations=6, patience=(1, 2)))
            _, r2 = op.improve(task, rt, GOOD_SOURCE,
                               OperatorBudget(iterations=3, patience=(1, 1)))  # fmt: skip
        finally:
            store.close()
        return [r1, r2], store

    want, _ = two_phases(ScriptedModel([WORSE, HALF, WORSE, WORSE, WORSE]))
    decided = [(r.iterations, r.stopped.split(":")[0], r.detail["start_id"],
                r.detail["accepted_id"], [i["best_id"] for i in r.detail["iterations"]])
               for r in want]  # fmt: skip
    assert decided == [(4, "patience", "c0000", "c0200", ["c0000", "c0200", "c0200", "c0200"]),
                       (1, "patience", "c0500", "c0500", ["c0500"])]  # fmt: skip

    def dead(messages, sampling):
        raise AssertionError("a replayed session was run again")

    got, store = two_phases(ScriptedModel(dead))
    assert [(r.end_hash, r.rollouts, r.iterations, r.stopped, r.detail) for r in got] == \
        [(r.end_hash, r.rollouts, r.iterations, r.stopped, r.detail) for r in want]
    assert store.new_rollouts == 0
