"""The broker's `tool` op: one run's calls of user and MCP tools (`ToolGate`).

A request {name, kwargs} is, in this order: refused when `name` is no declared tool, when
`kwargs` is not an object, when its JSON is over ARGS_BYTES, or when it does not fit the
tool's schema (spec.check_args) — an error reply, no budget spent; refused as over budget
once the tool's own `calls` per question are spent (the run ends `budget_exceeded`, as with
every budget); else sent to the tools process with timeout min(the tool's timeout_s, what is
left of the run). Whatever happens, the call is a `ToolCall` on the trajectory (name, args,
result or error, latency); calls that were never sent are recorded up to
MAX_REFUSED_RECORDS per run (they cost nothing, so a harness could repeat one until its
deadline), then only counted in one last record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from whale.harness.calls import BadCall, Refused
from whale.harness.tools.host import ToolCallFailed, ToolsUnavailable
from whale.harness.tools.spec import ARGS_BYTES, BadArgs, ToolSpec, check_args
from whale.harness.trajectory import ToolCall, Trajectory

MAX_REFUSED_RECORDS = 32
NAME_CHARS = 100  # of a refused call's name, as recorded


class ToolBackend(Protocol):
    """What serves user tools (host.ToolHost, or a test's fake)."""

    def specs(self) -> tuple[ToolSpec, ...]: ...

    def call(self, name: str, kwargs: dict[str, Any], timeout: float) -> Any:
        """The JSON result; ToolCallFailed with the text the harness reads."""
        ...


class ToolGate:
    """One run's user tools: their per-question budgets, checks and records."""

    def __init__(self, backend: ToolBackend | None, traj: Trajectory) -> None:
        self.backend, self.traj = backend, traj
        self.specs = {s.name: s for s in backend.specs()} if backend is not None else {}
        self.used = dict.fromkeys(self.specs, 0)
        self.refused = 0

    def names(self) -> list[str]:
        return list(self.specs)

    def params(self) -> dict[str, list[str]]:
        """Each tool's positional parameters, for the worker to map positional arguments."""
        return {n: list(s.params) for n, s in self.specs.items()}

    def left(self) -> dict[str, Any]:
        """The budget view's part: {"tools": {name: calls left}}, or nothing without tools."""
        if not self.specs:
            return {}
        return {"tools": {n: s.calls - self.used[n] for n, s in self.specs.items()}}

    def call(self, args: dict[str, Any], remaining_s: Callable[[], float]) -> Any:
        """Serve one `tool` request (see the module docstring); BadCall / Refused say why it
        failed, and the harness reads it as a ToolError / BudgetExceeded."""
        name, kwargs = args.get("name"), args.get("kwargs", {})
        if not isinstance(name, str) or name not in self.specs:
            shown = (name if isinstance(name, str) else repr(name))[:NAME_CHARS]
            why = f"no tool {shown!r}: the tools of this run are {', '.join(self.specs) or 'none'}"
            self._refuse(shown, {}, why)
            raise BadCall(why)
        spec = self.specs[name]
        if not isinstance(kwargs, dict):
            why = f"{name}(): arguments must be an object of name: value"
            self._refuse(name, {}, why)
            raise BadCall(why)
        size = len(json.dumps(kwargs))
        if size > ARGS_BYTES:
            why = f"{name}(): arguments of {size} bytes of JSON are over the {ARGS_BYTES}-byte cap"
            self._refuse(name, {}, why)
            raise BadCall(why)
        try:
            check_args(spec, kwargs)
        except BadArgs as e:
            self._refuse(name, kwargs, str(e))
            raise BadCall(str(e)) from None
        if self.used[name] >= spec.calls:
            why = f"budget exceeded: {name} limit of {spec.calls} calls reached"
            self._refuse(name, kwargs, why)
            raise Refused(why)
        self.used[name] += 1
        timeout = min(spec.timeout_s, remaining_s())
        assert self.backend is not None
        t = time.monotonic()
        try:
            result = self.backend.call(name, kwargs, timeout)
        except (ToolCallFailed, ToolsUnavailable) as e:
            self.traj.add_tool_call(ToolCall(name, kwargs, None, time.monotonic() - t, str(e)))
            raise BadCall(f"{name}: {e}") from None
        self.traj.add_tool_call(ToolCall(name, kwargs, result, time.monotonic() - t))
        return result

    def _refuse(self, name: str, kwargs: dict[str, Any], why: str) -> None:
        """A call that was never sent, on the trajectory (up to MAX_REFUSED_RECORDS)."""
        self.refused += 1
        if self.refused < MAX_REFUSED_RECORDS:
            self.traj.add_tool_call(ToolCall(name, kwargs, None, 0.0, why))
        elif self.refused == MAX_REFUSED_RECORDS:
            why += " (later calls refused before sending are not recorded)"
            self.traj.add_tool_call(ToolCall(name, kwargs, None, 0.0, why))
