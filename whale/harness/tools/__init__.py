"""User tools: trusted Python callables and MCP servers a harness calls through the broker.

`config` parses `runtime.tools`; `spec` describes each tool (`ToolSpec`) from a callable's
signature and docstring or an MCP tool's listing, and checks a call's arguments; `host` runs
the one tools process of a Runtime (`child`, and `mcp` inside it) outside the jail; `gate` is
the broker's `tool` op for one run (budget, checks, records). docs/harness.md, "User tools".
"""

from whale.harness.tools.config import (
    RESERVED,
    McpServer,
    ToolsConfig,
    UserTool,
    parse_tools,
)
from whale.harness.tools.gate import ToolBackend, ToolGate
from whale.harness.tools.host import ToolCallFailed, ToolHost, ToolsUnavailable
from whale.harness.tools.spec import ARGS_BYTES, RESULT_BYTES, ToolSpec, describe_callable

__all__ = [
    "ARGS_BYTES", "RESERVED", "RESULT_BYTES", "McpServer", "ToolBackend", "ToolCallFailed",
    "ToolGate", "ToolHost", "ToolSpec", "ToolsConfig", "ToolsUnavailable", "UserTool",
    "describe_callable", "parse_tools",
]  # fmt: skip
