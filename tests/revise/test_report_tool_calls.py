"""The execution report (whale.revise.report) shows the tool calls a model made through
`env.llm(..., tools=)`, and survives the messages a harness may send."""

from __future__ import annotations

from whale.harness.trajectory import ModelCall, Trajectory
from whale.revise.report import _trace


def test_a_model_s_tool_calls_are_in_the_trace():
    t = Trajectory("q", "h", answer="17")
    t.add_model_call(ModelCall([{"role": "user", "content": "How many?"}], "", "tool_calls",
                               tool_calls=[{"id": "call_0_0", "name": "sql",
                                            "arguments": '{"query": "SELECT 1"}'}]))  # fmt: skip
    line = _trace(t, 2000)[1]
    assert "tool calls 'sql({\"query\": \"SELECT 1\"})'" in line


def test_a_last_message_without_content_does_not_break_the_report():
    """An assistant turn holding only tool calls has no `content` key."""
    t = Trajectory("q", "h", answer="")
    t.add_model_call(ModelCall([{"role": "assistant", "tool_calls": []}], "ok", "stop"))
    assert "last message ''" in _trace(t, 2000)[1]
