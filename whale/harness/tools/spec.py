"""What a user tool takes and does, read from a callable or an MCP tool listing: `ToolSpec`.

One record serves three readers: the broker checks a call's arguments against `schema`
(`check_args`) before anything is sent or spent; the worker maps positional arguments by
`params`; the proposer and the search agent read `describe` (signature, first docstring
paragraph, budget), as they read of `env.tools.retrieve`.

The schema is a small subset of JSON Schema, the form MCP servers list their tools in:
top-level `properties`, `required`, `additionalProperties`, and each property's `type` (one
or a list) and `enum`. A Python parameter's annotation becomes a type where it is one of
str, int, float, bool, None, list/tuple/set, dict (bare or parameterized, or a union of
them) or a Literal; any other annotation is not checked here. Not covered: nested schemas
(`items`, nested `properties`, formats, ranges): the callable (or the MCP server) gets what
passes and answers a bad value with its own error, which the harness sees.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The JSON encoding of one call's arguments, and of one result: past either the call is an
# error the harness sees (a result is measured in the tools process, before it is sent).
ARGS_BYTES = 64 * 1024
RESULT_BYTES = 64 * 1024
DOC_CHARS = 400  # the most of a docstring's first paragraph a proposer is shown

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
               type(None): "null", list: "array", tuple: "array", set: "array",
               frozenset: "array", dict: "object"}  # fmt: skip


class BadArgs(ValueError):
    """A call's arguments do not fit the tool's schema (the message says how)."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the harness calls it: `env.tools.NAME(...)`, or `env.tools.SERVER.TOOL(...)`
    for a tool of MCP server SERVER (then `name` is "SERVER.TOOL" and `target` the tool's own
    name on the server, which may hold characters an attribute cannot)."""

    name: str
    params: tuple[str, ...]  # positional order (the worker maps positional arguments by it)
    signature: str  # "(query: str, k: int = 5)"
    doc: str  # the docstring's (or description's) first paragraph
    schema: dict[str, Any] = field(default_factory=dict)
    calls: int = 12
    timeout_s: float = 30.0
    server: str | None = None
    target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolSpec:
        return cls(**{**d, "params": tuple(d["params"])})

    def describe(self) -> str:
        """One line of the `env` API: call, what it does, its budget."""
        doc = f" {self.doc}" if self.doc else ""
        # an MCP server writes its own schemas: its signature is capped like a docstring
        sig = self.signature
        sig = sig if len(sig) <= DOC_CHARS else sig[: DOC_CHARS - 4] + "...)"
        return (f"- `env.tools.{self.name}{sig}`:{doc} At most {self.calls} calls "
                f"per question, {self.timeout_s:g} s each; returns JSON data (a failure raises "
                "ToolError).")  # fmt: skip


def describe_tools(specs: Sequence[ToolSpec]) -> str:
    """The user's tools as lines of the `env` API (what the proposer and the search agent's
    `task` tool show), one per tool."""
    return "\n".join(s.describe() for s in specs)


def first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    para = inspect.cleandoc(doc).strip().split("\n\n", 1)[0]
    text = " ".join(para.split())
    return text if len(text) <= DOC_CHARS else text[: DOC_CHARS - 3] + "..."


# --- from a Python callable -------------------------------------------------------------------


def describe_callable(name: str, fn: Callable[..., Any], calls: int, timeout_s: float) -> ToolSpec:
    """The spec of a user's callable; ValueError when it cannot be called by keyword
    arguments (no signature, or a positional-only parameter without a default)."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, SyntaxError, TypeError):  # an annotation that does not evaluate
        sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - any annotation problem: its types are not checked
        hints = {}
    props: dict[str, Any] = {}
    required, positional, extra = [], [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            extra = True
        elif p.kind is p.VAR_POSITIONAL:
            continue  # nothing a keyword call can fill
        elif p.kind is p.POSITIONAL_ONLY:
            if p.default is p.empty:
                raise ValueError(f"parameter {p.name!r} is positional-only: a tool is called "
                                 "with keyword arguments")  # fmt: skip
        else:
            props[p.name] = json_schema(hints.get(p.name, p.annotation))
            if p.default is p.empty:
                required.append(p.name)
            if p.kind is p.POSITIONAL_OR_KEYWORD:
                positional.append(p.name)
    schema = {"type": "object", "properties": props, "required": required,
              "additionalProperties": extra}  # fmt: skip
    return ToolSpec(name, tuple(positional), str(sig), first_paragraph(inspect.getdoc(fn)),
                    schema, calls, timeout_s, None, name)  # fmt: skip


def json_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema type of an annotation, where this module checks one; else {}."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint is None:
        hint = type(None)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        ok = all(isinstance(v, str | int | float | bool) or v is None for v in values)
        return {"enum": values} if ok else {}
    if origin is typing.Union or isinstance(hint, types.UnionType):
        arms = [json_schema(a) for a in typing.get_args(hint)]
        if not all("type" in a for a in arms):
            return {}
        names: list[str] = []
        for a in arms:
            for t in a["type"] if isinstance(a["type"], list) else [a["type"]]:
                if t not in names:
                    names.append(t)
        return {"type": names}
    base = origin or hint
    if isinstance(base, type):
        for py, name in _JSON_TYPES.items():
            if base is py:
                return {"type": name}
        if issubclass(base, Mapping):
            return {"type": "object"}
        if issubclass(base, Sequence) and not issubclass(base, str | bytes):
            return {"type": "array"}
    return {}


# --- from an MCP tool -----------------------------------------------------------------------


def spec_from_mcp(server: str, attr: str, tool_name: str, description: str | None,
                  input_schema: Mapping[str, Any] | None, calls: int,
                  timeout_s: float) -> ToolSpec:  # fmt: skip
    """The spec of an MCP server's tool (`attr`: its name as a Python attribute)."""
    schema = dict(input_schema or {})
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    parts = []
    for p, s in props.items():
        s = s if isinstance(s, dict) else {}
        t = s.get("type")
        shown = "|".join(t) if isinstance(t, list) else (t if isinstance(t, str) else "")
        text = f"{p}: {shown}" if shown else str(p)
        if p not in required:
            text += f" = {json.dumps(s['default'])}" if "default" in s else " = ..."
        parts.append(text)
    clean = {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": schema.get("additionalProperties", True) is not False,
    }
    return ToolSpec(f"{server}.{attr}", tuple(props), f"({', '.join(parts)})",
                    first_paragraph(description), clean, calls, timeout_s, server,
                    tool_name)  # fmt: skip


# --- checking a call ------------------------------------------------------------------------


def check_args(spec: ToolSpec, kwargs: Mapping[str, Any]) -> None:
    """BadArgs unless `kwargs` fits `spec.schema`: no required argument missing, none unknown
    (unless the tool takes any), each of the type its schema names."""
    schema = spec.schema
    props: dict[str, Any] = schema.get("properties", {})
    for r in schema.get("required", ()):
        if r not in kwargs:
            raise BadArgs(f"{spec.name}(): missing argument {r!r}")
    for k, v in kwargs.items():
        if k not in props:
            if schema.get("additionalProperties", True) is False:
                known = ", ".join(props) or "no arguments"
                raise BadArgs(f"{spec.name}(): unexpected argument {_short(k)} (it takes "
                              f"{known})")  # fmt: skip
            continue
        s = props[k] if isinstance(props[k], dict) else {}
        if "enum" in s and not any(_same(v, e) for e in s["enum"]):
            raise BadArgs(f"{spec.name}({k}=...): must be one of {json.dumps(s['enum'])[:200]}")
        t = s.get("type")
        wanted = t if isinstance(t, list) else [t] if isinstance(t, str) else []
        if wanted and not any(_is(v, w) for w in wanted):
            raise BadArgs(f"{spec.name}({k}=...): expected {' or '.join(wanted)}, got "
                          f"{_json_type(v)}")  # fmt: skip


def _is(v: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, int | float) and not isinstance(v, bool)
    return _json_type(v) == t or t not in ("string", "boolean", "null", "array", "object")


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    for py, name in _JSON_TYPES.items():
        if isinstance(v, py):
            return name
    return type(v).__name__


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_json_type(a) == _json_type(b) == "number" and a == b)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."
