"""The requests a harness may make, checked before the broker acts on them (broker.py), and
what an `llm` request returns (text, finish reason, tool calls)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from whale.harness.budget import Budget
from whale.harness.trajectory import Failure, Status
from whale.models.base import MAX_TEMPERATURE, TOOL_CHOICES, Completion, Sampling


class Refused(Exception):
    """A budget is spent: the call is refused and the refusal recorded."""


class BadCall(Exception):
    """The harness asked for something invalid: an error reply, the run goes on."""


class ModelFailed(BadCall):
    """The model backend failed or timed out (`kind` "model" / "timeout"): an error reply."""

    def __init__(self, message: str, kind: str = "model") -> None:
        super().__init__(message)
        self.kind = kind


class Rejected(BadCall):
    """The request is out of range (a sampling value, a prompt that cannot fit): it is refused
    before anything is sent, with an error reply, and recorded on the trajectory as a
    `refused` event (which, unlike a budget refusal, leaves the run's status alone)."""


# What `env.llm` sends (worker.py); any other key is refused rather than ignored, so that a
# harness writing its own requests learns that e.g. top_p is not its to set.
LLM_ARGS = ("messages", "max_tokens", "temperature", "stop", "tools", "tool_choice")
# OpenAI's bound on stop sequences; each is matched against the reply at every token.
MAX_STOPS = 4
STOP_CHARS = 256
# Function tools a call may offer (`tools=`, OpenAI's schema) and the JSON text they may take:
# the schemas are rendered into the prompt at every call.
MAX_TOOLS = 64
TOOLS_CHARS = 65_536
# Tool calls one assistant message of the history may carry.
MAX_MESSAGE_CALLS = 32
# OpenAI's rule for a function's name; ids of tool calls are at most as long.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ID_CHARS = 64
# The largest repetition bound a tool's parameter schema may hold (maxLength, maxItems, ...,
# and {n,m} in a `pattern`). llama.cpp's server compiles the schemas of the tools offered
# into a grammar at every call, and a bound of n there becomes about n grammar rules: a
# harness asking for maxLength 10**9 would have the server (shared by every run) build a
# billion rules.
SCHEMA_BOUND = 1000
_BOUND_KEYS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties",
                         "maxProperties", "minContains", "maxContains"})  # fmt: skip
_PATTERN_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
# Nesting of the parsed arguments handed to a harness: deeper arguments stay text.
ARG_DEPTH = 32


def check_llm_args(
    args: dict[str, Any], b: Budget, default_temperature: float, seed: int | None
) -> tuple[list[dict[str, Any]], Sampling]:
    """The messages and sampling of an `llm` request, or BadCall (malformed) / Rejected (out
    of range) saying what is wrong. Nothing out of range is clamped: the harness is told."""
    unknown = sorted(str(k) for k in args if k not in LLM_ARGS)
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:4])
        raise Rejected(f"llm(): unknown argument {shown} (it takes {', '.join(LLM_ARGS)})")
    clean = check_messages(args.get("messages"))
    tools = check_tools(args.get("tools"))
    tool_choice = args.get("tool_choice")
    if tool_choice is not None and tool_choice not in TOOL_CHOICES:
        raise BadCall(f"llm(tool_choice={_show(tool_choice)}): must be one of "
                      f"{', '.join(map(repr, TOOL_CHOICES))}")  # fmt: skip
    if tool_choice is not None and tools is None:
        raise BadCall("llm(tool_choice=): needs tools=")
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
            tools=tools,
            tool_choice=tool_choice,
        )
    except ValueError as e:  # the runtime's own defaults out of range (a config)
        raise Rejected(f"llm(): {e}") from None
    return clean, sampling


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages of an `llm` request as they are sent and recorded, or BadCall / Rejected.

    Each keeps its role and content (a string; an assistant message that carries tool calls
    may have None, sent as ""), an assistant message its `tool_calls` (each `{id, type:
    "function", function: {name, arguments}}`, arguments as JSON text: a harness may also give
    whale's flat form `{id, name, arguments}`, as `Reply.tool_calls` has it, and arguments as
    an object), a tool message its `tool_call_id`, which must name a call of an earlier
    assistant message. A tool message may leave the id out (tool output fed back without a
    call, as harnesses did before tool calling; backends that need one get one, see
    whale.models.embedded.server_messages). Other keys are dropped."""
    if not isinstance(messages, list) or not messages:
        raise BadCall("llm(messages): messages must be a non-empty list of {role, content}")
    clean: list[dict[str, Any]] = []
    ids: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadCall(f"llm(messages): message {i} must be a dict with a string 'content'")
        role, content, calls = m.get("role"), m.get("content"), m.get("tool_calls")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadCall(f"llm(messages): message {i} has role {_show(role)}")
        if calls is not None and role != "assistant":
            raise BadCall(f"llm(messages): message {i} has tool_calls; only an assistant "
                          "message may")  # fmt: skip
        if m.get("tool_call_id") is not None and role != "tool":
            raise BadCall(f"llm(messages): message {i} has a tool_call_id; only a tool "
                          "message may")  # fmt: skip
        if calls and content is None:
            content = ""
        if not isinstance(content, str):
            raise BadCall(f"llm(messages): message {i} must be a dict with a string 'content'")
        out: dict[str, Any] = {"role": role, "content": content}
        if calls:
            out["tool_calls"] = _check_calls(i, calls, ids)
        elif calls is not None and calls != []:
            raise BadCall(f"llm(messages): message {i}: tool_calls must be a list")
        ref = m.get("tool_call_id")
        if role == "tool" and ref is not None:
            if not isinstance(ref, str) or ref not in ids:
                raise BadCall(f"llm(messages): message {i}: tool_call_id {_show(ref)} names no "
                              "tool call of an earlier assistant message")  # fmt: skip
            out["tool_call_id"] = ref
        clean.append(out)
    return clean


def _check_calls(i: int, calls: Any, ids: set[str]) -> list[dict[str, Any]]:
    """The tool calls of assistant message `i` in OpenAI's form; their ids join `ids`."""
    where = f"llm(messages): message {i}: tool_calls"
    if not isinstance(calls, list):
        raise BadCall(f"{where} must be a list")
    if len(calls) > MAX_MESSAGE_CALLS:
        raise Rejected(f"{where}: {len(calls)} calls, at most {MAX_MESSAGE_CALLS}")
    out = []
    for j, c in enumerate(calls):
        if not isinstance(c, dict):
            raise BadCall(f"{where}[{j}] must be a dict {{id, function: {{name, arguments}}}}")
        fn = c.get("function", c)  # OpenAI's nested form, or whale's flat {id, name, arguments}
        if c.get("type", "function") != "function" or not isinstance(fn, dict):
            raise BadCall(f"{where}[{j}] must be a function call {{id, type: 'function', "
                          "function: {name, arguments}}")  # fmt: skip
        cid, name, arguments = c.get("id"), fn.get("name"), fn.get("arguments")
        if not isinstance(cid, str) or not 1 <= len(cid) <= ID_CHARS or cid in ids:
            raise BadCall(f"{where}[{j}]: id {_show(cid)} must be a string of 1 to {ID_CHARS} "
                          "characters, unique in the conversation")  # fmt: skip
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadCall(f"{where}[{j}]: name {_show(name)} must be 1 to 64 letters, digits, "
                          "'_' or '-'")  # fmt: skip
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise BadCall(f"{where}[{j}]: arguments must be JSON text or an object")
        arguments = _rendered_arguments(arguments)
        ids.add(cid)
        out.append({"id": cid, "type": "function",
                    "function": {"name": name, "arguments": arguments}})  # fmt: skip
    return out


def check_tools(tools: Any) -> str | None:
    """The JSON text of the tools an `llm` request offers (each `{type: "function", function:
    {name, description, parameters}}`, other keys and `strict` dropped), None for no tools; or
    BadCall (malformed) / Rejected (over MAX_TOOLS, TOOLS_CHARS or SCHEMA_BOUND)."""
    if tools is None:
        return None
    shape = "a list of {type: 'function', function: {name, description, parameters}}"
    if not isinstance(tools, list) or not tools:
        raise BadCall(f"llm(tools=): must be {shape}")
    if len(tools) > MAX_TOOLS:
        raise Rejected(f"llm(tools=): {len(tools)} tools, at most {MAX_TOOLS}")
    clean, names = [], set()
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function":
            raise BadCall(f"llm(tools=): tool {j} must be {{type: 'function', function: "
                          "{name, description, parameters}}")  # fmt: skip
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in names:
            raise BadCall(f"llm(tools=): tool {j}'s name {_show(name)} must be 1 to 64 "
                          "letters, digits, '_' or '-', and unique")  # fmt: skip
        names.add(name)
        # The form llama.cpp's server renders (it parses a tool into these three and writes
        # them back in this order, "" and {} where absent, `strict` dropped), so what is
        # recorded renders to the very prompt the backend saw: the weight phase rebuilds the
        # prompt's ids from the record and skips a call whose count differs. `strict` is
        # accepted and not passed on: no backend whale serves enforces it.
        out: dict[str, Any] = {"name": name, "description": "", "parameters": {}}
        for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
            value = fn.get(key)
            if value is not None and not isinstance(value, kind):
                raise BadCall(f"llm(tools=): tool {name}'s {key} must be a {kind.__name__}")
            if value is not None and key != "strict":
                out[key] = value
        out["parameters"] = _rendered_numbers(out["parameters"], f"tool {name}'s parameters")
        fault = _schema_fault(out.get("parameters"))
        if fault is not None:
            raise Rejected(f"llm(tools=): tool {name}'s parameters: {fault}")
        clean.append({"type": "function", "function": out})
    text = json.dumps(clean, ensure_ascii=False)
    if len(text) > TOOLS_CHARS:
        raise Rejected(f"llm(tools=): the tools take {len(text):,} characters of JSON, at "
                       f"most {TOOLS_CHARS:,}")  # fmt: skip
    return text


_INT64 = 2**63


def _rendered_numbers(x: Any, where: str, lenient: bool = False) -> Any:
    """`x` with every number one that llama.cpp's server and Python write alike, so that the
    recorded tools render (transformers, the weight phase) to the prompt the server rendered.
    The server's template engine writes a float as C++'s `%g` (6 significant digits, no
    ".0": 1.0 -> "1", 3.14159265 -> "3.14159") and an integer as a signed 64-bit one (2**64 - 1
    -> "-1"); Python writes repr. So: a float that is a whole number in range becomes that int
    (the same JSON number); any other float becomes the number the server would have shown
    (what the model read); BadCall for an integer out of the signed 64-bit range, a float
    neither writes alike (subnormal), and NaN or infinity (not JSON); `lenient`: those are
    left as they are."""
    if isinstance(x, dict):
        return {k: _rendered_numbers(v, f"{where}.{k}", lenient) for k, v in x.items()}
    if isinstance(x, list):
        return [_rendered_numbers(v, f"{where}[{i}]", lenient) for i, v in enumerate(x)]
    if isinstance(x, bool):
        return x
    if isinstance(x, int):
        if not -_INT64 <= x < _INT64 and not lenient:
            raise BadCall(f"llm(tools=): {where}: {x} is out of the signed 64-bit range")
        return x
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            if lenient:
                return x
            raise BadCall(f"llm(tools=): {where}: {x} is not a JSON number")
        if x.is_integer() and -_INT64 <= x < _INT64:
            return int(x)
        shown = float(f"{x:g}")
        if shown.is_integer() and -_INT64 <= shown < _INT64:
            return int(shown)
        if json.dumps(shown) != f"{shown:g}":
            if lenient:
                return x
            raise BadCall(f"llm(tools=): {where}: {x!r} cannot be written alike by the "
                          "model server and the recorded prompt")  # fmt: skip
        return shown
    return x


def _rendered_arguments(text: str) -> str:
    """A tool call's JSON-object arguments with their numbers as `_rendered_numbers` makes
    them (templates render the parsed object: llama.cpp's server wrote 37.7749295 as 37.7749
    and 1.0 as 1 in every later call's prompt, Python as given), the text unchanged where no
    number changes; a number neither writes alike is left as it is (the weight phase's
    count check skips that call rather than refusing the model's own reply here)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if not isinstance(value, dict):
        return text
    try:
        changed = _rendered_numbers(value, "arguments", lenient=True)
    except RecursionError:
        return text
    return text if _same_json(changed, value) else json.dumps(changed, ensure_ascii=False)


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON texts would be: 1 and 1.0 differ."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or a != a  # NaN is left as it was


def _schema_fault(x: Any) -> str | None:
    """A repetition bound over SCHEMA_BOUND anywhere in a parameter schema, or None."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k in _BOUND_KEYS and isinstance(v, int | float) and v > SCHEMA_BOUND:
                return f"{k} = {_show(v)} is over {SCHEMA_BOUND}"
            if k == "pattern" and isinstance(v, str):
                for m in _PATTERN_BOUND.finditer(v):
                    if any(n and int(n) > SCHEMA_BOUND for n in m.groups()):
                        return f"pattern repeats {m.group(0)[:40]}, over {SCHEMA_BOUND}"
            fault = _schema_fault(v)
            if fault is not None:
                return fault
    if isinstance(x, list):
        for v in x:
            fault = _schema_fault(v)
            if fault is not None:
                return fault
    return None


def reply_calls(c: Completion, index: int) -> list[dict[str, str]]:
    """The tool calls of a completion as the trajectory records them and the harness gets them:
    `{id, name, arguments}` with arguments the JSON text the model wrote. Ids are whale's,
    `call_{index}_{j}` (the run's `index`th model call), not the backend's: the same run then
    sends the same follow-up messages, which the response cache and the SFT data rely on."""
    return [{"id": f"call_{index}_{j}", "name": str(t.get("name") or ""),
             "arguments": str(t.get("arguments") or "")}
            for j, t in enumerate(c.tool_calls or [])]  # fmt: skip


def llm_result(c: Completion, calls: list[dict[str, str]]) -> dict[str, Any]:
    """What `env.llm` returns to the worker: text, finish reason, the tool calls with their
    arguments parsed (a dict where the text is a JSON object of at most ARG_DEPTH levels, else
    the text as it is), and the assistant message to append to the conversation (OpenAI's
    form, arguments as text)."""
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if calls:
        message["tool_calls"] = [{"id": t["id"], "type": "function",
                                  "function": {"name": t["name"], "arguments": t["arguments"]}}
                                 for t in calls]  # fmt: skip
    parsed = [{**t, "arguments": _json_object(t["arguments"])} for t in calls]
    usage = {k: int(v) for k, v in c.usage.items() if isinstance(v, int) and k in _USAGE}
    return {"text": c.text, "finish_reason": c.finish_reason, "tool_calls": parsed,
            "message": message, "usage": usage}  # fmt: skip


_USAGE = ("prompt_tokens", "completion_tokens", "total_tokens")


def record_params(sampling: Sampling) -> dict[str, Any]:
    """The sampling a model event records: its key, less the tools (recorded as `tools`)."""
    return {k: v for k, v in sampling.key().items() if k != "tools"}


def record_tools(sampling: Sampling) -> list[dict[str, Any]] | None:
    """The tools a model event records (ModelCall.tools): the schemas sent, or None."""
    return None if sampling.tools is None else list(json.loads(sampling.tools))


def _json_object(text: str) -> dict[str, Any] | str:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if not isinstance(value, dict) or _depth(value) > ARG_DEPTH:
        return text
    return value


def _depth(x: Any) -> int:
    if isinstance(x, dict):
        return 1 + max((_depth(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return 1 + max((_depth(v) for v in x), default=0)
    return 0


def prompt_chars(messages: list[dict[str, Any]], tools: str | None = None) -> int:
    """The characters of text a request puts in the prompt: message contents, the name and
    arguments of each tool call, and the tools' JSON."""
    size = len(tools or "")
    for m in messages:
        size += len(m["content"])
        for t in m.get("tool_calls") or ():
            size += len(t["function"]["name"]) + len(t["function"]["arguments"])
    return size


def check_prompt_size(
    messages: list[dict[str, Any]], limit: int | None, tools: str | None = None
) -> None:
    """Rejected where the messages cannot fit the model's context: their text (with the
    tools offered and the tool calls of the history, `prompt_chars`), whitespace included, is
    over `limit` characters, the model's upper bound (models.base.
    prompt_char_limit; None: unknown, not checked). Whitespace counts: templates such as
    Qwen2.5's send it as it is, and megabytes of spaces inflate the server like any text (the
    hostile review's three 7.5 MB messages of spaces). A template that trims it could in
    principle have taken such a prompt; the bound's margin (the longest token) dwarfs that."""
    if limit is None:
        return
    size = prompt_chars(messages, tools)
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
