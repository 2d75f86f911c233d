"""The requests a harness may make, checked before the broker acts on them (broker.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

from whale.harness.budget import Budget
from whale.harness.trajectory import Failure, Status
from whale.models.base import MAX_TEMPERATURE, Sampling


class Refused(Exception):
    """A budget is spent: the call is refused and the refusal recorded."""


class BadCall(Exception):
    """The harness asked for something invalid: an error reply, the run goes on."""


class Rejected(BadCall):
    """The request is out of range (a sampling value, a prompt that cannot fit): it is refused
    before anything is sent, with an error reply, and recorded on the trajectory as a
    `refused` event (which, unlike a budget refusal, leaves the run's status alone)."""


# What `env.llm` sends (worker.py); any other key is refused rather than ignored, so that a
# harness writing its own requests learns that e.g. top_p is not its to set.
LLM_ARGS = ("messages", "max_tokens", "temperature", "stop")
# OpenAI's bound on stop sequences; each is matched against the reply at every token.
MAX_STOPS = 4
STOP_CHARS = 256


def check_llm_args(
    args: dict[str, Any], b: Budget, default_temperature: float, seed: int | None
) -> tuple[list[dict[str, Any]], Sampling]:
    """The messages and sampling of an `llm` request, or BadCall (malformed) / Rejected (out
    of range) saying what is wrong. Nothing out of range is clamped: the harness is told."""
    unknown = sorted(str(k) for k in args if k not in LLM_ARGS)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:4])
        raise Rejected(f"llm(): unknown argument {shown} (it takes {', '.join(LLM_ARGS)})")
    messages = args.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadCall("llm(messages): messages must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadCall(f"llm(messages): message {i} must be a dict with a string 'content'")
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadCall(f"llm(messages): message {i} has role {m.get('role')!r}")
    cap = b.max_tokens_per_call
    max_tokens = args.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
        or not 1 <= max_tokens <= cap
    ):  # fmt: skip
        raise Rejected(f"llm(max_tokens={_show(max_tokens)}): must be an int from 1 to {cap} "
                       "(the budget's max_tokens_per_call)")  # fmt: skip
    temperature = args.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or isinstance(temperature, bool)
        or not 0 <= temperature <= MAX_TEMPERATURE
    ):  # fmt: skip
        raise Rejected(f"llm(temperature={_show(temperature)}): must be a number from 0 to "
                       f"{MAX_TEMPERATURE:g}")  # fmt: skip
    stop = args.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadCall("llm(stop=): must be a string or a list of strings")
    stop = stop or []
    if len(stop) > MAX_STOPS or not all(1 <= len(s) <= STOP_CHARS for s in stop):
        raise Rejected(f"llm(stop=): at most {MAX_STOPS} strings of 1 to {STOP_CHARS} "
                       f"characters each (got {len(stop)}, of lengths "
                       f"{[len(s) for s in stop[:8]]})")  # fmt: skip
    try:
        sampling = Sampling(
            max_tokens=cap if max_tokens is None else max_tokens,
            temperature=default_temperature if temperature is None else float(temperature),
            stop=tuple(stop),
            seed=seed,
        )
    except ValueError as e:  # the runtime's own defaults out of range (a config)
        raise Rejected(f"llm(): {e}") from None
    clean = [{"role": m["role"], "content": m["content"]} for m in messages]
    return clean, sampling


def check_prompt_size(messages: list[dict[str, Any]], limit: int | None) -> None:
    """Rejected where the messages cannot fit the model's context: their text, whitespace
    included, is over `limit` characters, the model's upper bound (models.base.
    prompt_char_limit; None: unknown, not checked). Whitespace counts: templates such as
    Qwen2.5's send it as it is, and megabytes of spaces inflate the server like any text (the
    hostile review's three 7.5 MB messages of spaces). A template that trims it could in
    principle have taken such a prompt; the bound's margin (the longest token) dwarfs that."""
    if limit is None:
        return
    size = sum(len(m["content"]) for m in messages)
    if size > limit:
        raise Rejected(f"ContextOverflow: the messages hold {size:,} characters, more than "
                       f"the model's context can take (at most {limit:,}); not sent")  # fmt: skip


def _show(x: Any) -> str:
    """A value the harness sent, quoted short (a reply must stay small)."""
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


class Ending(NamedTuple):
    """How a run ended: its status, error, answer and failure kind (trajectory.Failure)."""

    status: Status
    error: str | None = None
    answer: str | None = None
    failure: Failure | None = None


def done_outcome(msg: dict[str, Any], answer_chars: int | None = None) -> Ending:
    """The ending the worker's `done` message reports; an answer longer than `answer_chars`
    is an error (and is not kept). The worker runs beside the harness, so whatever fails
    there is the harness's: LOAD when the worker says its module did not load, else HARNESS."""
    status = msg.get("status")
    if status == "ok" and isinstance(msg.get("answer"), str):
        n = len(msg["answer"])
        if answer_chars is not None and n > answer_chars:
            return Ending("error", f"harness: answer of {n} chars is over limits.answer_chars "
                                   f"= {answer_chars}", None, Failure.HARNESS)  # fmt: skip
        return Ending("ok", None, msg["answer"])
    if status in ("error", "budget_exceeded"):
        kind = Failure.LOAD if msg.get("failure") == Failure.LOAD.value else Failure.HARNESS
        return Ending(status, str(msg.get("error", ""))[:4000], None, kind)
    return Ending("error", "harness: malformed done message", None, Failure.HARNESS)
