"""What a brokered user tool costs per call, against a direct call of the same function.

Measured in one run, so the ratios hold on a noisy machine:
- direct: `add(i, 1)` called in this process (median over many calls);
- retrieve: a jailed harness calling `env.tools.retrieve` on an in-process retriever, the
  broker's own round trip (worker -> broker -> back), for scale;
- user tool: the harness calling `env.tools.add(i, 1)`, the same function as a user tool
  (`runtime.tools`): the broker round trip, then the hop to the tools process and back;
- MCP: the harness calling `env.tools.m.add(i, 1)`, the same function served by an MCP server
  over stdio (this file, `--mcp-server`) through the tools process;
- MCP SDK alone: the same server called by the `mcp` SDK's own client in this process, no
  whale in between: what the protocol itself costs.
Each per-call cost is (a run of N + 10 calls - a run of 10 calls) / N, medians over runs, so
the worker's start and the run's fixed costs cancel out.

    python -m benchmarks.tool_overhead [--calls 200] [--runs 5]
Target (issue 23): a brokered user-tool call or MCP call adds under 2 ms over a direct call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from whale.harness import Budget, Runtime
from whale.harness.tools import parse_tools

CALLS = (
    "def run(q, env):\n"
    "    n, which = q.split()\n"
    "    f = {'user': lambda i: env.tools.add(i, 1), 'mcp': lambda i: env.tools.m.add(i, 1),\n"
    "         'retrieve': lambda i: env.tools.retrieve(str(i), 1)}[which]\n"
    "    for i in range(int(n)):\n"
    "        f(i)\n"
    "    return 'ok'\n"
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Echo:
    def retrieve(self, query: str, k: int) -> list[dict[str, object]]:
        return [{"id": query, "title": "", "text": query, "score": 1.0}][:k]


def serve_mcp() -> None:
    from mcp.server import MCPServer

    app = MCPServer("bench")
    app.tool()(add)
    app.run("stdio")


def sdk_per_call_s(server: list[str], n: int) -> float:
    """One MCP client session of the SDK, `n` calls of add, per call."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    out: list[float] = []

    async def go() -> None:
        params = StdioServerParameters(command=server[0], args=server[1:])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("add", {"a": 0, "b": 1})
            t = time.perf_counter()
            for i in range(n):
                await s.call_tool("add", {"a": i, "b": 1})
            out.append((time.perf_counter() - t) / n)

    anyio.run(go)
    return out[0]


def median_s(fn, runs: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def per_call_s(rt: Runtime, which: str, n: int, runs: int) -> float:
    def one(k: int) -> None:
        t = rt.run(CALLS, f"{k} {which}", retriever=Echo())
        assert t.status == "ok", t.error

    base = median_s(lambda: one(10), runs)
    many = median_s(lambda: one(n + 10), runs)
    return (many - base) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mcp-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mcp_server:
        serve_mcp()
        return
    n = args.calls
    server = [sys.executable, str(Path(__file__).resolve()), "--mcp-server"]
    # The tools process imports this module again, by its name (this run's is __main__).
    table = {"add": {"function": "benchmarks.tool_overhead:add", "calls": n + 10},
             "mcp": {"m": {"command": server, "calls": n + 10}}}  # fmt: skip
    rt = Runtime(budget=Budget(retrievals=n + 10, run_timeout_s=600), tools=parse_tools(table))
    try:
        t0 = time.perf_counter()
        rt.tool_specs()
        start = time.perf_counter() - t0
        k = 100_000
        t0 = time.perf_counter()
        for i in range(k):
            add(i, 1)
        direct = (time.perf_counter() - t0) / k
        rt.run(CALLS, "1 user", retriever=Echo())  # warm the page cache
        retrieve = per_call_s(rt, "retrieve", n, args.runs)
        user = per_call_s(rt, "user", n, args.runs)
        mcp = per_call_s(rt, "mcp", n, args.runs)
    finally:
        rt.close()
    sdk = statistics.median(sdk_per_call_s(server, n) for _ in range(args.runs))
    print(f"sandbox: {rt.sandbox.resolved()}   calls per run: {n}   runs: {args.runs}")
    print(f"tools process start (once):     {start * 1000:8.0f} ms (imports, one MCP server)")
    print(f"direct call in process:         {direct * 1e6:8.2f} us")
    print(f"retrieve through the broker:    {retrieve * 1e6:8.0f} us per call (the broker alone)")
    print(
        f"user tool through the broker:   {user * 1e6:8.0f} us per call   "
        f"added {(user - direct) * 1000:.2f} ms   target < 2 ms   ratio {user / direct:,.0f}x"
    )
    print(
        f"MCP tool through the broker:    {mcp * 1e6:8.0f} us per call   "
        f"added {(mcp - direct) * 1000:.2f} ms   target < 2 ms   ratio {mcp / direct:,.0f}x"
    )
    print(f"MCP SDK alone (its own client):  {sdk * 1e6:8.0f} us per call (no whale in between)")
    print(f"tools-process hop (user - retrieve):     {(user - retrieve) * 1e6:8.0f} us")
    print(f"whale's part of an MCP call (mcp - sdk): {(mcp - sdk) * 1e6:8.0f} us")


if __name__ == "__main__":
    main()
