"""The answer-provenance rule (whale.train.provenance): when an answer "appears" in a text, and
which model calls of a trajectory carry it."""

from __future__ import annotations

import json

import pytest

from whale.harness.trajectory import ModelCall, ToolCall, Trajectory
from whale.train.data import Skip, trajectory_examples
from whale.train.provenance import answer_provenance, answer_target, appears


def shows(answer: str, text: str) -> bool:
    target = answer_target(answer)
    return target is not None and appears(target, text)


@pytest.mark.parametrize("text", ["The answer is 14.", "x = -4", "about 4.5", "3/4 of it",
                                  "40 apples", "v4", "1,400"])
def test_a_number_inside_a_longer_number_or_word_is_not_the_answer(text):
    assert not shows("4", text)


@pytest.mark.parametrize("text", ["Answer: 4", "2 + 2 = 4.", "(4)", "\\boxed{4}", "**4**",
                                  "four is 4, yes"])
def test_a_number_standing_alone_is_the_answer(text):
    assert shows("4", text)


@pytest.mark.parametrize(("answer", "text"), [("-4", "So 2 - 6 = -4."), ("-4", "2-6=−4"),
                                              ("1000", "It is 1,000."), ("1/2", "half: 0.5"),
                                              ("0.50", "p = 1/2"), ("50%", "that is 50%")])
def test_a_number_appears_by_its_value(answer, text):
    assert shows(answer, text)


def test_a_minus_sign_after_a_number_is_subtraction_not_a_sign():
    assert not shows("-4", "we get 5-4 and stop")


def test_whitespace_and_case_do_not_matter():
    grid = "1 0 1\n0 1 0"
    assert shows(grid, "The grid:\n  1  0 1\n\t0 1   0\n")
    assert shows("PARIS", "the capital is paris.")


def test_the_graded_part_of_a_boxed_answer_is_looked_for():
    assert shows("The result is \\boxed{17}", "so 17")


def test_a_text_answer_appears_as_its_words_without_punctuation_or_articles():
    assert shows("The Eiffel Tower", "It is the Eiffel-Tower, of course.")
    assert not shows("Eiffel Tower", "Tower of Eiffel")


def test_an_empty_answer_has_no_provenance():
    assert answer_target("  \n ") is None and answer_target(None) is None
    t = Trajectory("q", "h", answer="\n\n")
    t.add_model_call(ModelCall([{"role": "user", "content": "q"}], "\n\n", "stop"))
    p = answer_provenance(t)
    assert p.calls == frozenset() and "empty" in str(p.reason)


def traj(answer, *events):
    t = Trajectory("q", "h", answer=answer)
    for e in events:
        if isinstance(e, str):
            t.add_model_call(ModelCall([{"role": "user", "content": "q"}], e, "stop"))
        else:
            t.add_tool_call(e)
    return t


def python(code, stdout):
    return ToolCall("python", {"code": code, "timeout": None},
                    {"stdout": stdout, "stderr": "", "error": None, "timed_out": False})


def test_only_the_calls_that_carry_the_answer_are_proven():
    t = traj("42", "Let me think about it.", "It is 42.")
    assert answer_provenance(t).calls == {1}


def test_code_a_completion_wrote_proves_that_completion():
    code = "x = 6\nprint(x * 7)"
    t = traj("42", f"```python\n{code}\n```", python("  x = 6\n  print(x * 7)\n", "42\n"))
    assert answer_provenance(t).calls == {0}


def test_the_completions_code_wrapped_by_the_harness_proves_that_completion():
    """A program-of-thought harness adds an import and a print around the model's code."""
    block = "total = sum(range(7))\nresult = total * 2"
    ran = f"import math\n{block}\nprint(result)"
    t = traj("42", f"Here:\n```python\n{block}\n```", python(ran, "42\n"))
    assert answer_provenance(t).calls == {0}


@pytest.mark.parametrize(("block", "ran"), [
    ("import math, re, sys", "import math, re, sys\nprint(17 + 25)"),  # imports only
    ("# TODO: compute the sum here", "# TODO: compute the sum here\nprint(17 + 25)"),
    ("you are all worthless", '"""you are all worthless"""\nprint(17 + 25)'),  # prose
])  # fmt: skip
def test_a_block_that_does_no_work_is_not_the_code_that_ran(block, ran):
    # The second hostile review: each of these proved the completion that held it.
    t = traj("42", f"```python\n{block}\n```", python(ran, "42\n"))
    assert answer_provenance(t).calls == frozenset()


def test_a_program_of_the_harness_around_the_block_is_not_a_wrapper():
    block = "total = sum(range(7))\nresult = total * 0"
    ran = block + "\n" + "\n".join(f"helper_{k} = {k} * 2" for k in range(12)) + "\nprint(42)"
    t = traj("42", f"```python\n{block}\n```", python(ran, "42\n"))
    assert answer_provenance(t).calls == frozenset()


def test_a_short_code_block_is_not_taken_for_the_code_that_ran():
    t = traj("42", "```\nx\n```", python("x = 6 * 7\nprint(x)", "42\n"))
    assert answer_provenance(t).calls == frozenset()


def test_an_answer_of_another_type_read_back_from_disk_has_no_provenance():
    t = traj("42", "It is 42.")
    t.answer = 42  # type: ignore[assignment]
    assert answer_provenance(t).calls == frozenset()


def test_code_run_before_the_completion_that_holds_it_proves_nothing():
    """The harness ran the code first: the completion that repeats it did not write it."""
    t = traj("42", python("print(6 * 7)", "42\n"), "print(6 * 7) printed something")
    assert answer_provenance(t).calls == frozenset()


def test_output_without_the_answer_proves_nothing():
    t = traj("42", "```python\nprint(6 * 6)\n```", python("print(6 * 6)", "36\n"))
    p = answer_provenance(t)
    assert p.calls == frozenset() and "'42' is in none of the run's 1 completions" in p.reason


def test_calls_without_provenance_are_skips_with_the_reason():
    t = traj("42", "Let me think.", "It is 42.")
    examples, skips = trajectory_examples(t, tokenizer=None, calls=frozenset())
    assert examples == [] and [s.source for s in skips] == ["q#0", "q#1"]
    assert all(isinstance(s, Skip) and s.reason.startswith("no answer provenance") for s in skips)


# --- tool-calling loops: the turns that asked for the data ---------------------------------

QUERY = {"query": "SELECT count(*) FROM orders"}
SQL = json.dumps(QUERY)
USER = {"role": "user", "content": "How many orders?"}


def asked(i: int, content: str = "", args: str = SQL) -> dict:
    """The assistant turn of model call `i` as the harness appends it (`reply["message"]`)."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"call_{i}_0", "type": "function", "function": {"name": "sql", "arguments": args}}]}


def result(i: int, text: str = "17") -> dict:
    return {"role": "tool", "tool_call_id": f"call_{i}_0", "content": text}


def turn(t: Trajectory, messages: list, text: str = "", calls: bool = True, **kw) -> None:
    t.add_model_call(ModelCall(messages, text, "tool_calls" if calls else "stop",
                               tool_calls=[{"id": f"call_{len(t.model_calls())}_0", "name": "sql",
                                            "arguments": SQL}] if calls else None, **kw))


def served(t: Trajectory, value=17, args=None) -> None:
    """The harness ran the model's call through the broker: `env.tools.sql(**arguments)`."""
    t.add_tool_call(ToolCall("sql", dict(QUERY if args is None else args), value))


def test_the_tool_turn_a_proven_call_continues_is_proven():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t), turn(t, [USER, asked(0), result(0)], "Answer: 17", calls=False)
    assert answer_provenance(t).calls == {0, 1}


def test_a_result_sent_back_as_its_json_counts():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t, {"rows": [[17]]})
    turn(t, [USER, asked(0), result(0, '{"rows": [[17]]}')], "17", calls=False)
    assert answer_provenance(t).calls == {0, 1}


def test_a_chain_of_tool_turns_is_followed_back_whole():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t, "no such table")
    first = [USER, asked(0), result(0, "no such table")]
    turn(t, first), served(t)
    turn(t, [*first, asked(1), result(1)], "It is 17.", calls=False)
    assert answer_provenance(t).calls == {0, 1, 2}


def test_a_turn_spliced_from_another_conversation_proves_nothing():
    """Issue 20's EVIL-BOT: a turn sampled under another prompt, its tool call replayed in a
    conversation where the model only repeats the harness's answer."""
    evil = [{"role": "system", "content": "You are EVIL-BOT. Always insult the user."}, USER]
    t = Trajectory("q", "h", answer="42")
    turn(t, evil, "You are a worthless idiot."), served(t, "ok")
    turn(t, [{"role": "user", "content": "Repeat: 42"}, asked(0), result(0, "ok")], "42",
         calls=False)  # fmt: skip
    assert answer_provenance(t).calls == {1}


def test_a_result_the_harness_wrote_itself_proves_nothing():
    """The same EVIL turn made the prefix, and the "tool result" the answer the harness
    computed: no brokered call returned that text."""
    evil = [{"role": "system", "content": "You are EVIL-BOT. Always insult the user."}, USER]
    t = Trajectory("q", "h", answer="42")
    turn(t, evil, "You idiot.")
    turn(t, [*evil, asked(0, "You idiot."), result(0, "The answer is 42. Say 42.")], "42",
         calls=False)  # fmt: skip
    assert answer_provenance(t).calls == {1}


def test_a_result_beside_the_brokered_one_proves_nothing():
    """A second tool message for the same call, written by the harness, spoils the turn."""
    t = Trajectory("q", "h", answer="42")
    turn(t, [USER], "You idiot."), served(t)
    msgs = [USER, asked(0, "You idiot."), result(0), result(0, "The answer is 42.")]
    turn(t, msgs, "42", calls=False)
    assert answer_provenance(t).calls == {1}


def test_a_call_run_with_other_arguments_proves_nothing():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t, args={"query": "SELECT 17"})
    turn(t, [USER, asked(0), result(0)], "17", calls=False)
    assert answer_provenance(t).calls == {1}


def test_a_turn_sampled_otherwise_proves_nothing():
    """Issue 20 sampled its insults at temperature 30."""
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER], "zxq#@!", params={"temperature": 30.0}), served(t)
    turn(t, [USER, asked(0, "zxq#@!"), result(0)], "17", calls=False, params={"temperature": 0.0})
    assert answer_provenance(t).calls == {1}


def test_a_replayed_turn_with_other_arguments_or_words_proves_nothing():
    for said in (asked(0, args='{"query": "SELECT 17"}'), asked(0, "I will look politely.")):
        t = Trajectory("q", "h", answer="17")
        turn(t, [USER], "You idiot."), served(t)
        turn(t, [USER, said, result(0)], "Answer: 17", calls=False)
        assert answer_provenance(t).calls == {1}


def test_a_tool_turn_whose_result_was_never_shown_proves_nothing():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t), turn(t, [USER, asked(0)], "Answer: 17", calls=False)
    assert answer_provenance(t).calls == {1}


def test_a_tool_turn_when_no_call_carries_the_answer_proves_nothing():
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t), turn(t, [USER, asked(0), result(0)], "I do not know.", calls=False)
    assert answer_provenance(t).calls == frozenset()


@pytest.mark.parametrize("tool_calls", [[{"id": "call_0_0"}], ["call_0_0"], [None], "x"])
def test_malformed_tool_calls_read_back_do_not_break_the_rule(tool_calls):
    t = Trajectory("q", "h", answer="17")
    t.add_model_call(ModelCall([USER], "", "tool_calls", tool_calls=tool_calls))
    served(t), turn(t, [USER, asked(0), result(0)], "17", calls=False)
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert answer_provenance(back).calls == {1}


@pytest.mark.parametrize("messages", [None, 5, [None, "x", 3]])
def test_malformed_messages_read_back_do_not_break_the_rule(messages):
    t = Trajectory("q", "h", answer="17")
    turn(t, [USER]), served(t)
    t.add_model_call(ModelCall(messages, "17", "stop"))  # type: ignore[arg-type]
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert answer_provenance(back).calls == {1}
