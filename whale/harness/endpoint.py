"""The OpenAI-compatible endpoint inside the jail: `openai.OpenAI()` and the frameworks built on
it call the run's solver unchanged, through the broker.

Runs inside the jail, in the worker's process (worker.py loads this file's compiled code by
path and starts `Endpoint.serve` on a thread), standard library only. It listens on 127.0.0.1
in the jail's own network namespace (nsjail and bubblewrap each give a run its own loopback),
so only the run's own processes reach it; its address is `OPENAI_BASE_URL` and its key
`OPENAI_API_KEY` in the run's environment, and `env.openai_base_url`.

Nothing here is trusted, and nothing needs to be: a request is turned into the very `llm`
request `env.llm` sends over the run's pipe, and the broker checks it, spends the budget, makes
the call and records it on the trajectory as it does every `env.llm` call (one record, one
format, the weight phase's training data either way). A harness that rewrites this code or
writes its own frames gains nothing the pipe does not already give it.

What it speaks: `POST /v1/chat/completions` (with or without `stream`, with `tools` and
`tool_choice` "auto" / "none" / "required"), `GET /v1/models` and `GET /v1/models/ID`; HTTP/1.1
with Content-Length bodies, keep-alive. A streamed reply is sent as server-sent events once the
completion is done (the broker makes one call and returns it whole): a content chunk, a tool
call chunk, the finish chunk, usage where `stream_options.include_usage` asks, `[DONE]`.
Errors are OpenAI's error objects with the status an OpenAI client maps to its exception
(400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 413, 429 RateLimitError for a
spent budget, 502 / 504 for a model that failed or timed out), each with `x-should-retry:
false`: the client's automatic retries would only spend the budget again (but 503, a connection
turned away before anything was spent). Sampling parameters
whale does not set per call (`n` > 1, `top_p` < 1, penalties, logprobs, a forced function) are
refused, not ignored; `model`, `seed`, `user`, `store`, `metadata`, `parallel_tool_calls`,
`stream_options` and `response_format` of type "text" are accepted and do not change the call
(the run's solver answers whatever model is named; the runtime sets the seed).

Not covered: chunked request bodies (411), image or audio content parts (400), the Responses
and legacy completions APIs, embeddings.
"""

from __future__ import annotations

import _socket
import _thread
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs start-up time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# One request's headers, and the connections served at once: past that a connection is
# answered 503 and closed (each holds a thread, and threads count against the run's process
# limit).
HEADER_BYTES = 16 * 1024
MAX_CONNECTIONS = 8
# A connection that sends nothing for this long is closed (its thread is freed).
IDLE_S = 60.0

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 411: "Length Required", 413: "Payload Too Large",
            429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}  # fmt: skip
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 429: "insufficient_quota",
                502: "model_error", 504: "timeout"}  # fmt: skip
# What the broker's error reply says went wrong (its "kind"), as an HTTP status.
_KIND_STATUS = {"budget": 429, "invalid": 400, "model": 502, "timeout": 504}
# Accepted and without effect on the call (see the module's docstring).
_IGNORED = frozenset({"model", "seed", "user", "store", "metadata", "parallel_tool_calls",
                      "stream_options", "service_tier", "prompt_cache_key",
                      "safety_identifier"})  # fmt: skip
# Accepted only at the value that changes nothing.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "top_p": (None, 1, 1.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "functions": (None, []),
    "function_call": (None,),
    "modalities": (None, ["text"]),
}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class Refusal(Exception):
    """The broker refused the call: `kind` as in `_KIND_STATUS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def chat_args(body: Any) -> dict[str, Any]:
    """The `llm` request an OpenAI chat completion request stands for; HTTPError(400) for what
    whale cannot honour. Messages' content parts are joined into one text (text parts only);
    role "developer" is sent as "system"."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    known = {"messages", "max_tokens", "max_completion_tokens", "temperature", "stop", "tools",
             "tool_choice", "stream", "response_format"}  # fmt: skip
    for key, value in body.items():
        if key in known or key in _IGNORED:
            continue
        if key in _NEUTRAL:
            if value not in _NEUTRAL[key]:
                raise HTTPError(400, f"{key}={_short(value)} is not supported here (whale "
                                     f"serves one sampled reply per call)")  # fmt: skip
            continue
        raise HTTPError(400, f"unsupported parameter {_short(key)}")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise HTTPError(400, "response_format other than {'type': 'text'} is not supported")
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise HTTPError(400, "stream must be a boolean")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise HTTPError(400, "messages must be a list")
    args: dict[str, Any] = {"messages": [_message(i, m) for i, m in enumerate(messages)]}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    for key in ("temperature", "stop", "tools"):
        if body.get(key) is not None:
            args[key] = body[key]
    if max_tokens is not None:
        args["max_tokens"] = max_tokens
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, str):
            raise HTTPError(400, "tool_choice naming a function is not supported; use "
                                 "'auto', 'none' or 'required'")  # fmt: skip
        if body.get("tools"):  # OpenAI allows "none"/"auto" without tools; whale's llm does not
            args["tool_choice"] = choice
    return args


def _message(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise HTTPError(400, f"messages[{i}] must be an object")
    out = {k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in m}
    if out.get("role") == "developer":
        out["role"] = "system"
    content = out.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "text",
                "input_text",
                "output_text",
            ):
                raise HTTPError(400, f"messages[{i}]: only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise HTTPError(400, f"messages[{i}]: a text part without text")
            parts.append(text)
        out["content"] = "".join(parts)
    elif content is None and out.get("role") == "assistant":
        out["content"] = ""
    if out.get("tool_calls") is None:
        out.pop("tool_calls", None)
    return out


def completion(result: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    """OpenAI's chat.completion object for what `env.llm` returned."""
    message: dict[str, Any] = dict(result.get("message") or {"role": "assistant"})
    message["content"] = result.get("text", "")
    if message.get("tool_calls") and not message["content"]:
        message["content"] = None
    return {
        "id": f"chatcmpl-whale-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": result.get("finish_reason") or "stop",
            }
        ],  # fmt: skip
        "usage": _usage(result),
    }


def chunks(result: dict[str, Any], model: str, n: int, usage: bool) -> list[dict[str, Any]]:
    """The same reply as chat.completion.chunk objects, in the order they are streamed."""
    head = {"id": f"chatcmpl-whale-{n}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}]}  # fmt: skip

    out = [chunk({"role": "assistant", "content": result.get("text", "")})]
    calls = (result.get("message") or {}).get("tool_calls") or []
    if calls:
        out.append(chunk({"tool_calls": [{"index": j, **c} for j, c in enumerate(calls)]}))
    out.append(chunk({}, result.get("finish_reason") or "stop"))
    if usage:
        out.append({**head, "choices": [], "usage": _usage(result)})
    return out


def _usage(result: dict[str, Any]) -> dict[str, int]:
    u = result.get("usage") or {}
    p, c = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


class Endpoint:
    """Serves one run's endpoint on `sock` (bound and listening). `call(args)` sends one
    `llm` request over the run's pipe and returns its result, or raises Refusal."""

    def __init__(self, sock: Any, call: Callable[[dict[str, Any]], dict[str, Any]], key: str,
                 model: str, body_bytes: int) -> None:  # fmt: skip
        self.sock, self.call, self.key, self.model = sock, call, key, model
        self.body_bytes = body_bytes
        self.lock = _thread.allocate_lock()
        self.open = 0
        self.n = 0
        self.json: Any = None

    def start(self) -> None:
        _thread.start_new_thread(self.serve, ())

    def serve(self) -> None:
        while True:
            try:
                fd, _ = self.sock._accept()
            except OSError:
                return
            conn = _socket.socket(fileno=fd)
            with self.lock:
                busy = self.open >= MAX_CONNECTIONS
                if not busy:
                    self.open += 1
            if busy:
                self._refuse_busy(conn, "too many connections")
                continue
            try:
                _thread.start_new_thread(self._connection, (conn,))
            except RuntimeError:  # no thread to be had (the run's process limit)
                with self.lock:
                    self.open -= 1
                self._refuse_busy(conn, "no thread left to serve this connection: the run's "
                                  "process limit (threads count) is reached")  # fmt: skip

    def _refuse_busy(self, conn: Any, why: str) -> None:
        """503, which a client may retry (x-should-retry: true): unlike the other errors,
        nothing reached the broker and nothing was spent. (A harness of 8 threads calling the
        endpoint at once meets the thread case: its threads and the endpoint's share the
        run's process limit.)"""
        try:
            conn.settimeout(1.0)
            conn.sendall(self._response(503, self._error(503, why), True, retry=True))
        except OSError:
            pass
        conn.close()

    def _connection(self, conn: Any) -> None:
        try:
            conn.settimeout(IDLE_S)
            buf = b""
            while True:
                try:
                    request, buf = self._read(conn, buf)
                except HTTPError as e:
                    conn.sendall(self._response(e.status, self._error(e.status, str(e)), True))
                    _linger(conn)
                    return
                if request is None:
                    return
                status, body, close, stream = self._handle(*request)
                if stream is not None:
                    conn.sendall(self._stream(stream))
                    return
                conn.sendall(self._response(status, body, close))
                if close:
                    return
        except OSError:
            pass
        except Exception as e:  # noqa: BLE001 - a request no check above foresaw: a reply,
            # not a thread that dies silently (the client would see a dropped connection and
            # retry it) with a traceback on the run's stderr
            try:
                message = f"the endpoint failed on this request ({type(e).__name__})"
                conn.sendall(self._response(500, self._error(500, message), True))
            except Exception:  # noqa: BLE001
                pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def _read(self, conn: Any, buf: bytes) -> tuple[Any, bytes]:
        """One request off `conn`: ((method, path, headers, body), rest) or (None, b"") at
        the end of the connection."""
        while b"\r\n\r\n" not in buf:
            if len(buf) > HEADER_BYTES:
                raise HTTPError(431, f"request headers over {HEADER_BYTES} bytes", True)
            data = conn.recv(65536)
            if not data:
                if buf:
                    raise HTTPError(400, "incomplete request", True)
                return None, b""
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        if len(head) > HEADER_BYTES:
            raise HTTPError(431, f"request headers over {HEADER_BYTES} bytes", True)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HTTPError(400, "malformed request line", True)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HTTPError(400, "malformed header line", True)
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HTTPError(411, "chunked request bodies are not supported; send "
                                 "Content-Length", True)  # fmt: skip
        length_text = headers.get("content-length", "0")
        # isascii: "²" (latin-1 0xb2) is a digit to str.isdigit and not to int()
        if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 12:
            raise HTTPError(400, "bad Content-Length", True)
        length = int(length_text)
        if length > self.body_bytes:
            raise HTTPError(413, f"request body of {length} bytes is over the limit of "
                                 f"{self.body_bytes}", True)  # fmt: skip
        while len(rest) < length:
            data = conn.recv(min(1 << 20, length - len(rest)))
            if not data:
                raise HTTPError(400, "incomplete request body", True)
            rest += data
        close = headers.get("connection", "").lower() == "close"
        return (parts[0], parts[1], headers, rest[:length], close), rest[length:]

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes,
                close: bool) -> tuple[int, bytes, bool, Any]:  # fmt: skip
        """(status, response body, close, chunks to stream or None)."""
        path = path.split("?", 1)[0].rstrip("/")
        if path.startswith("/v1/"):
            path = path[3:]
        if headers.get("authorization", "") != "Bearer " + self.key:
            return 401, self._error(401, "invalid API key (use the run's OPENAI_API_KEY)"), \
                close, None  # fmt: skip
        if path in ("/models", "/models/" + self.model):
            if method != "GET":
                return 405, self._error(405, f"{method} not allowed"), close, None
            card = {"id": self.model, "object": "model", "created": 0, "owned_by": "whale"}
            data = card if path != "/models" else {"object": "list", "data": [card]}
            return 200, self._dumps(data), close, None
        if path != "/chat/completions":
            return 404, self._error(404, f"no route {_short(path)}"), close, None
        if method != "POST":
            return 405, self._error(405, f"{method} not allowed"), close, None
        try:
            request = self._loads(body)
            args = chat_args(request)
            result = self.call(args)
        except HTTPError as e:
            return e.status, self._error(e.status, str(e)), close, None
        except RecursionError:  # json.loads took it; the worker's recursive pipe encoder cannot
            return 400, self._error(400, "the request is nested too deeply"), close, None
        except Refusal as e:
            status = _KIND_STATUS.get(e.kind, 400)
            return status, self._error(status, str(e)), close, None
        with self.lock:
            self.n += 1
            n = self.n
        if request.get("stream"):
            options = request.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            return 200, b"", True, chunks(result, self.model, n, usage)
        return 200, self._dumps(completion(result, self.model, n)), close, None

    # -- bytes on the wire ---------------------------------------------------------------------
    def _json(self) -> Any:
        if self.json is None:  # on first use: json costs start-up time every run would pay
            import json

            self.json = json
        return self.json

    def _loads(self, body: bytes) -> Any:
        try:
            return self._json().loads(body.decode("utf-8"))
        except (ValueError, RecursionError, UnicodeDecodeError) as e:
            raise HTTPError(400, f"the body is not JSON: {_short(str(e))}") from None

    def _dumps(self, obj: Any) -> bytes:
        return self._json().dumps(obj, ensure_ascii=False).encode("utf-8")

    def _error(self, status: int, message: str) -> bytes:
        kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        return self._dumps({"error": {"message": message, "type": kind, "param": None,
                                      "code": kind if status == 429 else None}})  # fmt: skip

    def _response(self, status: int, body: bytes, close: bool, retry: bool = False) -> bytes:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                f"x-should-retry: {'true' if retry else 'false'}\r\n"
                f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n")  # fmt: skip
        return head.encode("ascii") + body

    def _stream(self, events: list[dict[str, Any]]) -> bytes:
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n")  # fmt: skip
        body = b"".join(b"data: " + self._dumps(e) + b"\n\n" for e in events)
        return head + body + b"data: [DONE]\n\n"


def _linger(conn: Any) -> None:
    """Close after an error reply without discarding it: the client may still be sending (an
    oversized request), and closing a socket with unread data resets the connection, which
    can drop the reply before the client reads it. Reads what comes for up to a second."""
    try:
        conn.shutdown(_socket.SHUT_WR)
        conn.settimeout(1.0)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass


def listen() -> Any:
    """A socket listening on 127.0.0.1 (an ephemeral port), or None where none can be had
    (no loopback): the run then has no endpoint."""
    try:
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(MAX_CONNECTIONS)
        return sock
    except OSError:
        return None
