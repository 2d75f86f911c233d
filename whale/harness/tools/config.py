"""`runtime.tools`: the user's tools, as a config table, parsed into typed records.

    [runtime.tools]
    lookup = "mypkg.tools:lookup"                                   # a callable, defaults
    sql = { function = "mypkg.tools:sql", calls = 20, timeout_s = 5 }

    [runtime.tools.mcp.files]                                        # an MCP server over stdio
    command = ["/usr/bin/node", "server.js"]
    env = { ROOT = "/data" }
    calls = 12          # per tool of the server, per question
    timeout_s = 30

A tool's name is what a harness writes after `env.tools.`: an identifier, not a keyword, not
starting with `_`, and not one of `RESERVED` (whale's own tools, and the `mcp` table). MCP
servers share that namespace (`env.tools.files.read(...)`). `calls` is each tool's own budget
per question, beside `runtime.budget.tool_calls` (the python tool's); `timeout_s` bounds one
call. Not covered here: whether the module imports and the function exists (the tools process
checks that when it starts, `make_runtime` turns a failure into a ConfigError naming the tool).
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from whale.config import FieldError

RESERVED = ("python", "retrieve", "mcp")
DEFAULT_CALLS = 12  # the papers' per-question tool budget (runtime.budget.tool_calls)
DEFAULT_TIMEOUT_S = 30.0
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class UserTool:
    """A trusted Python callable, imported by the tools process from `function`
    ("module:attribute", the attribute may be dotted)."""

    name: str
    function: str
    calls: int = DEFAULT_CALLS
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class McpServer:
    """An MCP server the tools process starts over stdio; each of its tools gets `calls` per
    question and `timeout_s` per call. `env` is added to the MCP SDK's default environment
    (HOME, PATH, ...; not whale's whole environment)."""

    name: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    calls: int = DEFAULT_CALLS
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class ToolsConfig:
    """Every user tool and MCP server of a Runtime (empty: none, and no tools process)."""

    user: tuple[UserTool, ...] = ()
    mcp: tuple[McpServer, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.user or self.mcp)

    def to_wire(self) -> dict[str, Any]:
        """What the tools process is told (plain JSON)."""
        return {
            "user": [[t.name, t.function, t.calls, t.timeout_s] for t in self.user],
            "mcp": [[s.name, list(s.command), dict(s.env), s.calls, s.timeout_s]
                    for s in self.mcp],
        }  # fmt: skip

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ToolsConfig:
        return cls(tuple(UserTool(*t) for t in d["user"]),
                   tuple(McpServer(n, tuple(c), tuple(e.items()), k, s)
                         for n, c, e, k, s in d["mcp"]))  # fmt: skip


def parse_tools(table: Mapping[str, Any], where: str = "tools",
                callables: bool = True) -> ToolsConfig:  # fmt: skip
    """The `runtime.tools` table as a ToolsConfig, or FieldError naming the bad field (dotted
    from `where`). With `callables` (Python, not a saved config), a value may also be a
    function: it is named by its module and qualified name, which the tools process imports
    again."""
    if not isinstance(table, Mapping):
        raise FieldError(where, "must be a table of tools")
    user: list[UserTool] = []
    mcp: list[McpServer] = []
    for name, value in table.items():
        if name == "mcp":
            if not isinstance(value, Mapping):
                raise FieldError(f"{where}.mcp", "must be a table of servers, one per name")
            for server, spec in value.items():
                mcp.append(_server(f"{where}.mcp", server, spec))
            continue
        _check_name(where, name)
        user.append(_user_tool(f"{where}.{name}", name, value, callables))
    taken = {t.name for t in user}
    for s in mcp:
        if s.name in taken:
            raise FieldError(f"{where}.mcp.{s.name}", "is also the name of a user tool")
    return ToolsConfig(tuple(user), tuple(mcp))


def _check_name(where: str, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise FieldError(f"{where}.{name}", "a tool's name must be a Python identifier")
    if keyword.iskeyword(name) or name.startswith("_") or name in RESERVED:
        raise FieldError(f"{where}.{name}", "is reserved (keywords, names starting with '_', "
                         f"and {', '.join(RESERVED)})")  # fmt: skip


def _user_tool(field: str, name: str, value: Any, callables: bool) -> UserTool:
    if callable(value) and not isinstance(value, str):
        value = _import_path(field, value, callables)
    short = isinstance(value, str)  # NAME = "module:function": the field is NAME itself
    if short:
        value = {"function": value}
    if not isinstance(value, Mapping):
        raise FieldError(field, 'expected "module:function" or a table '
                         '{ function = "module:function", calls = N, timeout_s = S }')  # fmt: skip
    _no_unknown(field, value, ("function", "calls", "timeout_s"))
    function = value.get("function")
    if callable(function) and not isinstance(function, str):
        function = _import_path(f"{field}.function", function, callables)
    module, sep, attr = function.partition(":") if isinstance(function, str) else ("", "", "")
    if not isinstance(function, str) or not (sep and _TARGET.fullmatch(module)
                                             and _TARGET.fullmatch(attr)):  # fmt: skip
        raise FieldError(field if short or "function" not in value else f"{field}.function",
                         f'expected "module:function" (e.g. "mypkg.tools:lookup"), '
                         f"got {function!r}")  # fmt: skip
    return UserTool(name, function, _calls(field, value), _timeout(field, value))


def _server(where: str, name: Any, spec: Any) -> McpServer:
    _check_name(where, name)
    field = f"{where}.{name}"
    if not isinstance(spec, Mapping):
        raise FieldError(field, "must be a table { command = [...], env = {...} }")
    _no_unknown(field, spec, ("command", "env", "calls", "timeout_s"))
    command = spec.get("command")
    if (not isinstance(command, list | tuple) or not command
            or not all(isinstance(a, str) and a and "\0" not in a for a in command)):  # fmt: skip
        raise FieldError(f"{field}.command", "must be a non-empty list of strings (the "
                         "server's program and its arguments)")  # fmt: skip
    env = spec.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise FieldError(f"{field}.env", 'must be a table of strings (NAME = "value")')
    return McpServer(name, tuple(command), tuple(sorted(env.items())), _calls(field, spec),
                     _timeout(field, spec))  # fmt: skip


def _no_unknown(field: str, table: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in table:
        if key not in known:
            raise FieldError(f"{field}.{key}", f"unknown key (known: {', '.join(known)})")


def _calls(field: str, table: Mapping[str, Any]) -> int:
    calls = table.get("calls", DEFAULT_CALLS)
    if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0:
        raise FieldError(f"{field}.calls", f"must be an integer of at least 0 (got {calls!r})")
    return calls


def _timeout(field: str, table: Mapping[str, Any]) -> float:
    t = table.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise FieldError(f"{field}.timeout_s", f"must be a number greater than 0 (got {t!r})")
    return float(t)


def _import_path(field: str, fn: Callable[..., Any], callables: bool) -> str:
    """The "module:qualname" of a function the tools process can import again."""
    if not callables:
        raise FieldError(field, 'a config names a function as "module:function"')
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise FieldError(field, f"{fn!r} cannot be imported by the tools process (a lambda, a "
                         "local function or one of __main__): name it as "
                         '"module:function"')  # fmt: skip
    return f"{module}:{qualname}"
