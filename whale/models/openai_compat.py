"""Any OpenAI-compatible chat server: vLLM, SGLang, llama.cpp server, hosted APIs.

Retries with exponential backoff on connection errors, 429 and 5xx (the client's own retries
are off so that the policy is ours and tested). A wrong URL, a missing model and a context
overflow each raise their own error with a message that names the URL or the model.
After `close()` (or `refuse()`) every call, and every retry of a call in flight, raises
`ModelError` at once: a backend that is being shut down is never retried or waited on.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

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
        # The client's own pool (up to 1,000 connections, 100 kept alive) serves our
        # concurrency; its retries are off.
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=key, max_retries=0, timeout=timeout_s
        )
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
            except openai.APITimeoutError:
                raise ModelTimeout(
                    f"{self.model} at {self.base_url}: no reply within {timeout:.1f} s"
                ) from None
            except openai.APIConnectionError as e:
                err: ModelError = ModelUnreachable(
                    f"cannot reach the model server at {self.base_url}: {e.__cause__ or e}"
                )
            except openai.NotFoundError as e:
                raise ModelNotFound(
                    f"model {self.model!r} not found at {self.base_url} ({_message(e)})"
                ) from None
            except openai.RateLimitError as e:
                err = ModelError(f"{self.base_url} kept refusing with 429: {_message(e)}")
            except openai.InternalServerError as e:
                err = ModelError(f"{self.base_url} answered {e.status_code}: {_message(e)}")
            except (ValueError, AttributeError, TypeError) as e:
                # A 200 whose body is not a chat completion (not JSON, HTML, a bare string):
                # the server's fault, retried like a 5xx (and failed over by a fleet).
                err = ModelError(f"{self.base_url} sent a reply that is not a chat completion "
                                 f"({type(e).__name__}: {str(e)[:200]})")  # fmt: skip
            except openai.APIStatusError as e:
                text = _message(e)
                if e.status_code in (400, 413, 422) and any(
                    w in text.lower() for w in _CONTEXT_WORDS
                ):
                    raise ContextOverflow(f"{self.model}: prompt does not fit ({text})") from None
                if e.status_code >= 500:
                    err = ModelError(f"{self.base_url} answered {e.status_code}: {text}")
                else:
                    raise ModelError(f"{self.base_url} answered {e.status_code}: {text}") from None
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

    def _kwargs(
        self, messages: list[Message], sampling: Sampling, timeout: float, fields: dict[str, Any]
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=messages,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            timeout=timeout,
        )
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            kwargs["seed"] = wire_seed(sampling.seed)
        extra_body: dict[str, Any] = {}
        if sampling.grammar is not None:
            extra_body["grammar"] = sampling.grammar
        if self.token_ids:
            extra_body["return_token_ids"] = True
        if self.request_fields is not None:
            extra_body.update(self.request_fields(sampling))
        extra_body.update(fields)
        if extra_body:
            kwargs["extra_body"] = extra_body
        if sampling.tools is not None:
            kwargs["tools"] = json.loads(sampling.tools)
            kwargs["tool_choice"] = sampling.tool_choice or "auto"
        return kwargs

    def _once(self, messages: list[Message], sampling: Sampling, timeout: float) -> Completion:
        r = self._client.chat.completions.create(**self._kwargs(messages, sampling, timeout, {}))
        if not r.choices:
            raise ModelError(f"{self.base_url} returned no choices")
        return self._completion(r, r.choices[0], sampling, _usage(r))

    def _choices(
        self,
        messages: list[Message],
        sampling: Sampling,
        timeout: float,
        n: int,
        fields: dict[str, Any],
    ) -> list[Completion]:
        kwargs = self._kwargs(messages, sampling, timeout, fields)
        kwargs["n"] = n
        r = self._client.chat.completions.create(**kwargs)
        if len(r.choices or []) != n:
            raise ModelError(f"{self.base_url} returned {len(r.choices or [])} choices, not {n}")
        usage = _usage(r)
        out = []
        for choice in r.choices:
            own = {"prompt_tokens": usage["prompt_tokens"]} if usage else {}
            content = getattr(getattr(choice, "logprobs", None), "content", None)
            if isinstance(content, list):
                own["completion_tokens"] = len(content)
            out.append(self._completion(r, choice, sampling, own))
        return out

    def _completion(
        self, r: Any, choice: Any, sampling: Sampling, usage: dict[str, int]
    ) -> Completion:
        extra = getattr(choice, "model_extra", None) or {}
        token_ids = extra.get("token_ids")  # vLLM with return_token_ids
        prompt_ids = (getattr(r, "model_extra", None) or {}).get("prompt_token_ids")
        calls = _tool_calls(getattr(choice.message, "tool_calls", None))
        text, finish = choice.message.content or "", choice.finish_reason or "stop"
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
        self._client.close()


def _usage(r: Any) -> dict[str, int]:
    if r.usage is None:
        return {}
    return {
        "prompt_tokens": int(r.usage.prompt_tokens or 0),
        "completion_tokens": int(r.usage.completion_tokens or 0),
        "total_tokens": int(r.usage.total_tokens or 0),
    }


def _tool_calls(raw: Any) -> list[dict[str, str]]:
    """The function calls of a reply message: name, arguments (JSON text, as sent) and the
    server's id where it gave a string one. Entries without a function are left out."""
    calls = []
    for t in raw or []:
        fn = getattr(t, "function", None)
        if fn is None:
            continue
        call = {"name": str(fn.name or ""), "arguments": str(fn.arguments or "")}
        if isinstance(getattr(t, "id", None), str) and t.id:
            call["id"] = t.id
        calls.append(call)
    return calls


def _ids(x: Any) -> list[int] | None:
    """A server's token id list, or None when it is absent or not a list of ints."""
    if not isinstance(x, list) or not x:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in x):
        return None
    return list(x)


def _message(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        if isinstance(inner, str):
            return inner[:500]
    return str(e.message)[:500]
