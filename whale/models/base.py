"""One chat-model protocol for every backend.

A backend takes OpenAI-style messages and sampling parameters and returns a `Completion`
(text, finish reason, usage, token ids where the backend gives them). `chat` is the one verb;
`achat` is the async twin, run in a thread by default.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from whale.errors import WhaleError

Message = dict[str, Any]

# The range of temperatures a request may carry: the OpenAI API's. llama.cpp takes any value
# (at 30.0 it samples near-uniform noise, which a harness could then have trained on), so the
# bound is whale's, for every backend.
MAX_TEMPERATURE = 2.0
# What `Sampling.tool_choice` may be: OpenAI's string choices (llama.cpp's server takes no
# named-function choice).
TOOL_CHOICES = ("auto", "none", "required")

# When a server may reuse a processed prompt prefix (its KV cache) for a call
# (`ModelConfig.prefix_cache`): "sampled" for calls with temperature > 0 only, "all" for greedy
# calls too, "off" never. Greedy calls are left out by default because reusing a prefix changes
# the low bits of the logits, and so some greedy replies (docs/models.md).
PrefixCache = Literal["sampled", "all", "off"]
PREFIX_CACHE: tuple[PrefixCache, ...] = ("sampled", "all", "off")
# Speculative decoding on the embedded native server: "ngram" drafts tokens from n-grams of the
# context itself (llama-server `--spec-type ngram-simple`, no draft model) and keeps those the
# model's own sampling confirms, so replies are drawn from the same distribution, faster where
# they copy the prompt (a proposer rewriting a harness it was shown).
Speculative = Literal["off", "ngram"]
SPECULATIVE: tuple[Speculative, ...] = ("off", "ngram")


# The seeds a server is sent: llama.cpp reads a request's seed as a uint32 and takes 0xFFFFFFFF
# (LLAMA_DEFAULT_SEED) to mean "pick one at random", so whale's seeds (any int: a run's seed
# times 1_000_000 plus a round's offset grows past 2**32) are sent modulo 0xFFFFFFFF, which never
# reaches that value: a seeded call stays repeatable, and the response cache's entry for it is
# the reply the same call gets again. Seeds that differ by a multiple of 0xFFFFFFFF share one
# sample; seeds below it are sent as they are.
SEED_SPACE = 0xFFFFFFFF


def wire_seed(seed: int) -> int:
    """The seed sent to a server for whale's `seed` (see SEED_SPACE)."""
    return seed % SEED_SPACE


def crosses_seed_space(sampling: Sampling, n: int) -> bool:
    """Whether seeds `sampling.seed` .. `+ n - 1`, as one request's choices (the server adding i
    to the seed it was sent), would reach SEED_SPACE."""
    return sampling.seed is not None and wire_seed(sampling.seed) + n - 1 >= SEED_SPACE


def reuses_prefix(policy: str, sampling: Sampling) -> bool:
    """Whether a call with `sampling` may reuse a cached prompt prefix under `policy`."""
    if policy == "all":
        return True
    return policy == "sampled" and sampling.temperature > 0


def prefix_fields(policy: str, sampling: Sampling) -> dict[str, bool]:
    """The native llama-server's per-request prompt cache switch under `policy` (its own
    default is off)."""
    return {"cache_prompt": reuses_prefix(policy, sampling)}


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
    # A backend that cannot return tool calls refuses a request with tools (ModelError), it
    # never drops them.
    tools: str | None = None
    # With tools: "auto" (the model chooses; also what None sends), "none" or "required".
    tool_choice: str | None = None

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
        if self.tool_choice is not None:
            if self.tool_choice not in TOOL_CHOICES:
                choices = ", ".join(TOOL_CHOICES)
                return f"tool_choice must be one of {choices}, not {self.tool_choice!r}"
            if self.tools is None:
                return "tool_choice needs tools"
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
        if self.tool_choice is not None:
            key["tool_choice"] = self.tool_choice
        if self.seed is not None and not 0 <= self.seed < SEED_SPACE:
            # sent as wire_seed(seed) since that rule came in; before, as llama.cpp read it
            key["wire_seed"] = wire_seed(self.seed)
        return key


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" | "length" | other backend reasons, passed through
    usage: dict[str, int] = field(default_factory=dict)
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    cached: bool = False
    # Function calls of the reply, each {"name": str, "arguments": str (the JSON text as the
    # backend gave it)} and "id" where the backend gave one.
    tool_calls: list[dict[str, str]] | None = None
    # The reply as the model wrote it, where whale read its tool call out of the text
    # (`text_call`; `text` is then ""), else None: what the SFT data builder trains on.
    raw_text: str | None = None

    def charged_tokens(self, cap: int) -> int:
        """The completion tokens a budget charges this reply: the backend's count; where it
        gave none (a server without `usage`), or 0 for a reply that has text or a tool call
        (a server that does not count, or a reply cached when whale stored a missing count
        as 0), the sampled ids' length, else `cap`, the max_tokens the call was sent with. An
        over-charge, never an under-charge, so that a backend that reports no usage cannot
        leave a token budget unenforced."""
        n = self.usage.get("completion_tokens")
        said = bool(self.text or self.tool_calls or self.token_ids)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0 and (n > 0 or not said):
            return n
        return len(self.token_ids) if self.token_ids else cap


def template_messages(messages: list[Message]) -> list[Message]:
    """`messages` as chat templates read them: each assistant tool call's `arguments` (JSON
    text on the wire, as OpenAI sends it) parsed into an object where it is one. Templates
    render arguments with `tojson` (Qwen2.5's: `{"name": ..., "arguments": <object>}`), and a
    string would be rendered as a quoted string; llama.cpp's server parses them the same way
    before rendering. Arguments that are not a JSON object are left as text. The messages
    given are not changed."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list) and calls:
            m = {**m, "tool_calls": [_object_arguments(c) for c in calls]}
        out.append(m)
    return out


def _object_arguments(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = call["function"]
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except (ValueError, RecursionError):
            return call
        if isinstance(value, dict):
            return {**call, "function": {**fn, "arguments": value}}
    return call


def text_call(text: str, tools: str) -> list[dict[str, str]] | None:
    """The tool call a reply wrote as its whole text, where the server read none: one JSON
    object `{"name": <a tool offered>, "arguments": {...}}`, bare or inside `<tool_call>` tags,
    and nothing else but whitespace. None for any other text.

    Why: Qwen2.5-Coder-0.5B (the default solver) writes its calls without the `<tool_call>`
    tags its chat template asks for (measured on the native llama-server, 2026-12: three
    prompts, each answered `{"name": "multiply", "arguments": {"a": 1234, "b": 5678}}` and
    the end of turn), and llama.cpp's parser, like vLLM's hermes parser, reads only tagged
    calls. A reply that is exactly a call to an offered tool is read as that call; anything
    more (a sentence around it, two objects, an unknown name, arguments that are not an
    object) stays text."""
    body = text.strip()
    if body.startswith("<tool_call>") and body.endswith("</tool_call>"):
        body = body[len("<tool_call>") : -len("</tool_call>")].strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    try:
        value = json.loads(body)
        names = {t["function"]["name"] for t in json.loads(tools)}
    except (ValueError, RecursionError, TypeError, KeyError):
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    if value["name"] not in names or not isinstance(value["arguments"], dict):
        return None
    return [{"name": value["name"],
             "arguments": json.dumps(value["arguments"], ensure_ascii=False)}]  # fmt: skip


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


# What a caller may wait out and ask again (a busy or restarting server): the experiment
# runner resumes a step stopped by one (whale.experiments.runner).
TRANSIENT: tuple[type[ModelError], ...] = (ModelTimeout, ModelUnreachable)


def failure_cause(errors: Sequence[str]) -> ModelError | None:
    """The model error that stands for calls that failed with one, kept as text ("Type:
    message": a Proposal's error, a search session's end): a timeout or an unreachable server,
    which an unattended runner resumes (`TRANSIENT`), else None."""
    kinds = {kind.__name__: kind for kind in TRANSIENT}
    for text in errors:
        kind = kinds.get(text.split(":", 1)[0])
        if kind is not None:
            return kind(text)
    return None


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


class PartialBatch(ModelError):
    """`chat_n` failed after its first `len(done)` completions came back (a later request of
    several): `done` holds them, in order, so that what was paid for is kept."""

    def __init__(self, message: str, done: list[Completion]) -> None:
        super().__init__(message)
        self.done = done


def each(
    model: ChatModel,
    messages: list[Message],
    sampling: Sampling,
    n: int,
    timeout: float | None = None,
) -> list[Completion]:
    """`n` completions of one prompt, completion i sampled with seed `sampling.seed + i` (all
    with no seed where it has none), by `n` calls made together: what `chat_n` does where a
    backend cannot share the prompt. The first failure raises."""
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n}")

    def one(i: int) -> Completion:
        seed = None if sampling.seed is None else sampling.seed + i
        return model.chat(messages, replace(sampling, seed=seed), timeout)

    if n == 1:
        return [one(0)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


def chat_n(
    model: ChatModel,
    messages: list[Message],
    sampling: Sampling,
    n: int,
    timeout: float | None = None,
) -> list[Completion]:
    """`n` completions of one prompt, completion i sampled with seed `sampling.seed + i`: by
    the model's own `chat_n` where it has one (the embedded server, the response cache), else
    by `each`. Whether the prompt is then processed once: `shares_prompt`."""
    own = getattr(model, "chat_n", None)
    if callable(own):
        return own(messages, sampling, n, timeout)  # type: ignore[no-any-return]
    return each(model, messages, sampling, n, timeout)


def shares_prompt(model: Any, sampling: Sampling) -> bool:
    """Whether `chat_n(model, ...)` with `sampling` processes the prompt once for all its
    samples (the model says so by a `shares_prompt(sampling)` method; wrappers ask theirs)."""
    own = getattr(model, "shares_prompt", None)
    return bool(own(sampling)) if callable(own) else False


async def achat(
    model: ChatModel, messages: list[Message], sampling: Sampling, timeout: float | None = None
) -> Completion:
    """Async call of any backend; backends that are natively async may override `achat`."""
    native = getattr(model, "achat", None)
    if native is not None:
        return await native(messages, sampling, timeout)  # type: ignore[no-any-return]
    return await asyncio.to_thread(model.chat, messages, sampling, timeout)
