"""The weight phase's guard against lucky guesses (issue 26): an answer the solver gives on
several prompts of a step and that the verifier mostly rejects is left out of S+."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.train.test_rsft_provenance import SEEDS, weight_step
from whale import config as cfgmod
from whale.train.guesses import answer_key, guesses
from whale.train.rsft import RsftSettings

SINGLE_CALL = (SEEDS / "single_call.py").read_text()


def outcome(prompt: str, g: int, answer: str | None, correct: bool) -> SimpleNamespace:
    return SimpleNamespace(question_id=f"{prompt}@w0.{g}", answer=answer, correct=correct)


def test_a_constant_answer_right_on_a_quarter_of_its_prompts_is_a_guess():
    """letter_counting's collapse: "2" to every question, accepted where the count is 2."""
    outs = [outcome(f"q{i}", g, "2", i == 0) for i in range(4) for g in range(2)]
    got = guesses(outs, 0.5)
    assert list(got) == ["2"]
    assert (got["2"].prompts, got["2"].samples, got["2"].accepted) == (4, 8, 2)


def test_answers_that_differ_by_question_are_not_guesses():
    outs = [outcome(f"q{i}", g, str(i), g == 0) for i in range(4) for g in range(2)]
    assert guesses(outs, 0.5) == {}


def test_an_answer_given_on_one_prompt_only_is_never_judged():
    """All G samples of one question agree and half are accepted: nothing to compare with."""
    outs = [outcome("q0", g, "7", g % 2 == 0) for g in range(4)]
    assert guesses(outs, 0.5) == {}


def test_an_answer_right_on_most_of_its_prompts_is_kept():
    """A yes/no task and a solver right on 3 of the 4 questions it says "yes" to."""
    outs = [outcome(f"q{i}", 0, "Yes", i < 3) for i in range(4)]
    assert guesses(outs, 0.5) == {}
    assert list(guesses(outs, 0.75)) == ["yes"]  # the share is the user's threshold


def test_answers_compare_stripped_with_case_and_spaces_folded():
    assert answer_key("  The  Answer\n") == answer_key("the answer") == "the answer"
    assert answer_key(None) is None and answer_key("   ") is None
    outs = [outcome("q0", 0, "Two ", True), outcome("q1", 0, "two", False),
            outcome("q2", 0, "TWO", False)]  # fmt: skip
    assert list(guesses(outs, 0.5)) == ["two"]


def test_off_by_default_and_at_zero():
    assert RsftSettings().guess_precision == 0.0
    outs = [outcome(f"q{i}", 0, "2", i == 0) for i in range(4)]
    assert guesses(outs, 0.0) == {}


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_a_share_outside_zero_to_one_is_a_config_error(value):
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.build(RsftSettings, {"guess_precision": value})
    assert e.value.field == "guess_precision"


def always_13(messages, sampling):
    return "Answer: 13"  # right for a1 (13), wrong for a0 (-4)


def test_a_step_whose_accepted_runs_are_all_guesses_trains_nothing(tmp_path):
    """Real jailed runs: the solver says 13 to both questions; a1's two samples are accepted."""
    rec, trainer = weight_step(tmp_path, SINGLE_CALL, always_13, guess_precision=0.5)
    assert rec.samples == 4 and rec.accepted == 2 and rec.guessed == 2
    assert not rec.trained and trainer is None and "guess" in rec.skipped
    row = json.loads((tmp_path / "weight" / "steps.jsonl").read_text().splitlines()[0])
    assert row["guesses"] == {"13": "accepted in 2 of 4 samples on 2 prompts"}


def test_without_the_guard_the_guesses_are_trained_on(tmp_path):
    rec, trainer = weight_step(tmp_path, SINGLE_CALL, always_13)
    assert rec.accepted == 2 and rec.guessed == 0 and rec.trained
    assert trainer is not None and len(trainer.examples) == 2


def test_a_solver_that_answers_each_question_keeps_its_runs(tmp_path):
    def right(messages, sampling):
        return "Answer: -4" if "5 - 3" in messages[-1]["content"] else "Answer: 13"

    rec, trainer = weight_step(tmp_path, SINGLE_CALL, right, guess_precision=0.5)
    assert rec.accepted == 4 and rec.guessed == 0 and rec.guesses == {}
    assert rec.trained and trainer is not None and len(trainer.examples) == 4


def test_the_phase_table_shows_a_collapse_as_the_top_answer_share():
    """What the phase table reads after each phase: 1.0 when every eval answer is one."""
    from whale.schedule.curves import top_answer_share

    rows = [{"answer": a} for a in ["2", "2 ", "3", None]]
    assert top_answer_share(rows) == 0.5  # "2" twice of 4; no answer counts as none
    assert top_answer_share([{"answer": "2"}] * 40) == 1.0
    assert top_answer_share([]) is None
    assert top_answer_share([{"answer": None}, {"answer": 5}]) == 0.0  # not text: no answer


def test_review26_an_answer_that_is_not_text_is_no_answer():
    """A ledger row read back with a non-text answer (a number in hand-edited or foreign JSON)
    crashed the weight step (`int.split`); top_answer_share already counts it as none."""
    outs = [outcome("q0", 0, 2, True), outcome("q1", 0, 2, False), outcome("q2", 0, "2", True),
            outcome("q3", 0, "2", False), outcome("q4", 0, "2", False)]  # fmt: skip
    assert answer_key(2) is None  # type: ignore[arg-type]
    assert list(guesses(outs, 0.5)) == ["2"]
    assert guesses(outs, 0.5)["2"].samples == 3


def pairs(rows):
    """(outcome, trajectory) pairs of accepted runs: (prompt, sample, answer)."""
    return [(outcome(p, g, a, True), f"{p}.{g}") for p, g, a in rows]


def test_an_answer_is_taught_on_at_most_k_prompts_with_all_their_samples():
    from whale.train.guesses import one_answer_per_prompts

    rows = [(f"q{i}", g, "2") for i in range(4) for g in range(2)] + [("q9", 0, "5")]
    kept, dropped = one_answer_per_prompts(pairs(rows), 1, "0:0")
    twos = [t for t in kept if not t.startswith("q9")]
    assert len(twos) == 2 and len({t.split(".")[0] for t in twos}) == 1  # one prompt, both g
    assert "q9.0" in kept and dropped == {"2": 6}


def test_the_prompts_kept_are_seeded():
    from whale.train.guesses import one_answer_per_prompts

    rows = [(f"q{i}", 0, "2") for i in range(8)]
    picks = {tuple(one_answer_per_prompts(pairs(rows), 2, f"0:{k}")[0]) for k in range(6)}
    assert len(picks) > 1  # the step's salt moves the choice
    assert one_answer_per_prompts(pairs(rows), 2, "0:1") == one_answer_per_prompts(
        pairs(rows), 2, "0:1"
    )


def test_answers_tied_to_their_question_lose_nothing():
    from whale.train.guesses import one_answer_per_prompts

    rows = [(f"q{i}", g, str(i)) for i in range(4) for g in range(4)]
    kept, dropped = one_answer_per_prompts(pairs(rows), 1, "0:0")
    assert len(kept) == 16 and dropped == {}
    assert one_answer_per_prompts(pairs(rows * 2), 0, "x")[0] == [t for _, t in pairs(rows * 2)]


def test_a_step_teaches_a_repeated_answer_on_one_prompt(tmp_path):
    """Real jailed runs: three questions whose answer is 13, a solver that says 13 to all."""
    from tests.train.test_rsft_provenance import (
        Arithmetic,
        CharTokenizer,
        RecordingTrainer,
        Serving,
    )
    from whale.harness import RuntimeConfig
    from whale.runs import OutcomeStore
    from whale.tasks import Question
    from whale.train.rsft import Solver, WeightPhase
    from whale.train.sft import SFTSettings

    class Thirteens(Arithmetic):
        def questions(self):
            return [Question(id=f"a{i}", prompt=f"Calculate {i} + {13 - i}.", reference="13")
                    for i in range(3)]  # fmt: skip

    task, store = Thirteens(), OutcomeStore(tmp_path, "fp")
    made: list[RecordingTrainer] = []

    def make_trainer(adapter):
        made.append(RecordingTrainer())
        return made[-1]

    rs = RsftSettings(g=2, step_epochs=1.0, sft=SFTSettings(max_len=4096), answer_prompts=1)
    wp = WeightPhase(tmp_path / "weight", task, task.questions(), store,
                     Solver(Serving([always_13("", None)]), "fp",
                            RuntimeConfig(sandbox="auto", warm=0)),
                     rs, make_trainer, CharTokenizer, seed=0, workers=2)  # fmt: skip
    tags = {"schedule": "weight-only", "cycle": 1, "phase": "weight", "kind": "weight_sample",
            "step": 0, "adapter": None}  # fmt: skip
    try:
        rec = wp.step(SINGLE_CALL, 0, 0, None, tags)
    finally:
        wp.close()
        store.close()
    assert rec.accepted == 6 and rec.repeated == {"13": 4}
    assert rec.trained and len(made[0].examples) == 2


def counting_task(refs):
    """Questions q0.. with these references; the grade is an exact match."""
    return [SimpleNamespace(id=f"q{i}", reference=r) for i, r in enumerate(refs)]


def exact(q, a):
    return a.strip() == q.reference


def test_a_solver_that_says_2_to_everything_is_at_chance():
    """letter_counting's guesser: "2" to 8 questions, right on the 2 whose count is 2."""
    from whale.train.guesses import chance

    qs = counting_task(["2", "2", "1", "3", "1", "4", "1", "3"])
    outs = [outcome(q.id, g, "2", q.reference == "2") for q in qs for g in range(4)]
    luck = chance(outs, qs, exact)
    assert luck.rate == luck.chance == 0.25 and not luck.above
    assert luck.grades == 8  # one answer text against 8 prompts


def test_a_solver_that_counts_is_far_above_chance():
    from whale.train.guesses import chance

    qs = counting_task(["2", "2", "1", "3", "1", "4", "1", "3"])
    outs = [outcome(q.id, g, q.reference if g < 2 else "5", g < 2) for q in qs for g in range(4)]
    luck = chance(outs, qs, exact)
    assert luck.rate == 0.5 and luck.chance < 0.15 and luck.above


def test_a_binary_guesser_is_caught_and_a_binary_solver_is_not():
    from whale.train.guesses import chance

    qs = counting_task(["yes", "no"] * 8)
    guesser = [outcome(q.id, 0, "yes", q.reference == "yes") for q in qs]
    assert not chance(guesser, qs, exact).above  # 0.5 against 0.5
    solver = [outcome(q.id, 0, q.reference if i % 8 else "maybe", bool(i % 8))
              for i, q in enumerate(qs)]  # fmt: skip
    assert chance(solver, qs, exact).above  # 0.875 against ~0.44


def test_samples_without_an_answer_pass_nothing():
    from whale.train.guesses import chance

    qs = counting_task(["1", "2"])
    outs = [outcome("q0", 0, None, False), outcome("q1", 0, "2", True),
            outcome("q0", 1, 7, False)]  # fmt: skip
    luck = chance(outs, qs, exact)
    assert luck.samples == 3 and luck.chance == 0.5 / 3 and luck.grades == 2


def test_a_step_at_chance_trains_nothing_and_says_why(tmp_path):
    """Real jailed runs: 13 to both questions (refs -4 and 13) is 2 of 4 against chance 0.5."""
    rec, trainer = weight_step(tmp_path, SINGLE_CALL, always_13, chance_guard=True)
    assert rec.accepted == 2 and not rec.trained and trainer is None
    assert rec.skipped.startswith("no better than chance")
    assert rec.chance == {"rate": 0.5, "chance": 0.5, "se": 0.25, "grades": 2}


def test_a_step_that_solves_its_questions_trains(tmp_path):
    def right(messages, sampling):
        return "Answer: -4" if "5 - 3" in messages[-1]["content"] else "Answer: 13"

    rec, trainer = weight_step(tmp_path, SINGLE_CALL, right, chance_guard=True)
    assert rec.trained and rec.chance["rate"] == 1.0 and rec.chance["chance"] == 0.5
