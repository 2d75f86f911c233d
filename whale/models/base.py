"""One chat-model protocol for every backend.

A backend takes OpenAI-style messages and sampling parameters and returns a `Completion`
(text, finish reason, usage, token ids where the backend gives them). `chat` is the one verb;
`achat` is the async twin, run in a thread by default.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from whale.errors import WhaleError

Message = dict[str, Any]

# The range of temperatures a request may carry: the OpenAI API's. llama.cpp takes any value
# (at 30.0 it samples near-uniform noise, which a harness could then have trained on), so the
# bound is whale's, for every backend.
MAX_TEMPERATURE = 2.0


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one call. Made out of range (max_tokens < 1, a temperature
    outside [0, MAX_TEMPERATURE], top_p outside (0, 1], ...) it raises ValueError, so that no
    config or request out of range reaches a server."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = 0
    # A GBNF grammar the reply must follow (llama.cpp servers; others may refuse it).
    grammar: str | None = None
    # OpenAI-style function tools, as the JSON text of the request's `tools` list (a string,
    # so that Sampling stays hashable); the reply's calls come back in Completion.tool_calls.
    tools: str | None = None

    def __post_init__(self) -> None:
        fault = self.fault()
        if fault is not None:
            raise ValueError(f"sampling: {fault}")

    def fault(self) -> str | None:
        """What is out of range, or None."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool):
            return f"max_tokens must be an int, not {self.max_tokens!r}"
        if self.max_tokens < 1:
            return f"max_tokens must be at least 1, not {self.max_tokens}"
        if not _number(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            return f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}, " \
                f"not {self.temperature!r}"
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            return f"top_p must be a number above 0 and at most 1, not {self.top_p!r}"
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            return f"stop must be a tuple of strings, not {self.stop!r}"
        seed = self.seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            return f"seed must be an int or None, not {self.seed!r}"
        for name in ("grammar", "tools"):
            if not isinstance(getattr(self, name), str | None):
                return f"{name} must be a string or None"
        return None

    def key(self) -> dict[str, Any]:
        key: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
        }
        if self.grammar is not None:
            key["grammar"] = self.grammar
        if self.tools is not None:
            key["tools"] = self.tools
        return key


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" | "length" | other backend reasons, passed through
    usage: dict[str, int] = field(default_factory=dict)
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    cached: bool = False
    # Function calls of the reply, each {"name": str, "arguments": str (JSON text)}.
    tool_calls: list[dict[str, str]] | None = None


class ModelError(WhaleError, RuntimeError):
    """A backend call failed for a reason the caller should read (not retry)."""


class ModelUnreachable(ModelError):
    pass


class ModelNotFound(ModelError):
    pass


class ContextOverflow(ModelError):
    pass


class ModelTimeout(ModelError):
    pass


def prompt_char_limit(model: Any) -> int | None:
    """The most characters of message text one call to `model` can carry and still fit its
    context, where the backend knows (`prompt_char_limit()` of an embedded llama.cpp model,
    through wrappers: the response cache keeps its model in `inner`, a model served on demand
    gives it by `resolve_model()`, which serves it, as its first call would); None where it
    does not (an OpenAI-compatible server does not say its context; transformers models
    check theirs in process before generating)."""
    for _ in range(8):  # wrappers are few; a cycle of them must not loop
        limit = getattr(model, "prompt_char_limit", None)
        if callable(limit):
            value = limit()
            return value if isinstance(value, int) else None
        resolve = getattr(model, "resolve_model", None)
        model = resolve() if callable(resolve) else getattr(model, "inner", None)
        if model is None:
            break
    return None


@runtime_checkable
class ChatModel(Protocol):
    """`name` identifies backend + model for the cache key and for records."""

    name: str

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion: ...


async def achat(
    model: ChatModel, messages: list[Message], sampling: Sampling, timeout: float | None = None
) -> Completion:
    """Async call of any backend; backends that are natively async may override `achat`."""
    native = getattr(model, "achat", None)
    if native is not None:
        return await native(messages, sampling, timeout)  # type: ignore[no-any-return]
    return await asyncio.to_thread(model.chat, messages, sampling, timeout)
