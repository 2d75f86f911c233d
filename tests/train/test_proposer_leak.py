"""The held-out leak search (`whale.train.proposer.leak`) against texts that hide a question
behind more than one layer of escaping, or behind invisible characters used two ways at once."""

import json

import pytest

from whale.revise.report import _event
from whale.tasks.base import fold_text
from whale.train.proposer.leak import EvalLeak, check_no_eval_text

Q = "What is 17 + 35 divided by two hundred?"


def _leaks(text: str, held: str = Q) -> bool:
    try:
        check_no_eval_text([text], [fold_text(held)])
    except EvalLeak:
        return True
    return False


@pytest.mark.parametrize("event", [
    # a user tool's arguments: str(dict) escapes the newline, the report's repr() again
    {"kind": "tool", "name": "lookup", "args": {"question": "Solve this:\n" + Q}, "result": "ok"},
    # a tool call the model wrote: JSON arguments, shown with repr()
    {"kind": "model", "messages": [{"role": "user", "content": "hi"}], "text": "x",
     "finish_reason": "stop",
     "tool_calls": [{"name": "ask", "arguments": json.dumps({"question": "Solve:\n" + Q})}]},
])  # fmt: skip
def test_a_question_the_report_escapes_twice_is_found(event):
    """The report shows a tool call's arguments with repr() of a text that is already escaped
    (str() of a dict, a JSON string): "\\\\n" undone once is "\\n", whose "n" was glued to the
    question's first word, which then was not found whole."""
    line = _event(1, event, 400)
    assert "\\\\n" in line
    assert _leaks(line)


def test_escapes_and_entities_nested_a_few_levels_are_undone():
    e = "How many times does the letter e appear in the text: élan vital?"
    assert _leaks(json.dumps(json.dumps(e)), e)  # "\\u00e9": JSON of JSON
    assert _leaks(repr(json.dumps({"q": "x\n" + Q})))  # repr of JSON
    assert _leaks("Q: What is 17 &amp;#43; 35 divided by two hundred?")  # an entity escaped


def test_one_lone_surrogate_escape_does_not_unpair_the_others():
    """Surrogate escapes were paired only if every one in the text had its other half: one lone
    half anywhere (a JSON string cut between its two halves, or put there) hid an emoji
    question written as JSON."""
    held = "Decode the hidden sentence: \U0001f436\U0001f431 and answer with it."
    assert _leaks(json.dumps({"prompt": held}), held)
    assert _leaks(json.dumps({"prompt": held, "cut": "\ud83d"}), held)


def test_invisible_characters_used_both_ways_in_one_text_are_seen_through():
    """A zero-width space for a space and a soft hyphen for nothing, in one question: neither
    the view with all of them as spaces nor the one with all deleted held it."""
    assert _leaks("Q: What is 17 + 35\u200bdivided by two hun\u00addred?")
    assert _leaks("Q: What\u200bis 17 + 35 di\u2060vided\u200b\u200bby two hundred")


@pytest.mark.parametrize(
    "mark", ["\x00", "\u034f", "\u3164", "\u115f", "\uffa0", "\u17b4", "\u180b"]
)
def test_other_default_ignorable_characters_are_invisible_too(mark):
    """The combining grapheme joiner, the Hangul fillers and the like show nothing, as format
    characters do, but are letters or marks: kept, they split a word or stood for a space."""
    assert _leaks(f"Q: What is 17 + 35 div{mark}ided by two hundred?")
    assert _leaks(f"Q: What is 17 + 35{mark}divided by two hundred?")


def test_a_question_holding_a_backslash_is_found_with_an_invisible_character_in_it():
    held = r"Reverse the string 'ab\ncd' character by character"
    assert _leaks("Q: Reverse the string 'ab\\ncd' char\u00adacter by character", held)


def test_seeing_through_invisibles_keeps_other_questions_apart():
    """Invisible characters stand for a space or for nothing, never for a visible character:
    "13 + 7" is not "3 + 7"; and variation selectors are not invisible here, since
    rg:emoji_mystery writes its whole question in them (two such questions differ only there)."""
    held = "What is 3 + 7? Answer with a number."
    assert not _leaks("What is 13\u200b + 7? Answer with a number.", held)
    assert not _leaks("What is 3 + 7\u00ad1? Answer with a number.", held)
    assert _leaks("What is 3\u200b+\u00ad7? Answer\u200bwith a num\u00adber.", held)
    a = "Decode the hidden sentence: \U0001f600\ufe01\ufe07\ufe03 and answer with it."
    b = "Decode the hidden sentence: \U0001f600\ufe02\ufe05\ufe03 and answer with it."
    assert not _leaks(a + "\u200b", b) and _leaks(b + "\u200b", b)


def test_a_pathological_escape_chain_is_undone_a_bounded_number_of_times():
    """Each pass over "\\x5cx5cx5c..." undoes one escape and leaves the next: undone until
    nothing changed, a long one took a pass per escape (quadratic)."""
    check_no_eval_text(["\\x5c" + "x5c" * 20_000], [fold_text(Q)])
