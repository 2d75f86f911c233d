"""One verifier (issue 21, item 3): Select, its noise check and the reward's J decide on the
accuracy (the task's binary verifier, `Outcome.correct`), never on the mean partial score,
which stays an extra column of candidates.json, decision.json and the summaries.

The hand-made case: a task that gives 0.9 partial credit to an answer holding the right number
in prose, and 1 only to the exact number. Candidate A (NEAR_EDIT) keeps the prose: mean score
0.9, accuracy 0. Candidate B (PARITY_EDIT) answers exactly when the sum is even and "none"
otherwise: on the first 10 questions mean score 0.5, accuracy 0.5. The seed scores as A."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import SEED, SumTask, prose_solver
from whale.harness import Runtime
from whale.revise.loop import LoopSettings, adapt, revise, summary_markdown
from whale.revise.proposer import Proposer, ProposerConfig
from whale.revise.run import adapt_json
from whale.revise.select import Candidate, select
from whale.runs import OutcomeStore
from whale.tasks import Grade, SealedSplit

NEAR_EDIT = (
    "Drop the final period.\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    return reply.text.strip().rstrip('.')\n>>>>>>> REPLACE\n"
)
PARITY_EDIT = (
    "Keep the even answers.\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    import re\n    n = re.findall(r'-?\\d+', reply.text)[-1]\n"
    "    return n if int(n) % 2 == 0 else 'none'\n>>>>>>> REPLACE\n"
)


class PartialSumTask(SumTask):
    """SumTask with partial credit: 0.9 for the right number inside other text (not correct)."""

    def grade(self, q, answer):
        if answer.strip() == str(q.reference):
            return Grade(1.0, True)
        return Grade(0.9 if str(q.reference) in answer else 0.0, False)


def _cand(index, accuracy, mean_score, rho_run=1.0, h=None):
    reward = accuracy + 0.15 + 0.15 * rho_run
    return Candidate(1, index, "p", h or f"c{index}", True, "", "blocks", True, True, rho_run,
                     accuracy, reward, 10, mean_score)  # fmt: skip


@pytest.mark.parametrize("rule", ["ratchet", "best-of-g"])
def test_select_takes_the_more_accurate_candidate_over_the_higher_mean_score(rule):
    a, b = _cand(0, 0.0, 0.9), _cand(1, 0.5, 0.5)
    d = select(rule, "p", 0.0, [a, b], parent_mean_score=0.9)
    assert d.chosen == 1 and d.kept_hash == "c1"
    assert (d.kept_accuracy, d.kept_mean_score) == (0.5, 0.5)
    assert (d.parent_accuracy, d.parent_mean_score) == (0.0, 0.9)


def test_the_ratchet_keeps_the_parent_on_a_tie_in_accuracy_whatever_the_mean_score():
    better_mean = _cand(0, 0.5, 1.0)
    d = select("ratchet", "p", 0.5, [better_mean], parent_mean_score=0.5)
    assert d.chosen is None and d.kept_hash == "p" and d.kept_mean_score == 0.5


def test_best_of_g_breaks_a_tie_in_accuracy_by_index_not_by_mean_score_or_validity():
    # index 2 has the higher mean score and the higher reward (ρ_run): neither decides
    early, late = _cand(1, 0.5, 0.5, rho_run=0.5), _cand(2, 0.5, 0.9, rho_run=1.0)
    assert late.reward > early.reward
    for order in ([early, late], [late, early]):
        assert select("best-of-g", "p", 0.9, order).chosen == 1


def _revise(tmp_path, rule, noise_k=0):
    task = PartialSumTask()
    dev = task.questions()[:10]
    store = OutcomeStore(tmp_path, "fp")
    proposer = Proposer(ScriptedModel([NEAR_EDIT, PARITY_EDIT]), ProposerConfig(concurrency=1))
    try:
        return revise(task, SEED, dev, dev, Runtime(model=prose_solver()), proposer, store,
                      LoopSettings(rounds=1, g=2, select=rule, feedback=4, workers=4,
                                   noise_k=noise_k))  # fmt: skip
    finally:
        store.close()


@pytest.mark.parametrize("rule", ["ratchet", "best-of-g"])
def test_the_loop_keeps_the_more_accurate_candidate(tmp_path, rule):
    h, rounds = _revise(tmp_path, rule)
    a, b = rounds[0].candidates
    assert (a.accuracy, a.mean_score) == (0.0, pytest.approx(0.9))
    assert (b.accuracy, b.mean_score) == (0.5, 0.5)
    d = rounds[0].decision
    assert d.chosen == 1 and h == b.hash == d.kept_hash
    assert rounds[0].parent_accuracy == 0.0 and rounds[0].parent_mean_score == pytest.approx(0.9)


def test_the_loops_reward_j_is_the_accuracy(tmp_path):
    _, rounds = _revise(tmp_path, "best-of-g")
    a, b = rounds[0].candidates
    # v = 0.05 + 0.10 + 0.15·1 = 0.3 for both; J is the accuracy, not the mean score (0.9)
    assert a.reward == pytest.approx(0.3) and b.reward == pytest.approx(0.8)


def test_the_noise_check_rescores_the_accuracy(tmp_path):
    # On mean scores the candidate (0.5) is below the parent (0.9) and would not be kept.
    _, rounds = _revise(tmp_path, "best-of-g", noise_k=2)
    d = rounds[0].decision
    assert d.noise is not None and d.noise["parent_scores"] == [0.0, 0.0]
    assert d.noise["candidate_scores"] == [0.5, 0.5] and d.noise["passed"] and d.chosen == 1


def test_round_files_hold_accuracy_as_the_decision_and_mean_score_beside_it(tmp_path):
    _revise(tmp_path, "ratchet")
    cands = json.loads((tmp_path / "round_01" / "candidates.json").read_text())
    assert [(c["accuracy"], c["mean_score"]) for c in cands] == [
        (0.0, pytest.approx(0.9)), (0.5, 0.5)]  # fmt: skip
    assert all("score" not in c for c in cands)  # no unnamed column: which one decided?
    d = json.loads((tmp_path / "round_01" / "decision.json").read_text())
    assert (d["kept_accuracy"], d["kept_mean_score"]) == (0.5, 0.5)
    assert (d["parent_accuracy"], d["parent_mean_score"]) == (0.0, pytest.approx(0.9))


def test_the_summaries_name_both_columns(tmp_path):
    task = PartialSumTask()
    qs = task.questions()
    store = OutcomeStore(tmp_path)
    proposer = Proposer(ScriptedModel([NEAR_EDIT, PARITY_EDIT]), ProposerConfig(concurrency=1))
    try:
        result = adapt(task, SEED, qs[:10], qs[:10],
                       SealedSplit(qs[10:20], tmp_path / "eval_read.json"),
                       Runtime(model=prose_solver()), proposer, store,
                       LoopSettings(rounds=1, g=2, select="ratchet", feedback=4, workers=4))
    finally:
        store.close()
    j = adapt_json(result, {"task": task.name})
    row = j["rounds_detail"][0]
    assert (row["parent_accuracy"], row["parent_mean_score"]) == (0.0, pytest.approx(0.9))
    assert [(c["accuracy"], c["mean_score"]) for c in row["candidates"]] == [
        (0.0, pytest.approx(0.9)), (0.5, 0.5)]  # fmt: skip
    assert set(j["final_eval"]) == {"accuracy", "mean_score", "rho_run", "hash"}
    md = summary_markdown(result, {"task": task.name})
    assert "| round | parent J | parent mean score |" in md
    # round 1's row: parent J 0, its mean score 0.9; the best candidate by J is B (0.5, 0.5)
    assert "| 1 | 0.000 | 0.900 | 2/2 | 0.500 | 0.500 | 0.800 |" in md
