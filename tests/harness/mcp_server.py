"""An MCP server for the MCP-tool tests, run as `python mcp_server.py` over stdio (the `mcp`
SDK's MCPServer, the FastMCP of SDK 1.x)."""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server import MCPServer

app = MCPServer("test-tools")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers.

    Not shown to proposers."""
    return a + b


@app.tool(name="get-weather")
def get_weather(city: str, unit: str = "C") -> dict:
    """The weather of a city (made up)."""
    return {"city": city, "temp": 21, "unit": unit}


@app.tool()
async def hang() -> str:
    """Never returns."""
    await anyio.sleep(3600)
    return "never"


@app.tool()
def fail() -> str:
    """Raises."""
    raise ValueError("the server's own error")


@app.tool()
def pid() -> int:
    """The server's pid."""
    return os.getpid()


@app.tool()
def die() -> str:
    """The server exits mid-call."""
    os._exit(5)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fail-start":
        sys.exit("this server does not start")
    app.run("stdio")
