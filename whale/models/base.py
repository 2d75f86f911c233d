"""One chat-model protocol for every backend.

A backend takes OpenAI-style messages and sampling parameters and returns a `Completion`
(text, finish reason, usage, token ids where the backend gives them). `chat` is the one verb;
`achat` is the async twin, run in a thread by default.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]


@dataclass(frozen=True)
class Sampling:
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


class ModelError(RuntimeError):
    """A backend call failed for a reason the caller should read (not retry)."""


class ModelUnreachable(ModelError):
    pass


class ModelNotFound(ModelError):
    pass


class ContextOverflow(ModelError):
    pass


class ModelTimeout(ModelError):
    pass


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
