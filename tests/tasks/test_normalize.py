"""A question's identity (`normalize_prompt`) and the looser text a leak is searched in
(`fold_text`). Folding every non-word character made whole Reasoning Gym families one question."""

import json

import pytest

from whale.tasks.base import dedupe, fold_text, normalize_prompt
from whale.tasks.rg import ReasoningGymTask


def test_case_width_and_whitespace_do_not_make_a_new_question():
    assert normalize_prompt("What  is\n2 + 3?") == normalize_prompt("what is 2 + 3")
    assert normalize_prompt("Ｗhat is ２＋３") == normalize_prompt("what is 2+3")


@pytest.mark.parametrize(("a", "b"), [
    ("What is 2+3?", "What is 2*3?"),
    ("Compute (1+2)*3", "Compute 1+(2*3)"),
    ("Solve 🍎 + 🍌", "Solve 🐶 + 🐱"),
    ("#..\n.#.", "..#\n.#."),
])  # fmt: skip
def test_symbols_emoji_and_boards_tell_questions_apart(a, b):
    assert normalize_prompt(a) != normalize_prompt(b)


@pytest.mark.parametrize(("family", "old_distinct"), [
    ("emoji_mystery", 1), ("modulo_grid", 1), ("rectangle_count", 1), ("sokoban", 8),
])  # fmt: skip
def test_a_reasoning_gym_family_keeps_its_questions_apart(family, old_distinct):
    """The old rule (every non-word character a space) made these 200 questions
    `old_distinct` texts, the figures normalize_prompt's docstring quotes; every distinct
    question now stays one (task seed 0, the first 200)."""
    import re
    import unicodedata

    def old_rule(text):
        text = unicodedata.normalize("NFKC", text).casefold()
        return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", text)).strip()

    qs = ReasoningGymTask(family, size=200, seed=0).questions()
    assert len({old_rule(q.prompt) for q in qs}) == old_distinct
    assert len({q.prompt for q in qs}) == len({normalize_prompt(q.prompt) for q in qs})
    assert len(dedupe(qs)) == len({q.prompt for q in qs}) > old_distinct


def test_a_quoted_or_escaped_question_still_folds_to_its_text():
    q = fold_text("What is the GCD of 12 and 18?")
    assert q in fold_text('{"question": "What is the GCD of 12 and 18?"}')
    assert q in fold_text("“What is the GCD of 12 and 18”")


def test_folding_keeps_symbols_and_underscores():
    assert fold_text("Solve 🍎 + 🍌!") != fold_text("Solve 🐶 + 🐱!")
    assert fold_text("_ Q _ _") == "_ q _ _"


def test_the_leak_check_tells_apart_two_emoji_questions_of_one_template():
    """Folded to their shared words, every rg:emoji_mystery question was "in" every training
    text of the family, and the leak check refused them all."""
    from whale.train.proposer.contexts import EvalLeak, check_no_eval_text

    template = "Decode the hidden sentence: {} and answer with it."
    held = [fold_text(template.format("🐶🐱🐭"))]
    check_no_eval_text(["x_t: " + template.format("🍎🍌🍒")], held)
    with pytest.raises(EvalLeak):
        check_no_eval_text(["x_t: " + template.format("🐶🐱🐭")], held)


@pytest.mark.parametrize("text", [
    "Q: what is 17+35 divided by two hundred A",  # operators re-spaced
    "Q: What is 17 + 35 \u200bdivided by two hundred",  # a zero-width space beside a space
    "Q: What is 17 + 35\u200bdivided by two hundred",  # a zero-width space for a space
    "Q: What is 17 \u2212 35 divided by two hundred",  # the minus sign for the hyphen
])  # fmt: skip
def test_the_leak_check_sees_a_question_re_spaced_or_with_invisible_characters(text):
    """The fold before this kept "+" and zero-width characters as they were: "17+35" was not
    "17 + 35" (the old rule, every non-word character a space, found both)."""
    from whale.train.proposer.contexts import EvalLeak, check_no_eval_text

    held = "What is 17 {} 35 divided by two hundred?"
    op = "-" if "\u2212" in text else "+"
    with pytest.raises(EvalLeak):
        check_no_eval_text([text], [fold_text(held.format(op))])


@pytest.mark.parametrize("family", ["rectangle_count", "sokoban"])
def test_folding_keeps_a_board_familys_questions_apart(family):
    """Boards drawn with "#" (rg:rectangle_count: 200 questions folded to 104 texts) would make
    a feedback question of the family "hold" a held-out one: EvalLeak on every corpus."""
    qs = ReasoningGymTask(family, size=200, seed=0).questions()
    assert len({fold_text(q.prompt) for q in qs}) == len({q.prompt for q in qs})


def test_typographic_quotes_are_the_straight_ones():
    assert normalize_prompt("Spell \u201cdog\u201d backwards, it\u2019s easy") == \
        normalize_prompt('Spell "dog" backwards, it\'s easy')


HELD = "How many times does the letter e appear in the text: élan vital + cheese?"


@pytest.mark.parametrize("text", [
    "Q: How many times does the letter e ap\u00adpear in the text: élan vital + cheese",  # soft hyphen
    "Q: How many times does the let\u200bter e appear in the text: élan vital + cheese",  # ZWSP in a word
    "Q: How many times does the letter e appear in the text: &eacute;lan vital &#43; cheese",
    'Q: "How many times does the letter e appear in the text: \\u00e9lan vital \\x2b cheese"',
    '{"content": "How many times does the letter e appear in the text:\\n\\u00e9lan vital + cheese"}',
])  # fmt: skip
def test_the_leak_check_sees_a_question_behind_a_soft_hyphen_an_entity_or_an_escape(text):
    """The review's gaps, which the old rule had too: a soft hyphen or a zero-width space inside
    a word split it; HTML entities and \\u, \\x escapes (JSON, repr) hid a letter or an
    operator."""
    from whale.train.proposer.contexts import EvalLeak, check_no_eval_text

    with pytest.raises(EvalLeak):
        check_no_eval_text([text], [fold_text(HELD)])


def test_the_leak_check_sees_an_emoji_question_written_as_json_surrogate_escapes():
    from whale.train.proposer.contexts import EvalLeak, check_no_eval_text

    held = "Decode the hidden sentence: \U0001f436\U0001f431 and answer with it."
    with pytest.raises(EvalLeak):
        check_no_eval_text([json.dumps({"prompt": held})], [fold_text(held)])


def test_the_leak_check_sees_a_question_that_holds_a_backslash_itself():
    from whale.train.proposer.contexts import EvalLeak, check_no_eval_text

    held = r"Reverse the string 'ab\ncd' character by character"
    with pytest.raises(EvalLeak):
        check_no_eval_text(["Q: " + held], [fold_text(held)])


def test_undoing_escapes_does_not_make_another_question_match():
    from whale.train.proposer.contexts import check_no_eval_text

    held = "How many times does the letter e appear in the text: elan vital + cheese?"
    check_no_eval_text(["Q: " + HELD, "Q: how many times does the letter \\u0065 appear"],
                       [fold_text(held)])  # fmt: skip
