"""Revision contexts, the execution reward and the teacher filter, with a fake solver and a
real isolated runtime (the task: 'What is a + b?'; the seed returns the solver's prose)."""

import json

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import BAD_EDIT, GOOD_EDIT, SEED, SumTask, prose_solver
from whale.harness import Runtime
from whale.revise.code_screens import DuplicateScreen
from whale.revise.proposer import Proposer, ProposerConfig
from whale.revise.select import reward, validity
from whale.tasks.base import fold_text
from whale.train.proposer.contexts import (
    ContextSettings,
    EvalLeak,
    FamilyOverlap,
    FamilySplits,
    build_contexts,
    check_no_eval_text,
    family_of,
    held_out_texts,
    load_contexts,
    save_contexts,
)
from whale.train.proposer.reward import EditResult, ExecutionReward, echo_screen, score_edit
from whale.train.proposer.teacher import TeacherSettings, filter_reason, teacher_data

FAMILY = "test:sum"
# The same fix as GOOD_EDIT written as other code: not a duplicate.
OTHER_GOOD = (
    "Take the digits after the last space.\n"
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    words = reply.text.replace('.', ' ').split()\n"
    "    return [w for w in words if w.lstrip('-').isdigit()][-1]\n>>>>>>> REPLACE\n"
)
HOSTILE = (
    "Read the answers from disk.\n"
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    import os\n    return open(os.path.join('/tmp', 'answers')).read()\n>>>>>>> REPLACE\n"
)


@pytest.fixture
def setup(tmp_path):
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    cfg = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=2, seeds=[str(seed)])
    fam = family_of(FAMILY, SumTask(), cfg, tmp_path / "rollouts")
    rt = Runtime(model=prose_solver())
    yield cfg, fam, rt
    fam.store.close()
    rt.close()


def test_a_family_in_two_lists_is_refused():
    with pytest.raises(FamilyOverlap, match="rg:lcm"):
        FamilySplits(sft=["rg:gcd", "rg:lcm"], rl=[], eval=["rg:lcm"]).validate()
    FamilySplits(sft=["rg:gcd"], rl=["rg:count_bits"], eval=["rg:maze"]).validate()


def test_contexts_score_on_questions_disjoint_from_their_feedback(setup):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    assert len(ctxs) == 2 and len({c.id for c in ctxs}) == 2
    held = {q.id for q in fam.held_out._questions}
    for c in ctxs:
        assert not set(c.feedback_ids) & set(c.scoring_ids)
        assert not (set(c.feedback_ids) | set(c.scoring_ids)) & held
        assert c.parent_score == 0.0 and "SEARCH" in c.prompt and SEED.strip() in c.prompt


def test_contexts_round_trip_through_their_file(setup, tmp_path):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    save_contexts(tmp_path / "c.json", ctxs)
    assert load_contexts(tmp_path / "c.json") == ctxs


def test_no_held_out_question_text_enters_the_training_prompts(setup):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    held = held_out_texts([fam])
    check_no_eval_text([c.prompt for c in ctxs], held)  # the real contexts are clean
    leaked = ctxs[0].prompt + "\n" + fam.held_out._questions[0].prompt
    with pytest.raises(EvalLeak, match="held-out"):
        check_no_eval_text([leaked], held)


def test_the_leak_check_sees_through_case_and_spacing():
    text = "Here:   what IS 17 + 35   divided by two hundred?"
    with pytest.raises(EvalLeak):
        check_no_eval_text([text], [fold_text("What is 17 + 35 divided by two hundred?")])


def test_an_edit_that_does_not_apply_earns_validity_credit_only(setup):
    cfg, fam, rt = setup
    (ctx, _) = build_contexts(fam, rt, cfg, workers=2)
    res = score_edit(ctx, "no edit here", fam, rt, 2, None)
    assert not res.valid and res.stage == "apply" and res.accuracy is None
    assert res.reward == validity(False, False, 0.0) == 0.0
    broken = "x\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n    return (\n>>>>>>> REPLACE\n"
    assert score_edit(ctx, broken, fam, rt, 2, None).reward == 0.0  # does not parse: 0


def test_a_screened_edit_earns_the_parse_credit_only_and_runs_nothing(setup):
    cfg, fam, rt = setup
    (ctx, _) = build_contexts(fam, rt, cfg, workers=2)
    before = fam.store.rollouts
    res = score_edit(ctx, HOSTILE, fam, rt, 2, None)
    assert res.stage == "interface" and "os" in res.reason
    assert res.reward == pytest.approx(validity(True, False, 0.0)) and fam.store.rollouts == before


def test_an_answer_echo_is_invalid(setup):
    cfg, fam, rt = setup
    (ctx, _) = build_contexts(fam, rt, cfg, workers=2)
    table = {q.prompt: str(q.reference) for q in fam.scoring}
    echo = (
        "Look it up.\n<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
        f"    return {table!r}.get(question, '0')\n>>>>>>> REPLACE\n"
    )
    res = score_edit(ctx, echo, fam, rt, 2, echo_screen(fam, SEED))
    assert res.stage == "answer_echo" and not res.valid


def test_a_valid_edit_earns_its_score_plus_the_validity_bonus(setup):
    cfg, fam, rt = setup
    (ctx, _) = build_contexts(fam, rt, cfg, workers=2)
    good = score_edit(ctx, GOOD_EDIT, fam, rt, 2, None)
    assert good.valid and good.accuracy == 1.0 and good.rho_run == 1.0
    assert good.reward == pytest.approx(reward(1.0, True, True, 1.0)) == pytest.approx(1.3)
    bad = score_edit(ctx, BAD_EDIT, fam, rt, 2, None)
    assert bad.valid and bad.accuracy == 0.0 and bad.reward == pytest.approx(0.3)


def test_grpo_reward_scores_identical_candidates_once_and_keeps_the_best(setup, tmp_path):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    r = ExecutionReward(ctxs, {FAMILY: fam}, rt, tmp_path / "rewards.jsonl", workers=3)
    # contexts of one family share the parent and the scoring set: GOOD_EDIT is one harness
    ids = [ctxs[0].id] * 3 + [ctxs[1].id] * 2
    got = r(ids, [GOOD_EDIT, GOOD_EDIT, "nonsense", BAD_EDIT, GOOD_EDIT])
    r.close()
    assert got == pytest.approx([1.3, 1.3, 0.0, 0.3, 1.3])
    seed_runs = len(set(ctxs[0].feedback_ids) | set(ctxs[1].feedback_ids)) + 6
    assert fam.store.new_rollouts == seed_runs + 2 * 6  # the seed, then 2 distinct edits
    rows = [json.loads(x) for x in (fam.store.dir / "outcomes.jsonl").read_text().splitlines()]
    keys = [(row["harness"], row["question_id"]) for row in rows]
    assert len(keys) == len(set(keys))
    logged = [json.loads(x) for x in (tmp_path / "rewards.jsonl").read_text().splitlines()]
    assert [x["reward"] for x in logged] == got
    assert r.best[ctxs[0].id][0] == 1.0 and r.best[ctxs[1].id][0] == 1.0
    assert 0.0 <= r.solver_fraction <= 1.0 and r.run_s > 0


def test_grpo_reward_refuses_an_unknown_context(setup, tmp_path):
    cfg, fam, rt = setup
    r = ExecutionReward([], {FAMILY: fam}, rt, tmp_path / "rewards.jsonl")
    with pytest.raises(KeyError, match="unknown context"):
        r(["nope"], [GOOD_EDIT])
    r.close()


def _res(score, valid=True):
    return EditResult("c", valid, "" if valid else "apply: x", "scored" if valid else "apply",
                      None, valid, valid, 1.0, score, 0.0)  # fmt: skip


@pytest.mark.parametrize(
    ("score", "parent", "kept"),
    [(0.48, 0.40, True), (0.47, 0.40, False), (0.40, 0.10, True), (0.39, 0.10, False),
     (0.90, 0.85, False), (1.0, 0.0, True)],
)  # fmt: skip
def test_the_teacher_filter_needs_the_gain_and_the_absolute_bar(score, parent, kept):
    assert (filter_reason(_res(score), parent, TeacherSettings()) is None) is kept


def test_the_teacher_filter_rejects_an_invalid_edit_with_its_reason():
    assert filter_reason(_res(None, valid=False), 0.0, TeacherSettings()) == "apply: x"


def test_teacher_data_keeps_good_edits_once_and_records_every_rejection(setup, tmp_path):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    script = [GOOD_EDIT, BAD_EDIT, HOSTILE, "nonsense", GOOD_EDIT, OTHER_GOOD, BAD_EDIT, BAD_EDIT]
    teacher = Proposer(ScriptedModel(script), ProposerConfig(concurrency=1))
    out = tmp_path / "teacher"
    summary = teacher_data(ctxs, {FAMILY: fam}, rt, teacher, TeacherSettings(g=4), out,
                           {FAMILY: echo_screen(fam, SEED)}, held_out_texts([fam]))  # fmt: skip
    rows = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and summary["kept"] == 2
    reasons = [r["reason"] for r in rows]
    assert reasons[0] == "" and reasons[5] == ""  # GOOD_EDIT, and OTHER_GOOD (other code)
    assert [x.split(":")[0] for x in (reasons[1], reasons[2], reasons[3], reasons[6])] == [
        "filter", "interface", "apply", "filter"]  # fmt: skip
    # the second GOOD_EDIT (the other context, same parent) is the same code: a duplicate
    assert reasons[4].startswith(f"duplicate of {ctxs[0].id}#0")
    from datasets import load_from_disk

    ds = load_from_disk(str(out / "dataset"))
    assert ds.column_names == ["prompt", "completion", "family", "context"] and len(ds) == 2
    assert ds[0]["prompt"][0]["content"] == ctxs[0].prompt
    assert ds[0]["completion"][0]["content"] == GOOD_EDIT


def test_the_duplicate_screen_used_by_the_teacher_sees_renamed_copies():
    d = DuplicateScreen()
    d.add("a", SEED)
    assert d.check(SEED.replace("reply", "answer")) is not None


def test_the_leak_check_does_not_match_inside_a_longer_number():
    held = [fold_text("What is 3 + 7?")]
    check_no_eval_text(["What is 13 + 7? And what is 3 + 71?"], held)
    with pytest.raises(EvalLeak):
        check_no_eval_text(["Q: What is 3 + 7? A: 10"], held)


def test_the_leak_check_sees_a_prompt_shown_with_repr():
    q = "How many e are in\nthe text: apple pie?"
    with pytest.raises(EvalLeak):
        check_no_eval_text(["messages: " + repr([{"content": q}])], [fold_text(q)])


def test_a_resumed_reward_keeps_the_best_found_and_numbers_calls_on(setup, tmp_path):
    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)
    first = ExecutionReward(ctxs, {FAMILY: fam}, rt, tmp_path / "rewards.jsonl")
    first([ctxs[0].id, ctxs[1].id], [GOOD_EDIT, BAD_EDIT])
    first.close()
    again = ExecutionReward(ctxs, {FAMILY: fam}, rt, tmp_path / "rewards.jsonl")
    assert again.best[ctxs[0].id][0] == 1.0 and "re.findall" in again.best[ctxs[0].id][1]
    assert again.best[ctxs[1].id][0] == 0.0
    again([ctxs[0].id], [BAD_EDIT])
    again.close()
    calls = [json.loads(x)["call"] for x in (tmp_path / "rewards.jsonl").read_text().splitlines()]
    assert calls == [1, 1, 2]


def _raising(error: Exception):
    """A model whose every call raises `error`."""

    def reply(messages, sampling):
        raise error

    return ScriptedModel(reply)


def test_a_failed_teacher_call_leaves_the_stage_unfinished(setup, tmp_path):
    from whale.models import ModelTimeout
    from whale.revise.proposer import ProposalsFailed

    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)[:1]
    out = tmp_path / "teacher"
    with pytest.raises(ProposalsFailed, match="failed") as e:
        teacher_data(ctxs, {FAMILY: fam}, rt, Proposer(_raising(ModelTimeout("no reply"))),
                     TeacherSettings(g=2), out, {}, held_out_texts([fam]))  # fmt: skip
    assert isinstance(e.value.__cause__, ModelTimeout)  # what a runner resumes
    assert not (out / "summary.json").exists() and (out / "candidates.jsonl").exists()
    teacher = Proposer(ScriptedModel([GOOD_EDIT]), ProposerConfig(concurrency=1))
    summary = teacher_data(ctxs, {FAMILY: fam}, rt, teacher, TeacherSettings(g=2), out, {},
                           held_out_texts([fam]))  # fmt: skip
    assert summary["proposals"] == 2 and summary["kept"] == 1  # asked again, then kept


def test_a_teacher_prompt_that_does_not_fit_is_a_rejected_edit(setup, tmp_path):
    from whale.models import ContextOverflow

    cfg, fam, rt = setup
    ctxs = build_contexts(fam, rt, cfg, workers=2)[:1]
    small = _raising(ContextOverflow("small: prompt does not fit"))
    summary = teacher_data(ctxs, {FAMILY: fam}, rt, Proposer(small), TeacherSettings(g=2),
                           tmp_path / "teacher", {}, held_out_texts([fam]))  # fmt: skip
    assert summary["proposals"] == 2 and summary["kept"] == 0
    assert summary["rejected"] == {"context_overflow": 2}
