"""Any OpenAI-compatible chat server: vLLM, SGLang, llama.cpp server, hosted APIs.

Retries with exponential backoff on connection errors, 429 and 5xx (the policy is ours and
tested). A wrong URL, a missing model and a context overflow each raise their own error with a
message that names the URL or the model.
After `close()` (or `refuse()`) every call, and every retry of a call in flight, raises
`ModelError` at once: a backend that is being shut down is never retried or waited on.

Requests go out through one `httpx.Client`, not the `openai` SDK: the SDK's typed request
transform and response models cost about 0.85 ms of CPU per call more than the request itself
(1.24 against 0.39 ms, `python -m benchmarks.model_call`), paid by every rollout's every call
in whale's one process (issue 25). The body is the same JSON; the reply is read as plain data,
and anything that is not a chat completion is the server's fault (retried like a 5xx).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from whale.models.base import (
    Completion,
    ContextOverflow,
    Message,
    ModelError,
    ModelNotFound,
    ModelTimeout,
    ModelUnreachable,
    Sampling,
    text_call,
    wire_seed,
)

R = TypeVar("R")

# The longest reply body read (also of an error): a server's reply is held whole in memory.
REPLY_BYTES = 64 << 20

_CONTEXT_WORDS = ("context length", "context window", "maximum context", "too many tokens",
                  "exceed context", "context_length", "context size")  # fmt: skip


class OpenAICompatible:
    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        retries: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float = 120.0,
        token_ids: bool = False,
        request_fields: Callable[[Sampling], dict[str, Any]] | None = None,
    ) -> None:
        """`token_ids`: ask for the sampled token ids (vLLM's `return_token_ids`), so that
        training uses the tokens that were sampled; other servers may refuse the field.
        `request_fields`: extra body fields for a call with these sampling parameters (the
        embedded llama-server's `cache_prompt`), merged into every request."""
        self.model = model
        self.token_ids = token_ids
        self.request_fields = request_fields
        self.base_url = base_url.rstrip("/")
        self.name = f"openai:{self.base_url}:{model}"
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        key = (
            api_key or os.environ.get("WHALE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none"
        )
        self.api_key = key  # what a Ray actor's own client is made with (ray_executor.py)
        # One pool (up to 1,000 connections, 100 kept alive, as the openai SDK's) serves our
        # concurrency.
        self._http = httpx.Client(
            base_url=self.base_url + "/",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                     "Accept": "application/json"},
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
            # As the SDK's client: a server moved behind a redirect still answers (httpx drops
            # the key on one to another origin).
            follow_redirects=True,
        )  # fmt: skip
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self._closed = False  # a plain flag: set from signal handlers, so no lock

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        return self._retrying(lambda left: self._once(messages, sampling, left), timeout)

    def chat_choices(
        self,
        messages: list[Message],
        sampling: Sampling,
        n: int,
        timeout: float | None = None,
        fields: dict[str, Any] | None = None,
    ) -> list[Completion]:
        """One request for `n` completions of one prompt (OpenAI's `n`), retried as `chat`
        is; `fields` are added to the body. What seed each choice was sampled with is the
        server's business (llama.cpp: the request's seed + the choice's index). A choice's
        `completion_tokens` is counted from its `logprobs.content` where the server sent it
        (llama.cpp counts only the first choice in `usage`), else left out; tool calls are
        not read (a request with tools is refused: ValueError)."""
        if sampling.tools is not None:
            raise ValueError("chat_choices: a request with tools is not supported")
        if n < 1:
            raise ValueError(f"chat_choices: n must be >= 1, not {n}")
        return self._retrying(
            lambda left: self._choices(messages, sampling, left, n, fields or {}), timeout
        )

    def _retrying(self, once: Callable[[float], R], timeout: float | None) -> R:
        """`once(seconds left)`, retried with backoff on connection errors, 429 and 5xx until
        `timeout` (default: this client's) has passed; other errors are raised as whale's."""
        timeout = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            if self._closed:
                raise ModelError(f"{self.model} at {self.base_url}: backend closed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ModelTimeout(
                    f"{self.model} at {self.base_url}: no reply within {timeout:.1f} s"
                )
            try:
                return once(left)
            except _Timeout:
                raise ModelTimeout(
                    f"{self.model} at {self.base_url}: no reply within {timeout:.1f} s"
                ) from None
            except _Unreachable as e:
                err: ModelError = ModelUnreachable(
                    f"cannot reach the model server at {self.base_url}: {e}"
                )
            except StatusError as e:
                if e.status_code == 404:
                    raise ModelNotFound(
                        f"model {self.model!r} not found at {self.base_url} ({e.message})"
                    ) from None
                if e.status_code == 429:
                    err = ModelError(f"{self.base_url} kept refusing with 429: {e.message}")
                elif e.status_code >= 500:
                    err = ModelError(f"{self.base_url} answered {e.status_code}: {e.message}")
                elif e.status_code in (400, 413, 422) and any(
                    w in e.message.lower() for w in _CONTEXT_WORDS
                ):
                    raise ContextOverflow(
                        f"{self.model}: prompt does not fit ({e.message})"
                    ) from None
                else:
                    raise ModelError(
                        f"{self.base_url} answered {e.status_code}: {e.message}"
                    ) from None
            except (ValueError, AttributeError, TypeError, KeyError) as e:
                # A 200 whose body is not a chat completion (not JSON, HTML, a bare string):
                # the server's fault, retried like a 5xx (and failed over by a fleet).
                err = ModelError(f"{self.base_url} sent a reply that is not a chat completion "
                                 f"({type(e).__name__}: {str(e)[:200]})")  # fmt: skip
            if self._closed:  # the failure is the shutdown itself: do not retry
                raise ModelError(f"{self.model} at {self.base_url}: backend closed") from None
            attempt += 1
            if attempt > self.retries:
                raise err
            with self._lock:
                jitter = self._rng.uniform(0.5, 1.0)
            self._backoff(
                min(
                    self.backoff_s * 2 ** (attempt - 1) * jitter,
                    max(0.0, deadline - time.monotonic()),
                )
            )

    def _backoff(self, seconds: float) -> None:
        """Sleep, in 50 ms slices that end early when the backend is closed."""
        end = time.monotonic() + seconds
        while not self._closed:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def _body(self, messages: list[Message], sampling: Sampling, fields: dict[str, Any]
              ) -> dict[str, Any]:  # fmt: skip
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = wire_seed(sampling.seed)
        if sampling.tools is not None:
            body["tools"] = json.loads(sampling.tools)
            body["tool_choice"] = sampling.tool_choice or "auto"
        if sampling.grammar is not None:
            body["grammar"] = sampling.grammar
        if self.token_ids:
            body["return_token_ids"] = True
        if self.request_fields is not None:
            body.update(self.request_fields(sampling))
        body.update(fields)
        return body

    def _post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The JSON object a 2xx reply holds; StatusError for any other status, _Timeout,
        _Unreachable; ValueError / TypeError where the reply is not a JSON object."""
        # ASCII JSON: a lone surrogate a harness wrote goes as its escape, not as bytes that
        # are not UTF-8.
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii")
        content = self._send("POST", path, timeout, data)
        try:
            out = json.loads(content)
        except RecursionError:  # JSON nested deeper than Python's stack: not a completion
            raise ValueError("JSON nested too deep") from None
        if not isinstance(out, dict):
            raise TypeError(f"a JSON {type(out).__name__}, not an object")
        return out

    def _get(self, path: str, timeout: float) -> None:
        """GET `{base}/{path}`: StatusError, _Timeout, _Unreachable unless it answers 2xx."""
        self._send("GET", path, timeout)

    def _send(self, method: str, path: str, timeout: float, data: bytes | None = None) -> bytes:
        """The body of a 2xx reply, read whole within `timeout` (httpx's timeouts bound each
        read, not the reply: a server that sends a byte now and then would hold the call, and
        the run's clock, for ever; the headers are still bounded by the read timeout only);
        StatusError for any other status, _Timeout, _Unreachable; ValueError for a body over
        REPLY_BYTES (the server's fault)."""
        deadline = time.monotonic() + timeout
        try:
            with self._http.stream(method, path, content=data, timeout=timeout) as r:
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > REPLY_BYTES:
                        raise _TooBig(f"a reply over {REPLY_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise _Timeout(f"no whole reply within {timeout:.1f} s")
        except (_Timeout, _TooBig):
            raise
        except httpx.TimeoutException:
            raise _Timeout(f"no reply within {timeout:.1f} s") from None
        except Exception as e:  # noqa: BLE001 - every failure to be answered (a closed pool too)
            raise _Unreachable(str(e) or type(e).__name__) from None
        if not r.is_success:
            kind = {"content-type": r.headers.get("content-type", "")}
            read = httpx.Response(r.status_code, headers=kind, content=bytes(body))
            raise StatusError(r.status_code, _error_message(read))
        return bytes(body)

    def _once(self, messages: list[Message], sampling: Sampling, timeout: float) -> Completion:
        r = self._post("chat/completions", self._body(messages, sampling, {}), timeout)
        choices = r.get("choices")
        if not choices:
            raise ModelError(f"{self.base_url} returned no choices")
        return self._completion(r, choices[0], sampling, _usage(r))

    def _choices(
        self,
        messages: list[Message],
        sampling: Sampling,
        timeout: float,
        n: int,
        fields: dict[str, Any],
    ) -> list[Completion]:
        body = self._body(messages, sampling, fields)
        body["n"] = n
        r = self._post("chat/completions", body, timeout)
        choices = r.get("choices") or []
        if not isinstance(choices, list) or len(choices) != n:
            got = len(choices) if isinstance(choices, list) else 0
            raise ModelError(f"{self.base_url} returned {got} choices, not {n}")
        usage = _usage(r)
        out = []
        for choice in choices:
            own = {"prompt_tokens": usage["prompt_tokens"]} if "prompt_tokens" in usage else {}
            logprobs = _field(choice, "logprobs")
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            if isinstance(content, list):
                own["completion_tokens"] = len(content)
            out.append(self._completion(r, choice, sampling, own))
        return out

    def _completion(
        self, r: dict[str, Any], choice: Any, sampling: Sampling, usage: dict[str, int]
    ) -> Completion:
        message = _field(choice, "message")
        if not isinstance(message, dict):
            raise TypeError(f"a choice's message is a {type(message).__name__}, not an object")
        token_ids = choice.get("token_ids")  # vLLM with return_token_ids
        prompt_ids = r.get("prompt_token_ids")
        calls = _tool_calls(message.get("tool_calls"))
        text, finish = _text(message.get("content")), _text(choice.get("finish_reason")) or "stop"
        raw = None
        if sampling.tools is not None and sampling.tool_choice != "none" and not calls \
                and finish == "stop":  # fmt: skip
            # The model ended its turn after writing a call the server did not read (see
            # base.text_call): the call, and what it wrote kept for training.
            read = text_call(text, sampling.tools)
            if read is not None:
                calls, raw, text, finish = read, text, "", "tool_calls"
        return Completion(
            text=text,
            finish_reason=finish,
            usage=usage,
            token_ids=_ids(token_ids),
            prompt_token_ids=_ids(prompt_ids),
            tool_calls=calls or None,
            raw_text=raw,
        )

    def refuse(self) -> None:
        """Fail every later call and retry; unlike `close`, takes no lock (signal-safe)."""
        self._closed = True

    def close(self) -> None:
        self._closed = True
        self._http.close()


class StatusError(Exception):
    """A server's answer with a status other than 2xx, and the error message it gave."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code, self.message = status_code, message


class _TooBig(ValueError):
    """A reply longer than REPLY_BYTES."""


class _Timeout(Exception):
    """No reply within the call's time."""


class _Unreachable(Exception):
    """No answer at all: refused, reset or dropped connections, DNS, a closed pool."""


def _field(d: Any, key: str) -> Any:
    """d[key] of a JSON object (None when absent); TypeError when d is not one."""
    if not isinstance(d, dict):
        raise TypeError(f"a {type(d).__name__} where the reply has an object")
    return d.get(key)


def _text(x: Any) -> str:
    """A text field: "" for null; TypeError for anything but a string."""
    if x is None:
        return ""
    if not isinstance(x, str):
        raise TypeError(f"a {type(x).__name__} where the reply has text")
    return x


def _usage(r: dict[str, Any]) -> dict[str, int]:
    """The reply's token counts; a count the server did not give as one is absent, not 0
    (a budget then charges the call's cap: Completion.charged_tokens)."""
    u = r.get("usage")
    if not isinstance(u, dict):
        return {}
    counts = {k: _count(u.get(k)) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {k: n for k, n in counts.items() if n is not None}


def _count(x: Any) -> int | None:
    """A non-negative integer, or one written as its decimal digits (a proxy that sends
    "12"); None for anything else (a bool, a negative, a float, other text)."""
    if isinstance(x, str) and x.isascii() and x.isdigit() and len(x) <= 18:
        x = int(x)
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _tool_calls(raw: Any) -> list[dict[str, str]]:
    """The function calls of a reply message: name, arguments (JSON text, as sent) and the
    server's id where it gave a string one. Entries without a function are left out."""
    calls = []
    for t in raw if isinstance(raw, list) else []:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            continue
        call = {"name": str(fn.get("name") or ""), "arguments": _arguments(fn.get("arguments"))}
        if isinstance(t.get("id"), str) and t["id"]:
            call["id"] = t["id"]
        calls.append(call)
    return calls


def _arguments(x: Any) -> str:
    """A call's arguments as the JSON text the model wrote; a server that sent them as an
    object gets them written back as JSON."""
    if x is None:
        return ""
    return x if isinstance(x, str) else json.dumps(x)


def _ids(x: Any) -> list[int] | None:
    """A server's token id list, or None when it is absent or not a list of ints."""
    if not isinstance(x, list) or not x:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in x):
        return None
    return list(x)


def _error_message(r: httpx.Response) -> str:
    """What a non-2xx answer says went wrong: OpenAI's `error.message` where the body has
    one, else the body's text (at most 500 characters)."""
    text = r.text.strip()
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python's stack
        return (text or f"Error code: {r.status_code}")[:500]
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict) and inner.get("message"):
        return str(inner["message"])[:500]
    if isinstance(inner, str):
        return inner[:500]
    return f"Error code: {r.status_code} - {body}"[:500]
