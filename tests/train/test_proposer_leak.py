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


def test_a_question_holding_a_backslash_is_found_with_an_invisible_character_in_it():
    held = r"Reverse the string 'ab\ncd' character by character"
    assert _leaks("Q: Reverse the string 'ab\\ncd' char\u00adacter by character", held)


def test_a_pathological_escape_chain_is_undone_a_bounded_number_of_times():
    """Each pass over "\\x5cx5cx5c..." undoes one escape and leaves the next: undone until
    nothing changed, a long one took a pass per escape (quadratic)."""
    check_no_eval_text(["\\x5c" + "x5c" * 20_000], [fold_text(Q)])
