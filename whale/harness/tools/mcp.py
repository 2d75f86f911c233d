"""The MCP side of the tools process: start each configured server over stdio, list its tools,
call them. Runs on the tools process's event loop (child.py); needs the `mcp` SDK
(`pip install 'whale[tools]'`), imported only where a server is configured.

Each server is started through a tiny wrapper (`PRELUDE`) that sets SIGKILL as its
parent-death signal and then execs the server's command, so a server dies with the tools
process however that ends (the tools process itself dies with whale the same way). The
wrapper is forked by the event loop's thread, the tools process's main thread, which lives
as long as the process (the signal follows the forking thread). On a clean stop the SDK
closes the server's stdin, waits, then kills its process group; the tools process then kills
every child still there (`kill_children`).

A server that dies mid-run is not restarted: each later call of its tools is an error the
harness sees ("closed its connection"), and the run goes on. Restarting would hide a crash
loop and give a stateful server a fresh state in the middle of an evaluation.
Not covered: processes a server starts in sessions of their own, if it exits by SIGKILL
(only its direct process gets the parent-death signal; a clean stop kills its group).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale.harness.tools.config import McpServer
from whale.harness.tools.spec import ToolSpec, spec_from_mcp

# `python -I -S -c PRELUDE PARENT_PID CMD...`: parent-death signal, give up if the parent is
# already gone (the signal would never come), then exec the server (PATH lookup: the SDK
# hands the server a PATH).
PRELUDE = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0:\n"  # PR_SET_PDEATHSIG=1
    "    sys.exit('prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('parent exited before the server started')\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class CallError(Exception):
    """A call failed: the text is what the harness reads."""


class StartError(Exception):
    """A server or tool could not be started; `field` names its config entry."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def attribute(name: str) -> str:
    """An MCP tool's name as a Python attribute (MCP names may hold '-' and '.')."""
    attr = re.sub(r"\W", "_", name, flags=re.ASCII)
    return attr if attr and not attr[0].isdigit() else f"_{attr}"


class McpClients:
    """Every configured server's session, on one event loop."""

    def __init__(self, servers: Sequence[McpServer]) -> None:
        self.servers = list(servers)
        self.sessions: dict[str, Any] = {}
        self.gone: dict[str, str] = {}  # server -> why its tools fail
        self.targets: dict[str, tuple[str, str, bool]] = {}  # spec name -> server, tool, wrapped
        self._stop: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, timeout: float) -> list[ToolSpec]:
        """Start every server and list its tools; StartError naming the first that fails."""
        self._stop = asyncio.Event()
        specs = await asyncio.gather(*(self._start_one(s, timeout) for s in self.servers))
        return [s for group in specs for s in group]

    async def _start_one(self, srv: McpServer, timeout: float) -> list[ToolSpec]:
        field = f"mcp.{srv.name}"
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._tasks.append(asyncio.ensure_future(self._serve(srv, ready)))
        try:
            tools = await asyncio.wait_for(asyncio.shield(ready), timeout)
        except TimeoutError:
            raise StartError(field, f"MCP server {srv.name!r} did not list its tools within "
                             f"{timeout:g} s ({' '.join(srv.command)})") from None  # fmt: skip
        except Exception as e:  # noqa: BLE001 - any failure of a server is its config's
            raise StartError(field, f"MCP server {srv.name!r} failed to start "
                             f"({' '.join(srv.command)}): {_leaf(e)}") from None  # fmt: skip
        specs = []
        for t in tools:
            spec = spec_from_mcp(srv.name, attribute(t.name), t.name, t.description,
                                 t.input_schema, srv.calls, srv.timeout_s)  # fmt: skip
            if spec.name in self.targets:
                continue  # two names that read as one attribute: the first is offered
            out = t.output_schema or {}
            wrapped = list(out.get("properties") or {}) == ["result"]
            self.targets[spec.name] = (srv.name, t.name, wrapped)
            specs.append(spec)
        return specs

    async def _serve(self, srv: McpServer, ready: asyncio.Future[list[Any]]) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        args = ["-I", "-S", "-c", PRELUDE, str(os.getpid()), *srv.command]
        params = StdioServerParameters(command=sys.executable, args=args, env=dict(srv.env))
        assert self._stop is not None
        try:
            async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
                await session.initialize()
                tools, cursor = [], None
                while True:  # every page of the listing
                    page = await session.list_tools(
                        params=None if cursor is None else _page(cursor)
                    )
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.sessions[srv.name] = session
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                if isinstance(e, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self.sessions.pop(srv.name, None)
            self.gone.setdefault(srv.name, "it stopped")

    async def call(self, name: str, kwargs: dict[str, Any], timeout: float) -> Any:
        """The tool's result as JSON data: its structured content (a server's wrapped
        {"result": x} as x) where it has one, else its text; CallError otherwise."""
        from mcp import MCPError

        server, tool, wrapped = self.targets[name]
        session = self.sessions.get(server)
        if session is None or server in self.gone:
            raise CallError(f"MCP server {server!r} is not running ({self.gone.get(server)})")
        try:
            result = await asyncio.wait_for(session.call_tool(tool, kwargs), timeout)
        except TimeoutError:
            raise CallError(f"timed out after {timeout:g} s") from None
        except MCPError as e:
            if e.code == -32000:  # CONNECTION_CLOSED: the server exited
                self.gone[server] = "it exited mid-run, and is not restarted"
                raise CallError(f"MCP server {server!r} closed its connection (it exited); its "
                                "tools fail for the rest of this command") from None  # fmt: skip
            raise CallError(f"MCP error {e.code}: {e.message}") from None
        text = "\n".join(_block_text(b) for b in result.content)
        if result.is_error:
            raise CallError(text or "the tool reported an error")
        data = result.structured_content
        if data is None:
            return text
        if wrapped and isinstance(data, dict) and list(data) == ["result"]:
            return data["result"]
        return data

    async def stop(self, grace_s: float) -> None:
        """Stop every server (the SDK's own close: stdin, wait, kill), within `grace_s`."""
        if self._stop is not None:
            self._stop.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace_s)


def _page(cursor: str) -> Any:
    from mcp.types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _block_text(block: Any) -> str:
    text = getattr(block, "text", None)
    return text if isinstance(text, str) else f"[{getattr(block, 'type', '?')} content]"


def _leaf(e: BaseException) -> str:
    """The first real error inside exception groups (the SDK's task groups wrap them)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def kill_children() -> None:
    """SIGKILL every child of this process and its process group (servers lead their own):
    what is left once the servers had their grace."""
    for path in Path("/proc/self/task").glob("*/children"):
        try:
            pids = [int(p) for p in path.read_text().split()]
        except OSError:
            continue
        for pid in pids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)
