"""The revision loop with fake models: Select rules, the reward, the sealed eval split."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import BAD_EDIT, GOOD_EDIT, SEED, prose_solver
from whale.evaluation import Outcome
from whale.harness import Runtime
from whale.revise.loop import LoopSettings, adapt
from whale.revise.proposer import Proposer
from whale.revise.select import Candidate, reward, select
from whale.runs import OutcomeStore
from whale.tasks import EvalAlreadyRead, SealedSplit


def run_loop(task, tmp_path, proposals, rule="ratchet", rounds=2, g=1, solver=None):
    qs = task.questions()
    dev, held = qs[:10], qs[10:20]
    store = OutcomeStore(tmp_path)
    rt = Runtime(model=solver or prose_solver())
    try:
        return adapt(
            task, SEED, dev, dev, SealedSplit(held, tmp_path / "eval_read.json"), rt,
            Proposer(ScriptedModel(proposals)), store,
            LoopSettings(rounds=rounds, g=g, select=rule, feedback=4, workers=4),
        )  # fmt: skip
    finally:
        store.close()


def test_a_good_edit_is_kept_and_improves_held_out(task, tmp_path):
    r = run_loop(task, tmp_path, [GOOD_EDIT])
    assert r.seed_eval.accuracy == 0.0 and r.final_eval.accuracy == 1.0
    assert r.rounds[0].decision.chosen == 0 and r.format_compliance == 0.5  # round 2 is a no-op


def test_ratchet_never_lowers_the_kept_dev_score(task, tmp_path):
    r = run_loop(task, tmp_path, [GOOD_EDIT, BAD_EDIT], rounds=3)
    kept = [x.decision.kept_accuracy for x in r.rounds]
    assert kept == sorted(kept) and kept[-1] == 1.0


def test_best_of_g_may_go_below_the_parent(task, tmp_path):
    r = run_loop(task, tmp_path, [GOOD_EDIT, BAD_EDIT], rule="best-of-g", rounds=2)
    assert r.rounds[0].decision.kept_accuracy == 1.0
    assert r.rounds[1].decision.kept_accuracy == 0.0 and r.rounds[1].decision.chosen == 0


def test_identical_candidates_are_scored_once(task, tmp_path):
    run_loop(task, tmp_path, [GOOD_EDIT], g=4, rounds=1)
    rows = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    keys = [(r["harness"], r["question_id"]) for r in rows]
    assert len(keys) == len(set(keys))


def test_invalid_candidates_are_kept_with_their_reason(task, tmp_path):
    r = run_loop(task, tmp_path, ["no edit here"], rounds=1)
    (c,) = r.rounds[0].candidates
    assert not c.valid and "no SEARCH/REPLACE" in c.reason and c.accuracy is None
    saved = json.loads((tmp_path / "round_01" / "candidates.json").read_text())
    assert saved[0]["reason"] == c.reason


def test_reward_worked_example_from_the_paper():
    # parses, runnable, ρ_run = 0.9, completed trials right half the time: J = 0.45 (the
    # verifier's accuracy), v = 0.285
    outcomes = [Outcome(f"q{i}", "x", float(i % 2), i % 2 == 1, "ok") for i in range(18)]
    outcomes += [Outcome(f"t{i}", None, 0.0, False, "timeout") for i in range(2)]
    j = sum(o.correct for o in outcomes) / len(outcomes)
    rho = sum(o.status == "ok" for o in outcomes) / len(outcomes)
    assert (j, rho) == (0.45, 0.9)
    assert reward(j, True, True, rho) == pytest.approx(0.735)


def test_an_invalid_candidate_earns_validity_credit_only():
    assert reward(None, True, False, 0.0) == pytest.approx(0.05)
    assert reward(None, False, False, 0.0) == 0.0


def test_ratchet_keeps_the_parent_on_a_tie():
    c = Candidate(1, 0, "p", "c", True, "", "blocks", True, True, 1.0, 0.5, 0.8)
    assert select("ratchet", "p", 0.5, [c]).kept_hash == "p"
    assert select("best-of-g", "p", 0.5, [c]).kept_hash == "c"


def test_eval_split_cannot_be_read_twice(task, tmp_path):
    s = SealedSplit(task.questions()[:5], tmp_path / "eval_read.json")
    s.open("final", ["a", "b"])
    with pytest.raises(EvalAlreadyRead, match="read once"):
        s.open("peek", ["c"])
    record = json.loads((tmp_path / "eval_read.json").read_text())
    assert record["purpose"] == "final" and len(record["question_ids"]) == 5


def test_eval_split_read_may_be_finished_after_a_crash(task, tmp_path):
    s = SealedSplit(task.questions()[:5], tmp_path / "eval_read.json")
    s.open("final", ["a", "b"])
    assert len(s.open("final", ["b", "a"])) == 5
    assert json.loads((tmp_path / "eval_read.json").read_text())["resumed"] == 1


def test_report_never_sees_scoring_or_eval_questions(task, tmp_path):
    run_loop(task, tmp_path, [GOOD_EDIT], rounds=1)
    report = (tmp_path / "round_01" / "report.md").read_text()
    held = [q.prompt for q in task.questions()[10:20]]
    assert not any(p in report for p in held)


def test_the_revise_operator_improves_without_reading_an_eval_split(task, tmp_path):
    from whale.operators import OperatorBudget
    from whale.revise.operator import ReviseOperator

    qs = task.questions()[:10]
    store = OutcomeStore(tmp_path)
    op = ReviseOperator(tmp_path / "phases", qs, qs, store, Proposer(ScriptedModel([GOOD_EDIT])),
                        LoopSettings(rounds=3, g=1, feedback=4, workers=4))
    try:
        source, rec = op.improve(task, Runtime(model=prose_solver()), SEED,
                                 OperatorBudget(iterations=1))
    finally:
        store.close()
    assert rec.operator == "revise" and rec.iterations == 1
    assert rec.start_score == 0.0 and rec.end_score == 1.0 and "re.findall" in source
    assert (tmp_path / "phases/phase_01/round_01/decision.json").exists()
    assert not (tmp_path / "eval_read.json").exists()


def _capped_phase(task, tmp_path, budget, noise_k=0):
    """One revise phase of up to 3 rounds (G = 2: a good and a bad edit) on 10 questions that
    are both the feedback pool and the scoring set, under a rollout budget."""
    from whale.operators import OperatorBudget
    from whale.revise.operator import ReviseOperator

    qs = task.questions()[:10]
    store = OutcomeStore(tmp_path)
    op = ReviseOperator(tmp_path / "phases", qs, qs, store,
                        Proposer(ScriptedModel([GOOD_EDIT, BAD_EDIT] * 3)),
                        LoopSettings(rounds=3, g=2, feedback=4, workers=4,
                                     noise_k=noise_k))  # fmt: skip
    try:
        _, rec = op.improve(task, Runtime(model=prose_solver()), SEED,
                            OperatorBudget(rollouts=budget, iterations=3))  # fmt: skip
    finally:
        store.close()
    return rec


@pytest.mark.parametrize("budget", [10, 25, 40])
def test_the_revise_operators_rollout_cap_is_hard(task, tmp_path, budget):
    """A round starts only if its worst case fits: the parent's feedback and scoring not yet
    paid, and G candidates scored in full. The start costs 10; the feedback (drawn from the
    scoring set) is then paid, so round 1 may cost 2·10 more: it starts only from 30."""
    rec = _capped_phase(task, tmp_path, budget)
    assert rec.rollouts <= budget
    assert rec.iterations == (0 if budget < 30 else 1)


@pytest.mark.parametrize("budget", [40, 89, 90])
def test_the_revise_operators_rollout_cap_counts_the_noise_check(task, tmp_path, budget):
    """With Select's noise check the worst case of a round adds 2·k·|Q_score| rescorings (the
    parent and the kept candidate, k times each). k = 3, 10 questions, feedback 4 drawn from
    them (already paid by the start's scoring), G = 2: the start costs 10, round 1 at most
    2·10 + 2·3·10 = 80 more, so it starts only at 90 (it pays 10 + 10 + 60: one candidate
    applies). Without the noise term it would start at 40 and spend 80."""
    rec = _capped_phase(task, tmp_path, budget, noise_k=3)
    assert rec.rollouts <= budget
    assert rec.iterations == (0 if budget < 90 else 1)
