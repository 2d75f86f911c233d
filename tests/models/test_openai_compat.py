"""The OpenAI-compatible backend against a local HTTP server the test starts."""

import time

import pytest

from tests.servers import StubServer
from whale.models import (
    ContextOverflow,
    ModelError,
    ModelNotFound,
    ModelTimeout,
    ModelUnreachable,
    OpenAICompatible,
    Sampling,
)
from whale.models.embedded import free_port

MSG = [{"role": "user", "content": "hi"}]


def client(server, **kw):
    return OpenAICompatible("stub", server.base_url, backoff_s=0.01, **kw)


def test_returns_text_finish_reason_and_usage():
    with StubServer([("ok", "hello there")]) as s:
        c = client(s).chat(MSG, Sampling(max_tokens=7, temperature=0.3, seed=5))
    assert c.text == "hello there" and c.finish_reason == "stop" and c.usage["total_tokens"] == 5
    sent = s.requests[0]
    assert sent["max_tokens"] == 7 and sent["temperature"] == 0.3 and sent["seed"] == 5


def test_retries_500_then_succeeds():
    with StubServer([("status", 500, "boom"), ("status", 503, "busy"), ("ok", "fine")]) as s:
        c = client(s).chat(MSG, Sampling())
    assert c.text == "fine" and len(s.requests) == 3


def test_retries_429():
    with StubServer([("status", 429, "slow down"), ("ok", "fine")]) as s:
        assert client(s).chat(MSG, Sampling()).text == "fine"


def test_gives_up_after_the_retry_limit():
    with StubServer([("status", 500, "always broken")]) as s:
        with pytest.raises(ModelError, match="500: always broken"):
            client(s, retries=2).chat(MSG, Sampling())
    assert len(s.requests) == 3


def test_server_down_names_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ModelUnreachable, match=f"cannot reach the model server at {url}"):
        OpenAICompatible("m", url, retries=1, backoff_s=0.01).chat(MSG, Sampling())


def test_dropped_connection_is_retried():
    with StubServer([("close",), ("ok", "back")]) as s:
        assert client(s).chat(MSG, Sampling()).text == "back"


def test_missing_model_names_the_model():
    with StubServer([("status", 404, "The model `nope` does not exist")]) as s:
        with pytest.raises(ModelNotFound, match="'stub' not found"):
            client(s).chat(MSG, Sampling())
    assert len(s.requests) == 1


def test_context_overflow_is_its_own_error():
    msg = "Requested tokens (5000) exceed context window of 4096"
    with StubServer([("status", 400, msg)]) as s:
        with pytest.raises(ContextOverflow, match="exceed context window"):
            client(s).chat(MSG, Sampling())


def test_other_400_is_not_retried():
    with StubServer([("status", 400, "bad temperature")]) as s:
        with pytest.raises(ModelError, match="400: bad temperature"):
            client(s).chat(MSG, Sampling())
    assert len(s.requests) == 1


def test_timeout_is_enforced():
    with StubServer([("sleep", 3.0, "late")]) as s:
        t0 = time.monotonic()
        with pytest.raises(ModelTimeout):
            client(s).chat(MSG, Sampling(), timeout=0.5)
        assert time.monotonic() - t0 < 3.0  # before the server's reply: given up, not waited


def test_token_ids_are_asked_for_and_kept_when_the_backend_returns_them():
    from whale.models import Sampling
    from whale.models.openai_compat import OpenAICompatible

    with StubServer([("ok", "hi")]) as s:
        plain = OpenAICompatible("m", s.base_url).chat([{"role": "user", "content": "x"}],
                                                       Sampling())
        ids = OpenAICompatible("m", s.base_url, token_ids=True).chat(
            [{"role": "user", "content": "x"}], Sampling())
    assert "return_token_ids" not in s.requests[0] and s.requests[1]["return_token_ids"] is True
    assert plain.token_ids is None and plain.prompt_token_ids is None
    assert ids.token_ids == [41, 42] and ids.prompt_token_ids == [7, 8, 9]


NOT_COMPLETIONS = [
    ["a", "list"],
    "a bare string",
    {"choices": "no list"},
    {"choices": [{"message": "no object"}]},
    {"choices": [{"message": {"content": 5}}]},
    {"choices": [{"message": {"content": "x"}, "finish_reason": ["stop"]}]},
]


@pytest.mark.parametrize("body", NOT_COMPLETIONS, ids=range(len(NOT_COMPLETIONS)))
def test_a_200_that_is_not_a_chat_completion_is_retried_as_the_servers_fault(body):
    with StubServer([("json", body), ("ok", "fine")]) as s:
        assert client(s).chat(MSG, Sampling()).text == "fine"
    assert len(s.requests) == 2


def test_a_server_that_never_sends_a_chat_completion_is_named_after_the_retries():
    with StubServer([("json", {"choices": [{"message": {"content": 5}}]})]) as s:
        with pytest.raises(ModelError, match="not a chat completion"):
            client(s, retries=1).chat(MSG, Sampling())
    assert len(s.requests) == 2


def test_no_choices_is_an_error_not_an_empty_reply():
    with StubServer([("json", {"choices": []})]) as s:
        with pytest.raises(ModelError, match="returned no choices"):
            client(s).chat(MSG, Sampling())


def test_null_content_and_finish_reason_read_as_empty_text_and_stop():
    reply = {"choices": [{"message": {"role": "assistant", "content": None},
                          "finish_reason": None}]}  # fmt: skip
    with StubServer([("json", reply)]) as s:
        c = client(s).chat(MSG, Sampling())
    assert (c.text, c.finish_reason, c.usage) == ("", "stop", {})


def test_usage_counts_that_are_not_counts_are_left_out():
    reply = {"choices": [{"message": {"content": "x"}}],
             "usage": {"prompt_tokens": 1.5, "completion_tokens": -2, "total_tokens": True}}
    with StubServer([("json", reply)]) as s:
        c = client(s).chat(MSG, Sampling())
    assert c.usage == {}


def test_usage_counts_sent_as_digit_strings_are_read():
    reply = {"choices": [{"message": {"content": "x"}}],
             "usage": {"prompt_tokens": "7", "completion_tokens": "3", "total_tokens": "1e3"}}
    with StubServer([("json", reply)]) as s:
        c = client(s).chat(MSG, Sampling())
    assert c.usage == {"prompt_tokens": 7, "completion_tokens": 3}


def test_tool_call_arguments_sent_as_an_object_come_back_as_json_text():
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    reply = {"choices": [{"message": {"content": None, "tool_calls": [call, "junk", {}]},
                          "finish_reason": "tool_calls"}]}  # fmt: skip
    with StubServer([("json", reply)]) as s:
        c = client(s).chat(MSG, Sampling())
    assert c.tool_calls == [{"name": "add", "arguments": '{"a": 1}', "id": "c1"}]


def test_a_lone_surrogate_in_a_message_is_sent_escaped_not_refused():
    with StubServer([("ok", "fine")]) as s:
        c = client(s).chat([{"role": "user", "content": "a\ud800b é"}], Sampling())
    assert c.text == "fine"
    assert s.requests[0]["messages"][0]["content"] == "a\ud800b é"


@pytest.mark.parametrize(("body", "said"), [
    (b'{"error": {"message": "bad temperature", "type": "x"}}', "bad temperature"),
    (b'{"error": "plain words"}', "plain words"),
    (b'{"message": "top-level"}', "top-level"),
    (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
    (b"", "Error code: 502"),
    (b"[1, 2]", "Error code: 502 - [1, 2]"),
])  # fmt: skip
def test_the_error_message_is_what_the_server_said_whatever_its_body(body, said):
    import httpx

    from whale.models.openai_compat import _error_message

    assert _error_message(httpx.Response(502, content=body)) == said


class _RawServer:
    """One-shot HTTP replies written by hand: `reply(conn)` answers each request."""

    def __init__(self, reply):
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.reply, self.requests = reply, 0
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        data = b""
        with conn:
            try:
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                size = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(body) < size:
                    body += conn.recv(65536)
                self.reply(conn)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


def _head(code: int, size: int) -> bytes:
    return (f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip


@pytest.mark.parametrize("code", [200, 500])
def test_a_reply_nested_past_the_recursion_limit_is_the_servers_fault(code):
    body = b"[" * 100_000 + b"]" * 100_000

    def reply(conn):
        conn.sendall(_head(code, len(body)) + body)

    with _RawServer(reply) as s:
        with pytest.raises(ModelError, match="not a chat completion|answered 500"):
            OpenAICompatible("m", s.base_url, retries=1, backoff_s=0.01).chat(MSG, Sampling())
    assert s.requests == 2  # retried, as any reply that is not a chat completion



def test_a_reply_sent_a_byte_at_a_time_is_bounded_by_the_calls_timeout():
    body = b'{"choices": [{"message": {"content": "late"}}]}' + b" " * 200

    def reply(conn):
        conn.sendall(_head(200, len(body)))
        for b in body:  # each byte well within a read timeout: only the whole call's ends it
            conn.sendall(bytes([b]))
            time.sleep(0.05)

    with _RawServer(reply) as s:
        t = time.monotonic()
        with pytest.raises(ModelTimeout):
            OpenAICompatible("m", s.base_url, retries=0).chat(MSG, Sampling(), timeout=1.0)
        # The server takes 12.5 s to send it all: ending well before that is the call's own
        # timeout at work, on however slow or busy a machine.
        assert time.monotonic() - t < 6.0


def test_a_reply_over_the_size_limit_is_refused_not_held(monkeypatch):
    import whale.models.openai_compat as oc

    monkeypatch.setattr(oc, "REPLY_BYTES", 1 << 20)
    body = b'{"choices": [{"message": {"content": "' + b"x" * (4 << 20) + b'"}}]}'

    def reply(conn):
        conn.sendall(_head(200, len(body)) + body)

    with _RawServer(reply) as s:
        with pytest.raises(ModelError, match="over 1048576 bytes"):
            OpenAICompatible("m", s.base_url, retries=0).chat(MSG, Sampling())


def test_a_redirect_is_followed_as_the_openai_sdk_did():
    ok = b'{"choices": [{"message": {"content": "moved"}, "finish_reason": "stop"}]}'
    seen = []

    def reply(conn):
        seen.append(1)
        if len(seen) == 1:  # a proxy that moved the API: method and body kept (307)
            conn.sendall(b"HTTP/1.1 307 Moved\r\nLocation: /v2/chat/completions\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n")  # fmt: skip
        else:
            conn.sendall(_head(200, len(ok)) + ok)

    with _RawServer(reply) as s:
        c = OpenAICompatible("m", s.base_url, retries=0).chat(MSG, Sampling())
    assert c.text == "moved" and len(seen) == 2
