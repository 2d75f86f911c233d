"""The requests a harness may make, checked before the broker acts on them (broker.py)."""

from __future__ import annotations

import math
from typing import Any

from whale.harness.budget import Budget
from whale.harness.trajectory import Status
from whale.models.base import Sampling


class Refused(Exception):
    """A budget is spent: the call is refused and the refusal recorded."""


class BadCall(Exception):
    """The harness asked for something invalid: an error reply, the run goes on."""


def check_llm_args(
    args: dict[str, Any], b: Budget, default_temperature: float, seed: int | None
) -> tuple[list[dict[str, Any]], Sampling]:
    """The messages and sampling of an `llm` request, or BadCall saying what is wrong."""
    messages = args.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadCall("llm(messages): messages must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadCall(f"llm(messages): message {i} must be a dict with a string 'content'")
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadCall(f"llm(messages): message {i} has role {m.get('role')!r}")
    max_tokens = args.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadCall("llm(max_tokens=): must be a positive int")
    temperature = args.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or not 0 <= temperature < math.inf
    ):
        raise BadCall("llm(temperature=): must be a finite number >= 0")
    stop = args.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadCall("llm(stop=): must be a string or a list of strings")
    sampling = Sampling(
        max_tokens=min(max_tokens or b.max_tokens_per_call, b.max_tokens_per_call),
        temperature=default_temperature if temperature is None else float(temperature),
        stop=tuple(stop or ())[:4],
        seed=seed,
    )
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]
    return clean, sampling


def done_outcome(
    msg: dict[str, Any], answer_chars: int | None = None
) -> tuple[Status, str | None, str | None]:
    """Status, error and answer of the worker's `done` message; an answer longer than
    `answer_chars` is an error (and is not kept)."""
    status = msg.get("status")
    if status == "ok" and isinstance(msg.get("answer"), str):
        n = len(msg["answer"])
        if answer_chars is not None and n > answer_chars:
            return "error", f"harness: answer of {n} chars is over limits.answer_chars = " \
                f"{answer_chars}", None
        return "ok", None, msg["answer"]
    if status in ("error", "budget_exceeded"):
        return status, str(msg.get("error", ""))[:4000], None
    return "error", "harness: malformed done message", None
