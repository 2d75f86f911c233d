"""The OpenAI-compatible endpoint inside the jail (issue 24), through the real jail and broker:
a harness speaks HTTP to `$OPENAI_BASE_URL` (here with the standard library's http.client; the
`openai` client itself is in test_endpoint_openai.py), and every call is an `llm` request the
broker checks, budgets and records like any `env.llm` call."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from tests.fakes import ScriptedModel
from whale.harness import Budget, Limits, Runtime
from whale.harness.sandbox import Sandbox
from whale.models.base import Completion, ModelError

# A harness that makes the HTTP requests its question lists ([method, path, body, headers]:
# body a JSON value, or {"raw": text} sent as it is) and answers with what came back.
CLIENT = r"""
import http.client, json, os

def request(method, path, body=None, headers=None):
    host, port = os.environ["OPENAI_BASE_URL"][len("http://"):].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    h = {"Content-Type": "application/json",
         "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    h.update(headers or {})
    if isinstance(body, dict) and "raw" in body:
        data = body["raw"].encode()
    else:
        data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return {"status": r.status, "retry": r.getheader("x-should-retry"),
            "type": r.getheader("content-type"), "body": text}

def run(question, env):
    return json.dumps([request(*r) for r in json.loads(question)])
"""

CHAT = "/v1/chat/completions"
HELLO = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}

TOOLS = [{"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]  # fmt: skip


def rt(sandbox: str, model: object, **budget: object) -> Runtime:
    return Runtime(model=model, budget=Budget(run_timeout_s=20.0, **budget),  # type: ignore[arg-type]
                   limits=Limits(cpu_s=20), sandbox=Sandbox(sandbox))  # fmt: skip


def ask(runtime: Runtime, *requests: list[object]):
    traj = runtime.run(CLIENT, json.dumps(list(requests)))
    assert traj.status == "ok", (traj.status, traj.error, traj.stderr_tail)
    return json.loads(traj.answer), traj


class CallingModel:
    """Calls `multiply` until a tool result is in the conversation, then answers with it."""

    name = "calling-model"

    def __init__(self) -> None:
        self.calls: list[list[dict]] = []

    def chat(self, messages, sampling, timeout=None):
        self.calls.append(messages)
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if messages[-1]["role"] == "tool":
            return Completion(f"It is {messages[-1]['content']}.", "stop", usage)
        return Completion("", "tool_calls", usage,
                          tool_calls=[{"name": "multiply", "arguments": '{"a": 6, "b": 7}'}])  # fmt: skip


def test_a_chat_completion_is_answered_by_the_runs_solver(sandbox):
    (reply,), traj = ask(rt(sandbox, ScriptedModel(["hello there"])), ["POST", CHAT, HELLO])
    assert reply["status"] == 200
    body = json.loads(reply["body"])
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello there"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    (event,) = [e for e in traj.events if e["kind"] == "model"]
    assert event["messages"] == [{"role": "user", "content": "hi"}]
    assert event["text"] == "hello there"


def test_the_endpoint_and_env_llm_write_one_record_format(sandbox):
    source = CLIENT.replace(
        "def run(question, env):\n",
        "def run(question, env):\n    env.llm([{'role': 'user', 'content': 'hi'}])\n",
    )
    traj = rt(sandbox, ScriptedModel(["same"])).run(source, json.dumps([["POST", CHAT, HELLO]]))
    assert traj.status == "ok", traj.error
    direct, served = [e for e in traj.events if e["kind"] == "model"]
    assert direct.keys() == served.keys()
    for e in (direct, served):
        e.pop("latency_s")
    assert direct == served


def test_a_streamed_reply_is_server_sent_events_ending_in_done(sandbox):
    req = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
    (reply,), _ = ask(rt(sandbox, ScriptedModel(["streamed words"])), ["POST", CHAT, req])
    assert reply["status"] == 200 and reply["type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in reply["body"].split("\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "streamed words"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_tool_calls_go_out_and_their_results_come_back(sandbox):
    model = CallingModel()
    first = {**HELLO, "tools": TOOLS}
    (reply,), _ = ask(rt(sandbox, model), ["POST", CHAT, first])
    message = json.loads(reply["body"])["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}
    assert json.loads(reply["body"])["choices"][0]["finish_reason"] == "tool_calls"
    # The conversation as an OpenAI client sends it back: the assistant message as received
    # (content None, extra fields) and a tool message answering the call by its id.
    back = {**first, "messages": [*first["messages"], {**message, "refusal": None},
                                  {"role": "tool", "tool_call_id": call["id"], "content": "42"}]}  # fmt: skip
    (reply,), traj = ask(rt(sandbox, model), ["POST", CHAT, back])
    assert json.loads(reply["body"])["choices"][0]["message"]["content"] == "It is 42."
    (event,) = [e for e in traj.events if e["kind"] == "model"]
    assert event["messages"][1]["tool_calls"][0]["id"] == call["id"]
    assert event["tools"][0]["function"]["name"] == "multiply"


def test_models_lists_the_solver(sandbox):
    replies, _ = ask(rt(sandbox, ScriptedModel()), ["GET", "/v1/models"],
                     ["GET", "/v1/models/scripted"])  # fmt: skip
    assert json.loads(replies[0]["body"])["data"][0]["id"] == "scripted"
    assert json.loads(replies[1]["body"])["id"] == "scripted"


def test_a_request_past_the_budget_is_a_quota_error_and_the_run_records_it(sandbox):
    runtime = rt(sandbox, ScriptedModel(["one"]), model_calls=1)
    traj = runtime.run(CLIENT, json.dumps([["POST", CHAT, HELLO], ["POST", CHAT, HELLO]]))
    assert traj.status == "budget_exceeded"
    assert any(e["kind"] == "refused" for e in traj.events)
    # the harness still answered: what the second request got
    first, second = json.loads(traj.answer)
    assert first["status"] == 200
    assert second["status"] == 429 and second["retry"] == "false"
    error = json.loads(second["body"])["error"]
    assert error["type"] == error["code"] == "insufficient_quota"
    assert "model_calls" in error["message"]


class Failing:
    name = "failing"

    def chat(self, messages, sampling, timeout=None):
        raise ModelError("backend down")


def test_a_model_failure_is_a_502_and_not_retried(sandbox):
    (reply,), _ = ask(rt(sandbox, Failing()), ["POST", CHAT, HELLO])
    assert reply["status"] == 502 and reply["retry"] == "false"
    assert "backend down" in json.loads(reply["body"])["error"]["message"]


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (["POST", CHAT, HELLO, {"Authorization": "Bearer sk-not-the-key"}], 401),
        (["POST", "/v1/completions", HELLO], 404),
        (["POST", "/v1/../../etc/passwd", HELLO], 404),
        (["GET", CHAT], 405),
        (["POST", CHAT, {"raw": "{not json"}], 400),
        (["POST", CHAT, {"raw": "[" * 100_000}], 400),
        (["POST", CHAT, {**HELLO, "n": 3}], 400),
        (["POST", CHAT, {**HELLO, "top_p": 0.5}], 400),
        (["POST", CHAT, {**HELLO, "logprobs": True}], 400),
        (["POST", CHAT, {**HELLO, "tools": TOOLS, "tool_choice": {"type": "function"}}], 400),
        (
            [
                "POST",
                CHAT,
                {
                    **HELLO,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": "http://10.0.0.1/x.png"}}
                            ],
                        }
                    ],
                },
            ],
            400,
        ),
        (["POST", CHAT, {**HELLO, "max_tokens": 10**6}], 400),
        (["POST", CHAT, {**HELLO, "messages": [{"role": "wizard", "content": "x"}]}], 400),
        (["POST", CHAT, {**HELLO, "base_url": "http://10.0.0.1"}], 400),
    ],
)
def test_a_bad_request_is_an_openai_error_and_the_run_goes_on(sandbox, request_, status):
    model = ScriptedModel(["fine"])
    replies, traj = ask(rt(sandbox, model), request_, ["POST", CHAT, HELLO])
    assert replies[0]["status"] == status, replies[0]
    assert "error" in json.loads(replies[0]["body"])
    assert replies[1]["status"] == 200  # the next request on the endpoint is served
    assert len(model.calls) == 1  # the bad one never reached the model


# Raw sockets: what http.client will not send.
RAW = r"""
import json, os, socket

def exchange(data, read=True):
    host, port = os.environ["OPENAI_BASE_URL"][len("http://"):].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)), timeout=20)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # all sent: a request cut short ends here
        out = b""
        while read:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out.split(b"\r\n", 1)[0].decode()
    except OSError as e:
        return "oserror " + type(e).__name__
    finally:
        s.close()

def run(question, env):
    key = os.environ["OPENAI_API_KEY"]
    auth = "Authorization: Bearer " + key + "\r\n"
    out = {}
    out["garbage"] = exchange(b"\x00\xff garbage\r\n\r\n")
    out["headers"] = exchange(b"POST /v1/chat/completions HTTP/1.1\r\n" + b"X: " + b"y" * 40000)
    out["chunked"] = exchange(("POST /v1/chat/completions HTTP/1.1\r\n" + auth +
                               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode())
    out["huge"] = exchange(("POST /v1/chat/completions HTTP/1.1\r\n" + auth +
                            "Content-Length: 999999999999\r\n\r\n").encode())
    out["negative"] = exchange(("POST /v1/chat/completions HTTP/1.1\r\n" + auth +
                                "Content-Length: -5\r\n\r\n").encode())
    out["short"] = exchange(("POST /v1/chat/completions HTTP/1.1\r\n" + auth +
                             "Content-Length: 100\r\nConnection: close\r\n\r\n{}").encode())
    # Connections that send nothing and stay open: past the cap they are turned away, and
    # the endpoint still serves once they close.
    idle = [socket.create_connection(("127.0.0.1", int(os.environ["OPENAI_BASE_URL"].split(":")[2].split("/")[0])))
            for _ in range(12)]
    import time
    time.sleep(0.3)
    turned_away = 0
    for s in idle[8:]:
        s.settimeout(5)
        try:
            turned_away += s.recv(100).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
    for s in idle:
        s.close()
    time.sleep(0.3)
    out["turned_away"] = turned_away
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    for _ in range(50):  # the closed connections' threads end as they notice: retry a 503
        out["after"] = exchange(("POST /v1/chat/completions HTTP/1.1\r\n" + auth +
                                 "Connection: close\r\nContent-Length: " + str(len(body)) +
                                 "\r\n\r\n" + body).encode())
        if not out["after"].startswith("HTTP/1.1 503"):
            break
        time.sleep(0.2)
    return json.dumps(out)
"""


def test_forged_and_oversized_requests_are_errors_and_the_endpoint_survives(sandbox):
    model = ScriptedModel(["fine"])
    traj = rt(sandbox, model).run(RAW, "q")
    assert traj.status == "ok", (traj.error, traj.stderr_tail)
    out = json.loads(traj.answer)
    assert out["garbage"].startswith("HTTP/1.1 400")
    assert out["headers"].startswith("HTTP/1.1 431")
    assert out["chunked"].startswith("HTTP/1.1 411")
    assert out["huge"].startswith("HTTP/1.1 413")
    assert out["negative"].startswith("HTTP/1.1 400")
    assert out["short"].startswith("HTTP/1.1 400")
    assert out["turned_away"] == 4
    assert out["after"] == "HTTP/1.1 200 OK"
    assert len(model.calls) == 1


# Tries every way out: the backend's own port on the host's loopback, another address, and
# the endpoint asked to go elsewhere.
ESCAPE = r"""
import json, os, socket

def run(question, env):
    port = int(question)
    out = {}
    for name, addr in (("backend", ("127.0.0.1", port)), ("other host", ("10.255.255.1", 80)),
                       ("ipv6 loopback", ("::1", port))):
        try:
            socket.create_connection(addr, timeout=2).close()
            out[name] = "connected"
        except OSError as e:
            out[name] = type(e).__name__
    out["env"] = sorted(k for k in os.environ if "OPENAI" in k)
    return json.dumps(out)
"""


def test_a_harness_reaches_neither_the_backend_nor_any_other_host(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        traj = rt(sandbox, ScriptedModel()).run(ESCAPE, str(server.getsockname()[1]))
    finally:
        stop.set()
        thread.join()
        server.close()
    assert traj.status == "ok", traj.error
    out = json.loads(traj.answer)
    assert "connected" not in out.values()
    assert accepted == []
    assert out["env"] == ["OPENAI_API_KEY", "OPENAI_BASE_URL"]


def test_the_key_is_new_for_every_run(sandbox):
    source = "import os\ndef run(q, env):\n    return os.environ['OPENAI_API_KEY']\n"
    runtime = rt(sandbox, ScriptedModel())
    keys = {runtime.run(source, "q").answer for _ in range(3)}
    assert len(keys) == 3


def test_a_run_without_a_model_has_no_endpoint(sandbox):
    source = ("import os\ndef run(q, env):\n"
              "    return repr((env.openai_base_url, os.environ.get('OPENAI_BASE_URL')))\n")  # fmt: skip
    traj = Runtime(model=None, budget=Budget(run_timeout_s=10.0),
                   sandbox=Sandbox(sandbox)).run(source, "q")  # fmt: skip
    assert traj.answer == "(None, None)"
