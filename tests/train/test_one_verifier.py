"""One verifier (issue 21, item 3) on the training side: the execution reward's J, GRPO's best
candidate per context, the teacher filter and the revision context's parent J are accuracies
(the task's binary verifier), and the weight phase accepts only R = 1. The mean partial score
is recorded beside them and decides nothing. The hand-made task and edits:
tests/revise/test_one_verifier.py (A = NEAR_EDIT: mean score 0.9, accuracy 0)."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, prose_solver
from tests.revise.test_one_verifier import NEAR_EDIT, PARITY_EDIT, PartialSumTask
from whale.harness import Runtime
from whale.revise.proposer import Proposer, ProposerConfig
from whale.train.proposer.contexts import (
    ContextSettings,
    build_contexts,
    family_of,
    held_out_texts,
)
from whale.train.proposer.reward import EditResult, ExecutionReward, score_edit
from whale.train.proposer.teacher import TeacherSettings, filter_reason, teacher_data

FAMILY = "test:partial-sum"


@pytest.fixture
def setup(tmp_path):
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    cfg = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=1, seeds=[str(seed)])
    fam = family_of(FAMILY, PartialSumTask(), cfg, tmp_path / "rollouts")
    rt = Runtime(model=prose_solver())
    (ctx,) = build_contexts(fam, rt, cfg, workers=2)
    yield ctx, fam, rt
    fam.store.close()
    rt.close()


def _even_share(fam):
    """PARITY_EDIT's accuracy (= its mean score) on the scoring set: the even sums."""
    return sum(int(q.reference) % 2 == 0 for q in fam.scoring) / len(fam.scoring)


def test_the_contexts_parent_j_is_its_accuracy(setup):
    ctx, fam, rt = setup
    # the seed answers in prose: mean score 0.9, accuracy 0
    assert ctx.parent_score == 0.0


def test_the_execution_reward_is_accuracy_plus_validity(setup):
    ctx, fam, rt = setup
    near = score_edit(ctx, NEAR_EDIT, fam, rt, 2, None)
    assert near.valid and near.accuracy == 0.0 and near.mean_score == pytest.approx(0.9)
    assert near.reward == pytest.approx(0.3)  # J = 0 + v = 0.3; not 0.9 + 0.3
    good = score_edit(ctx, GOOD_EDIT, fam, rt, 2, None)
    assert good.accuracy == good.mean_score == 1.0 and good.reward == pytest.approx(1.3)


def test_grpos_best_candidate_is_the_more_accurate_one(setup, tmp_path):
    ctx, fam, rt = setup
    share = _even_share(fam)
    assert 0.0 < share < 0.9  # the hand-made case: B beats A on accuracy, A beats B on mean
    r = ExecutionReward([ctx], {FAMILY: fam}, rt, tmp_path / "rewards.jsonl", workers=2)
    got = r([ctx.id, ctx.id], [NEAR_EDIT, PARITY_EDIT])
    r.close()
    assert got == pytest.approx([0.3, share + 0.3])
    acc, source = r.best[ctx.id]
    assert acc == share and "% 2" in source
    rows = [json.loads(x) for x in (tmp_path / "rewards.jsonl").read_text().splitlines()]
    assert [(x["accuracy"], x["mean_score"]) for x in rows] == [
        (0.0, pytest.approx(0.9)), (share, share)]  # fmt: skip


def test_a_resumed_reward_takes_no_best_from_a_row_without_accuracy(setup, tmp_path):
    ctx, fam, rt = setup
    h = fam.store.save_harness(SEED)
    old = {"call": 1, "sample": 0, "context": ctx.id, "valid": True, "hash": h, "score": 0.9}
    (tmp_path / "rewards.jsonl").write_text(json.dumps(old) + "\n")
    r = ExecutionReward([ctx], {FAMILY: fam}, rt, tmp_path / "rewards.jsonl")
    r.close()
    assert r.best == {} and r.calls == 1


def _res(accuracy, mean_score):
    return EditResult("c", True, "", "scored", "h", True, True, 1.0, accuracy,
                      accuracy + 0.3, 6, mean_score=mean_score)  # fmt: skip


def test_the_teacher_filter_reads_accuracy_not_the_mean_score():
    s = TeacherSettings()  # gain 0.08 over the parent, 0.40 absolute
    a, b = _res(0.0, 0.9), _res(0.5, 0.5)
    assert "filter: accuracy 0.000" in (filter_reason(a, 0.0, s) or "")
    assert filter_reason(b, 0.0, s) is None


def test_the_teacher_keeps_an_accuracy_gain_below_the_parents_mean_score(setup, tmp_path):
    """PARITY_EDIT's mean score is below the seed's 0.9 (a loss on mean scores), its accuracy
    above the seed's 0 by more than 0.08: kept. NEAR_EDIT ties the seed on both. (The absolute
    bar is off here: PARITY_EDIT is right on 2 of this split's 6 scoring questions.)"""
    ctx, fam, rt = setup
    share = _even_share(fam)
    assert 0.08 <= share < 0.9  # the hand-made case on this split
    teacher = Proposer(ScriptedModel([NEAR_EDIT, PARITY_EDIT]), ProposerConfig(concurrency=1))
    out = tmp_path / "teacher"
    s = TeacherSettings(g=2, min_score=0.0)
    summary = teacher_data([ctx], {FAMILY: fam}, rt, teacher, s, out, {}, held_out_texts([fam]))
    rows = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    assert rows[0]["reason"].startswith("filter: accuracy 0.000 < parent 0.000 + 0.08")
    assert rows[0]["result"]["mean_score"] == pytest.approx(0.9)
    assert rows[1]["reason"] == "" and rows[1]["parent_accuracy"] == 0.0
    assert summary["kept"] == 1 and summary["mean_kept_gain"] == share


def test_the_weight_phase_accepts_only_what_the_verifier_accepts(tmp_path, monkeypatch):
    """S+ = samples with R = 1: a wrong answer with 0.9 partial credit is not accepted, and the
    phase's reward is the fraction correct, not the mean score."""
    from tests.train import test_rsft_provenance as rp
    from whale.tasks import Grade
    from whale.tasks.answers import numbers_match

    def partial(self, q, answer):
        ok = numbers_match(answer, q.reference)
        return Grade(1.0 if ok else 0.9, ok)

    monkeypatch.setattr(rp.Arithmetic, "grade", partial)
    seed = (rp.SEEDS / "single_call.py").read_text()
    rec, _ = rp.weight_step(tmp_path, seed, ["Answer: 13"])  # right on a1 only
    assert rec.samples == 4 and rec.accepted == 2 and rec.reward == 0.5


def test_evaluates_held_out_readings_are_accuracies(setup, tmp_path):
    """On PartialSumTask the prose seed and NEAR_EDIT score 0.9 in partial credit and 0 in
    accuracy: every held-out reading (seed, proposals, ratchet rounds) is the accuracy."""
    from whale.train.proposer.evaluate import EvaluateSettings, evaluate_proposers

    _, fam, rt = setup
    cs = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=1,
                         seeds=[str(tmp_path / "seed.py")])  # fmt: skip
    proposer = ScriptedModel([NEAR_EDIT, GOOD_EDIT])  # then GOOD_EDIT in the ratchet's round
    # one call at a time: the script's replies go by call order
    out = evaluate_proposers({"p": lambda: proposer}, [fam], rt, cs, ProposerConfig(concurrency=1),
                             EvaluateSettings(against=[], contexts=1, g=2, rounds=1), 2,
                             tmp_path / "evaluate")  # fmt: skip
    (row,) = out["readings"]
    held = fam.held_out._questions
    seed = fam.store.evaluate(rt, SEED, fam.task, held, "eval", 2)  # from the ledger
    assert seed.score == pytest.approx(0.9) and seed.accuracy == 0.0  # the two measures differ
    assert row["seed_score"] == 0.0
    assert row["held"] == [[0.0, 1.0]]  # NEAR_EDIT: 0 (not 0.9); GOOD_EDIT: 1
    assert row["ratchet_rounds"] == [0.0, 1.0] and row["mean_no_change"] == 0.5


def test_a_stored_context_without_the_accuracy_marker_is_refused(setup, tmp_path):
    """parent_score meant the mean partial score before the one-verifier change: a record that
    does not say it is an accuracy would feed partial scores to the filter and the advance."""
    from whale.train.proposer.contexts import OldContextRecord, load_contexts, save_contexts

    ctx, _, _ = setup
    path = tmp_path / "contexts.json"
    save_contexts(path, [ctx])
    (row,) = json.loads(path.read_text())
    assert row["parent_measure"] == "accuracy" and load_contexts(path) == [ctx]
    for old in (
        {k: v for k, v in row.items() if k != "parent_measure"},
        {**row, "parent_measure": "mean_score"},
    ):
        path.write_text(json.dumps([old]))
        with pytest.raises(OldContextRecord, match=r"predates the one-verifier change.*"
                           r"start a new run directory"):  # fmt: skip
            load_contexts(path)
