"""Tool calling in the models layer (issue 23): `Sampling.tools` / `tool_choice` go to an
OpenAI-compatible server as its API takes them, the reply's calls come back in
`Completion.tool_calls`, the response cache keys on the tools, and a backend that cannot
return tool calls refuses `tools=` instead of dropping them.

The server is a tiny `http.server` on 127.0.0.1 that records each request body and answers
the reply a test gives it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from whale.models import native
from whale.models.base import Completion, ModelError, Sampling, template_messages
from whale.models.cache import CachedModel, cache_key
from whale.models.embedded import EmbeddedLlama, server_messages
from whale.models.hf import TransformersChat
from whale.models.openai_compat import OpenAICompatible

TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "a times b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]  # fmt: skip
TOOLS_JSON = json.dumps(TOOLS)
ASK = [{"role": "user", "content": "What is 6 times 7?"}]
# A conversation after one call: the assistant's call and the tool's answer.
HISTORY = [
    *ASK,
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0_0", "type": "function",
        "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}]},
    {"role": "tool", "tool_call_id": "call_0_0", "content": "42"},
]  # fmt: skip


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}  # fmt: skip


class Server:
    """Answers every POST with `reply` (a chat.completion body) and keeps the request bodies."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(size)))
                data = json.dumps(outer.reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[Server] = []

    def start(reply: dict[str, Any]) -> tuple[Server, OpenAICompatible]:
        s = Server(reply)
        servers.append(s)
        return s, OpenAICompatible("m", s.url, api_key="none", retries=0)

    yield start
    for s in servers:
        s.close()


CALL = {"role": "assistant", "content": None, "tool_calls": [{
    "id": "srv-1", "type": "function",
    "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}]}  # fmt: skip


def test_tools_and_tool_choice_are_sent_as_the_api_takes_them(serve):
    server, model = serve(completion(CALL, "tool_calls"))
    model.chat(ASK, Sampling(tools=TOOLS_JSON))
    model.chat(ASK, Sampling(tools=TOOLS_JSON, tool_choice="required"))
    model.chat(ASK, Sampling())
    first, second, plain = server.bodies
    assert first["tools"] == TOOLS and first["tool_choice"] == "auto"
    assert second["tool_choice"] == "required"
    assert "tools" not in plain and "tool_choice" not in plain


def test_the_replys_calls_come_back_with_name_arguments_and_id(serve):
    _, model = serve(completion(CALL, "tool_calls"))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert c.finish_reason == "tool_calls" and c.text == ""
    assert c.tool_calls == [{"name": "multiply", "arguments": '{"a": 6, "b": 7}', "id": "srv-1"}]


def test_a_reply_without_calls_has_none(serve):
    _, model = serve(completion({"role": "assistant", "content": "42"}))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert c.text == "42" and c.tool_calls is None


def test_a_tool_call_history_is_sent_as_given(serve):
    server, model = serve(completion({"role": "assistant", "content": "42"}))
    model.chat(HISTORY, Sampling(tools=TOOLS_JSON))
    sent = server.bodies[0]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 6, "b": 7}'  # JSON text
    assert sent[2] == {"role": "tool", "tool_call_id": "call_0_0", "content": "42"}


@pytest.mark.parametrize("kwargs", [{"tool_choice": "maybe", "tools": "[]"},
                                    {"tool_choice": "auto"},  # no tools
                                    {"tools": ["not", "text"]}])  # fmt: skip
def test_sampling_refuses_a_tool_choice_or_tools_out_of_range(kwargs):
    with pytest.raises(ValueError, match="sampling: tool"):
        Sampling(**kwargs)


def test_the_cache_key_holds_the_tools_and_the_tool_choice():
    keys = {cache_key("m", ASK, s) for s in (
        Sampling(), Sampling(tools=TOOLS_JSON), Sampling(tools="[]"),
        Sampling(tools=TOOLS_JSON, tool_choice="required"))}  # fmt: skip
    assert len(keys) == 4


class Calls:
    name = "calls"

    def __init__(self) -> None:
        self.n = 0

    def chat(self, messages, sampling, timeout=None):
        self.n += 1
        calls = None if sampling.tools is None else [{"name": "multiply", "arguments": "{}"}]
        return Completion("", "tool_calls" if calls else "stop", {}, tool_calls=calls)


def test_the_cache_keeps_tool_calls_and_misses_on_other_tools(tmp_path):
    inner = Calls()
    model = CachedModel(inner, tmp_path / "c.sqlite")
    try:
        first = model.chat(ASK, Sampling(tools=TOOLS_JSON))
        again = model.chat(ASK, Sampling(tools=TOOLS_JSON))
        other = model.chat(ASK, Sampling())
    finally:
        model.close()
    assert inner.n == 2 and again.cached and again.tool_calls == first.tool_calls
    assert other.tool_calls is None


def test_the_python_embedded_server_refuses_tools_without_starting(tmp_path):
    """llama-cpp-python's server renders the tools but returns the call as text: refused."""
    m = EmbeddedLlama(tmp_path / "absent.gguf", server="python")
    with pytest.raises(ModelError, match="native llama-server"):
        m.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert not m.started
    m.close()


def test_transformers_generation_refuses_tools(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="returns no tool calls"):
        TransformersChat(tmp_path).chat(ASK, Sampling(tools=TOOLS_JSON))


def test_the_native_server_runs_in_chat_template_mode():
    """llama-server parses tool calls only with its jinja chat templates."""
    cmd = native.command(Path("llama-server"), Path("m.gguf"), port=1, alias="m", n_ctx=64,
                         slots=1, threads=1)  # fmt: skip
    assert "--jinja" in cmd


def test_server_messages_give_every_tool_message_an_id():
    """llama-cpp-python's server answers HTTP 500 to a tool message without tool_call_id."""
    bare = [*ASK, {"role": "assistant", "content": "```print(42)```"},
            {"role": "tool", "content": "42"}]  # fmt: skip
    for kind in ("native", "python"):
        sent = server_messages(bare, kind)
        assert sent[2] == {"role": "tool", "content": "42", "tool_call_id": "call_2"}
    assert "tool_call_id" not in bare[2]  # the caller's messages (the cache key) are unchanged
    assert server_messages(HISTORY, "native") == HISTORY  # an id given is kept


def test_the_python_server_gets_arguments_as_objects():
    """It hands messages to the template as they are, and Qwen2.5's renders arguments with
    tojson: text would be rendered as a quoted string. The native server parses them itself."""
    py = server_messages(HISTORY, "python")
    assert py[1]["tool_calls"][0]["function"]["arguments"] == {"a": 6, "b": 7}
    assert server_messages(HISTORY, "native")[1]["tool_calls"][0]["function"]["arguments"] \
        == '{"a": 6, "b": 7}'  # fmt: skip


def test_template_messages_parse_only_json_objects():
    calls = [
        {"id": str(i), "type": "function", "function": {"name": "f", "arguments": a}}
        for i, a in enumerate(['{"x": [1]}', "[1, 2]", "not json", "[" * 5000])
    ]
    msgs = [{"role": "assistant", "content": "", "tool_calls": calls}]
    out = template_messages(msgs)
    assert [c["function"]["arguments"] for c in out[0]["tool_calls"]] == \
        [{"x": [1]}, "[1, 2]", "not json", "[" * 5000]  # fmt: skip
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == '{"x": [1]}'  # not changed


# -- calls written as text ---------------------------------------------------------------------
# Qwen2.5-Coder-0.5B writes its calls without the <tool_call> tags (measured: whale/models/base.py
# text_call), and llama.cpp's server then returns the call as content.
BARE = '{"name": "multiply", "arguments": {"a": 6, "b": 7}}'


def test_a_reply_that_is_a_bare_call_is_read_as_the_call(serve):
    _, model = serve(completion({"role": "assistant", "content": BARE}))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert c.tool_calls == [{"name": "multiply", "arguments": '{"a": 6, "b": 7}'}]
    assert c.text == "" and c.finish_reason == "tool_calls" and c.raw_text == BARE


@pytest.mark.parametrize(
    "text",
    [
        f"Sure: {BARE}",  # words around it
        f"{BARE}\n{BARE}",  # two objects
        '{"name": "divide", "arguments": {"a": 6}}',  # no such tool
        '{"name": "multiply", "arguments": "a=6"}',  # arguments not an object
        '{"name": "multiply", "arguments": {}, "id": 1}',  # other keys
        '{"name": "multiply", "arguments": {"a": 6, "b": 7}',  # not JSON
        "[" * 3000 + "]" * 3000,
    ],
)
def test_any_other_text_stays_text(serve, text):
    _, model = serve(completion({"role": "assistant", "content": text}))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert c.text == text and c.tool_calls is None and c.raw_text is None


def test_a_tagged_call_left_as_text_is_read_too(serve):
    tagged = f"<tool_call>\n{BARE}\n</tool_call>"
    _, model = serve(completion({"role": "assistant", "content": tagged}))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON))
    assert c.tool_calls is not None and c.raw_text == tagged


def test_a_bare_call_is_text_without_tools_or_when_cut(serve):
    """Only a reply to a call that offered tools, and that the model ended itself."""
    _, model = serve(completion({"role": "assistant", "content": BARE}))
    assert model.chat(ASK, Sampling()).tool_calls is None
    _, cut = serve(completion({"role": "assistant", "content": BARE}, "length"))
    assert cut.chat(ASK, Sampling(tools=TOOLS_JSON)).tool_calls is None


def test_a_bare_call_is_text_when_the_call_asked_for_no_tool(serve):
    """tool_choice="none": the harness asked for an answer, whatever the reply looks like."""
    _, model = serve(completion({"role": "assistant", "content": BARE}))
    c = model.chat(ASK, Sampling(tools=TOOLS_JSON, tool_choice="none"))
    assert c.tool_calls is None and c.text == BARE and c.finish_reason == "stop"
