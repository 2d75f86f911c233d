"""The tools process: runs the user's trusted tools, outside the jail, for every broker thread.

    python -m whale.harness.tools.child WHALE_PID RFD WFD

Started by `host.ToolHost` (through whale.models.serverproc.spawn: SIGKILL as its
parent-death signal, its own session). It reads its config (`ToolsConfig.to_wire`, and
whale's `sys.path`) from RFD, imports each callable, starts each MCP server (mcp.py) and
answers with every tool's `ToolSpec`, or with the first failure and the config field it is
about. Then each request {id, name, kwargs} gets one reply {id, ok, result | error}, in any
order: a plain callable runs on a thread pool (so calls of many runs overlap), an `async def`
one and MCP calls on the event loop of the main thread. Arguments are bound to the callable's
signature here too (the broker checked them against the spec); a result must be JSON of at
most RESULT_BYTES, or the reply is an error. Nothing here can stop a callable that hangs:
whale stops waiting at the call's timeout, and restarts this process when such calls pile up
(host.py). At end of file on RFD (whale closed it, or died) the MCP servers get a short grace
and this process exits; what the user's code printed goes to stderr, never into a pipe.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from whale.harness.streams import MAX_DEPTH
from whale.harness.tools.config import ToolsConfig
from whale.harness.tools.frames import encode, read_frame, write_all
from whale.harness.tools.mcp import CallError, McpClients, StartError, kill_children
from whale.harness.tools.spec import RESULT_BYTES, describe_callable

POOL_THREADS = 32  # calls of plain callables in flight at once (more wait their turn)
START_S = 60.0  # for every MCP server to start and list its tools
STOP_GRACE_S = 3.0
ERROR_CHARS = 1000


class _Tools:
    def __init__(self, wfd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.wfd, self.loop = wfd, loop
        self.funcs: dict[str, tuple[Callable[..., Any], inspect.Signature]] = {}
        self.mcp: McpClients | None = None
        self.pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="whale-tool")
        self._write = threading.Lock()

    def load(self, cfg: ToolsConfig) -> list[dict[str, Any]]:
        specs = []
        for t in cfg.user:
            field = t.name
            module, _, attr = t.function.partition(":")
            try:
                obj: Any = importlib.import_module(module)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except Exception as e:  # noqa: BLE001 - the user's import fails in any way
                raise StartError(field, f"cannot import {t.function}: {type(e).__name__}: "
                                 f"{e}") from None  # fmt: skip
            if not callable(obj):
                raise StartError(field, f"{t.function} is a {type(obj).__name__}, not callable")
            try:
                spec = describe_callable(t.name, obj, t.calls, t.timeout_s)
                sig = inspect.signature(obj)
            except ValueError as e:
                raise StartError(field, f"{t.function}: {e}") from None
            self.funcs[t.name] = (obj, sig)
            specs.append(spec.to_dict())
        if cfg.mcp:
            self.mcp = McpClients(cfg.mcp)
            specs += [s.to_dict() for s in self.loop.run_until_complete(self.mcp.start(START_S))]
        return specs

    def reply(self, msg: dict[str, Any]) -> None:
        data = encode(msg)
        with self._write:
            write_all(self.wfd, data)

    def ok(self, i: int, result: Any) -> None:
        if _deeper_than(result, MAX_DEPTH):  # the broker's records and replies stop there too
            self.error(i, f"the tool returned data nested deeper than {MAX_DEPTH} levels")
            return
        try:
            text = json.dumps(result, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            self.error(i, f"the tool returned what is not JSON data ({e})")
            return
        except RecursionError:  # nested deeper than json can write: still one reply, now
            self.error(i, "the tool returned data nested too deep to write as JSON")
            return
        if len(text.encode()) > RESULT_BYTES:
            self.error(i, f"the tool's result is {len(text.encode())} bytes of JSON, over the "
                       f"{RESULT_BYTES}-byte cap")  # fmt: skip
            return
        data = f'{{"id":{i},"ok":true,"result":{text}}}'.encode()
        with self._write:
            write_all(self.wfd, len(data).to_bytes(4, "big") + data)

    def error(self, i: int, text: str) -> None:
        self.reply({"id": i, "ok": False, "error": text[:ERROR_CHARS]})

    # -- one request -------------------------------------------------------------------------
    def dispatch(self, req: dict[str, Any]) -> None:
        i, name, kwargs = req["id"], req["name"], req["kwargs"]
        if name in self.funcs:
            fn, sig = self.funcs[name]
            try:
                bound = sig.bind(**kwargs)
            except TypeError as e:
                self.error(i, f"{name}(): {e}")
                return
            if inspect.iscoroutinefunction(fn):  # on the loop, cancelled at its timeout
                coro = asyncio.wait_for(fn(*bound.args, **bound.kwargs), float(req["timeout"]))
                fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
                fut.add_done_callback(lambda f: self._done(i, f))
            else:
                self.pool.submit(self._run, i, fn, bound).add_done_callback(
                    lambda f: self._done(i, f)
                )
        elif self.mcp is not None and name in self.mcp.targets:
            coro = self.mcp.call(name, kwargs, float(req["timeout"]))
            asyncio.run_coroutine_threadsafe(coro, self.loop).add_done_callback(
                lambda f: self._done(i, f)
            )
        else:
            self.error(i, f"no tool {name!r} in the tools process")

    @staticmethod
    def _run(i: int, fn: Callable[..., Any], bound: inspect.BoundArguments) -> Any:
        return fn(*bound.args, **bound.kwargs)

    def _done(self, i: int, fut: Future[Any]) -> None:
        try:
            result = fut.result()
        except CallError as e:
            self.error(i, str(e))
        except TimeoutError:
            self.error(i, "timed out")
        except BaseException as e:  # noqa: BLE001 - the user's tool fails in any way
            self.error(i, f"{type(e).__name__}: {e}")
        else:
            try:
                self.ok(i, result)
            except Exception as e:  # noqa: BLE001 - every request gets its one reply
                self.error(i, f"the tool's result could not be sent ({type(e).__name__})")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests lists, tuples or dicts deeper than `limit` (without recursion, and
    ending on data that holds itself)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            if depth >= limit:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _read(rfd: int, tools: _Tools) -> None:
    try:
        while True:
            req = read_frame(rfd)
            if req is None:
                break
            try:
                tools.dispatch(req)
            except Exception as e:  # noqa: BLE001 - a request this process cannot take
                tools.error(req.get("id", -1), f"tools process: {type(e).__name__}: {e}")
    finally:
        tools.loop.call_soon_threadsafe(tools.loop.stop)


def main() -> None:
    rfd, wfd = int(sys.argv[2]), int(sys.argv[3])
    os.dup2(2, 1)  # what the user's code prints goes to stderr (the pipes are RFD and WFD)
    init = read_frame(rfd)
    if init is None:
        return
    for p in reversed(init["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tools = _Tools(wfd, loop)
    try:
        specs = tools.load(ToolsConfig.from_wire(init["tools"]))
    except StartError as e:
        tools.reply({"ready": False, "error": str(e)[: 4 * ERROR_CHARS], "field": e.field})
        _exit(tools)
        return
    tools.reply({"ready": True, "specs": specs})
    threading.Thread(target=_read, args=(rfd, tools), name="whale-tools-reader",
                     daemon=True).start()  # fmt: skip
    try:
        loop.run_forever()
    finally:
        _exit(tools)


def _exit(tools: _Tools) -> None:
    """Give the MCP servers their grace, kill what is left, and go (without waiting for
    callables that may never return)."""
    try:
        if tools.mcp is not None:
            tools.loop.run_until_complete(tools.mcp.stop(STOP_GRACE_S))
    finally:
        kill_children()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
