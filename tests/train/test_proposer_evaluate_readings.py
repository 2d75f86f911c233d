"""`train-proposer evaluate`'s readings with scripted proposers, a scripted solver and the real
isolated runtime: several contexts per family on different feedback draws, applicability as
its own column, the two readings of an edit that makes no harness, the ratchet's held-out score
after every round, the decoding recorded with the readings, and a rerun answered from the
records (the held-out split read once)."""

import json
import re

import pytest

from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask
from whale.harness import Runtime
from whale.records import RecordError
from whale.revise.proposer import ProposerConfig
from whale.train.proposer.contexts import ContextSettings, Decoding, family_of, feedback_draws
from whale.train.proposer.evaluate import (
    EvaluateSettings,
    FamilyReading,
    eval_contexts,
    evaluate_proposers,
    markdown,
)

JUNK = "I would rewrite it, but here is no block at all."


def half_prose_solver():
    """Plain digits when a is even, prose around them when a is odd: the seed scores about a
    half (so the 'no change' reading differs from 0) and GOOD_EDIT scores 1."""

    def reply(messages, sampling):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return str(a + b) if a % 2 == 0 else f"Sure! The answer is {a + b}."

    return ScriptedModel(reply)


def good_on_even_seeds():
    """GOOD_EDIT on even sampling seeds, an answer with no edit block on odd ones."""
    return ScriptedModel(lambda m, s: GOOD_EDIT if s.seed % 2 == 0 else JUNK)


@pytest.fixture
def setup(tmp_path):
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)
    cs = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=1, seeds=[str(seed)])
    fam = family_of("test:sum", SumTask(), cs, tmp_path / "rollouts")
    rt = Runtime(model=half_prose_solver())
    yield cs, fam, rt, tmp_path
    fam.store.close()
    rt.close()


def run(setup, models, es, decoding=None, pcfg=None, say=lambda m: None):
    cs, fam, rt, tmp = setup
    pcfg = pcfg or ProposerConfig()
    return evaluate_proposers({n: (lambda m=m: m) for n, m in models.items()}, [fam], rt, cs,
                              pcfg, es, 2, tmp / "evaluate", decoding=decoding, say=say)  # fmt: skip


def expected_seed_score(fam):
    held = fam.held_out._questions
    return sum(int(q.prompt.split()[2]) % 2 == 0 for q in held) / len(held)


def test_each_context_is_on_its_own_feedback_draw(setup):
    cs, fam, rt, _ = setup
    ctxs = eval_contexts(fam, rt, cs, EvaluateSettings(contexts=4), workers=2)
    pool = {q.id for q in fam.feedback_pool}
    assert len(ctxs) == 4 and len({c.prompt for c in ctxs}) == 4
    assert len({frozenset(c.feedback_ids) for c in ctxs}) == 4
    assert all(set(c.feedback_ids) <= pool and len(c.feedback_ids) == 4 for c in ctxs)
    again = eval_contexts(fam, rt, cs, EvaluateSettings(contexts=4), workers=2)
    assert [c.feedback_ids for c in again] == [c.feedback_ids for c in ctxs]  # seeded


def test_feedback_draws_are_pairwise_different_even_when_few_exist():
    pool = SumTask(5).questions()  # 5 questions, draws of 4: exactly 5 different sets
    draws = feedback_draws(pool, 4, 5, "k")
    assert len({frozenset(q.id for q in d) for d in draws}) == 5
    with pytest.raises(RecordError, match="bigger feedback pool"):
        feedback_draws(pool, 4, 6, "k")


def test_g_proposals_on_each_of_the_contexts_are_read(setup):
    subject = good_on_even_seeds()
    out = run(setup, {"trained": subject}, EvaluateSettings(against=[], contexts=4, g=2,
                                                           rounds=0))  # fmt: skip
    (row,) = out["readings"]
    assert [len(c) for c in row["held"]] == [2, 2, 2, 2] and row["proposals"] == 8
    prompts = {m[-1]["content"] for m, _ in subject.calls}
    assert len(subject.calls) == 8 and len(prompts) == 4  # 4 contexts × g = 2


def test_an_edit_that_makes_no_harness_reads_0_and_no_change(setup):
    _, fam, _, _ = setup
    out = run(setup, {"trained": good_on_even_seeds(), "base": ScriptedModel([JUNK])},
              EvaluateSettings(against=["base"], contexts=4, g=2, rounds=0))  # fmt: skip
    trained, base = out["readings"]
    seed = expected_seed_score(fam)
    assert 0 < seed < 1 and trained["seed_score"] == base["seed_score"] == seed
    # trained: per context [GOOD_EDIT -> 1.0, no block -> no harness]
    assert trained["held"] == [[1.0, None]] * 4
    assert trained["applicable"] == 0.5 and trained["applied"] == 4
    assert trained["mean"] == 0.5 and trained["mean_no_change"] == pytest.approx((1 + seed) / 2)
    assert trained["oracle"] == trained["oracle_no_change"] == 1.0
    # base: nothing applies, so 0 in the paper's reading and the seed's score as no change
    assert base["applicable"] == 0.0 and base["mean"] == 0.0 and base["oracle"] == 0.0
    assert base["mean_no_change"] == base["oracle_no_change"] == pytest.approx(seed)
    diffs = {p["reading"]: p["mean_diff"] for p in out["paired"]["base"]}
    assert diffs["applicable"] == 0.5 and diffs["mean"] == 0.5
    assert diffs["mean_no_change"] == pytest.approx((1 - seed) / 2)


def test_the_two_readings_on_a_hand_made_case():
    r = FamilyReading("p", "f", 0.4, held=[[None, 0.8], [0.0, None]], applied=3,
                      ratchet_rounds=[0.4, 0.6], ratchet_kept=1)  # fmt: skip
    assert r.mean == pytest.approx(0.2)  # (0 + 0.8 + 0 + 0) / 4
    assert r.mean_no_change == pytest.approx(0.4)  # (0.4 + 0.8 + 0 + 0.4) / 4
    assert r.oracle == pytest.approx(0.4)  # mean over contexts of (0.8, 0)
    assert r.oracle_no_change == pytest.approx(0.6)  # (0.8, 0.4)
    assert r.applicable == 0.75 and r.valid == 2 and r.ratchet == 0.6
    assert r.scores == [0.0, 0.8, 0.0, 0.0]


def test_the_ratchet_is_read_on_the_held_out_split_after_every_round(setup):
    cs, fam, _, tmp = setup
    out = run(setup, {"trained": ScriptedModel([GOOD_EDIT])},
              EvaluateSettings(against=[], contexts=1, g=1, rounds=3))  # fmt: skip
    (row,) = out["readings"]
    seed = expected_seed_score(fam)
    # round 1 keeps GOOD_EDIT (1.0 on the dev scoring set); its SEARCH is gone after that,
    # so rounds 2 and 3 keep the round-1 harness
    assert row["ratchet_rounds"] == [pytest.approx(seed), 1.0, 1.0, 1.0]
    assert row["ratchet_kept"] == 1 and row["ratchet"] == 1.0
    read = json.loads((tmp / "rollouts" / "eval_read.json").read_text())
    assert len(read["harnesses"]) == 2  # the seed and the one kept harness, each read once
    assert "r3" in out["table"] and "1.000 | 1.000 | 1.000" in out["table"]


def test_the_decoding_is_used_and_recorded(setup):
    # the proposer config asks for no grammar: the run's decoding replaces it
    subject = ScriptedModel([GOOD_EDIT])
    on = Decoding(grammar="on")
    out = run(setup, {"trained": subject}, EvaluateSettings(against=[], contexts=2, g=1,
              rounds=1), decoding=on, pcfg=ProposerConfig(grammar="off"))  # fmt: skip
    assert {s.grammar for _, s in subject.calls} == {on.grammar_for(SEED)}
    assert out["setup"]["decoding"] == {"grammar": "on", "grammar_blocks": 1}
    assert out["readings"][0]["decoding"] == {"grammar": "on", "grammar_blocks": 1}
    assert "edit grammar on" in out["table"]
    saved = json.loads((setup[3] / "evaluate" / "summary.json").read_text())
    assert saved["setup"]["decoding"]["grammar"] == "on"


def test_the_default_decoding_is_free(setup):
    subject = ScriptedModel([GOOD_EDIT])
    out = run(setup, {"trained": subject}, EvaluateSettings(against=[], contexts=1, g=2,
              rounds=0), pcfg=ProposerConfig(grammar="on"))  # fmt: skip
    assert all(s.grammar is None for _, s in subject.calls)
    assert out["setup"]["decoding"]["grammar"] == "off" and "edit grammar off" in out["table"]


def test_a_rerun_answers_from_the_records_and_reads_the_held_out_split_once(setup):
    cs, fam, rt, tmp = setup
    es = EvaluateSettings(against=["base"], contexts=2, g=2, rounds=2)
    first = run(setup, {"trained": good_on_even_seeds(), "base": ScriptedModel([JUNK])}, es)
    solver_calls = len(rt.model.calls)
    again_t, again_b = good_on_even_seeds(), ScriptedModel([JUNK])
    second = run(setup, {"trained": again_t, "base": again_b}, es)
    assert again_t.calls == [] and again_b.calls == []  # every proposal came from the records
    assert len(rt.model.calls) == solver_calls  # every rollout came from the ledger
    assert second["readings"] == first["readings"]
    read = json.loads((tmp / "rollouts" / "eval_read.json").read_text())
    assert read["resumed"] == 1


def test_the_table_has_applicability_both_readings_and_the_decoding():
    r = FamilyReading("trained", "a", 0.25, [[0.5, None]], 1, [0.25], 0)
    text = markdown([r], {}, ["trained"], Decoding())
    assert "| trained | a | 1×2 | 50% (1/2) | 0.250 | 0.250 | 0.375 | 0.500 | 0.500 |" in text
    assert "edit grammar off" in text and "applicable" in text and "no change" in text


# A seed that keeps the solver's (right) answer only when it is below 40; the round-2 edit
# keeps those below 80, the round-4 edit every answer: three kept harnesses with three
# different held-out accuracies (SumTask's sums run from 1 to 118).
STEP_SEED = ("def run(question, env):\n    n = int(env.llm(question).text.strip())\n"
             "    return str(n) if n < 40 else 'none'\n")  # fmt: skip


def _keep(old, new):
    return (f"Keep more answers.\n<<<<<<< SEARCH\n    return str(n) if n < {old} else "
            f"'none'\n=======\n    return str(n) if n < {new} else 'none'\n"
            ">>>>>>> REPLACE\n")  # fmt: skip


def test_each_ratchet_round_reads_the_harness_kept_after_that_round(tmp_path):
    seed = tmp_path / "seed.py"
    seed.write_text(STEP_SEED)
    cs = ContextSettings(dev=12, score=6, eval=8, feedback=4, contexts=1, seeds=[str(seed)])
    fam = family_of("test:sum", SumTask(), cs, tmp_path / "rollouts")
    digits = ScriptedModel(
        lambda m, s: str(sum(map(int, re.findall(r"\d+", m[-1]["content"])[:2])))
    )
    rt = Runtime(model=digits)
    # one single-step proposal, then rounds 1..5: no edit, 40 -> 80, no edit, 80 -> 1000, no edit
    proposer = ScriptedModel([JUNK, JUNK, _keep(40, 80), JUNK, _keep(80, 1000), JUNK])
    try:
        out = evaluate_proposers({"p": lambda: proposer}, [fam], rt, cs, ProposerConfig(),
                                 EvaluateSettings(against=[], contexts=1, g=1, rounds=5), 2,
                                 tmp_path / "evaluate")  # fmt: skip
    finally:
        fam.store.close()
        rt.close()

    def share(qs, bound):
        return sum(q.reference < bound for q in qs) / len(qs)

    # the hand-made case: each edit beats its parent on the dev scoring set (so it is kept)
    # and the three harnesses differ on the held-out split (so the rounds tell them apart)
    assert share(fam.scoring, 40) < share(fam.scoring, 80) < 1.0
    held = fam.held_out._questions
    s0, s2, s4 = share(held, 40), share(held, 80), 1.0
    assert len({s0, s2, s4}) == 3
    (row,) = out["readings"]
    assert row["ratchet_kept"] == 2
    assert row["ratchet_rounds"] == [s0, s0, s2, s2, s4, s4]
    assert len(proposer.calls) == 6


@pytest.mark.parametrize("name", ["/abs/path/adapter", "../../escape", "http://h:1/v1", "..", ""])
def test_a_proposer_named_by_a_path_or_url_stays_inside_evaluate_s_folder(name, tmp_path):
    from whale.train.proposer.evaluate import folder_name

    folder = folder_name(name)
    assert "/" not in folder and folder not in ("", ".", "..")
    assert (tmp_path / folder).resolve().parent == tmp_path.resolve()


def test_plain_proposer_names_keep_their_folder_names():
    from whale.train.proposer.evaluate import folder_name

    assert [folder_name(n) for n in ("base", "grpo", "sft", "teacher", "qwen-coder-0.5b")] == [
        "base", "grpo", "sft", "teacher", "qwen-coder-0.5b"]  # fmt: skip


def test_a_ratchet_round_whose_proposal_timed_out_stops_evaluate_and_is_asked_again(setup):
    from whale.experiments.runner import _transient
    from whale.models.base import ModelTimeout
    from whale.revise.proposer import ProposalsFailed

    def slow_in_round_1(messages, sampling):  # the context (seed 0) answers; round 1 (1000) not
        if sampling.seed == 1000:
            raise ModelTimeout("no reply within 600.0 s")
        return GOOD_EDIT

    es = EvaluateSettings(against=[], contexts=1, g=1, rounds=2)
    with pytest.raises(ProposalsFailed, match="round 1") as err:
        run(setup, {"trained": ScriptedModel(slow_in_round_1)}, es)
    assert isinstance(_transient(err.value), ModelTimeout)  # not read as a rejected edit
    again = ScriptedModel([GOOD_EDIT])
    (row,) = run(setup, {"trained": again}, es)["readings"]
    assert [s.seed for _, s in again.calls][0] == 1000 and row["ratchet_kept"] == 1


def test_a_ratchet_prompt_the_proposer_cannot_hold_is_a_failed_candidate_not_a_stop(setup):
    # A ContextOverflow fails the same way however often it is asked (not a runner's transient
    # error): stopping on it would leave evaluate unable to finish, on any rerun.
    from whale.models.base import ContextOverflow

    def overflow_in_round_1(messages, sampling):
        if sampling.seed == 1000:
            raise ContextOverflow("qwen-coder-0.5b: prompt does not fit")
        return GOOD_EDIT

    es = EvaluateSettings(against=[], contexts=1, g=1, rounds=2)
    for _ in range(2):  # and a rerun reads the same from the records
        (row,) = run(setup, {"trained": ScriptedModel(overflow_in_round_1)}, es)["readings"]
        assert len(row["ratchet_rounds"]) == 3 and row["ratchet_kept"] == 1


def test_the_contexts_whose_prompt_did_not_fit_are_counted_in_a_line(setup):
    from whale.models.base import ContextOverflow

    def overflow_on_odd_seeds(messages, sampling):
        if sampling.seed % 2:
            raise ContextOverflow("qwen-coder-0.5b: prompt does not fit")
        return GOOD_EDIT

    said: list[str] = []
    es = EvaluateSettings(against=[], contexts=1, g=4, rounds=0)
    run(setup, {"trained": ScriptedModel(overflow_on_odd_seeds)}, es, say=said.append)
    assert [m for m in said if "did not fit" in m] == [
        "evaluate trained on test:sum: 2 prompt(s) did not fit the proposer's context: read as "
        "edits that made no harness"]


def test_the_teacher_is_evaluated_in_a_context_as_large_as_the_others(monkeypatch, tmp_path):
    # A prompt that does not fit is read as an edit that made no harness: a teacher served
    # with a smaller window (its own default, 4096) would lose readings the others make.
    import whale.train.proposer.run as run_mod

    monkeypatch.setattr(run_mod, "build_model", lambda mcfg: mcfg)
    cfg = run_mod.ProposerTrainConfig()
    base = run_mod.proposer_model("base", cfg, tmp_path)()
    teacher = run_mod.proposer_model("teacher", cfg, tmp_path)()
    assert teacher.n_ctx == base.n_ctx > cfg.teacher.n_ctx
