"""How the in-jail endpoint reads an OpenAI request into an `llm` request and writes the reply
back (whale/harness/endpoint.py's pure functions; the jail itself is in test_endpoint.py)."""

from __future__ import annotations

import pytest

from whale.harness.endpoint import HTTPError, chat_args, chunks, completion

USER = {"role": "user", "content": "hi"}


def test_content_parts_are_joined_into_one_text():
    parts = [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]
    args = chat_args({"messages": [{"role": "user", "content": parts}]})
    assert args["messages"] == [{"role": "user", "content": "a b"}]


def test_a_developer_message_is_sent_as_system():
    args = chat_args({"messages": [{"role": "developer", "content": "be brief"}, USER]})
    assert args["messages"][0] == {"role": "system", "content": "be brief"}


def test_max_completion_tokens_is_the_calls_max_tokens():
    assert chat_args({"messages": [USER], "max_completion_tokens": 7})["max_tokens"] == 7


def test_fields_that_change_nothing_are_not_forwarded():
    args = chat_args({"messages": [USER], "model": "gpt-4o", "seed": 3, "user": "u",
                      "parallel_tool_calls": True, "response_format": {"type": "text"},
                      "n": 1, "top_p": 1, "stream": False})  # fmt: skip
    assert args == {"messages": [USER]}


def test_tool_choice_without_tools_is_dropped():
    assert "tool_choice" not in chat_args({"messages": [USER], "tool_choice": "auto"})


def test_an_assistant_message_without_content_is_sent_with_empty_text():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    args = chat_args({"messages": [USER, {"role": "assistant", "content": None,
                                          "tool_calls": calls, "refusal": None}]})  # fmt: skip
    assert args["messages"][1] == {"role": "assistant", "content": "", "tool_calls": calls}


@pytest.mark.parametrize(
    "body",
    [[], {"messages": "hi"}, {"messages": [USER], "stream": "yes"},
     {"messages": [USER], "response_format": {"type": "json_object"}},
     {"messages": [USER], "frequency_penalty": 0.5}, {"messages": [USER], "surprise": 1},
     {"messages": [3]}, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400(body):
    with pytest.raises(HTTPError) as e:
        chat_args(body)
    assert e.value.status == 400


RESULT = {"text": "", "finish_reason": "tool_calls", "usage": {"prompt_tokens": 3,
          "completion_tokens": 2}, "message": {"role": "assistant", "content": "", "tool_calls": [
          {"id": "call_0_0", "type": "function",
           "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}}  # fmt: skip


def test_a_reply_with_calls_and_no_text_has_content_none():
    out = completion(RESULT, "m", 1)
    message = out["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_a_streamed_reply_carries_each_call_with_its_index_then_the_finish():
    out = chunks(RESULT, "m", 1, usage=False)
    assert out[1]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
